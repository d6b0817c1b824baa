r"""Attention rules that also credit the query/key path (the scores), not only the values.

One head at row ``i``: ``o_i = Σ_j α_ij v_j``, ``α_i = softmax(t(s_i) + mask)``,
``s_ij = scale · q_i·k_j`` and ``t`` the identity or a soft-capping ``c·tanh(s / c)``.
Both rules here write ``o_i`` as a part linear in the values and a part linear in the
scores, each made linear in the players by coefficients taken from the real forward pass:

    o_i = Σ_j c_ij v_j  +  ½ Σ_j [L_i(s_i) + e_i]_j v̄_j

with ``v̄`` the real values, ``L_i`` a linear map on the scores of row ``i`` (a linearised
softmax) and ``e_i`` the part of the attention owed to no player. The scores are split
evenly between queries and keys, ``s_ij = ½ scale (q_i·k̄_j + q̄_i·k_j)`` (the uniform rule,
Integrated Gradients for a bilinear form), and queries and keys are linear in the
attention's input once rotary embeddings (a per-position linear map) and query/key norms
(scales frozen) are applied as in the real pass.

- :class:`IGAttention`: Integrated Gradients from zero scores. The Shapley split of ``α·V``
  with baseline ``(u, 0)`` (``u`` the uniform attention over the allowed keys, the softmax
  at ``s = 0``) gives ``c = ½(α + u)`` and the scores ``½(α − u)·V̄``; ``α − u = J̃ s`` with the
  path-averaged Jacobian ``J̃ = ∫₀¹ J(t·s) dt`` (Gauss–Legendre, ``n_steps`` points).
- :class:`AttnLRPAttention`: AttnLRP's rules (Achtibat et al., 2024): the uniform rule on
  ``α·V`` (``c = ½α``) and on ``q·kᵀ``, and the softmax linearised at the real scores,
  ``L = J(s̄)``, i.e. ``R_s = s ⊙ (R_α − α Σ R_α)``; what that linearisation leaves,
  ``e = α − J(s̄) s̄``, is owed to no player.

``J(x)·v = a ⊙ (v − ⟨a, v⟩)`` with ``a = softmax(x)``: no ``n × n`` Jacobian per row is
formed. On the one-backward-pass route the same maps are gradient replacements
(:meth:`ScoreCreditingAttention.linearised`), so both routes give the same numbers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from captum_ffb.core.decomposition import Decomposition
from captum_ffb.rules.attention import Attention, head_projections, head_values
from captum_ffb.rules.base import Rule

#: Bytes the forward route's per-row-chunk score tensors may take.
_CHUNK_BYTES = 256 * 2**20


@dataclass
class ScorePath:
    r"""The query/key side of one attention block, as the real forward pass saw it.

    Attributes:
        query (Tensor): queries as read by the attention function ``(B, H, n, e)`` (after
                    rotary embeddings and query norms).
        key (Tensor): keys ``(B, H_kv, n, e)``.
        allowed (Tensor): ``(B, 1 or H, n, n)`` bool, the keys each query may attend to
                    (causal, sliding window, padding).
        scaling (float): the factor of ``q·k``.
        softcap (float, optional): the logit soft-capping ``c·tanh(s / c)``.
        project (Callable): ``project(vectors, affine)`` maps attention-input vectors
                    ``(B, n, m, d)`` (``m`` per position) to their queries
                    ``(B, H, n, m, e)`` and keys ``(B, H_kv, n, m, e)`` with the real pass's
                    rotary embeddings and frozen query/key norm scales; ``affine`` adds
                    the projections' constants (biases), else the map is linear.
        inputs (Tensor, optional): the attention's real input ``(B, n, d)`` (the real values
                    are read from it; else from the value input's total).
    """

    query: Tensor
    key: Tensor
    allowed: Tensor
    scaling: float
    softcap: float | None
    project: Callable[[Tensor, bool], tuple[Tensor, Tensor]]
    inputs: Tensor | None = None


def allowed_keys(mask: Tensor | None, shape: tuple[int, ...], device: torch.device) -> Tensor:
    """Bool ``(B, 1 or H, n, n_keys)`` from an attention mask (additive float or bool);
    every key when there is no mask."""
    if mask is None:
        return torch.ones(shape[0], 1, shape[2], shape[3], dtype=torch.bool, device=device)
    if mask.dim() == 2:
        mask = mask[:, None, None, :]
    mask = mask[..., : shape[3]]
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def row_dot(a: Tensor, b: Tensor) -> Tensor:
    """``⟨a_i, b_i⟩`` for each row ``i`` of the last dimension, kept as a size-1 dimension (by
    ``einsum``: one read of each tensor and no product tensor; on the CPU several times faster
    than ``(a * b).sum(-1)`` or a batch of ``1 × n`` products)."""
    return torch.einsum("...j,...j->...", a, b).unsqueeze(-1)


def uniform_attention(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """The softmax at zero scores: uniform over the allowed keys (rows without one are 0)."""
    weights = allowed.to(dtype)
    return weights / weights.sum(-1, keepdim=True).clamp_min(1)


def _repeat(tensor: Tensor, groups: int, dim: int = 1) -> Tensor:
    return tensor if groups == 1 else tensor.repeat_interleave(groups, dim=dim)


def masked_softmax(scores: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the allowed keys; rows without an allowed key are 0."""
    return _MaskedSoftmax(allowed, scores.dtype)(scores)


