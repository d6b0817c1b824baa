"""Activation rules: how ``g(S)`` and ``g(A) ⊙ B`` are shared among the players of ``S``.

The default is Integrated Gradients with a zero baseline over the players' shares of the
pre-activation (the paper's choice). For an element-wise ``g`` applied to
``S = Σ_j u_j + u_b`` the integral has the closed form ``IG_j = u_j · (g(S) − g(0)) / S``;
the numeric route through Captum's :class:`~captum.attr.IntegratedGradients` computes the
same numbers and stays available for checking. Gated activations ``g(A) ⊙ B`` need one 1-D
integral per output element.

The alternatives people compare against are rules too: the linearised rule (gradient times
input, ``F ⊙ g'(S)``: not complete, and its convergence delta says by how much) and the
"FF owed to no token" rule (the activation's whole output goes to the bias, so the FF block
adds nothing to any token's share: the view of Kobayashi et al. 2021). Shapley values are in
:mod:`captum_ffb.rules.shapley`.

Every rule whose coefficients are fixed by the real pre-activation also gives them to the
one-backward-pass route: :meth:`slope` (element-wise) or :meth:`slopes` (gated) is the
derivative of the rule's frozen linear map.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from captum_ffb.core.decomposition import (
    Decomposition,
    FactoredDecomposition,
    TokenwiseDecomposition,
    no_terms,
)
from captum_ffb.rules.base import Rule
from captum_ffb.rules.fused import fused

ActivationFn = Callable[[Tensor], Tensor]

ROUTES = ("closed_form", "captum")


def _check_route(route: str) -> None:
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")


def _scale_terms(decomposition: Decomposition, coeff: Tensor, bias: Tensor) -> Decomposition:
    """``F ⊙ coeff`` row by row (``coeff`` ``(B, n_out, d)``), with the given new bias."""
    if isinstance(decomposition, TokenwiseDecomposition):
        return TokenwiseDecomposition(decomposition.vectors * coeff, bias, decomposition.token_mask)
    if isinstance(decomposition, FactoredDecomposition):
        terms = decomposition.terms  # materialised afresh: scale it in place
        terms.mul_(coeff[:, :, None, :])
    else:  # stored terms: leave them untouched
        terms = decomposition.terms * coeff[:, :, None, :]
    return Decomposition(terms, bias, decomposition.token_mask, player_mask=decomposition.player_mask)


def _real(value: Tensor | None, decomposition: Decomposition) -> Tensor:
    total = decomposition.total() if value is None else value
    return total.to(decomposition.bias.dtype)


def _slope_at(fn: ActivationFn, x: Tensor) -> Tensor:
    """``g'(x)`` element-wise, by autograd."""
    with torch.enable_grad():
        point = x.detach().clone().requires_grad_(True)
        (slope,) = torch.autograd.grad(fn(point).sum(), point)
    return slope.detach()


