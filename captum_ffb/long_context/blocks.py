r"""Presence attention by blocks of queries: the presences' gradients in linear memory.

Presence attribution (:mod:`~captum_ffb.long_context.presence`) adds ``log t_g`` to the
attention logits of group ``g``'s keys for every query outside ``g``. Given as an ``n × n``
mask that needs a gradient, the attention falls back to its reference kernel, which keeps
every layer's ``n × n`` weights of every head for the backward pass: memory grows with the
square of the prompt (presence on SmolLM2 at 2,023 tokens: 7.65 GiB above the model and
52.2 s through the mask, 2.96 GiB and 37.1 s by blocks; at 4,051 tokens the mask's weights
alone would take 16.5 GiB, the blocks' whole pass 6.00 GiB: ``benchmarks/LONG_CONTEXT.md``).

Where each group is one run of consecutive tokens, the queries of a run share their biases:
a group's tokens see the keys before the group with their presences and the group's own keys
with none; the tokens outside every group see every key with its presence. So the bias of
query ``q`` on key ``k`` is ``b_k − b_k·[k in q's group's run]``, and for the scale ``s``
``q·k·s + bias = (q, 1, e_q)·(k, b_k / s, −b_k e_k / s)·s`` with ``e`` a one-hot of the run:
keys of a few more columns, which the fused attention kernels take with their gradient. The
queries are cut into blocks of whole runs of at least :data:`BLOCK` tokens (one column more
per run in the block), each attending to the keys up to its end (causal within it); a block's
attention is computed again in the backward pass instead of kept. The numbers are the mask's
(a check on the first use with each model compares the two).
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

__all__ = ["BLOCK", "IMPLEMENTATION", "BlockPlan", "QueryBlock", "Unsupported", "block_plan", "presences_by_blocks"]

#: The fewest queries of a block (whole runs are added until it holds this many): on SmolLM2
#: with sentences as groups, 128 took 10.1 s for presence's two passes at 976 tokens, 64 took
#: 11.5 and 256 took 11.0.
BLOCK = 128
#: The attention implementation's name in transformers' registry (only the passes of
#: :func:`presences_by_blocks` run it).
IMPLEMENTATION = "captum_ffb_presence_blocks"
#: Keyword arguments an attention function may be given that change what it computes: the
#: block attention runs only where each is absent or ``None``.
_CHANGES_ATTENTION = ("softcap", "s_aux", "sinks", "sliding_window", "position_bias", "head_mask")


class Unsupported(RuntimeError):
    """The model's attention asks for something the block attention does not compute."""


@dataclass(frozen=True)
class QueryBlock:
    """A block of queries: whole runs of tokens, and the columns they add to queries and keys.

    Attributes:
        start, end (int): its queries are tokens ``start … end − 1``; it attends to keys
                    ``0 … end − 1``.
        query_columns (Tensor): ``(end − start, 1 + R)``: 1, then the one-hot of each
                    query's run (``R`` runs in the block).
        key_signs (Tensor): ``(end, 1 + R)``: 1, then ``−1`` where a key is in a group's run
                    of the block (times ``b_k / s``, the keys' columns).
        causal (Tensor): ``(end − start, end)`` which keys each query sees.
    """

    start: int
    end: int
    query_columns: Tensor
    key_signs: Tensor
    causal: Tensor


@dataclass(frozen=True)
class BlockPlan:
    """The runs of a prompt's token groups and the blocks of queries they make.

    Attributes:
        runs (tuple): ``(start, end, cut)`` per run of equal groups: its queries are tokens
                    ``start … end − 1`` and see the keys before ``cut`` with their presences
                    (``start`` for a group's run, ``end`` outside every group).
        groups (Tensor): ``(n,)`` each token's group (negative: none).
        blocks (tuple): the :class:`QueryBlock` s, in order.
    """

    runs: tuple[tuple[int, int, int], ...]
    groups: Tensor
    blocks: tuple[QueryBlock, ...] = ()


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
    return BlockPlan(tuple(runs), groups, _blocks(runs, groups.device))


def _blocks(runs: list[tuple[int, int, int]], device: torch.device) -> tuple[QueryBlock, ...]:
    """The runs cut into blocks of at least :data:`BLOCK` queries (whole runs)."""
    found, members = [], []
    for index, run in enumerate(runs):
        members.append(run)
        if run[1] - members[0][0] < BLOCK and index < len(runs) - 1:
            continue
        start, end = members[0][0], members[-1][1]
        queries = torch.zeros(end - start, 1 + len(members), device=device)
        signs = torch.zeros(end, 1 + len(members), device=device)
        queries[:, 0], signs[:, 0] = 1.0, 1.0
        for j, (first, last, cut) in enumerate(members, start=1):
            queries[first - start:last - start, j] = 1.0
            if cut == first:  # a group's run: its own keys without their presence
                signs[first:last, j] = -1.0
        causal = torch.ones(end - start, end, dtype=torch.bool, device=device).tril(start)
        found.append(QueryBlock(start, end, queries, signs, causal))
        members = []
    return tuple(found)


_PASS: contextvars.ContextVar[tuple[BlockPlan, Tensor, list[int]] | None] = contextvars.ContextVar(
    "captum_ffb_presence_blocks", default=None)


def _attend(plan: BlockPlan, scale: float, query: Tensor, key: Tensor, value: Tensor, bias: Tensor) -> Tensor:
    """``(B, n, H, D)`` the attention of every block of ``plan``, ``bias`` ``(n,)`` on each key."""
    b, h, _, d = query.shape
    kv = key.shape[1]
    column = (bias / scale).to(query.dtype)
    found = []
    for block in plan.blocks:
        start, end, extra = block.start, block.end, block.query_columns.shape[1]
        queries = torch.cat([query[:, :, start:end],
                             block.query_columns.to(query.dtype).expand(b, h, end - start, extra)], dim=-1)
        columns = column[:end, None] * block.key_signs.to(query.dtype)
        keys = torch.cat([key[:, :, :end], columns.expand(b, kv, end, extra)], dim=-1)
        values = torch.cat([value[:, :, :end], value.new_zeros(b, kv, end, extra)], dim=-1)  # the kernels want one width
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=block.causal, scale=scale,
                                             enable_gqa=kv != h)
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
