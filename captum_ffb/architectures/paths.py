"""Dotted module paths, as the specs write them, resolved below a module."""

from __future__ import annotations

from typing import Any

from torch import nn


def resolve(root: nn.Module, path: str) -> Any:
    """The attribute at dotted ``path`` below ``root``, with a clear error when it is missing."""
    obj: Any = root
    for name in path.split("."):
        if not hasattr(obj, name):
            raise ValueError(
                f"{type(root).__name__} has no {path!r} (missing {name!r}): the layer does not "
                "match the registered architecture"
            )
        obj = getattr(obj, name)
    return obj


def has_path(root: nn.Module, path: str | None) -> bool:
    """Whether ``path`` resolves below ``root`` (and is not ``None``)."""
    if path is None:
        return False
    try:
        return resolve(root, path) is not None
    except ValueError:
        return False


def is_present(root: nn.Module, path: str | None) -> bool:
    """Whether ``path`` resolves below ``root`` to something other than an ``nn.Identity``
    (ModernBERT's first layer has an identity where the others have their attention norm)."""
    return has_path(root, path) and not isinstance(resolve(root, path), nn.Identity)