# --------------------------------------------------------------------------- element-wise
@dataclass
class IGActivation(Rule):
    r"""Integrated Gradients (zero baseline, straight path) for an element-wise ``g(S)``.

    The players are the tokens' shares ``u_j`` of the pre-activation and the bias share
    ``u_b``. ``g(0)`` (zero for GELU, ReLU, SiLU) joins the bias, so completeness holds.

    Call: ``IGActivation()(decomposition, fn, pre_activation)`` with the decomposition of
    ``S``, the activation ``g`` and the real ``S`` ``(B, n_out, d)`` (``None``: the
    decomposition's own total).

    Args:
        route (str): ``"closed_form"`` (default: ``IG_j = u_j (g(S) − g(0)) / S``, exact) or
                    ``"captum"`` (the integral computed by :class:`captum.attr.IntegratedGradients`
                    with one example per output row; for checking).
        method (str): Captum's integration method for the ``"captum"`` route.
        n_steps (int): Captum's number of steps for the ``"captum"`` route.
        internal_batch_size (int, optional): Captum's ``internal_batch_size`` for that route.

    Examples::

        >>> from captum_ffb import LayerNormDecomposition
        >>> from captum_ffb.rules import IGActivation
        >>> lnd = LayerNormDecomposition(model, layer,
        ...                              rules={"activation": IGActivation(route="captum")})
    """

    route: str = "closed_form"
    method: str = "gausslegendre"
    n_steps: int = 50
    internal_batch_size: int | None = None

    role = "activation"

    def __post_init__(self) -> None:
        _check_route(self.route)

    @property
    def linear_in_players(self) -> bool:  # type: ignore[override]
        return self.route == "closed_form"

    def slope(self, fn: ActivationFn, pre_activation: Tensor) -> Tensor:
        """The frozen coefficient ``(g(S) − g(0)) / S`` (``g'(0)`` where ``S = 0``)."""
        return activation_coefficients(fn, pre_activation)[0]

    def __call__(self, decomposition: Decomposition, fn: ActivationFn,
                 pre_activation: Tensor | None = None) -> Decomposition:
        if self.route == "captum":
            return _captum_activation(decomposition, fn, self.method, self.n_steps,
                                      self.internal_batch_size)
        coeff, g0 = activation_coefficients(fn, _real(pre_activation, decomposition))
        return _scale_terms(decomposition, coeff, decomposition.bias * coeff + g0)


@dataclass
class LinearisedActivation(Rule):
    r"""Gradient times input for an element-wise ``g(S)``: ``F' = F ⊙ g'(S)``, ``b' = b ⊙ g'(S)``.

    The first-order view many gradient methods take. It is not complete (``S g'(S) ≠ g(S)``
    for a curved ``g``): the convergence delta of a decomposition using it measures the gap.
    Call as :class:`IGActivation`.
    """

    role = "activation"

    def slope(self, fn: ActivationFn, pre_activation: Tensor) -> Tensor:
        """``g'(S)``."""
        return _slope_at(fn, pre_activation)

    def __call__(self, decomposition: Decomposition, fn: ActivationFn,
                 pre_activation: Tensor | None = None) -> Decomposition:
        slope = self.slope(fn, _real(pre_activation, decomposition))
        return _scale_terms(decomposition, slope, decomposition.bias * slope)


@dataclass
class NoTokenActivation(Rule):
    r"""The activation's whole output ``g(S)`` is owed to no token (it goes to the bias).

    With it the FF block adds nothing to any token's share: every token term after the FF
    comes through the residual, the view of Kobayashi et al. (2021), which left FF out.
    Complete. Call as :class:`IGActivation`.
    """

    role = "activation"

    def slope(self, fn: ActivationFn, pre_activation: Tensor) -> Tensor:
        """Zero: no token's share passes."""
        return torch.zeros_like(pre_activation)

    def __call__(self, decomposition: Decomposition, fn: ActivationFn,
                 pre_activation: Tensor | None = None) -> Decomposition:
        real = _real(pre_activation, decomposition)
        return no_terms(decomposition, fn(real))


