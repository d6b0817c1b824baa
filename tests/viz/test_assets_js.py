"""The viewers' own files (``captum_ffb/viz/assets/``) read as what they are: every script parsed
as JavaScript (esprima, pure Python; also ``node --check`` where node is installed) and linted
for what matters when a page pastes a graph's or a text's strings into HTML; every style sheet
balanced; the files shipped as package data and inlined by the modules as they stand.

The lint's rules, for each script:

* it parses (a syntax error fails);
* no ``eval``, no ``Function`` (called or with ``new``), no ``setTimeout``/``setInterval`` with
  anything but a function (a string there is an ``eval``), no ``document.write``/``writeln``;
* nothing that ends the inline ``<script>`` element early or opens an HTML comment in it
  (``</script``, ``<script``, ``<!--``);
* every ``innerHTML``/``outerHTML`` assignment (``=`` and ``+=``) and every
  ``insertAdjacentHTML`` is *HTML-safe*: built only from constant strings, numbers (numeric
  literals and operators, ``.length``, ``Math.*``, ``Number``, ``toFixed``/``toExponential``/
  ``toPrecision``, which throw on anything but a number), and text passed through the page's
  escaping function ``esc(...)``, joined with ``+``, ``?:``, ``||``/``&&``. The script composes
  its panels in helper functions and variables (``details(u)``, ``cardHtml(u)``, ``h += ...``
  in callbacks), so the rule follows them: a function's result is safe when all its ``return``
  values are (given safe arguments for the parameters they use), a variable's when every value
  assigned to it anywhere is, ``xs.map(f).join(s)`` when ``f`` returns safe text, the parameter of
  a callback over an array literal of constants when those are; a least fixed point, so
  recursion and closures are covered. Anything else (a field of the data, a ``for ... in`` key,
  a callback's parameter over data) is unsafe unless escaped;
* a function named ``esc`` is the escaping function: ``String(s)`` with each of ``& < > " '``
  replaced by its numeric character reference (checked by its text; run in node where present);
* ``ffbColour.css`` (the shared colour scale, :data:`captum_ffb.io.pages.COLOUR_JS`) is taken as
  safe, and a test here checks that claim with the same analysis on that script.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path, PurePosixPath

import pytest

from captum_ffb.viz import _assets, _graph_page
from captum_ffb.viz._common import COLOUR_JS


def _esprima():
    try:
        import esprima
    except ImportError:  # it comes with [dev]; CI installs that
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI must lint the scripts: esprima (in [dev]) is not installed")
        pytest.skip("linting the scripts needs esprima (it comes with [dev])")
    return esprima


esprima = _esprima()
Node = esprima.nodes.Node

ROOT = Path(__file__).resolve().parents[2]
ASSETS = resources.files(_assets.__package__) / _assets.FOLDER
FILES = {"graph.js", "graph.css", "graph_body.html", "maps.js", "maps.css"}
SCRIPTS = sorted(name for name in FILES if name.endswith(".js"))
SHEETS = sorted(name for name in FILES if name.endswith(".css"))
NODE = shutil.which("node")


def text(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------- the lint
#: What the page's escaping function must be, token for token (whitespace aside).
ESC = re.compile(r"""function esc\(s\) \{ return String\(s\)\.replace\(/\[&<>"'\]/g, function \(c\) """
                 r"""\{ return "&#" \+ c\.charCodeAt\(0\) \+ ";"; \}\); \}""")
#: Known-safe functions of other scripts on the page (the colour scale's ``css``: ``rgb(r,g,b)``).
EXTERNAL = frozenset({"ffbColour.css"})
FUNCTIONS = ("FunctionDeclaration", "FunctionExpression", "ArrowFunctionExpression")
NUMBER = frozenset()  # a safe value that needs nothing: a constant, a number, escaped text
UNSAFE = None
NUMERIC_GLOBALS = {"Number", "parseInt", "parseFloat", "isNaN", "isFinite"}
NUMERIC_METHODS = {"toFixed", "toExponential", "toPrecision"}
SAME_TEXT_METHODS = {"toString", "trim", "toLowerCase", "toUpperCase"}
ARRAY_CALLBACKS = {"forEach", "map", "filter", "some", "every"}
HAZARDS = re.compile(r"</script|<script|<!--", re.I)


def _join(*values):
    if any(v is UNSAFE for v in values):
        return UNSAFE
    return frozenset().union(*values)


def _children(node):
    for key, value in vars(node).items():
        if key == "type":
            continue
        if isinstance(value, Node):
            yield value
        elif isinstance(value, list):
            yield from (v for v in value if isinstance(v, Node))


def _names(pattern) -> list[str]:
    """The identifiers a declaration or parameter pattern binds."""
    if pattern is None:
        return []
    if pattern.type == "Identifier":
        return [pattern.name]
    return [n for child in _children(pattern) for n in _names(child)] if isinstance(pattern, Node) else []


class Script:
    """One script's scopes, bindings and the values flowing into them, and its problems."""

    def __init__(self, source: str, external=EXTERNAL):
        self.source, self.external = source, external
        self.tree = esprima.parseScript(source, {"range": True, "loc": True})
        self.owner: dict[int, Node] = {}  # node -> the function (or the script) it sits in
        self.parent: dict[int, Node | None] = {id(self.tree): None}
        self.declared: dict[int, set[str]] = {id(self.tree): set()}
        self.declarations: dict[tuple, Node] = {}  # binding -> its FunctionDeclaration
        self.params: dict[tuple, tuple[Node, int]] = {}  # binding -> (its function, index)
        self.sources: dict[tuple, list] = {}  # binding -> [(expression, scope) or a value]
        self.functions: list[Node] = []
        self.returns: dict[int, list] = {}
        self.problems: list[str] = []
        self._sinks: list[tuple] = []  # (expression, scope, what): HTML that must be safe
        self._scan(self.tree, self.tree)
        self._callbacks = {  # a function passed to an array method -> that call
            id(node.arguments[0]): node for node in self._walk(self.tree)
            if node.type == "CallExpression" and node.callee.type == "MemberExpression"
            and not node.callee.computed and node.callee.property.name in ARRAY_CALLBACKS
            and node.arguments and node.arguments[0].type in FUNCTIONS[1:]}
        self._bind(self.tree)
        self._solve()

    # -- pass 1: scopes and declarations (var is function-scoped; let/const merged there too)
    def _declare(self, scope, name):
        self.declared[id(scope)].add(name)

    def _scan(self, node, scope):
        self.owner[id(node)] = scope
        kind = node.type
        if kind in FUNCTIONS:
            if kind == "FunctionDeclaration":
                self._declare(scope, node.id.name)
            self.parent[id(node)], self.declared[id(node)] = scope, set()
            self.functions.append(node)
            self.returns[id(node)] = []
            if kind == "FunctionExpression" and node.id is not None:
                self._declare(node, node.id.name)
            for p in node.params:
                for name in _names(p):
                    self._declare(node, name)
            inner = node
        else:
            inner = scope
            if kind == "VariableDeclarator":
                for name in _names(node.id):
                    self._declare(scope, name)
            elif kind == "CatchClause":
                for name in _names(node.param):
                    self._declare(scope, name)
            elif kind == "ReturnStatement":
                self.returns[id(scope)].append(node.argument)
        for child in _children(node):
            if kind in FUNCTIONS and child is node.id:
                self.owner[id(child)] = scope
                continue
            self._scan(child, inner)

    def resolve(self, name, scope):
        while scope is not None:
            if name in self.declared[id(scope)]:
                return (id(scope), name)
            scope = self.parent[id(scope)]
        return None  # a global

    # -- pass 2: what flows into each binding, and the rules that need no data flow
    def _add(self, binding, source):
        self.sources.setdefault(binding, []).append(source)

    def _bind(self, node):
        scope = self.owner[id(node)]
        kind = node.type
        if kind == "FunctionDeclaration":
            binding = self.resolve(node.id.name, scope)
            self.declarations[binding] = node
            self._add(binding, UNSAFE)  # a function is no text
            if node.id.name == "esc":
                self._check_esc(node)
        if kind in FUNCTIONS:
            for i, p in enumerate(node.params):
                for name in _names(p):
                    binding = (id(node), name)
                    self.params[binding] = (node, i)
                    if kind == "FunctionDeclaration" and p.type == "Identifier":
                        self._add(binding, frozenset({binding}))  # whatever its callers pass
                    elif not self._callback_param(node, i, binding):
                        self._add(binding, UNSAFE)
            if kind == "FunctionExpression" and node.id is not None:
                self._add((id(node), node.id.name), UNSAFE)
        elif kind == "VariableDeclarator":
            for name in _names(node.id):
                binding = self.resolve(name, scope)
                if node.init is not None:
                    self._add(binding, (node.init, scope) if node.id.type == "Identifier" else UNSAFE)
        elif kind == "AssignmentExpression":
            if node.left.type == "Identifier":
                binding = self.resolve(node.left.name, scope)
                if node.operator in ("=", "+="):
                    self._add(binding, (node.right, scope))
                # -=, *=, ... leave a number
            elif node.left.type != "MemberExpression":
                for name in _names(node.left):
                    self._add(self.resolve(name, scope), UNSAFE)
            if (node.left.type == "MemberExpression" and not node.left.computed
                    and node.left.property.name in ("innerHTML", "outerHTML")):
                self._sink(node.right, scope, f"{node.left.property.name} {node.operator}")
        elif kind in ("ForInStatement", "ForOfStatement"):
            left = node.left.declarations[0].id if node.left.type == "VariableDeclaration" else node.left
            for name in _names(left):
                self._add(self.resolve(name, scope), UNSAFE)  # keys and items of data
        elif kind == "CatchClause":
            for name in _names(node.param):
                self._add(self.resolve(name, scope), UNSAFE)
        elif kind in ("CallExpression", "NewExpression"):
            self._check_call(node, scope)
        for child in _children(node):
            self._bind(child)

    def _callback_param(self, fn, index, binding) -> bool:
        """``[safe, ...].forEach(function (item, k) ...)``: the item is as safe as the array's
        items; the index of any array method's callback is a number."""
        found = self._callbacks.get(id(fn))
        if found is None:
            return False
        if index == 1:
            self._add(binding, NUMBER)
            return True
        array = found.callee.object
        if index == 0 and array.type == "ArrayExpression":
            for item in array.elements:
                self._add(binding, (item, self.owner[id(array)]) if item is not None else NUMBER)
            return True
        return False

    def _walk(self, node):
        yield node
        for child in _children(node):
            yield from self._walk(child)

    def _problem(self, node, message):
        self.problems.append(f"line {node.loc.start.line}: {message}")

    def _check_esc(self, node):
        found = " ".join(self.source[node.range[0]:node.range[1]].split())
        if not ESC.fullmatch(found):
            self._problem(node, f"esc is not the escaping function: {found[:120]}")

    def _dotted(self, node) -> str | None:
        if node.type == "Identifier":
            return node.name
        if node.type == "MemberExpression" and not node.computed:
            head = self._dotted(node.object)
            return None if head is None else f"{head}.{node.property.name}"
        return None

    def _check_call(self, node, scope):
        name = self._dotted(node.callee) or ""
        last = name.rsplit(".", 1)[-1]
        if last == "eval" or name == "Function" or name.endswith(".Function"):
            self._problem(node, f"{'new ' if node.type == 'NewExpression' else ''}{name}(...) runs a string as code")
        elif name in ("document.write", "document.writeln") or (
                last in ("write", "writeln") and name.startswith(("document.", "window.document."))):
            self._problem(node, f"{name}(...) writes markup into the document")
        elif last in ("setTimeout", "setInterval") and node.arguments:
            first = node.arguments[0]
            is_function = first.type in FUNCTIONS[1:] or (
                first.type == "Identifier" and self.resolve(first.name, scope) in self.declarations)
            if not is_function:
                self._problem(node, f"{name}(...) with a string runs it as code")
        elif last == "insertAdjacentHTML" and len(node.arguments) >= 2:
            self._sink(node.arguments[1], scope, "insertAdjacentHTML")

    # -- pass 3: the least fixed point of "which values may carry unescaped text"
    def _solve(self):
        self.value = dict.fromkeys(self.sources, NUMBER)
        self.summary = {id(fn): NUMBER for fn in self.functions}
        changed = True
        while changed:
            changed = False
            for binding, sources in self.sources.items():
                new = _join(*(s if not isinstance(s, tuple) else self.eval(*s) for s in sources))
                if new != self.value[binding]:
                    self.value[binding], changed = new, True
            for fn in self.functions:
                if fn.type == "ArrowFunctionExpression" and fn.expression:
                    new = self.eval(fn.body, fn)
                else:
                    new = _join(*(NUMBER if r is None else self.eval(r, fn) for r in self.returns[id(fn)]))
                if new != self.summary[id(fn)]:
                    self.summary[id(fn)], changed = new, True
        for expression, scope, what in self._sinks:
            found = self.eval(expression, scope)
            if found != NUMBER:
                needs = "" if found is UNSAFE else " (unless its callers' arguments are: not checked)"
                self._problem(expression, f"{what} of text that is not escaped with esc(...){needs}: "
                                          f"{self.source[expression.range[0]:expression.range[1]][:100]}")

    def _sink(self, expression, scope, what):
        self._sinks.append((expression, scope, what))

    def eval(self, node, scope):
        """``UNSAFE``, or the parameters (bindings) whose arguments must be safe for ``node``'s
        value to be (empty: safe as it stands)."""
        kind = node.type
        if kind == "Literal":
            return NUMBER
        if kind == "TemplateLiteral":
            return _join(NUMBER, *(self.eval(e, scope) for e in node.expressions))
        if kind == "Identifier":
            binding = self.resolve(node.name, scope)
            if binding is None:
                return NUMBER if node.name in ("undefined", "NaN", "Infinity") else UNSAFE
            return self.value.get(binding, NUMBER)
        if kind == "BinaryExpression":
            if node.operator == "+":
                return _join(self.eval(node.left, scope), self.eval(node.right, scope))
            return NUMBER  # arithmetic, comparison: a number or a boolean
        if kind == "UnaryExpression" or kind == "UpdateExpression":
            return NUMBER
        if kind == "LogicalExpression":
            return _join(self.eval(node.left, scope), self.eval(node.right, scope))
        if kind == "ConditionalExpression":
            return _join(self.eval(node.consequent, scope), self.eval(node.alternate, scope))
        if kind == "SequenceExpression":
            return self.eval(node.expressions[-1], scope)
        if kind == "ArrayExpression":
            return _join(NUMBER, *(self.eval(e, scope) for e in node.elements if e is not None))
        if kind == "MemberExpression":
            if not node.computed and node.property.name == "length":
                return NUMBER
            return UNSAFE
        if kind == "CallExpression":
            return self._call(node, scope)
        return UNSAFE

    def _call(self, node, scope):
        callee, args = node.callee, node.arguments
        if callee.type == "Identifier":
            binding = self.resolve(callee.name, scope)
            if binding is None:
                if callee.name == "String" and args:
                    return self.eval(args[0], scope)
                return NUMBER if callee.name in NUMERIC_GLOBALS else UNSAFE
            fn = self.declarations.get(binding)
            if fn is None:
                return UNSAFE
            if fn.id.name == "esc":  # checked to be the escaping function
                return NUMBER
            return self._apply(fn, args, scope)
        if callee.type != "MemberExpression" or callee.computed:
            return UNSAFE
        method, target = callee.property.name, callee.object
        dotted = self._dotted(callee)
        if dotted is not None and self.resolve(dotted.split(".")[0], scope) is None:
            if dotted.startswith("Math.") or dotted in self.external:
                return NUMBER
        if method in NUMERIC_METHODS:
            return NUMBER  # Number.prototype's: anything else throws
        if method in SAME_TEXT_METHODS:
            return self.eval(target, scope)
        if method == "replace" and len(args) == 2 and args[1].type not in FUNCTIONS[1:]:
            return _join(self.eval(target, scope), self.eval(args[1], scope))
        if method == "join":
            separator = self.eval(args[0], scope) if args else NUMBER
            return _join(separator, self._items(target, scope))
        return UNSAFE

    def _items(self, node, scope):
        """How safe the items of an array are: ``[...]`` or ``xs.map(f)``."""
        if node.type == "ArrayExpression":
            return self.eval(node, scope)
        if (node.type == "CallExpression" and node.callee.type == "MemberExpression"
                and not node.callee.computed and node.callee.property.name == "map"
                and node.arguments and node.arguments[0].type in FUNCTIONS[1:]):
            return self.summary[id(node.arguments[0])]
        return UNSAFE

    def _apply(self, fn, args, scope):
        needs = self.summary[id(fn)]
        if needs is UNSAFE:
            return UNSAFE
        out = set()
        for binding in needs:
            if binding[0] == id(fn):  # one of fn's parameters: what the caller passes
                _, index = self.params[binding]
                got = self.eval(args[index], scope) if index < len(args) else NUMBER
                if got is UNSAFE:
                    return UNSAFE
                out |= got
            else:
                out.add(binding)
        return frozenset(out)

    def function_named(self, name: str) -> Node:
        (found,) = [f for f in self.functions if f.type == "FunctionDeclaration" and f.id.name == name]
        return found


def lint(source: str, external=EXTERNAL) -> list[str]:
    """The problems of one script (none: it passes)."""
    problems = [f"line {source.count(chr(10), 0, m.start()) + 1}: {m.group()!r} ends or breaks the inline "
                "<script> element" for m in HAZARDS.finditer(source)]
    try:
        script = Script(source, external)
    except esprima.Error as error:
        return problems + [f"syntax error: {error}"]
    return problems + script.problems


def style_problems(sheet: str) -> list[str]:
    """A style sheet's braces balanced (comments and strings aside), nothing that ends
    the inline ``<style>`` element."""
    problems = []
    if re.search(r"</style", sheet, re.I):
        problems.append("'</style' ends the inline <style> element")
    bare = re.sub(r"/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", "", sheet, flags=re.S)
    if "/*" in bare:
        problems.append("an unclosed comment")
    depth = 0
    for line_number, line in enumerate(bare.splitlines(), 1):
        for char in line:
            depth += {"{": 1, "}": -1}.get(char, 0)
            if depth < 0:
                problems.append(f"line {line_number}: a '}}' closes nothing")
                depth = 0
    if depth:
        problems.append(f"{depth} '{{' never closed")
    return problems


# ---------------------------------------------------------------------------------- the files
def test_the_files_are_package_data():
    found = {entry.name for entry in ASSETS.iterdir() if entry.is_file()}
    assert found == FILES
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    patterns = config["options.package_data"][_assets.__package__].replace(",", " ").split()
    for name in sorted(FILES):
        assert any(PurePosixPath(_assets.FOLDER, name).match(p) for p in patterns), name
    extras = config["options.extras_require"]["dev"].split()
    assert any(line.startswith("esprima") for line in extras)


def test_the_modules_inline_the_files_as_they_stand():
    assert _graph_page.SCRIPT == "\n" + text("graph.js") and _graph_page.STYLE == "\n" + text("graph.css")
    assert _graph_page.BODY == text("graph_body.html").removesuffix("\n") and not _graph_page.BODY.endswith("\n")
    assert _assets.JS == "\n" + text("maps.js") and _assets.CSS == "\n" + text("maps.css")
    assert _assets.asset("graph.js") is _assets.asset("graph.js")  # read once


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_files_are_plain_text_as_an_editor_keeps_it(name):
    raw = (ASSETS / name).read_bytes()
    assert raw.endswith(b"\n") and not raw.endswith(b"\n\n") and b"\r" not in raw and b"\t" not in raw
    assert not any(line != line.rstrip() for line in raw.decode("utf-8").splitlines())


# ---------------------------------------------------------------------------------- the scripts
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_parses_and_passes_the_lint(name):
    assert lint(text(name)) == []


@pytest.mark.skipif(NODE is None, reason="node is not installed (esprima parses the scripts without it)")
@pytest.mark.parametrize("name", SCRIPTS)
def test_node_checks_every_script(name):
    done = subprocess.run([NODE, "--check", str(ASSETS / name)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _planted(line: str, name: str = "graph.js") -> str:
    """The script with ``line`` added inside its function, after the escaping function (the
    maps view's: after its strict mode line)."""
    source = text(name)
    anchor = re.search(r"\n  function esc\(s\).*\n" if name == "graph.js" else r'\n  "use strict";\n', source)
    assert anchor is not None
    return source[:anchor.end()] + "  " + line + "\n" + source[anchor.end():]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_planted_syntax_error_fails(name, tmp_path):
    broken = _planted("var = 1;", name)
    with pytest.raises(esprima.Error):
        esprima.parseScript(broken)
    assert any(p.startswith("syntax error") for p in lint(broken))
    unbalanced = text(name).rstrip().removesuffix("})();") + "})(;\n"
    assert any(p.startswith("syntax error") for p in lint(unbalanced))
    if NODE is not None:
        path = tmp_path / name
        path.write_text(broken, encoding="utf-8")
        assert subprocess.run([NODE, "--check", str(path)], capture_output=True, timeout=60).returncode != 0


#: Lines that the lint must refuse, planted into the graph viewer's script.
REFUSED = {
    "eval": 'eval("1 + 1");',
    "window.eval": 'window.eval("1");',
    "new Function": 'var f = new Function("return 1");',
    "Function": 'var f = Function("return 1");',
    "document.write": 'document.write("<p>");',
    "document.writeln": "document.writeln(G.output);",
    "setTimeout string": 'setTimeout("render(true)", 10);',
    "end of script": 'var s = "</script><b>";',
    "html comment": 'var s = "<!-- x";',
    "data field": "card.innerHTML = G.output;",
    "data in constants": 'card.innerHTML = "<b>" + words[0] + "</b>";',
    "data appended": "card.innerHTML += nodes[0].label;",
    "outerHTML": "card.outerHTML = G.output;",
    "insertAdjacentHTML": 'card.insertAdjacentHTML("beforeend", G.output);',
    "unescaped helper": 'function bad(u) { return "<b>" + u.label + "</b>"; } card.innerHTML = bad(nodes[0]);',
    "helper passed data": 'function wrap(x) { return "<i>" + x + "</i>"; } card.innerHTML = wrap(G.output);',
    "variable in a closure": 'var bh = ""; nodes.forEach(function (u) { bh += u.id; }); side.innerHTML = bh;',
    "callback over data": "card.innerHTML = nodes.map(function (u) { return u.label; }).join(\"\");",
    "for-in key": 'for (var key in G) card.innerHTML = "<b>" + key + "</b>";',
    "recursion": ('function deep(k) { return k > 0 ? deep(k - 1) : G.output; } '
                  "card.innerHTML = deep(3);"),
    "unchecked parameter": "function put(x) { card.innerHTML = x; }",
    "string ops keep data": "card.innerHTML = G.output.trim().toLowerCase();",
}

#: Lines that it must let through: escaped text, constants, numbers, what flows from them.
ALLOWED = {
    "escaped": 'card.innerHTML = "<b>" + esc(G.output) + "</b>";',
    "helper passed escaped text": 'function wrap(x) { return "<i>" + x + "</i>"; } card.innerHTML = wrap(esc(G.output));',
    "numbers": 'card.innerHTML = "<b>" + fmt(G.value) + "</b> " + nodes.length + " " + (G.value * 2).toFixed(1);',
    "constants in a callback": '["a", "b"].forEach(function (k) { card.innerHTML = "<i>" + k + "</i>"; });',
    "escaped in a closure": 'var ok = ""; nodes.forEach(function (u) { ok += esc(u.id); }); side.innerHTML = ok;',
    "escaped map": 'card.innerHTML = nodes.map(function (u) { return esc(u.label); }).join("<br>");',
    "colour": 'card.innerHTML = "<i style=\\"color:" + ffbColour.css([1, 2, 3]) + "\\"></i>";',
    "timer with a function": "setTimeout(function () { render(true); }, 10);",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_lint_refuses(case):
    problems = lint(_planted(REFUSED[case]))
    assert len(problems) == 1, problems


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_the_lint_allows(case):
    assert lint(_planted(ALLOWED[case])) == []


#: Escapes in today's panels (details, the edge lists, the side list, the hover card); each
#: dropped, the lint must object.
ESCAPED = ['"</h3><code>" + esc(u.id)', "'<li data-go=\"' + esc(e[key])", "esc(groups[id].name)",
           '"<b>" + esc(words[p])', "esc(k.key_position)", "esc(o ? place(o) : e[key])"]


@pytest.mark.parametrize("escaped", ESCAPED)
def test_the_lint_refuses_an_escape_dropped_from_todays_panels(escaped):
    source = text("graph.js")
    assert source.count(escaped) == 1, escaped
    bare = re.sub(r"esc\((.*)\)$", r"(\1)", escaped)
    assert bare != escaped
    problems = lint(source.replace(escaped, bare))
    assert problems and all("not escaped" in p for p in problems), problems


def test_the_lint_refuses_a_weaker_esc():
    source = text("graph.js")
    weaker = source.replace("/[&<>\"']/g", "/[&<>]/g", 1)
    assert weaker != source
    (problem,) = lint(weaker)
    assert "esc is not the escaping function" in problem


def test_the_html_in_the_scripts_is_composed_in_functions_the_lint_follows():
    """The analysis is no blanket pass: today's panels are built by helpers it had to follow."""
    script = Script(text("graph.js"))
    for name in ("details", "cardHtml", "help", "top3", "signed", "fmt"):
        assert script.summary[id(script.function_named(name))] == NUMBER, name
    for name, needs in (("row", {"name", "value"}), ("list", {"key", "name"})):  # safe with safe arguments
        assert {b[1] for b in script.summary[id(script.function_named(name))]} == needs, name
    assert script.summary[id(script.function_named("label"))] is UNSAFE  # a token's text, unescaped
    assert script.summary[id(script.function_named("place"))] is UNSAFE


def test_the_colour_scales_css_is_safe_as_the_lint_assumes():
    script = Script(COLOUR_JS, external=frozenset())
    assert script.problems == []
    assert script.summary[id(script.function_named("css"))] == NUMBER
    assert re.search(r"\bcss: css\b", COLOUR_JS)


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_esc_escapes_every_markup_character_in_node():
    script = Script(text("graph.js"))
    fn = script.function_named("esc")
    code = (script.source[fn.range[0]:fn.range[1]]
            + "\nprocess.stdout.write(esc(\"<img src=x onerror='a(1)'> & \\\"q\\\"\") + \"|\" + esc(12));")
    done = subprocess.run([NODE, "-e", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "&#60;img src=x onerror=&#39;a(1)&#39;&#62; &#38; &#34;q&#34;|12"


# ---------------------------------------------------------------------------------- the rest
@pytest.mark.parametrize("name", SHEETS)
def test_every_style_sheet_is_balanced(name):
    assert style_problems(text(name)) == []


def test_the_style_check_refuses_what_it_should():
    assert style_problems("a { color: red; } }") == ["line 1: a '}' closes nothing"]
    assert style_problems("a { color: red;\nb { x: y; }") == ["1 '{' never closed"]
    assert style_problems('a::after { content: "}"; } /* { */') == []
    assert style_problems("a { } /* open") == ["an unclosed comment"]
    assert style_problems("a { } </style><script>") == ["'</style' ends the inline <style> element"]


def test_the_body_fragment_holds_no_script():
    body = text("graph_body.html")
    assert not re.search(r"<script|\son\w+\s*=|javascript:", body, re.I)
    assert body.count("<div") == body.count("</div>")
