"""What the sub-commands share: the user-error type and the checks made before any weights
load (layers and scopes against the model's configuration)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class UsageError(ValueError):
    """A mistake in the command line, shown to the user as one line (exit code 2)."""


def check_model_options(
    config: Any, layers: Sequence[int] | str | None = None, scopes: Sequence[str] | None = None
) -> None:
    r"""Check layer indices and scope names against a model's configuration, before its
    weights load.

    Args:
        config: the model's ``PretrainedConfig`` (:func:`captum_ffb.models.model_config`).
        layers (list[int] or "all", optional): layer indices (negative counts from the end).
        scopes (list[str], optional): scope names of the model's chain.
    """
    from captum_ffb.architectures import get_architecture, get_chain

    spec = get_architecture(getattr(config, "model_type", None))
    spec.check_config(config)
    count = getattr(config, "num_hidden_layers", None)
    if spec.decoder is not None:  # an encoder–decoder's maps are its decoder layers'
        spec = spec.decoder
        count = next((getattr(config, k) for k in ("decoder_layers", "num_decoder_layers")
                      if isinstance(getattr(config, k, None), int)), count)
    if isinstance(count, int) and count > 0 and layers not in (None, "all"):
        for layer in layers:
            if not -count <= layer < count:
                raise UsageError(f"layer {layer} does not exist: the model has {count} layers")
    if scopes:
        try:
            get_chain(spec.chain_name(config)).check_scopes(scopes)
        except ValueError as error:
            raise UsageError(str(error)) from None


def resolve_device(name: str) -> Any:
    """``name`` as a torch device that exists here, or a one-line error (before any model
    loads); the check is :func:`captum_ffb.models.check_device`."""
    from captum_ffb.models import check_device

    try:
        return check_device(name)
    except ValueError as error:
        raise UsageError(str(error)) from None


def add_engine_options(parser: Any) -> None:
    """``--engine``, ``--address``, ``--workers``, ``--gpus-per-worker`` for a corpus command."""
    group = parser.add_argument_group("where batches run")
    group.add_argument("--engine", choices=("local", "ray"), default="local",
                       help="local (default: this process) or ray (workers; pip install "
                       '"captum_ffb[ray]")')
    group.add_argument("--address", default=None, metavar="ADDR",
                       help="Ray: join the cluster at ADDR (auto: the running one); by default "
                       "an embedded local Ray starts and stops with the command")
    group.add_argument("--workers", type=int, default=None, metavar="N",
                       help="Ray: actors in the pool (each loads the model once; default: one "
                       "per CPU, or per GPU share with --gpus-per-worker)")
    group.add_argument("--gpus-per-worker", type=float, default=0.0, metavar="G",
                       help="Ray: GPUs each actor reserves (its model runs on cuda)")


def engine_options(args: Any) -> tuple[str, dict[str, Any]]:
    """``(engine, options)`` from the parsed engine flags, checked (a one-line error)."""
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if args.gpus_per_worker < 0:
        raise UsageError(f"--gpus-per-worker must not be negative, got {args.gpus_per_worker}")
    if args.engine == "local":
        given = [flag for flag, value in (("--address", args.address), ("--workers", args.workers),
                                          ("--gpus-per-worker", args.gpus_per_worker or None))
                 if value is not None]
        if given:
            raise UsageError(f"{given[0]} needs --engine ray")
        return "local", {}
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise UsageError('--engine ray needs Ray: pip install "captum_ffb[ray]"')
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


def check_port(host: str, port: int | None) -> None:
    """A one-line error, before any weights load, when ``host:port`` cannot be listened on
    (``None`` or 0: any free port)."""
    import socket

    if port is None:
        return
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must lie between 0 and 65535 (0: any free port), got {port}")
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error} "
                             "(choose another --port)") from None
