"""The options the sub-commands share, declared once.

Every sub-command takes the shared options that make sense for it through
:func:`add_shared_options`, so that ``--model``, ``--out``, ``--device``, ``--dtype``,
``--quiet``, ``--format`` and ``--scopes`` have one spelling, one help text and one check
everywhere: :func:`parse_formats`, :func:`parse_scopes` and :func:`model_placement` (the
device and dtype, checked before any weights load).

Spellings that were renamed stay accepted for one release, hidden from ``--help``, through
:func:`add_deprecated_alias`: they set the new option's value and leave a note that
:func:`captum_ffb.cli.main` prints as one warning line on stderr (``--quiet`` silences it).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from captum_ffb.cli._common import UsageError, resolve_device

__all__ = [
    "DEPRECATED", "DTYPES", "FORMATS", "SHARED", "ModelPlacement", "add_deprecated_alias",
    "add_backend_options", "add_shared_options", "backend_options", "default_out", "deprecation_warnings", "model_placement",
    "parse_formats", "parse_layers", "parse_scopes",
]

#: What ``--format`` chooses from (the commands that write pictures and data of one text).
FORMATS = ("png", "html", "json")
#: What ``--dtype`` chooses from (:data:`captum_ffb.explained.models.DTYPES`; not imported here, so that
#: building the parser does not import torch).
DTYPES = ("float32", "bfloat16", "float16", "float64")
#: The namespace attribute where deprecated spellings leave their warnings.
DEPRECATED = "_deprecated"


def default_out(command: str) -> str:
    """The default output folder of a command: ``captum_ffb_<command>``."""
    return f"captum_ffb_{command}"


#: The shared options, in the order ``--help`` lists them: flags and ``add_argument``'s
#: keywords (``--out``'s default is the command's :func:`default_out`).
SHARED: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "model": (("--model",), dict(
        default=None, metavar="NAME_OR_DIR",
        help="a model folder (config.json and a tokenizer, or a .gguf file), a Hugging Face id, "
        "or all-MiniLM-L6-v2 (the bundled default, offline)")),
    "scopes": (("--scopes",), dict(
        nargs="+", default=None, metavar="SCOPE",
        help="the decomposition's scopes, space and/or comma separated (Atb AtbFf, or "
        "Atb,AtbFf); all scopes of the model's chain by default")),
    "out": (("--out",), dict(
        metavar="DIR",
        help="output folder, created if needed (default ./captum_ffb_<command>, e.g. "
        "./captum_ffb_maps)")),
    "format": (("--format",), dict(
        default=",".join(FORMATS), metavar="LIST",
        help=f"comma list of {', '.join(FORMATS)} (default: all three)")),
    "device": (("--device",), dict(
        default="cpu",
        help="where the model runs: cpu (default), cuda, cuda:1, mps, ...; checked before the "
        "weights load")),
    "dtype": (("--dtype",), dict(
        default="float32", choices=DTYPES,
        help="the dtype the model's weights load in: float32 (default), bfloat16, float16 or "
        "float64; the decomposition itself computes in float32")),
    "quiet": (("--quiet",), dict(
        action="store_true",
        help="print nothing but errors: no progress bars, warnings, summaries or lists of "
        "files")),
}


def add_shared_options(parser: argparse.ArgumentParser, command: str, *names: str) -> None:
    """Add the shared options ``names`` (keys of :data:`SHARED`) to a command's parser, in
    one group of its ``--help``, with their one help text."""
    unknown = [n for n in names if n not in SHARED]
    if unknown:
        raise KeyError(f"no shared option {unknown[0]!r}; there are {', '.join(SHARED)}")
    group = parser.add_argument_group("shared options", "the same in every captum-ffb command")
    for name in SHARED:
        if name in names:
            flags, keywords = SHARED[name]
            if name == "out":
                keywords = {**keywords, "default": default_out(command)}
            group.add_argument(*flags, **keywords)


class _DeprecatedAlias(argparse.Action):
    """An old spelling: sets the new option's value (converted) and leaves a warning."""

    def __init__(self, option_strings: list[str], dest: str, *, warning: str,
                 convert: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.warning = warning
        self.convert = convert

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        value = self.const if self.nargs == 0 else values
        setattr(namespace, self.dest, self.convert(value) if self.convert else value)
        notes = list(getattr(namespace, DEPRECATED, None) or [])
        if self.warning not in notes:
            notes.append(self.warning)
        setattr(namespace, DEPRECATED, notes)


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, *, dest: str,
                         flag: bool = False, convert: Callable[[Any], Any] | None = None,
                         note: str = "", **kwargs: Any) -> None:
    """Keep ``old`` working for one release: hidden from ``--help``, it sets ``dest`` like
    ``new`` (a flag when ``flag``; ``convert`` maps its value to the new option's) and warns
    ``"<old> is deprecated: use <new><note>"``."""
    if flag:
        kwargs.update(nargs=0, const=True)
    parser.add_argument(old, dest=dest, action=_DeprecatedAlias, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS, warning=f"{old} is deprecated: use {new}{note}",
                        convert=convert, **kwargs)


