r"""Presence attention by blocks of queries: the presences' gradients in linear memory.

Presence attribution (:mod:`~captum_ffb.long_context.presence`) adds ``log t_g`` to the
attention logits of group ``g``'s keys for every query outside ``g``. Given as an ``n × n``
mask that needs a gradient, the attention falls back to its reference kernel, which keeps
every layer's ``n × n`` weights of every head for the backward pass: memory grows with the
square of the prompt (for SmolLM2 at 2,023 tokens, 7.5 GiB above the model against 2.8 GiB by
blocks; at 4,073 tokens its weights alone would take 16.7 GiB, the blocks' whole pass 5.2 GiB:
``benchmarks/LONG_CONTEXT.md``).

Where each group is one run of consecutive tokens, the queries of a run share their biases:
a group's tokens see the keys before the group with their presences and the group's own keys
with none; the tokens outside every group see every key with its presence. So, run by run,
the bias is one value per key, ``b_k``, and ``q·k·s + b_k = (q, 1)·(k, b_k / s)·s`` for the
scale ``s``: a key of one more column, which the fused attention kernels take with its
gradient. Each run's queries attend to the keys up to the run's end (causal within it); the
block's attention is computed again in the backward pass instead of kept. The numbers are the
mask's (a check on the first use with each model compares the two).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from captum_ffb.engine.passes import register_attention

__all__ = ["IMPLEMENTATION", "BlockPlan", "Unsupported", "block_plan", "presences_by_blocks"]

#: The attention implementation's name in transformers' registry (only the passes of
#: :func:`presences_by_blocks` run it).
IMPLEMENTATION = "captum_ffb_presence_blocks"
#: Keyword arguments an attention function may be given that change what it computes: the
#: block attention runs only where each is absent or ``None``.
_CHANGES_ATTENTION = ("softcap", "s_aux", "sinks", "sliding_window", "position_bias", "head_mask")


class Unsupported(RuntimeError):
    """The model's attention asks for something the block attention does not compute."""


@dataclass(frozen=True)
class BlockPlan:
    """The runs of a prompt's token groups and what each run's queries see.

    Attributes:
        runs (tuple): ``(start, end, cut)`` per run of equal groups: its queries are tokens
                    ``start … end − 1`` and see the keys before ``cut`` with their presences
                    (``start`` for a group's run, ``end`` outside every group).
        groups (Tensor): ``(n,)`` each token's group (negative: none).
    """

    runs: tuple[tuple[int, int, int], ...]
    groups: Tensor


def block_plan(groups: Tensor) -> BlockPlan | None:
    """The plan of the token groups ``groups`` ``(n,)``, or ``None`` where a group is split
    over runs (its later tokens would see its earlier ones without a presence: one bias per
    key no longer holds)."""
    values = groups.tolist()
    runs, seen, start = [], set(), 0
    for end in range(1, len(values) + 1):
        if end < len(values) and values[end] == values[start]:
            continue
        group = values[start]
        if group >= 0 and group in seen:
            return None
        seen.add(group)
        runs.append((start, end, start if group >= 0 else end))
        start = end
    return BlockPlan(tuple(runs), groups)


_PASS: contextvars.ContextVar[tuple[BlockPlan, Tensor, list[int]] | None] = contextvars.ContextVar(
    "captum_ffb_presence_blocks", default=None)


def _attend(plan: BlockPlan, scale: float, query: Tensor, key: Tensor, value: Tensor, bias: Tensor) -> Tensor:
    """``(B, n, H, D)`` the attention of every run of ``plan``, ``bias`` ``(n,)`` on each key."""
    b, h, n, d = query.shape
    column = (bias / scale).to(query.dtype)
    query = torch.cat([query, query.new_ones(b, h, n, 1)], dim=-1)
    value = torch.cat([value, value.new_zeros(*value.shape[:3], 1)], dim=-1)  # the kernels want one width
    positions = torch.arange(n, device=query.device)
    found = []
    for start, end, cut in plan.runs:
        extra = torch.where(positions[:end] < cut, column[:end], column.new_zeros(()))
        keys = torch.cat([key[:, :, :end], extra[None, None, :, None].expand(b, key.shape[1], end, 1)], dim=-1)
        causal = torch.ones(end - start, end, dtype=torch.bool, device=query.device).tril(start)
        out = F.scaled_dot_product_attention(query[:, :, start:end], keys, value[:, :, :end], attn_mask=causal,
                                             scale=scale, enable_gqa=key.shape[1] != h)
        found.append(out[..., :d])
    return torch.cat(found, dim=2).transpose(1, 2).contiguous()


def _block_attention(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                     dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """The attention function registered as :data:`IMPLEMENTATION` (transformers' signature)."""
    state = _PASS.get()
    changed = [name for name in _CHANGES_ATTENTION if kwargs.get(name) is not None]
    if state is None or changed or dropout or query.shape[2] != key.shape[2] or kwargs.get("output_attentions"):
        raise Unsupported(f"{type(module).__name__} asks for {', '.join(changed) or 'another attention'}")
    plan, bias, calls = state
    calls.append(1)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    if torch.is_grad_enabled() and (bias.requires_grad or query.requires_grad):
        out = checkpoint(_attend, plan, scale, query, key, value, bias, use_reentrant=False)
    else:
        out = _attend(plan, scale, query, key, value, bias)
    return out, None


@contextlib.contextmanager
def presences_by_blocks(run: Any, plan: BlockPlan, log_presence: Tensor) -> Iterator[list[int]]:
    """Inside the block, the pass ``run`` (an entered
    :class:`~captum_ffb.engine.passes.ModelPass`) attends by blocks with the groups'
    ``log_presence`` ``(G,)`` on their keys; yields the list its attention layers mark, one
    entry per call (empty after the run: the model's attention does not go through the
    interface)."""
    register_attention(IMPLEMENTATION, _block_attention, mask="sdpa")
    run.attention(lambda current: IMPLEMENTATION if current == "sdpa" else None)
    groups = plan.groups.to(log_presence.device)
    inside = groups >= 0
    bias = torch.where(inside, log_presence[groups.clamp_min(0)], log_presence.new_zeros(()))
    calls: list[int] = []
    token = _PASS.set((plan, bias, calls))
    try:
        yield calls
    finally:
        _PASS.reset(token)
