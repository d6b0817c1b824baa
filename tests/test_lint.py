"""The code is ruff clean: CI runs only the README's test line, so lint is a test."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the [dev] extra)")
    done = subprocess.run([ruff, "check", "captum_ffb", "tests", "benchmarks", "results"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _cited_files(text: str) -> set[str]:
    """The Markdown files a text sends its reader to: a path (``docs/graphs.md``) or a note's
    capitalised name (``METHOD.md``); a file a command writes (``compare.md``) is neither."""
    return set(re.findall(r"(?<![\w/.-])((?:[\w-]+/)+[\w-]+\.md|[A-Z][A-Z0-9_]+\.md)\b", text))


def test_the_code_and_docs_cite_only_files_in_the_repository():
    """A docstring or a page that sends the reader to a file must name one the repository has
    (the design notes kept outside it are not)."""
    missing = []
    sources = [*(ROOT / "captum_ffb").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    for source in sources:
        for name in _cited_files(source.read_text(encoding="utf-8")):
            here = [ROOT / name, source.parent / name, ROOT / "docs" / name]
            if not any(path.exists() for path in here) and not list(ROOT.glob(f"**/{name}")):
                missing.append(f"{source.relative_to(ROOT)}: {name}")
    assert not missing, "\n".join(missing)


def test_a_citation_of_a_missing_file_is_caught():
    assert _cited_files('(METHOD.md, "Whole model"); see docs/graphs.md; writes compare.md') == {
        "METHOD.md", "docs/graphs.md"}


#: The longest a function of the package may be (``def`` to its last line).
MAX_FUNCTION_LINES = 80


def long_functions(source: str, name: str) -> list[str]:
    """Every function of ``source`` longer than :data:`MAX_FUNCTION_LINES`."""
    import ast

    return [f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_is_over_80_lines():
    found = [line for path in sorted((ROOT / "captum_ffb").rglob("*.py"))
             for line in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not found, "\n".join(found)


def test_a_long_function_is_caught():
    body = "\n".join(f"    x{k} = {k}" for k in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n", "m.py") == [f"m.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions("def g():\n    return 1\n", "m.py") == []


def test_the_slowest_files_scheduled_first_are_test_files_and_go_first(pytestconfig):
    """``conftest.SLOWEST_FILES`` names files that exist (a renamed one would silently lose its
    place), and the collection starts with them in that order."""
    from tests.conftest import SLOWEST_FILES, pytest_collection_modifyitems

    assert all((ROOT / name).is_file() and Path(name).name.startswith("test_") for name in SLOWEST_FILES)

    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    items = [Item(n) for n in ("tests/a.py::x", f"{SLOWEST_FILES[1]}::y", "tests/b.py::z", f"{SLOWEST_FILES[0]}::w",
                               f"{SLOWEST_FILES[1]}::v")]
    pytest_collection_modifyitems(pytestconfig, items)
    assert [i.nodeid for i in items] == [f"{SLOWEST_FILES[0]}::w", f"{SLOWEST_FILES[1]}::y", f"{SLOWEST_FILES[1]}::v",
                                         "tests/a.py::x", "tests/b.py::z"]
