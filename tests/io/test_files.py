"""Every file the library writes goes through the atomic writer of :mod:`captum_ffb.io.files`:
no module opens a file for writing, or writes a path, by itself (such a write would follow a
symbolic link at the destination out of the output folder and leave half-written files)."""

from __future__ import annotations

import ast
from pathlib import Path

import captum_ffb

PACKAGE = Path(captum_ffb.__file__).parent
#: The modules allowed to open files for writing: the atomic writer itself, and the AttnLRP
#: worker, which runs in the peer's own environment without captum_ffb (it replaces its one
#: output file atomically with a writer of its own).
WRITERS = {PACKAGE / "outputs.py", PACKAGE / "evaluation" / "peers" / "attnlrp_worker.py"}
#: Methods that write a path directly.
PATH_WRITES = {"write_text", "write_bytes", "touch", "symlink_to", "hardlink_to"}
#: Writers that take a file object: fine on a handle or an in-memory buffer, not on a path.
HANDLE_WRITERS = {"savefig", "save", "savez", "savez_compressed", "to_csv", "to_json", "to_parquet"}
HANDLES = {"handle", "h", "buffer", "f", "file", "stream"}


def _mode(call: ast.Call, position: int) -> str | None:
    """The ``mode`` argument of an ``open`` call, when it is a literal."""
    node = call.args[position] if len(call.args) > position else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_store(receiver: ast.expr) -> bool:
    """A shard store's or an attribution graph's ``save`` (both write through the atomic
    writer: ``jobs``' store, ``attr.graph_files.save_graph``), not ``numpy.save``."""
    return isinstance(receiver, ast.Name) and receiver.id in ("store", "graph")


def raw_writes(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each write in ``source`` that does not go through the atomic writer."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        if isinstance(function, ast.Name) and function.id == "open":
            mode = _mode(node, 1)
            if mode is not None and any(c in mode for c in "wax+"):
                found.append((node.lineno, f"open(..., {mode!r})"))
        elif isinstance(function, ast.Attribute):
            if function.attr in PATH_WRITES:
                found.append((node.lineno, f".{function.attr}()"))
            elif function.attr == "open":
                mode = _mode(node, 0)
                if mode is not None and any(c in mode for c in "wax+"):
                    found.append((node.lineno, f".open({mode!r})"))
            elif function.attr in HANDLE_WRITERS and node.args and not _is_store(function.value):
                first = node.args[0]
                name = first.id if isinstance(first, ast.Name) else None
                if name not in HANDLES and not (isinstance(first, ast.Constant) and first.value is None):
                    found.append((node.lineno, f".{function.attr}({ast.unparse(first)})"))
    return found


def test_every_writer_goes_through_the_atomic_writer():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in WRITERS:
            continue
        for line, what in raw_writes(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {what}")
    assert not offenders, "writes that bypass captum_ffb.io.files:\n" + "\n".join(offenders)


def test_the_scan_finds_raw_writes():
    source = (
        "from pathlib import Path\n"
        "Path('a').write_text('x')\n"
        "open('b', 'w').write('x')\n"
        "Path('c').open('wb')\n"
        "figure.savefig(out / 'd.png')\n"
        "figure.savefig(buffer, format='png')\n"
        "open('e').read()\n"
    )
    assert sorted(line for line, _ in raw_writes(source)) == [2, 3, 4, 5]
