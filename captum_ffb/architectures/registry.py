"""The architecture registry: Hugging Face ``model_type`` → :class:`ArchitectureSpec`."""

from __future__ import annotations

from captum_ffb.architectures.spec import ArchitectureSpec

_REGISTRY: dict[str, ArchitectureSpec] = {}


class UnsupportedArchitectureError(ValueError):
    """Raised for a model whose ``model_type`` has no registered spec."""


def register_architecture(
    model_type: str, spec: ArchitectureSpec, overwrite: bool = False
) -> None:
    r"""Register where a model family keeps its block components.

    Args:
        model_type (str): the Hugging Face ``config.model_type`` (e.g. ``"bert"``).
        spec (ArchitectureSpec): module paths and the chain that applies.
        overwrite (bool): replace an existing registration instead of raising.

    Example::

        >>> from captum_ffb import ArchitectureSpec, Projection, register_architecture
        >>> register_architecture("my_bert", ArchitectureSpec(chain="post_ln", ...))
    """
    if not isinstance(spec, ArchitectureSpec):
        raise TypeError(f"spec must be an ArchitectureSpec, got {type(spec).__name__}")
    if model_type in _REGISTRY and not overwrite:
        raise ValueError(
            f"model_type {model_type!r} is already registered; pass overwrite=True to replace it"
        )
    _REGISTRY[model_type] = spec


def supported_architectures() -> list[str]:
    """The registered ``model_type`` names, sorted."""
    return sorted(_REGISTRY)


def get_architecture(model_type: str | None) -> ArchitectureSpec:
    """The spec registered for ``model_type``; a clear error when there is none."""
    if model_type in _REGISTRY:
        return _REGISTRY[model_type]
    raise UnsupportedArchitectureError(
        f"model_type {model_type!r} is not supported. Supported: "
        f"{', '.join(supported_architectures())}. To add a family, describe where its block "
        "keeps attention, norms and feed-forward with captum_ffb.ArchitectureSpec and call "
        "captum_ffb.register_architecture(model_type, spec)."
    )