class _MaskedSoftmax:
    """Softmax over the allowed keys, with the mask prepared once for many calls."""

    def __init__(self, allowed: Tensor, dtype: torch.dtype) -> None:
        self.shift = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min)
        valid = allowed.any(dim=-1, keepdim=True)
        self.valid = None if bool(valid.all()) else valid.to(dtype)

    def __call__(self, scores: Tensor) -> Tensor:
        return self.scaled(scores, 1.0)

    def scaled(self, scores: Tensor, factor: float) -> Tensor:
        """The softmax of ``factor · scores``."""
        out = torch.softmax(torch.add(self.shift, scores, alpha=factor), dim=-1)
        return out if self.valid is None else out.mul_(self.valid)


def soft_capped(scores: Tensor, softcap: float | None) -> tuple[Tensor, Tensor | None]:
    """``t(s)`` and ``t'(s)``: the identity (slope ``None``), or ``c·tanh(s / c)``."""
    if softcap is None:
        return scores, None
    tanh = torch.tanh(scores / softcap)
    return softcap * tanh, 1 - tanh * tanh


@dataclass
class SoftmaxLinearisation:
    r"""A linear map on each row of scores, ``L(S) = Σ_k w_k a_k ⊙ (d_k ⊙ S − ⟨a_k, d_k ⊙ S⟩)``,
    and its transpose ``Lᵀ(G) = Σ_k w_k d_k ⊙ a_k ⊙ (G − ⟨a_k, G⟩)`` (each ``a_k`` a softmax
    row, ``d_k`` a soft-capping slope; one term per quadrature point).
    """

    weights: list[float]
    probs: list[Tensor]
    slopes: list[Tensor | None]

    def mean_probs(self) -> Tensor:
        """``Σ_k w_k a_k``."""
        out = self.probs[0] * self.weights[0]
        for w, a in zip(self.weights[1:], self.probs[1:]):
            out.add_(a, alpha=w)
        return out

    def apply(self, scores: Tensor, rows: slice = slice(None)) -> Tensor:
        """``L`` applied to each row of ``scores`` (the rows ``rows`` of the linearisation)."""
        out = torch.zeros_like(scores)
        for w, a, d in zip(self.weights, self.probs, self.slopes):
            a, d = a[:, :, rows], (None if d is None else d[:, :, rows])
            z = scores if d is None else d * scores
            az = a * z
            out.add_(az - a * az.sum(-1, keepdim=True), alpha=w)
        return out

    def transpose(self, grad: Tensor) -> Tensor:
        if len(self.probs) > 1 and all(d is None for d in self.slopes):
            # G ⊙ Σ_k w_k a_k − Σ_k w_k ⟨a_k, G⟩ a_k: one pass over each row of probabilities
            out = grad * self.mean_probs()
            for w, a in zip(self.weights, self.probs):
                out.addcmul_(a, row_dot(a, grad), value=-w)
            return out
        out = None
        for w, a, d in zip(self.weights, self.probs, self.slopes):
            part = (grad - row_dot(a, grad)).mul_(a)  # a ⊙ (G − ⟨a, G⟩)
            if d is not None:
                part.mul_(d)
            if out is None:
                out = part.mul_(w) if w != 1.0 else part
            else:
                out.add_(part, alpha=w)
        return out

    def transpose_values(self, values: Tensor, rows: slice = slice(None)) -> Tensor:
        r"""``Lᵀ`` applied to each column of ``values`` ``(B, H, n, e)``, for every row in
        ``rows``: ``(B, H, r, n, e)`` with ``[i, j] = Σ_k w_k d_k a_k[i, j] (v_j − Σ_j' a_k[i, j'] v_j')``."""
        out = None
        for w, a, d in zip(self.weights, self.probs, self.slopes):
            a, d = a[:, :, rows], (None if d is None else d[:, :, rows])
            mean = torch.matmul(a, values)  # (B, H, r, e)
            scale = w * a if d is None else w * d * a
            part = scale[..., None] * (values[:, :, None] - mean[:, :, :, None])
            out = part if out is None else out + part
        return out


