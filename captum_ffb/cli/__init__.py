"""The ``captum-ffb`` command line.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``run=callable(args) -> int``.
The options several sub-commands take (``--model``, ``--out``, ``--device``, ``--dtype``,
``--quiet``, ``--format``, ``--scopes``) are declared once, in ``_options``. User mistakes
raise :class:`UsageError` (or the library's ``ValueError``s) and end with one line and exit
code 2; any other exception is a bug and keeps its traceback. Deprecated spellings of options
still work and print one warning line each (not with ``--quiet``).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from captum_ffb.cli._common import UsageError
from captum_ffb.cli._options import deprecation_warnings

__all__ = ["USER_ERRORS", "UsageError", "build_parser", "main"]

#: Errors shown to users as one line (no traceback); ``UsageError`` is a ``ValueError``.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)


class _ParseError(Exception):
    """A command line argparse refused (already reported in one line)."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr, naming the command's help,
    instead of the usage block and the message."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        print(f"captum-ffb: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise _ParseError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="captum-ffb",
        description="Exact token-to-token attribution maps for every Transformer layer.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    return parser


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: Any = None, line: str | None = None) -> None:
    """A warning as one line on stderr (``captum-ffb: warning: ...``), without the source line."""
    text = str(message).strip().splitlines()[0] if str(message).strip() else category.__name__
    print(f"captum-ffb: warning: {text}", file=sys.stderr if file is None else file)


def as_flags(message: str, flags: dict[str, str]) -> str:
    """A library message in the command line's words: each parameter the command maps to a
    flag (``class_index`` → ``--class``), where the message names it (at its start, or before
    a value, ``=`` or ``:``), becomes the flag."""
    for name, flag in flags.items():
        message = re.sub(rf"(?<![\w-]){re.escape(name)}(?=( \S|=|:|$))" if "_" in name
                         else rf"^{re.escape(name)}(?= )|(?<=leave out ){re.escape(name)}\b", flag, message)
    return message


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``captum-ffb`` console script."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _ParseError:
        return 2
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    if not getattr(args, "quiet", False):
        for message in deprecation_warnings(args):
            print(f"captum-ffb: warning: {message}", file=sys.stderr)
    try:
        with warnings.catch_warnings():
            flags = getattr(args, "flags", {})
            warnings.showwarning = lambda message, *rest, **extra: _one_line_warning(  # in the CLI's words
                as_flags(str(message), flags), *rest, **extra)
            if getattr(args, "quiet", False):
                warnings.simplefilter("ignore")
            return int(args.run(args) or 0)
    except USER_ERRORS as error:
        print(f"captum-ffb: error: {as_flags(str(error), getattr(args, 'flags', {}))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("captum-ffb: interrupted", file=sys.stderr)
        return 130
