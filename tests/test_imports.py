"""No import cycles between the package's modules."""

from __future__ import annotations

import ast
from pathlib import Path

import captum_ffb


def _imports(path: Path, package: Path) -> set[str]:
    """The captum_ffb modules a file imports at module level (not inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("captum_ffb"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("captum_ffb"))
    return found


def test_no_import_cycles_between_modules():
    package = Path(captum_ffb.__file__).parent
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {
        name: {m for m in _imports(path, package) if m in modules and m != name}
        for name, path in modules.items()
    }
    # a package's __init__ re-exports its own modules: edges into a package's own children
    # are part of defining it, not a cycle
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " → ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
