"""The package's floors: every import of the package's own modules, at module level or inside a
function, points down a floor (the order written out here), never sideways to a sibling
room or up; and no module imports itself back through others."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import captum_ffb

#: The floors, bottom up: a room (a top-level module or package of ``captum_ffb``) imports only
#: rooms of lower floors.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("_private", "_deprecation", "core", "convert"),  # private names; old calls kept working; the
                                              # vocabulary, versions, decompositions; converters
    ("architectures", "io"),                  # facts, no maths; files and pages out
    ("rules",),                               # what each component does to a decomposition
    ("engine",),                              # the machinery: passes, capture, linearise, blocks, chains
    ("explained",),                           # the model loaded; what is explained; the result
    ("patching", "components"),               # features: patching and its estimators; component tables
    ("graph",),                               # the attribution graph (its edges' patching estimates)
    ("attr",),                                # the Captum attributions: the doors
    ("texts",),                               # one text's maps; reading texts; numbers over maps
    ("jobs",),                                # where batches run
    ("analysis", "evaluation", "baselines"),  # the studies
    ("explain", "long_context"),              # one text explained; a long context's groups
    ("viz",),                                 # pictures and pages
    ("integrations", "environment"),          # other tools; this environment's report
    ("cli", "app"),                           # entry points
)
#: Imports that break the order on purpose, each with its reason.
ALLOWED = {
    ("app", "cli"): "`python -m captum_ffb.app` is the command line's `app` sub-command",
}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _floor(room: str) -> int | None:
    return next((k for k, rooms in enumerate(FLOORS) if room in rooms), None)


def imports_of(source: str, module: str, is_package: bool = False) -> Iterator[tuple[str, int, bool]]:
    """``(imported module, line, inside a function)`` for every import of ``captum_ffb`` in
    ``source``, at any depth (functions, methods, conditionals)."""
    tree = ast.parse(source)
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(sub) for sub in ast.walk(node) if sub is not node)
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base == "captum_ffb":
                targets = [f"captum_ffb.{alias.name}" for alias in node.names]
            elif base.startswith("captum_ffb."):
                targets = [base]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names if alias.name.startswith("captum_ffb.")]
        for target in targets:
            yield target, node.lineno, id(node) in inside


def violations(sources: Mapping[str, str], packages: frozenset[str] = frozenset()) -> list[str]:
    """Every import of ``sources`` (module name → source) that goes up, sideways, or into a
    room no floor names, but those in :data:`ALLOWED`."""
    found = []
    for module, source in sorted(sources.items()):
        here = _room(module)
        if not here:
            continue  # the package's front door re-exports every floor
        for target, line, nested in imports_of(source, module, module in packages):
            there = _room(target)
            if not there or there == here or (here, there) in ALLOWED:
                continue
            where = f"{module}:{line}{' (inside a function)' if nested else ''} imports {target}"
            a, b = _floor(here), _floor(there)
            if a is None or b is None:
                found.append(f"{where}: {here if a is None else there!r} is on no floor")
            elif b > a:
                found.append(f"{where}: up from floor {a} ({here}) to floor {b} ({there})")
            elif b == a:
                found.append(f"{where}: sideways between siblings {here} and {there}")
    return found


def _package_sources() -> tuple[dict[str, str], frozenset[str]]:
    root = Path(captum_ffb.__file__).parent
    sources, packages = {}, set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[name] = path.read_text(encoding="utf-8")
        if parts[-1] == "__init__":
            packages.add(name)
    return sources, frozenset(packages)


def test_every_import_points_down_a_floor():
    sources, packages = _package_sources()
    assert not (found := violations(sources, packages)), "\n".join(found)


def test_every_room_is_on_a_floor():
    sources, _ = _package_sources()
    rooms = {_room(name) for name in sources} - {""}
    assert rooms <= {room for floor in FLOORS for room in floor}, rooms - {r for f in FLOORS for r in f}


def test_a_planted_upward_import_inside_a_function_is_caught():
    planted = {
        "captum_ffb.rules.planted": "def rule():\n    if True:\n        from captum_ffb.cli import main\n",
        "captum_ffb.viz.fine": "from captum_ffb.attr import NormDecomposition\n",
        "captum_ffb.attr.fine": "class A:\n    def m(self):\n        import captum_ffb.explained.readouts\n",
        "captum_ffb.patching.sideways": "def f():\n    from captum_ffb import components\n",
    }
    found = violations(planted)
    assert found == [
        "captum_ffb.patching.sideways:2 (inside a function) imports captum_ffb.components: sideways "
        "between siblings patching and components",
        "captum_ffb.rules.planted:3 (inside a function) imports captum_ffb.cli: up from floor 2 "
        "(rules) to floor 14 (cli)",
    ]


def test_no_import_cycles_between_modules():
    """Every import counts, function-level ones too; a package's edges into its own
    children are part of defining it, not a cycle."""
    sources, packages = _package_sources()
    graph = {name: {t for t, _, _ in imports_of(src, name, name in packages) if t in sources and t != name}
             for name, src in sources.items()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " → ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


#: Modules made to hand out private names: upstream libraries' private names, old calls kept working.
MADE_FOR_IT = {"captum_ffb._private", "captum_ffb._deprecation"}


def private_imports(sources: Mapping[str, str], packages: frozenset[str] = frozenset()) -> list[str]:
    """Every import of another module's underscore name, and every import of a private module
    (``captum_ffb.a._m``) from outside its package ``captum_ffb.a``, but of :data:`MADE_FOR_IT`."""
    found = []
    for module, source in sorted(sources.items()):
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target, _line, _ in imports_of(ast.unparse(node), module, module in packages):
                if target in MADE_FOR_IT:
                    continue
                parts = target.split(".")
                private = [k for k, part in enumerate(parts) if part.startswith("_") and k > 0]
                owner = ".".join(parts[:private[0]]) if private else ""
                if private and module != owner and not module.startswith(owner + "."):
                    found.append(f"{module}:{node.lineno} imports the private module {target}")
                if isinstance(node, ast.ImportFrom) and target != module:
                    names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                    if names and f"{target}.{names[0]}" not in sources:  # a private module is not a name
                        found.append(f"{module}:{node.lineno} imports {', '.join(names)} from {target}")
    return found


def test_no_module_imports_another_modules_private_names():
    sources, packages = _package_sources()
    assert not (found := private_imports(sources, packages)), "\n".join(found)


def test_a_planted_private_import_is_caught():
    planted = {
        "captum_ffb.graph.build": "from captum_ffb.engine.tape import _seq\n",
        "captum_ffb.cli.maps": "from captum_ffb.viz._common import escape\n",
        "captum_ffb.viz.graph": "from captum_ffb.viz._common import escape\n",  # inside its package: fine
        "captum_ffb.attr.door": "from captum_ffb._private import saved_alpha\n",
    }
    assert private_imports(planted) == [
        "captum_ffb.cli.maps:1 imports the private module captum_ffb.viz._common",
        "captum_ffb.graph.build:1 imports _seq from captum_ffb.engine.tape",
    ]