class _ScoreCredit(torch.autograd.Function):
    """The rule's linear map as a gradient: zero in value (nothing is computed forward);
    backward, for each chunk of query rows, the scores are rebuilt from the saved queries and
    keys and the gradients of the values, queries and keys formed directly, so that no
    ``n × n`` tensor outlives its chunk and nothing of size ``n²`` is kept between the
    passes."""

    @staticmethod
    def forward(ctx, query: Tensor, key: Tensor, value: Tensor, allowed: Tensor, scaling: float,
                softcap: float | None, rule: ScoreCreditingAttention) -> Tensor:
        ctx.save_for_backward(query, key, value, allowed)
        ctx.scaling, ctx.softcap, ctx.rule = scaling, softcap, rule
        return query.new_zeros(*query.shape[:-1], value.shape[-1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        query, key, value, allowed = ctx.saved_tensors
        rule, scaling, softcap = ctx.rule, ctx.scaling, ctx.softcap
        batch, heads, n, _ = query.shape
        keys = key.shape[2]
        grad_query = torch.zeros_like(query)
        grad_key = torch.zeros_like(key)
        grad_value = torch.zeros_like(value)
        per_row = batch * heads * keys * query.dtype.itemsize * (8 + 2 * rule.steps)
        size = max(1, min(n, _CHUNK_BYTES // max(per_row, 1)))
        for first in range(0, n, size):
            rows = slice(first, min(n, first + size))
            q, g = query[:, :, rows], grad[:, :, rows]
            raw = torch.matmul(q * scaling, key.transpose(-1, -2))
            # the mask stays (B, 1, r, n) where it is shared by the heads: broadcast, not copied
            coefficients, linear = rule.backward_maps(raw, allowed[:, :, rows], softcap)
            grad_value += torch.matmul(coefficients.transpose(-1, -2), g)
            # ½ (value/score split) · ½ (query/key split) · scale, applied to the (r, e) side
            scores = linear.transpose(torch.matmul(g * (0.25 * scaling), value.transpose(-1, -2)))
            grad_query[:, :, rows] = torch.matmul(scores, key)
            grad_key += torch.matmul(scores.transpose(-1, -2), q)
        return grad_query, grad_key, grad_value, None, None, None, None


class ScoreCreditingAttention(Rule):
    r"""Base of the attention rules that credit values, queries and keys (see the module
    documentation). Subclasses say how ``α·V`` is split (``value_coefficients()``) and how
    the softmax is linearised (:meth:`softmax_map`).

    Call: as :class:`~captum_ffb.rules.Attention`, plus ``scores=``:class:`ScorePath`
    (the chains pass it for rules whose ``credits_scores`` is true).
    """

    role = "attention"
    credits_scores = True
    #: softmax rows the linearisation keeps per quadrature point (memory of the backward pass)
    steps = 1

    def value_coefficients(self, probs: Tensor, allowed: Tensor) -> Tensor:  # pragma: no cover
        """The values' coefficients of ``α·V`` (``allowed``: the keys each query may attend to)."""
        raise NotImplementedError

    def softmax_map(self, scores: Tensor, allowed: Tensor, probs: Tensor | None, softcap: float | None,
                    remainder: bool = True) -> tuple[SoftmaxLinearisation, Tensor | None]:  # pragma: no cover
        """``(L, e)``: the linearised softmax on the raw scores and the part owed to no player
        (``None`` when ``remainder`` is false)."""
        raise NotImplementedError

    def backward_maps(self, scores: Tensor, allowed: Tensor, softcap: float | None
                      ) -> tuple[Tensor, SoftmaxLinearisation]:
        """For a chunk of query rows on the backward route: the values' coefficients (with
        the remainder folded in where the rule hands it to the players) and ``L``."""
        probs = masked_softmax(soft_capped(scores, softcap)[0], allowed)
        linear, rest = self.softmax_map(scores, allowed, probs, softcap, remainder=self.needs_remainder)
        coefficients, _ = self._with_remainder(self.value_coefficients(probs, allowed), rest)
        return coefficients, linear

    @property
    def needs_remainder(self) -> bool:
        """Whether the values' coefficients on the backward route need the remainder ``e``."""
        return bool(getattr(self, "remainder_to_values", False))

    # ------------------------------------------------------------------ shared pieces
    def _coefficients(self, scores: ScorePath, probs: Tensor, dtype: torch.dtype):
        groups = scores.query.shape[1] // scores.key.shape[1]
        query = scores.query.to(dtype)
        key = _repeat(scores.key.to(dtype), groups)
        raw = torch.matmul(query, key.transpose(-1, -2)) * scores.scaling
        allowed = scores.allowed
        linear, rest = self.softmax_map(raw, allowed, probs, scores.softcap)
        coefficients, rest = self._with_remainder(self.value_coefficients(probs, allowed), rest)
        return query, key, groups, coefficients, linear, rest

    def _with_remainder(self, coefficients: Tensor, rest: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Where the rule hands the linearisation's remainder to the players
        (``remainder_to_values``), ``½ e`` joins the values' coefficients: ``½ e·V`` is then
        carried by each player's share of the values, through the frozen probabilities."""
        if rest is None or not getattr(self, "remainder_to_values", False):
            return coefficients, rest
        return coefficients + 0.5 * rest, None

    def __call__(
        self,
        value_input: Decomposition,
        probs: Tensor,
        value_weight: Tensor,
        value_bias: Tensor | None,
        output_weight: Tensor,
        output_bias: Tensor | None,
        scores: ScorePath | None = None,
    ) -> Decomposition:
        if scores is None:
            raise ValueError(f"{type(self).__name__} needs the attention's queries and keys (scores=)")
        dtype = value_input.bias.dtype
        probs = probs.to(dtype)
        query, key, groups, coefficients, linear, rest = self._coefficients(scores, probs, dtype)
        values_part = Attention()(value_input, coefficients, value_weight, value_bias, output_weight,
                                  output_bias).dense()

        dense = value_input.dense()
        terms, bias = dense.terms, dense.bias  # (B, n, P, d), (B, n, d)
        w_v, w_o, _ = head_projections(value_weight, output_weight, probs.shape[1])
        real_input = dense.total() if scores.inputs is None else scores.inputs.to(dtype)
        values = head_values(real_input, w_v, groups, value_bias)  # real values (B, H, n, e)
        q_parts, k_parts = (t.to(dtype) for t in scores.project(terms, False))
        q_bias, k_bias = (t.to(dtype) for t in scores.project(bias[:, :, None], True))
        k_parts, k_bias = _repeat(k_parts, groups), _repeat(k_bias, groups)
        q_all = torch.cat([q_parts, q_bias], dim=3)  # the bias player last
        k_all = torch.cat([k_parts, k_bias], dim=3)

        batch, heads, n, _ = values.shape
        players = q_all.shape[3]
        per_row = batch * heads * n * (values.shape[-1] + players) * dtype.itemsize * 3
        size = max(1, min(n, _CHUNK_BYTES // max(per_row, 1)))
        half = 0.25 * scores.scaling  # ½ (value/score split) · ½ (query/key split) · scale
        # few players (the bias player alone): L applied to each player's scores is cheaper
        # than L's transpose applied to every value column
        width, steps = values.shape[-1], len(linear.weights)
        per_player = players * (3 * width + 4 * steps) < width * (3 * steps + 2 * players)
        out = []
        for first in range(0, n, size):
            rows = slice(first, min(n, first + size))
            if per_player:
                parts = []
                for p in range(players):
                    own = torch.matmul(q_all[:, :, rows, p], key.transpose(-1, -2)) \
                        + torch.matmul(query[:, :, rows], k_all[:, :, :, p].transpose(-1, -2))
                    parts.append(torch.matmul(linear.apply(own, rows), values))
                part = half * torch.stack(parts, dim=3)  # (B, H, r, P + 1, e)
            else:
                kernel = linear.transpose_values(values, rows)  # (B, H, r, n, e)
                per_query = torch.einsum("bhjf,bhije->bhife", key, kernel)
                part = torch.einsum("bhipf,bhife->bhipe", q_all[:, :, rows], per_query)
                dots = torch.einsum("bhif,bhjpf->bhijp", query[:, :, rows], k_all)
                part = part + torch.einsum("bhijp,bhije->bhipe", dots, kernel)
                part = half * part
            if rest is not None:  # owed to no player: ½ e·V̄
                extra = 0.5 * torch.matmul(rest[:, :, rows], values)
                part = torch.cat([part[..., :-1, :], part[..., -1:, :] + extra[:, :, :, None]], dim=3)
            out.append(torch.einsum("bhipe,heo->bipo", part, w_o))
        scored = torch.cat(out, dim=1)  # (B, n, P + 1, d_out)
        result = Decomposition(values_part.terms + scored[:, :, :-1], values_part.bias + scored[:, :, -1],
                               values_part.token_mask, player_mask=value_input.player_mask)
        return result

    # ------------------------------------------------------------------ backward route
    def linearised(self, query: Tensor, key: Tensor, value: Tensor, allowed: Tensor, scaling: float,
                   softcap: float | None) -> Tensor:
        r"""The rule as a gradient replacement: a tensor ``(B, H, n, e)`` that is zero in value
        and whose gradient with respect to ``query``, ``key`` and ``value`` (``(B, H, n, e)``,
        ``(B, H_kv, n, e)``, ``(B, H_kv, n, e)``) is the rule's linear map; added to the
        attention's real (detached) output it gives the one-backward-pass route.
        """
        dtype = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
        groups = query.shape[1] // key.shape[1]
        q, k, v = query.to(dtype), _repeat(key.to(dtype), groups), _repeat(value.to(dtype), groups)
        out = _ScoreCredit.apply(q, k, v, allowed, float(scaling), softcap, self)
        return out.to(query.dtype)


@functools.lru_cache(maxsize=16)
def gauss_legendre(n_steps: int) -> tuple[list[float], list[float]]:
    """Nodes and weights of the ``n_steps``-point Gauss–Legendre rule on ``[0, 1]``."""
    nodes, weights = np.polynomial.legendre.leggauss(n_steps)
    return [float(0.5 * (x + 1)) for x in nodes], [float(0.5 * w) for w in weights]


class IGAttention(ScoreCreditingAttention):
    r"""Integrated Gradients through attention, from zero scores and zero values.

    The values get ``½(α + u)·V`` and the scores ``½(α − u)·V̄`` (the Shapley split of the
    bilinear ``α·V`` with baseline ``(u, 0)``, ``u`` the uniform attention over the allowed
    keys); the scores' share is carried through the softmax by ``J̃ = ∫₀¹ J(t·s) dt``
    (``J̃·s = α − u`` for the exact integral) and split evenly onto queries and keys.
    Complete up to the quadrature error of ``J̃·s``, which the convergence delta shows; with
    ``exact=True`` that error, ``r = α − u − J̃_q·s̄`` (computed from the real pass), is handed
    to the tokens through the frozen probabilities (the values get ``½(α + u + r)``), so the
    rule is complete at any number of points.

    Args:
        n_steps (int): Gauss–Legendre points for ``J̃`` (the error falls geometrically; sharp
                    attention, with a wide spread of scores in a row, needs more).
        exact (bool): hand the quadrature error to the tokens (see above).

    Examples::

        >>> nd = NormDecomposition(model, rules={"attention": IGAttention(n_steps=32)})
        >>> nd = NormDecomposition(model, rules={"attention": IGAttention(n_steps=4, exact=True)})
    """

    def __init__(self, n_steps: int = 32, exact: bool = False) -> None:
        if n_steps < 1:
            raise ValueError("n_steps must be at least 1")
        self.n_steps = int(n_steps)
        self.exact = bool(exact)

    def __repr__(self) -> str:
        return f"IGAttention(n_steps={self.n_steps}{', exact=True' if self.exact else ''})"

    @property
    def remainder_to_values(self) -> bool:
        return self.exact

    @property
    def steps(self) -> int:  # type: ignore[override]
        return self.n_steps

    def value_coefficients(self, probs: Tensor, allowed: Tensor) -> Tensor:
        return 0.5 * (probs + uniform_attention(allowed, probs.dtype))

    def softmax_map(self, scores, allowed, probs, softcap, remainder: bool = True):
        nodes, weights = gauss_legendre(self.n_steps)
        softmax = _MaskedSoftmax(allowed, scores.dtype)
        steps, slopes = [], []
        for t in nodes:
            if softcap is None:
                steps.append(softmax.scaled(scores, t))
                slopes.append(None)
                continue
            capped, slope = soft_capped(t * scores, softcap)
            steps.append(softmax(capped))
            slopes.append(slope)
        linear = SoftmaxLinearisation(weights, steps, slopes)
        if not (self.exact and remainder):
            return linear, None
        if probs is None:
            probs = softmax(soft_capped(scores, softcap)[0])
        return linear, probs * allowed - uniform_attention(allowed, scores.dtype) - linear.apply(scores)


class AttnLRPAttention(ScoreCreditingAttention):
    r"""AttnLRP's attention rules (Achtibat et al., ICML 2024) as a rule by role.

    The uniform rule on the bilinear products (``α·V``: half to the values, half to the
    probabilities; ``q·kᵀ``: half to queries, half to keys) and the softmax linearised at
    the real scores, ``R_s = s ⊙ (R_α − α Σ R_α)`` (its Jacobian ``J(s̄)`` applied to the
    scores, so that input × gradient is what the rule conserves). The rest of the
    probabilities, ``α − J(s̄)·s̄``, is owed to no token (the bias player), as is any
    relevance the ε-free rules do not pass on; with soft-capping the slope of the cap at
    the real scores is part of the Jacobian.

    Examples::

        >>> nd = NormDecomposition(model, rules={"attention": AttnLRPAttention()})
    """

    def value_coefficients(self, probs: Tensor, allowed: Tensor) -> Tensor:
        return 0.5 * probs

    def softmax_map(self, scores, allowed, probs, softcap, remainder: bool = True):
        _, slope = soft_capped(scores, softcap)
        if probs is None:
            probs = masked_softmax(soft_capped(scores, softcap)[0], allowed)
        probs = probs * allowed
        linear = SoftmaxLinearisation([1.0], [probs], [slope])
        return linear, (probs - linear.apply(scores) if remainder else None)

    def backward_maps(self, scores, allowed, softcap):
        if softcap is not None:
            return super().backward_maps(scores, allowed, softcap)
        probs = masked_softmax(scores, allowed)  # 0 off the allowed keys
        linear = SoftmaxLinearisation([1.0], [probs], [None])
        if not self.needs_remainder:
            return 0.5 * probs, linear
        # ½α + ½e = α − ½ J(s̄)·s̄ = α − ½ α ⊙ (s̄ − ⟨α, s̄⟩)
        coefficients = (scores - row_dot(probs, scores)).mul_(-0.5).add_(1).mul_(probs)
        return coefficients, linear


class CompleteAttnLRPAttention(AttnLRPAttention):
    r"""AttnLRP's attention rule with nothing owed to no token: the part of the probabilities
    its linearised softmax leaves, ``e = α − J(s̄)·s̄``, is handed to the tokens through the
    frozen probabilities (``½ e·V`` split as the values are), instead of to the bias player.

    The values get ``½α + ½e = α − ½ J(s̄)·s̄`` and the scores ``½ J(s̄)·s`` through the real
    values ``V̄``; the two add up to ``α·V`` exactly, so on a model without bias terms the
    tokens own the whole output (``Σ_j c_j`` = the explained value, reference zero). Where
    attention is saturated (``J(s̄) ≈ 0``) it is the paper's frozen rule; where it is flat,
    AttnLRP's.

    Examples::

        >>> nd = NormDecomposition(model, rules={"attention": CompleteAttnLRPAttention()})
    """

    remainder_to_values = True
