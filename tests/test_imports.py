"""The package's floors: every import of the package's own modules, at module level or inside a
function, points down a floor (DESIGN's order, written out here), never sideways to a sibling
room or up; and no module imports itself back through others."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import captum_ffb

#: The floors, bottom up: a room (a top-level module or package of ``captum_ffb``) imports only
#: rooms of lower floors.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("versions", "convert", "_private", "_deprecation", "vocabulary"),  # tested versions; converters;
                                              # private names; old calls kept working; the names
    # pages (the page skeleton and colour scale) is here, not in viz, for analysis and evaluation write pages too
    ("architectures", "decomposition", "outputs", "pages"),  # facts, no maths; files and pages out
    ("rules",),                               # what each component does to a decomposition
    ("engine",),                              # capture, blocks, chains, routes
    ("models", "readouts", "results"),        # loading; what is explained; the explained result
    ("attr",),                                # the Captum attributions
    ("text", "corpus"),                       # one text's maps; reading texts and datasets
    ("jobs", "stats"),                        # where batches run; numbers over maps
    ("analysis", "evaluation", "baselines"),  # the studies
    ("explain", "context"),                   # one text explained; a long context's groups
    ("viz",),                                 # pictures and pages
    ("integrations", "environment"),          # other tools; this environment's report
    ("cli", "app"),                           # entry points
)
#: Imports that break the order on purpose, each with its reason.
ALLOWED = {
    ("app", "cli"): "`python -m captum_ffb.app` is the command line's `app` sub-command",
    ("text", "corpus"): "read_rows and read_texts moved to corpus in 0.3; text still hands them "
                        "out (a module __getattr__, reached only through those two names)",
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
        "captum_ffb.attr.sideways": "class A:\n    def m(self):\n        import captum_ffb.readouts\n",
        "captum_ffb.models.sideways": "def f():\n    from captum_ffb import readouts\n",
    }
    found = violations(planted)
    assert found == [
        "captum_ffb.models.sideways:2 (inside a function) imports captum_ffb.readouts: sideways "
        "between siblings models and readouts",
        "captum_ffb.rules.planted:3 (inside a function) imports captum_ffb.cli: up from floor 2 "
        "(rules) to floor 12 (cli)",
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
