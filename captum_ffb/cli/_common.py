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
    if isinstance(count, int) and count > 0 and layers not in (None, "all"):
        for layer in layers:
            if not -count <= layer < count:
                raise UsageError(f"layer {layer} does not exist: the model has {count} layers")
    if scopes:
        chain = get_chain(spec.chain_name(config))
        unknown = [s for s in scopes if s not in chain.all_scopes]
        if unknown:
            raise UsageError(
                f"unknown scope {unknown[0]!r} for a {chain.name} model; choose from "
                f"{', '.join(chain.all_scopes)}"
            )
