"""The registries: Hugging Face ``model_type`` → :class:`ArchitectureSpec`, and chain name →
chain (the wiring of rules for one block type, see ``captum_ffb.engine.chains``)."""

from __future__ import annotations

from typing import Any

from captum_ffb.architectures.spec import ArchitectureSpec

_REGISTRY: dict[str, ArchitectureSpec] = {}
_CHAINS: dict[str, Any] = {}


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
    if _CHAINS:
        _check_chain(model_type, spec)
    if model_type in _REGISTRY and not overwrite:
        raise ValueError(
            f"model_type {model_type!r} is already registered; pass overwrite=True to replace it"
        )
    _REGISTRY[model_type] = spec


def _check_chain(model_type: str, spec: ArchitectureSpec) -> None:
    for part in (spec.decoder, spec.alternative):
        if part is not None:
            _check_chain(model_type, part)
    if isinstance(spec.chain, str) and spec.chain not in _CHAINS:
        raise ValueError(
            f"the spec of {model_type!r} names chain {spec.chain!r}, which is not registered; "
            f"registered: {', '.join(registered_chains())} (register_chain adds one)"
        )


def check_chain_names() -> None:
    """Raise a clear error when a registered family names a chain that is not registered.

    Runs when the built-in chains are registered (for the families registered before them)
    and at every :func:`register_architecture` after that. A family whose chain is a function
    of the config is checked when a model is bound to it (:func:`get_chain`).
    """
    for model_type, spec in _REGISTRY.items():
        _check_chain(model_type, spec)


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


def register_chain(name: str, chain: Any, overwrite: bool = False) -> None:
    r"""Register a block chain under ``name``, for specs to name in ``chain=``.

    Args:
        name (str): the chain's name (``chain.name`` must match).
        chain (Chain): a :class:`captum_ffb.engine.Chain`.
        overwrite (bool): replace an existing registration instead of raising.

    Example::

        >>> from captum_ffb import register_chain
        >>> from captum_ffb.engine import Chain
        >>> register_chain("my_block", Chain(name="my_block", ...))
    """
    for attribute in ("name", "scopes", "mix", "local", "roles"):
        if not hasattr(chain, attribute):
            raise TypeError(f"a chain needs a {attribute!r}; build it with captum_ffb.engine.Chain")
    if chain.name != name:
        raise ValueError(f"the chain is called {chain.name!r}, not {name!r}")
    if name in _CHAINS and not overwrite:
        raise ValueError(f"chain {name!r} is already registered; pass overwrite=True to replace it")
    _CHAINS[name] = chain


def registered_chains() -> list[str]:
    """The registered chain names, sorted."""
    return sorted(_CHAINS)


def get_chain(name: str) -> Any:
    """The chain registered as ``name``; a clear error when there is none."""
    if name not in _CHAINS:
        raise ValueError(f"unknown chain {name!r}; registered: {', '.join(registered_chains())}")
    return _CHAINS[name]


def model_type_of(*roots: Any) -> str | None:
    """The ``config.model_type`` of the first of ``roots`` (or their sub-modules) with one."""
    for root in roots:
        if root is None:
            continue
        for module in root.modules():
            model_type = getattr(getattr(module, "config", None), "model_type", None)
            if model_type:
                return model_type
    return None
