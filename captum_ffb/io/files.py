r"""Output folders and files: one check before any work starts, and atomic writes.

:func:`check_out_dir` tells at once whether an output folder can be used (it is a folder or
can be created, and files can be written in it), so that a command fails in one line before
its model loads rather than with an ``OSError`` after the computation.

Every output file is written through :func:`atomic_open` (or :func:`write_text`,
:func:`write_json`, :func:`save_figure`): the content goes to a temporary file in the same
folder, which then replaces the destination with :func:`os.replace`. A reader never sees a
half-written file, and a symbolic link at the destination is replaced, not followed, so the
file it pointed to stays untouched. A destination that is not a regular file (a device such
as ``/dev/null``, a pipe, a folder) is refused (:func:`check_destination`): replacing it would
destroy it. Temporary names are short (``.captum_ffb-tmp-<pid>-<hex>.tmp``), and what a killed
process left behind is removed by the next writer in that folder (:func:`remove_leftovers`).

A command's files are written as one set (:func:`output_set`): into a hidden folder inside
the output folder, moved into it when all of them are written. An error or an interrupt
leaves the folder's earlier set whole, and nothing of the new one.

JSON is written with non-finite floats (``NaN``, ``±inf``) as ``null`` and
``allow_nan=False``, so every file is valid JSON.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "OutputError",
    "OutputSet",
    "atomic_open",
    "check_destination",
    "check_out_dir",
    "check_out_files",
    "finite",
    "output_set",
    "remove_leftovers",
    "save_figure",
    "to_json",
    "write_json",
    "write_text",
]


class OutputError(ValueError):
    """An output folder that cannot be used, shown to CLI users as one line (exit code 2)."""


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def check_out_dir(path: str | os.PathLike, option: str = "--out") -> Path:
    r"""Check that ``path`` can take output files, before any work starts; nothing is created.

    The folder must exist and be writable, or be creatable: its nearest existing ancestor is
    a writable folder (not a file). Writability is tried by creating and removing a temporary
    entry, which also holds where permission bits say little (root, read-only mounts).

    Args:
        path (str or PathLike): the output folder.
        option (str): how the folder is named in messages (``"--out"``).

    Returns:
        Path: ``path``. Raises :class:`OutputError` (a ``ValueError``) with a one-line message.
    """
    folder = Path(path)
    try:
        if folder.is_symlink() and not folder.exists():
            raise OutputError(f"{option} {folder} is a broken symbolic link")
        if folder.exists():
            if not folder.is_dir():
                raise OutputError(f"{option} {folder} exists and is not a folder")
            try:
                _try_writing(folder, folder=False)
            except OSError as error:
                raise OutputError(f"{option} {folder} is not writable ({_reason(error)})") from None
            return folder
        ancestor = next((p for p in folder.absolute().parents if p.exists()), Path(folder.anchor))
        if not ancestor.is_dir():
            raise OutputError(f"{option} {folder} cannot be created: {ancestor} is a file, not a folder")
        try:
            _try_writing(ancestor, folder=True)
        except OSError as error:
            raise OutputError(f"{option} {folder} cannot be created: {ancestor} is not writable "
                              f"({_reason(error)})") from None
    except OSError as error:  # a folder on the way cannot be searched, for one
        raise OutputError(f"{option} {folder} cannot be used ({_reason(error)})") from None
    return folder


#: Temporary files and folders of this library's writers: ``.captum_ffb-<kind>-<pid>-<hex>``
#: (short: a destination's name of up to 255 characters still fits beside them).
_OWN = re.compile(r"\.captum_ffb-(tmp|writing|check)-(\d+)-[0-9a-f]{8}(\.tmp)?")


def _own_name(kind: str) -> str:
    return f".captum_ffb-{kind}-{os.getpid()}-{secrets.token_hex(4)}" + (".tmp" if kind == "tmp" else "")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (on this machine; another's is taken as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True
    return True


def remove_leftovers(folder: str | os.PathLike) -> list[Path]:
    r"""Remove what this library's writers left in ``folder`` when their process was killed
    (temporary files, staging folders: ``.captum_ffb-<kind>-<pid>-<hex>`` of a process that
    no longer runs); returns what was removed. Another running process's are left alone."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        found = _OWN.fullmatch(entry.name)
        if found is None or _alive(int(found.group(2))):
            continue
        path = Path(entry.path)
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
    return removed


def check_destination(path: str | os.PathLike) -> Path:
    """``path`` as a file to write: refused (an :class:`OutputError`) where something other than
    a regular file or a symbolic link is there (a folder, a device such as ``/dev/null``, a
    pipe, a socket), which replacing it would destroy."""
    target = Path(path)
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError as error:
        raise OutputError(f"{target} cannot be written ({_reason(error)})") from None
    if stat.S_ISDIR(mode):
        raise OutputError(f"{target} is a folder: give a file name")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        kind = "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
            "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise OutputError(f"{target} is {kind}, not a regular file: writing would replace it; give a file name")
    return target


def _try_writing(where: Path, folder: bool) -> None:
    """Create and remove a file (or a folder) in ``where``: an ``OSError`` where it cannot."""
    probe = where / _own_name("check")
    if folder:
        probe.mkdir()
        probe.rmdir()
    else:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)