# --------------------------------------------------------------------------- gated
@dataclass
class GatedIGActivation(Rule):
    r"""Integrated Gradients (zero baseline) for a gated activation ``g(A) ⊙ B`` (SwiGLU, GeGLU).

    Over the shares of ``A`` and ``B``: ``IG_{a_j} = a_j · ∫₀¹ t g'(tA) B dt`` and
    ``IG_{b_j} = b_j · ∫₀¹ g(tA) dt``. Neither integral depends on ``j``; with
    ``m = ∫₀¹ g(tA) dt`` (one quadrature per output element, or a closed form for exact GELU
    and ReLU) integration by parts gives ``∫₀¹ t g'(tA) dt = (g(A) − m) / A``, so the two
    coefficients add up to ``g(A)·B`` exactly.

    Call: ``GatedIGActivation()(gate, up, fn, real_gate, real_up)`` with the decompositions
    of ``A`` (gate projection) and ``B`` (up projection), ``g``, and the real ``A`` and ``B``
    (``None``: the decompositions' totals).

    Args:
        route (str): ``"closed_form"`` (the formulas above, default) or ``"captum"``
                    (Captum's ``IntegratedGradients`` over the pairs ``(a_j, b_j)``, for checking).
        method (str): Captum's integration method for the ``"captum"`` route.
        n_steps (int): Captum's number of steps for the ``"captum"`` route.
        n_points (int): Gauss–Legendre nodes for ``m``.
        mean_value (Callable, optional): a closed form of ``A ↦ ∫₀¹ g(tA) dt``, used instead
                    of quadrature (by default one is looked up for ``g``, see
                    :func:`mean_value_closed_form`).

    Examples::

        >>> lnd = LayerNormDecomposition(llama, llama.model.layers[0], rules={
        ...     "gated_activation": GatedIGActivation(route="captum", n_steps=64)})
    """

    route: str = "closed_form"
    method: str = "gausslegendre"
    n_steps: int = 50
    n_points: int = 32
    mean_value: Callable[[Tensor], Tensor] | None = None

    role = "gated_activation"

    def __post_init__(self) -> None:
        _check_route(self.route)

    @property
    def linear_in_players(self) -> bool:  # type: ignore[override]
        return self.route == "closed_form"

    def slopes(self, fn: ActivationFn, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """The frozen coefficients ``(B (g(A) − m) / A, m)`` of the gate and up shares."""
        mean_value = self.mean_value or mean_value_closed_form(fn)
        _, slope0 = _value_at_zero(fn, a)
        if mean_value is None:
            return _gated_coefficients(fn, gate_mean_value(fn, a, self.n_points), a, b, slope0 / 2)
        return _gated_ig_slopes(mean_value, fn)(a, b, slope0 / 2)

    def __call__(self, gate: Decomposition, up: Decomposition, fn: ActivationFn,
                 real_gate: Tensor | None = None, real_up: Tensor | None = None) -> Decomposition:
        if self.route == "captum":
            return _captum_gated(gate, up, fn, self.method, self.n_steps)
        coeff_gate, coeff_up = self.slopes(fn, _real(real_gate, gate), _real(real_up, up))
        return _combine_gated(gate, up, coeff_gate, coeff_up)


@dataclass
class LinearisedGatedActivation(Rule):
    r"""Gradient times input for ``g(A) ⊙ B``: shares of ``A`` times ``g'(A) B``, of ``B`` times ``g(A)``.

    Not complete (the gate's part is counted to first order only); its convergence delta
    measures the gap. Call as :class:`GatedIGActivation`.
    """

    role = "gated_activation"

    def slopes(self, fn: ActivationFn, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """``(g'(A) B, g(A))``."""
        return _slope_at(fn, a) * b, fn(a)

    def __call__(self, gate: Decomposition, up: Decomposition, fn: ActivationFn,
                 real_gate: Tensor | None = None, real_up: Tensor | None = None) -> Decomposition:
        coeff_gate, coeff_up = self.slopes(fn, _real(real_gate, gate), _real(real_up, up))
        return _combine_gated(gate, up, coeff_gate, coeff_up)


@dataclass
class UniformGatedActivation(Rule):
    r"""AttnLRP's rules for ``g(A) ⊙ B``: the identity rule on ``g``, the uniform rule on ``⊙``.

    The activation passes each share of ``A`` on in proportion, ``a_j ⊙ (g(A) − g(0)) / A``
    (the identity rule of Achtibat et al., 2024: relevance kept through an element-wise
    non-linearity; ``g(0)``, zero for SiLU and GELU, is owed to no token); the element-wise
    product is split evenly: half of ``g(A) ⊙ B`` follows the shares of ``g(A)``, half those
    of ``B``. The shares of ``A`` get ``½ B (g(A) − g(0)) / A``, those of ``B`` get ``½ g(A)``;
    with ``½ g(0) B`` owed to no token they add up to ``g(A) ⊙ B`` exactly (complete).
    Unlike :class:`GatedIGActivation` the split does not depend on how ``g`` bends between 0
    and ``A``. Call as :class:`GatedIGActivation`.

    Examples::

        >>> nd = NormDecomposition(llama, rules={"gated_activation": UniformGatedActivation()})
    """

    role = "gated_activation"

    def slopes(self, fn: ActivationFn, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """``(½ B (g(A) − g(0)) / A, ½ g(A))`` (``½ B g'(0)`` where ``A = 0``)."""
        ratio, _ = activation_coefficients(fn, a)
        return 0.5 * b * ratio, 0.5 * fn(a)

    def __call__(self, gate: Decomposition, up: Decomposition, fn: ActivationFn,
                 real_gate: Tensor | None = None, real_up: Tensor | None = None) -> Decomposition:
        a, b = _real(real_gate, gate), _real(real_up, up)
        coeff_gate, coeff_up = self.slopes(fn, a, b)
        out = _combine_gated(gate, up, coeff_gate, coeff_up)
        g0, _ = _value_at_zero(fn, a)
        if bool(g0 != 0):  # the constant g(0) of the activation's decomposition: half of g(0)·B
            out = out.add_bias(0.5 * g0 * b)
        return out


@dataclass
class NoTokenGatedActivation(Rule):
    r"""The gated activation's whole output ``g(A) ⊙ B`` is owed to no token (see
    :class:`NoTokenActivation`). Call as :class:`GatedIGActivation`."""

    role = "gated_activation"

    def slopes(self, fn: ActivationFn, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """Zeros: no token's share passes."""
        return torch.zeros_like(a), torch.zeros_like(b)

    def __call__(self, gate: Decomposition, up: Decomposition, fn: ActivationFn,
                 real_gate: Tensor | None = None, real_up: Tensor | None = None) -> Decomposition:
        return no_terms(gate, fn(_real(real_gate, gate)) * _real(real_up, up))


def _combine_gated(gate: Decomposition, up: Decomposition, coeff_gate: Tensor, coeff_up: Tensor) -> Decomposition:
    """``gate ⊙ coeff_gate + up ⊙ coeff_up``, term by term."""
    bias = gate.bias * coeff_gate + up.bias * coeff_up
    if isinstance(gate, TokenwiseDecomposition) and isinstance(up, TokenwiseDecomposition):
        vectors = gate.vectors * coeff_gate + up.vectors * coeff_up
        return TokenwiseDecomposition(vectors, bias, gate.token_mask)
    terms = _fresh_terms(gate)
    terms.mul_(coeff_gate[:, :, None, :])
    terms.addcmul_(_fresh_terms(up), coeff_up[:, :, None, :])
    return Decomposition(terms, bias, gate.token_mask, player_mask=gate.player_mask)


# --------------------------------------------------------------------------- shared maths
def _value_at_zero(fn: ActivationFn, like: Tensor) -> tuple[Tensor, Tensor]:
    """``g(0)`` and ``g'(0)`` (by autograd, as Captum's gradients see it), cached per ``g``."""
    key = (id(fn), like.dtype, like.device)
    cached = _AT_ZERO.get(key)
    if cached is not None and cached[0] is fn:
        return cached[1], cached[2]
    with torch.enable_grad():
        zero = torch.zeros(1, dtype=like.dtype, device=like.device, requires_grad=True)
        value = fn(zero)
        (slope,) = torch.autograd.grad(value.sum(), zero)
    _AT_ZERO[key] = (fn, value.detach()[0], slope[0])
    return value.detach()[0], slope[0]


_AT_ZERO: dict[tuple, tuple] = {}


def _gated_coefficients(fn: ActivationFn, m: Tensor, a: Tensor, b: Tensor, half_slope0: Tensor) -> tuple[Tensor, Tensor]:
    """``(B (g(A) − m) / A, m)``, with ``B g'(0) / 2`` where ``A = 0``."""
    zero = a == 0
    safe = torch.where(zero, torch.ones_like(a), a)
    return b * torch.where(zero, half_slope0, (fn(a) - m) / safe), m


@functools.lru_cache(maxsize=64)
def _gated_ig_slopes(mean_value: Callable[[Tensor], Tensor], fn: ActivationFn) -> Callable[..., tuple[Tensor, Tensor]]:
    """The gated IG coefficients from a closed-form mean value, as one fused function."""

    def slopes(a: Tensor, b: Tensor, half_slope0: Tensor) -> tuple[Tensor, Tensor]:
        return _gated_coefficients(fn, mean_value(a), a, b, half_slope0)

    slopes.__qualname__ = f"gated IG coefficients of {getattr(fn, '__name__', type(fn).__name__)}"
    return fused(slopes)


@functools.lru_cache(maxsize=64)
def _ig_coefficients(fn: ActivationFn) -> Callable[..., Tensor]:
    """``(g(S) − g(0)) / S`` (``g'(0)`` where ``S = 0``) as one fused function."""

    def coefficients(s: Tensor, g0: Tensor, slope0: Tensor) -> Tensor:
        zero = s == 0
        safe = torch.where(zero, torch.ones_like(s), s)
        return torch.where(zero, slope0, (fn(s) - g0) / safe)

    coefficients.__qualname__ = f"IG coefficients of {getattr(fn, '__name__', type(fn).__name__)}"
    return fused(coefficients)


def activation_coefficients(fn: ActivationFn, pre_activation: Tensor) -> tuple[Tensor, Tensor]:
    r"""Closed-form IG coefficients ``r = (g(S) − g(0)) / S`` (``g'(0)`` where ``S = 0``).

    Args:
        fn (Callable): the element-wise activation ``g``.
        pre_activation (Tensor): the real pre-activation ``S``.

    Returns:
        ``(r, g(0))``: every share ``u_j`` of ``S`` maps to ``u_j ⊙ r``; ``g(0)`` is owed to no
        token.
    """
    g0, slope0 = _value_at_zero(fn, pre_activation)
    return _ig_coefficients(fn)(pre_activation, g0, slope0), g0


def _captum_activation(
    decomposition: Decomposition,
    fn: ActivationFn,
    method: str,
    n_steps: int,
    internal_batch_size: int | None,
) -> Decomposition:
    """IG through Captum: one example per output row, one player per token plus the bias."""
    from captum.attr import IntegratedGradients

    terms = decomposition.terms
    batch, n_out, n_in, width = terms.shape
    players = torch.cat([terms, decomposition.bias[:, :, None]], dim=2)
    players = players.reshape(batch * n_out, n_in + 1, width)

    def summed_activation(shares: Tensor) -> Tensor:
        # Σ over features of g(Σ_j shares_j): separable, so per-feature IG is unchanged.
        return fn(shares.sum(dim=1)).sum(dim=-1)

    g0, _ = _value_at_zero(fn, terms)
    with torch.enable_grad():
        ig = IntegratedGradients(summed_activation)
        attributions = ig.attribute(
            players,
            baselines=0.0,
            method=method,
            n_steps=n_steps,
            internal_batch_size=internal_batch_size,
        )
    attributions = attributions.detach().reshape(batch, n_out, n_in + 1, width)
    return Decomposition(
        attributions[:, :, :n_in].contiguous(),
        attributions[:, :, n_in] + g0,
        decomposition.token_mask,
        player_mask=decomposition.player_mask,
    )


def _gauss_legendre(n_points: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """Gauss–Legendre nodes and weights on ``[0, 1]``."""
    nodes, weights = np.polynomial.legendre.leggauss(n_points)
    nodes = torch.as_tensor((nodes + 1) / 2, dtype=like.dtype, device=like.device)
    weights = torch.as_tensor(weights / 2, dtype=like.dtype, device=like.device)
    return nodes, weights


def gate_mean_value(fn: ActivationFn, gate: Tensor, n_points: int = 32) -> Tensor:
    r"""``∫₀¹ g(t·A) dt`` element-wise, by Gauss–Legendre quadrature on ``n_points`` nodes.

    Computed in float64 and returned in ``gate``'s dtype.
    """
    wide = gate.to(torch.float64)
    nodes, weights = _gauss_legendre(n_points, wide)
    total = torch.zeros_like(wide)
    for t, w in zip(nodes, weights):
        total += w * fn(t * wide)
    return total.to(gate.dtype)


def _fresh_terms(decomposition: Decomposition) -> Tensor:
    """Dense terms that may be written to (the compact forms materialise them afresh)."""
    if isinstance(decomposition, FactoredDecomposition):
        return decomposition.terms
    return decomposition.terms.clone()


def _captum_gated(gate: Decomposition, up: Decomposition, fn: ActivationFn, method: str, n_steps: int) -> Decomposition:
    """IG of ``g(Σ a) ⊙ Σ b`` through Captum, one example per output row."""
    from captum.attr import IntegratedGradients

    batch, n_out, n_in, width = gate.terms.shape

    def players(dec: Decomposition) -> Tensor:
        shares = torch.cat([dec.terms, dec.bias[:, :, None]], dim=2)
        return shares.reshape(batch * n_out, n_in + 1, width)

    def forward(a_shares: Tensor, b_shares: Tensor) -> Tensor:
        return (fn(a_shares.sum(dim=1)) * b_shares.sum(dim=1)).sum(dim=-1)

    with torch.enable_grad():
        ig_a, ig_b = IntegratedGradients(forward).attribute(
            (players(gate), players(up)), method=method, n_steps=n_steps
        )
    total = (ig_a + ig_b).detach().reshape(batch, n_out, n_in + 1, width)
    return Decomposition(total[:, :, :n_in].contiguous(), total[:, :, n_in], gate.token_mask,
                         player_mask=gate.player_mask)


def _exact_gelu_mean_value(a: Tensor) -> Tensor:
    """``∫₀¹ g(tA) dt`` for the exact GELU ``g(x) = x Φ(x)``.

    From ``∫₀^A x Φ(x) dx = ((A² − 1) Φ(A) + A φ(A) + 1/2) / 2``; near zero the series
    ``A/4 + A² φ(0)/3`` avoids cancellation.
    """
    wide = a.to(torch.float64)
    cdf = 0.5 * (1 + torch.erf(wide / 2**0.5))
    pdf = torch.exp(-0.5 * wide**2) / (2 * torch.pi) ** 0.5
    safe = torch.where(wide.abs() < 1e-3, torch.ones_like(wide), wide)
    exact = ((safe**2 - 1) * cdf + safe * pdf + 0.5) / (2 * safe)
    series = wide / 4 + wide**2 / (3 * (2 * torch.pi) ** 0.5)
    return torch.where(wide.abs() < 1e-3, series, exact).to(a.dtype)


def _relu_mean_value(a: Tensor) -> Tensor:
    return a.clamp_min(0) / 2


#: Bernoulli numbers B_2k over (2k + 1)!, k = 1 … 7: Li₂(y) = u − u²/4 + Σ_k B_2k u^(2k+1) / (2k+1)!
#: with u = −ln(1 − y) (the series converges for |u| < 2π; here u ≤ ln 2, and the first term
#: left out is below 1e-15 of the sum)
_LI2_COEFFICIENTS = (1 / 36, -1 / 3600, 1 / 211680, -1 / 10886400, 1 / 526901760, -691 / 16999766784000,
                     1 / 1120863744000)


def _silu_mean_value(a: Tensor) -> Tensor:
    """``∫₀¹ g(tA) dt`` for SiLU ``g(x) = x σ(x)``, in ``a``'s dtype: float64 by the closed
    form (:func:`_silu_mean_value_wide`); float32 and narrower in float32, by the Taylor series
    where ``|A| < 1.5`` (most of an FF's pre-activations) and the closed form elsewhere, within
    3e-7 of the float64 value relative (no float64 pass over ``n × d_ff``)."""
    if a.dtype == torch.float64:
        return _silu_mean_value_wide(a)
    x = a.float()
    mean = _silu_series(x)
    far = x.abs() >= _SILU_SERIES_RADIUS
    if torch.compiler.is_compiling():  # one fused kernel: both branches cost nothing more
        return torch.where(far, _silu_closed(x), mean).to(a.dtype)
    at = far.reshape(-1).nonzero().squeeze(1)
    if len(at):
        mean.reshape(-1).index_copy_(0, at, _silu_closed(x.reshape(-1).index_select(0, at)))
    return mean.to(a.dtype)


#: ``c_k`` of SiLU's mean value ``A/4 + Σ_k c_k A^(2k)``, k = 1 … 9: ``(2^(2k) − 1) B_2k / ((2k)! (2k + 1))``
#: (from ``x σ(x) = x/2 + (x/2) tanh(x/2)``; the series converges for ``|A| < π``, and at
#: ``|A| < 1.5`` the first term left out is below 1e-9 of the sum)
_SILU_SERIES = (1 / 12, -1 / 240, 1 / 3360, -2.3423721340388008e-05, 1.9415383998717333e-06,
                -1.6645198936865603e-07, 1.4616406398813807e-08, -1.3067217542323558e-09, 1.1846189819046541e-10)
_SILU_SERIES_RADIUS = 1.5


def _silu_series(x: Tensor) -> Tensor:
    """SiLU's mean value by its Taylor series (Horner's scheme in ``A²``)."""
    square = x * x
    acc = torch.full_like(x, _SILU_SERIES[-1])
    for c in reversed(_SILU_SERIES[:-1]):
        acc.mul_(square).add_(c)
    return acc.mul_(square).add_(x, alpha=0.25)


def _silu_closed(x: Tensor) -> Tensor:
    """SiLU's mean value by its closed form (:func:`_silu_mean_value_wide`), in ``x``'s dtype:
    for ``|A|`` away from zero, where nothing cancels."""
    magnitude = x.abs()
    u = torch.exp(-magnitude).log1p_()
    u2 = u * u
    series = torch.full_like(u, _LI2_COEFFICIENTS[-1])
    for c in reversed(_LI2_COEFFICIENTS[:-1]):
        series.mul_(u2).add_(c)
    # F(−|A|) = π²/12 − u (|A| + 1) − u²/4 − u³ Σ…
    negative = series.mul_(u2).mul_(u).add_(u2, alpha=0.25).addcmul_(u, magnitude + 1).neg_().add_(torch.pi**2 / 12)
    integral = torch.where(x > 0, (x * x).mul_(0.5).sub_(negative), negative)
    return integral.div_(x)


def _silu_mean_value_wide(a: Tensor) -> Tensor:
    """``∫₀¹ g(tA) dt`` for SiLU ``g(x) = x σ(x)``, in float64.

    With ``F(A) = ∫₀^A u σ(u) du``: ``F(A) + F(−A) = A²/2``, and for ``A ≤ 0``, with ``x = e^A``
    and ``u = ln(1 + x)``, ``F(A) = A·u + Li₂(−x) + π²/12`` where Landen's identity and the
    Bernoulli series give ``Li₂(−x) = −u²/2 − u + u²/4 − Σ_k B_2k u^(2k+1)/(2k+1)!``
    (:func:`_silu_closed`). Near zero the series ``A/4 + A²/12 − A⁴/240`` avoids cancellation.
    """
    wide = a.to(torch.float64)
    near = wide.abs() < 1e-2
    closed = _silu_closed(torch.where(near, torch.ones_like(wide), wide))  # near zero: replaced below
    square = wide * wide
    return torch.where(near, wide / 4 + square / 12 - square * square / 240, closed)


def mean_value_closed_form(fn: ActivationFn) -> Callable[[Tensor], Tensor] | None:
    """A closed form of ``A ↦ ∫₀¹ g(tA) dt`` for activations that have one (exact GELU,
    ReLU, SiLU), else ``None`` (then quadrature is used)."""
    if isinstance(fn, torch.nn.ReLU) or fn is torch.relu:
        return _relu_mean_value
    name = type(fn).__name__
    approximate = getattr(fn, "approximate", "none")
    if name == "GELU" and approximate == "none":
        return _exact_gelu_mean_value
    if name == "GELUActivation" and getattr(fn, "act", None) is torch.nn.functional.gelu:
        return _exact_gelu_mean_value
    if isinstance(fn, torch.nn.SiLU) or fn is torch.nn.functional.silu or name == "SiLUActivation":
        return _silu_mean_value
    return None
