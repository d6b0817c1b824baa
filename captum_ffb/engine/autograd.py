"""Autograd helpers the engine and the features share: vector–Jacobian products (one
cotangent, or many at once with a fallback where vmap cannot batch), a block call's first
input swapped for a leaf, and a writer's tensor in sequence shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["batched_vjp", "first_input", "leaf_input", "sequence_shaped", "swap_first", "vjp"]


def leaf_input(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A block's input hidden states replaced by a leaf that requires grad."""
    return swap_first(args, kwargs, first_input(args, kwargs).detach().requires_grad_(True))


def swap_first(args: tuple[Any, ...], kwargs: dict[str, Any], new: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A module call's arguments with its first input (the hidden states) replaced by ``new``."""
    if args:
        return (new, *args[1:]), kwargs
    key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
    return args, {**kwargs, key: new}


def first_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    """A module call's first input (the hidden states), positional or by keyword."""
    if args:
        return args[0]
    return kwargs["hidden_states"] if "hidden_states" in kwargs else next(iter(kwargs.values()))


def vjp(outputs: Tensor, inputs: Sequence[Tensor], cotangent: Tensor) -> list[Tensor]:
    """The vector–Jacobian product of ``cotangent`` with ``outputs`` at each of ``inputs``
    (zeros where an input is unused); the autograd graph is kept."""
    found = torch.autograd.grad(outputs, list(inputs), grad_outputs=cotangent, retain_graph=True,
                                allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(found, inputs)]


def batched_vjp(outputs: Tensor, inputs: Sequence[Tensor], cotangents: Tensor) -> list[Tensor]:
    """``[(k, *x.shape)]``: one gradient per cotangent ``(k, *outputs.shape)``."""
    if cotangents.shape[0] == 1:
        return [g[None] for g in vjp(outputs, inputs, cotangents[0])]
    try:
        found = torch.autograd.grad(outputs, list(inputs), grad_outputs=cotangents, retain_graph=True,
                                    allow_unused=True, is_grads_batched=True)
        return [torch.zeros((cotangents.shape[0], *x.shape), dtype=x.dtype, device=x.device) if g is None else g
                for g, x in zip(found, inputs)]
    except RuntimeError:  # an operation vmap cannot batch: one cotangent at a time
        per = [vjp(outputs, inputs, c) for c in cotangents]
        return [torch.stack([p[k] for p in per]) for k in range(len(inputs))]


def sequence_shaped(t: Tensor, n: int, leading: int = 0) -> Tensor:
    """A writer's tensor ``(…, B·n, d)`` (some families flatten the batch before the FF) as
    ``(…, B, n, d)``; ``leading`` dimensions kept in front."""
    if t.dim() - leading == 2:
        return t.reshape(*t.shape[:leading], -1, n, t.shape[-1])
    return t