def deprecation_warnings(args: argparse.Namespace) -> list[str]:
    """The warnings the deprecated spellings on the command line left."""
    return list(getattr(args, DEPRECATED, None) or [])


def parse_formats(value: str) -> list[str]:
    """``--format``: ``"png,html"`` → ``["png", "html"]``; a one-line error for an unknown or
    empty list, or for PNG figures without matplotlib."""
    formats = [f.strip().lower().lstrip(".") for f in value.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise UsageError(
            f"unknown format {unknown[0] if unknown else value!r}; choose from {', '.join(FORMATS)}"
        )
    if "png" in formats:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("PNG figures need matplotlib: pip install 'captum_ffb[viz]' "
                             "(or --format html,json)") from None
    return list(dict.fromkeys(formats))


def parse_scopes(values: list[str] | None) -> list[str] | None:
    """``--scopes``: scope names given as separate words and/or comma lists, once each."""
    if values is None:
        return None
    scopes = [s.strip() for v in values for s in v.split(",") if s.strip()]
    if not scopes:
        raise UsageError("--scopes is empty")
    return list(dict.fromkeys(scopes))


@dataclass(frozen=True)
class ModelPlacement:
    """Where the model runs and the dtype its weights load in (``--device``, ``--dtype``)."""

    device: Any
    dtype: Any

    def load_options(self) -> dict[str, Any]:
        """``load_model``'s keywords."""
        return {"device": self.device, "dtype": self.dtype}

    @property
    def default_dtype(self) -> bool:
        import torch

        return self.dtype == torch.float32


def model_placement(args: argparse.Namespace) -> ModelPlacement:
    """``--device`` and ``--dtype`` checked (one line each, before any weights load): a
    device this machine has (see :func:`captum_ffb.explained.models.check_device`) and a dtype of
    :data:`DTYPES` (float32 where the command has no ``--dtype``)."""
    from captum_ffb.explained.models import resolve_dtype

    device = resolve_device(getattr(args, "device", "cpu"))
    try:
        dtype = resolve_dtype(getattr(args, "dtype", "float32"))
    except ValueError as error:
        raise UsageError(f"--{error}") from None
    return ModelPlacement(device, dtype)


def parse_layers(value: str) -> list[int] | str:
    """``--layer``: ``"all"`` → ``"all"``; ``"3"`` or ``"0,-1"`` → a list of indices."""
    if value.strip().lower() == "all":
        return "all"
    try:
        layers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--layer takes an integer, a comma list or 'all', got {value!r}") from None
    if not layers:
        raise UsageError("--layer is empty")
    return layers


def add_backend_options(parser: Any) -> None:
    """``--backend``, ``--address``, ``--workers``, ``--gpus-per-worker`` for a corpus command
    (``--engine``, ``--backend``'s name before 0.4, is read with a warning)."""
    group = parser.add_argument_group("where batches run")
    group.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="local (default: this process) or ray (workers; pip install "
                       '"captum_ffb[ray]")')
    add_deprecated_alias(parser, "--engine", "--backend", dest="backend", choices=("local", "ray"))
    group.add_argument("--address", default=None, metavar="ADDR",
                       help="Ray: join the cluster at ADDR (auto: the running one); by default "
                       "an embedded local Ray starts and stops with the command")
    group.add_argument("--workers", type=int, default=None, metavar="N",
                       help="Ray: actors in the pool (each loads the model once; default: one "
                       "per CPU, or per GPU share with --gpus-per-worker)")
    group.add_argument("--gpus-per-worker", type=float, default=0.0, metavar="G",
                       help="Ray: GPUs each actor reserves (its model runs on cuda)")


def backend_options(args: Any) -> tuple[str, dict[str, Any]]:
    """``(backend, options)`` from the parsed backend flags, checked (a one-line error)."""
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if args.gpus_per_worker < 0:
        raise UsageError(f"--gpus-per-worker must not be negative, got {args.gpus_per_worker}")
    if args.backend == "local":
        given = [flag for flag, value in (("--address", args.address), ("--workers", args.workers),
                                          ("--gpus-per-worker", args.gpus_per_worker or None))
                 if value is not None]
        if given:
            raise UsageError(f"{given[0]} needs --backend ray")
        return "local", {}
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise UsageError('--backend ray needs Ray: pip install "captum_ffb[ray]"')
    if args.gpus_per_worker and args.address is None:
        _check_local_gpus(args.gpus_per_worker, args.workers)
    return "ray", {"address": args.address, "workers": args.workers,
                   "gpus_per_worker": args.gpus_per_worker}


def _check_local_gpus(gpus_per_worker: float, workers: int | None) -> None:
    """The embedded Ray uses this machine's GPUs: enough of them for ``--gpus-per-worker``
    (and ``--workers``), or a one-line error before anything starts (Ray would wait forever)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    needed = gpus_per_worker * (workers or 1)
    if needed > count + 1e-6:  # a float sum of fractions
        asked = f"--gpus-per-worker {gpus_per_worker:g}" + (f" with --workers {workers}" if workers else "")
        raise UsageError(f"{asked} needs {needed:g} GPUs, and this machine has {count}; use "
                         "--gpus-per-worker 0 (CPU), or --address to join a Ray cluster with GPUs")
