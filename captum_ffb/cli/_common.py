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
        config: the model's ``PretrainedConfig`` (:func:`captum_ffb.explained.models.model_config`).
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
    loads); the check is :func:`captum_ffb.explained.models.check_device`. The meta device, which
    holds shapes and no weights, is refused too: a model there has nothing to explain."""
    from captum_ffb.explained.models import check_device

    try:
        place = check_device(name)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if place.type == "meta":
        raise UsageError(f"--device {name} holds no weights (it is for building a model without loading "
                         "it): give cpu, cuda or another device")
    return place


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
