r"""Attention probabilities kept as what computes them, and vector–Jacobian products that read
only the rows they need.

A recorded frozen pass (:class:`~captum_ffb.engine.frozen.FrozenCoefficients`) keeps, for each
attention call, its detached queries and keys, its mask and its values (``O(n·d)``), not its
probabilities (``O(H·n²)``: 18 GB for a 30-block model at 4,096 tokens):
:class:`AttentionRows` computes the probabilities of the query positions it is asked for with
the module's own eager function. With the probabilities frozen, a cotangent at an attention's
output at a few query positions ``R`` reaches its values as ``P[R]ᵀ g[R]``
(:class:`RowRoute`): a graph's edges into a head node cost ``O(n·d)``, not ``O(n²·d)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.autograd import batched_vjp

__all__ = ["AttentionRows", "RowRoute", "row_route"]

#: Relative tolerance of the check that the kept inputs give the call's output again.
_CHECK_TOLERANCE = 1e-4


@dataclass
class AttentionRows:
    """One attention call of a recorded frozen pass: what computes its probabilities.

    Attributes:
        module (nn.Module): the attention module.
        function (Callable): its eager attention function (``(module, q, k, v, mask, **kw) →
                    (output, weights)``).
        query (Tensor): ``(B, H, n, e)`` its queries, detached (after any rotation).
        key (Tensor): ``(B, H_kv, m, e)`` its keys, detached.
        mask (Any): the mask the call had.
        kwargs (dict): the call's other arguments.
        value (Tensor): ``(B, H_kv, m, e)`` its values, with their graph.
        output (Tensor): ``(B, n, H, e)`` the call's output, with its graph.
        weights (Tensor, optional): the probabilities, where the call computed them anyway
                    (an eager model): then nothing is computed again.
    """

    module: nn.Module
    function: Callable
    query: Tensor
    key: Tensor
    mask: Any
    kwargs: dict[str, Any]
    value: Tensor
    output: Tensor
    weights: Tensor | None = None
    checked: bool | None = field(default=None, repr=False)

    def rows(self, positions: Tensor) -> Tensor:
        """``(B, H, r, m)``: the probabilities at the query positions ``positions`` ``(r,)``."""
        if self.weights is not None:
            return self.weights[:, :, positions]
        n = self.query.shape[2]
        kwargs = {k: _query_rows(v, n, positions) for k, v in self.kwargs.items()}
        _, weights = self.function(self.module, self.query[:, :, positions], self.key, self.value.detach()[..., :0],
                                   _query_rows(self.mask, n, positions), **kwargs)
        return weights

    def full(self) -> Tensor:
        """``(B, H, n, m)``: every probability (checked to give the call's output again)."""
        if self.weights is not None:
            return self.weights
        if not self.check():
            raise ValueError(f"{type(self.module).__name__}'s eager attention does not give what its recorded call "
                             "computed: its probabilities cannot be computed again")
        return self.rows(torch.arange(self.query.shape[2], device=self.query.device))

    def check(self) -> bool:
        """Whether the probabilities computed again mix the values into the call's output
        (at the first, middle and last query positions), once."""
        if self.checked is None:
            self.checked = self._check()
        return self.checked

    def _check(self) -> bool:
        if self.value.dim() != 4 or self.output.dim() != 4 or self.query.shape[1] % self.value.shape[1]:
            return False
        n = self.query.shape[2]
        positions = torch.tensor(sorted({0, n // 2, n - 1}), device=self.query.device)
        try:
            weights = self.rows(positions)
        except (RuntimeError, ValueError, IndexError, TypeError):
            return False
        if weights is None or weights.shape[:3] != (self.query.shape[0], self.query.shape[1], len(positions)) \
                or weights.shape[-1] != self.value.shape[2]:
            return False
        mixed = mix_rows(weights, self.value.detach())  # (B, r, H, e)
        real = self.output.detach()[:, positions].to(mixed.dtype)
        if mixed.shape != real.shape:
            return False
        scale = float(real.abs().max()) if real.numel() else 0.0
        return bool((mixed - real).abs().max() <= _CHECK_TOLERANCE * max(scale, 1e-6))


def _query_rows(value: Any, n: int, positions: Tensor) -> Any:
    """A per-query tensor argument ``(…, n, m)`` (a mask, a position bias) at the rows
    ``positions``; anything else as it is."""
    if isinstance(value, Tensor) and value.dim() == 4 and value.shape[2] == n and n > 1:
        return value[:, :, positions]
    return value


def mix_rows(weights: Tensor, value: Tensor) -> Tensor:
    """``(B, r, H, e)``: probability rows ``(B, H, r, m)`` mixing grouped values ``(B, H_kv, m, e)``."""
    batch, heads, r, m = weights.shape
    groups = heads // value.shape[1]
    w = weights.to(value.dtype).reshape(batch, value.shape[1], groups, r, m)
    return torch.einsum("bgsrm,bgme->brgse", w, value).reshape(batch, r, heads, value.shape[-1])


@dataclass
class RowRoute:
    """A writer whose every path from the stream it reads to ``start`` (its output, or its
    output projection's input) passes through one attention call's output ``mixing.output``:
    its vector–Jacobian products go to the call's output (position-wise maps), through the
    probability rows the cotangents touch, then from the values to the stream."""

    start: Tensor
    mixing: AttentionRows
    leaf: Tensor

    def pull(self, cotangents: Tensor) -> Tensor:
        """``(k, *leaf.shape)``: the products of ``k`` cotangents ``(k, *start.shape)``."""
        mixing = self.mixing
        if self.start is mixing.output:
            at_mix = cotangents
        else:
            (at_mix,) = batched_vjp(self.start, [mixing.output], cotangents)  # (k, B, n, H, e)
        k, batch, n, heads, width = at_mix.shape
        touched = at_mix.reshape(k, batch, n, -1).ne(0).any(-1).any(1).any(0).nonzero()[:, 0]
        value = mixing.value
        if not len(touched):
            return at_mix.new_zeros((k, *self.leaf.shape))
        weights = mixing.rows(touched).to(value.dtype)  # (B, H, r, m)
        groups = heads // value.shape[1]
        w = weights.reshape(batch, value.shape[1], groups, len(touched), -1)
        g = at_mix[:, :, touched].reshape(k, batch, len(touched), value.shape[1], groups, width)
        at_value = torch.einsum("bgsrm,kbrgse->kbgme", w, g)
        (back,) = batched_vjp(value, [self.leaf], at_value)
        return back


def row_route(start: Tensor, leaf: Tensor, calls: dict[Any, AttentionRows]) -> RowRoute | None:
    """The :class:`RowRoute` from ``start`` to ``leaf`` through one of ``calls`` (by their
    output's autograd node), or ``None`` where some path avoids them all, several are
    crossed, or the call's probabilities cannot be computed again."""
    found: set[int] = set()
    seen: set[Any] = set()
    stack = [start.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in calls:
            found.add(id(calls[node]))
            if len(found) > 1:
                return None
            mixing = calls[node]
            continue
        if type(node).__name__ == "AccumulateGrad":
            if node.variable is leaf:
                return None  # a path that avoids the attention's output
            continue
        stack.extend(f for f, _ in node.next_functions)
    if len(found) != 1 or not mixing.check():
        return None
    return RowRoute(start, mixing, leaf)