def check_out_files(folder: str | os.PathLike, names: list[str], option: str = "--out") -> None:
    """Check, before any work starts, that the files ``names`` can be written into ``folder``:
    none of them is a folder or another thing that is not a regular file there (an
    :class:`OutputError` in one line)."""
    for name in names:
        path = Path(folder) / name
        if path.is_dir() and not path.is_symlink():
            raise OutputError(f"{option} {folder}: {name} is a folder there, in the way of the file of that name; "
                              "move it or use another --out")
        try:
            check_destination(path)
        except OutputError as error:
            raise OutputError(f"{option} {folder}: {name} {str(error).removeprefix(str(path) + ' ')}") from None


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8",
                newline: str | None = None, fsync: bool = False) -> Iterator[IO[Any]]:
    r"""Open a temporary file beside ``path`` for writing; it replaces ``path`` when the block
    ends without an error, and is removed otherwise.

    Args:
        path (str or PathLike): the destination (a symbolic link there is replaced, not
                    followed).
        mode (str): ``"w"`` (text) or ``"wb"`` (bytes).
        encoding (str, optional): the text encoding (ignored for ``"wb"``).
        newline (str, optional): as for ``open()``.
        fsync (bool): flush the file to disk before the rename.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes with mode 'w' or 'wb', not {mode!r}")
    target = Path(path)
    check_destination(target)
    remove_leftovers(target.parent)
    tmp = target.with_name(_own_name("tmp"))
    # 0o666 as open() uses, so that the umask sets the permissions
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        binary = mode == "wb"
        with os.fdopen(fd, mode, encoding=None if binary else encoding,
                       newline=None if binary else newline) as handle:
            yield handle
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class OutputSet:
    """The files of one command being written (see :func:`output_set`).

    Attributes:
        folder (Path): the output folder the files move into.
        staging (Path): the hidden folder they are written into first.
    """

    def __init__(self, folder: Path, staging: Path) -> None:
        self.folder = folder
        self.staging = staging

    def path(self, name: str) -> Path:
        """Where to write the file ``name`` (in the staging folder)."""
        return self.staging / name

    def final(self, paths: list[Path]) -> list[Path]:
        """Where written files are once the set is in place."""
        return [self.folder / Path(p).name for p in paths]


@contextlib.contextmanager
def output_set(folder: str | os.PathLike, option: str = "--out") -> Iterator[OutputSet]:
    r"""Write a command's files as one set: into a hidden folder inside ``folder``, moved into
    ``folder`` when the block ends without an error. An error or an interrupt (``Ctrl+C``)
    removes the hidden folder and leaves ``folder``'s files as they were; a file that cannot be
    written (a full disk) or moved in (a folder in the way) is an :class:`OutputError` in one
    line, with nothing left behind.

    Args:
        folder (str or PathLike): the output folder (created if needed).
        option (str): how it is named in messages.

    Yields:
        OutputSet: ``.path(name)`` is where to write each file.
    """
    target = Path(folder)
    try:
        target.mkdir(parents=True, exist_ok=True)
        remove_leftovers(target)
        staging = target / _own_name("writing")
        staging.mkdir()
    except OSError as error:
        raise OutputError(f"{option} {target} cannot be written ({_reason(error)})") from None
    try:
        try:
            yield OutputSet(target, staging)
        except OSError as error:
            raise OutputError(f"{option} {target}: a file could not be written ({_reason(error)})") from None
        written = sorted(staging.iterdir())
        check_out_files(target, [p.name for p in written], option)
        try:
            for path in written:
                os.replace(path, target / path.name)
        except OSError as error:
            raise OutputError(f"{option} {target}: a file could not be moved in ({_reason(error)})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_open`); returns the path."""
    with atomic_open(path, "w", encoding=encoding) as handle:
        handle.write(text)
    return Path(path)


def finite(value: Any) -> Any:
    r"""``value`` with every non-finite float (``NaN``, ``±inf``) replaced by ``None``, NumPy
    scalars and arrays as Python numbers and lists, tuples as lists (for JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    tolist = getattr(value, "tolist", None)  # NumPy scalars and arrays
    if callable(tolist) and type(value).__module__ == "numpy":
        return finite(tolist())
    return value


def to_json(data: Any, default: Callable[[Any], Any] | None = None, **kwargs: Any) -> str:
    r"""``json.dumps`` that writes non-finite floats as ``null`` (see :func:`finite`) and
    never ``NaN`` (``allow_nan=False``).

    Args:
        data: what to write.
        default (callable, optional): as for :func:`json.dumps`; its results are cleaned too.
        **kwargs: passed to :func:`json.dumps` (``indent``, ``ensure_ascii``, ...).
    """
    clean_default = None if default is None else (lambda o: finite(default(o)))
    try:  # most data has nothing to clean: skip the walk through it
        return json.dumps(data, allow_nan=False, default=clean_default, **kwargs)
    except ValueError:
        return json.dumps(finite(data), allow_nan=False, default=clean_default, **kwargs)


def write_json(path: str | os.PathLike, data: Any, default: Callable[[Any], Any] | None = None,
               **kwargs: Any) -> Path:
    """Write ``data`` as JSON (:func:`to_json`) to ``path`` atomically; returns the path."""
    return write_text(path, to_json(data, default=default, **kwargs))


def save_figure(figure: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    r"""``figure.savefig`` to ``path`` atomically, in the format of the file's suffix.

    Args:
        figure: a Matplotlib figure.
        path (str or PathLike): the file (``.png``, ``.pdf``, ``.svg``, ...).
        **kwargs: passed to ``savefig`` (``dpi``, ``metadata``, ...).
    """
    target = Path(path)
    kwargs.setdefault("format", target.suffix.lstrip(".").lower() or "png")
    with atomic_open(target, "wb") as handle:
        figure.savefig(handle, **kwargs)
    return target
