"""The element-wise functions a head may name instead of holding them as modules."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

#: Name → function, for :class:`~captum_ffb.architectures.heads.HeadActivation`'s ``function``
#: (RoBERTa's classification head calls ``tanh``, DistilBERT's ``relu``).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "sigmoid": torch.sigmoid,
}


def activation_function(name: str) -> Callable[[Tensor], Tensor]:
    """The function called ``name`` in :data:`ACTIVATIONS`; a clear error when unknown."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown head activation function {name!r}; known: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]
