"""Activation rules: Integrated Gradients (zero baseline) over the tokens' shares of the input.

For an element-wise activation ``g`` applied to ``S = Σ_j u_j + u_b`` the integral has a closed
form, ``IG_j = u_j · (g(S) − g(0)) / S``; the numeric route through Captum's
:class:`~captum.attr.IntegratedGradients` computes the same numbers and stays available for
checking. Gated activations ``g(A) ⊙ B`` need one 1-D integral per output element.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from captum_ffb.decomposition import Decomposition, FactoredDecomposition, TokenwiseDecomposition

ActivationFn = Callable[[Tensor], Tensor]

ROUTES = ("closed_form", "captum")


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
    value = fn(pre_activation) - g0
    zero = pre_activation == 0
    safe = torch.where(zero, torch.ones_like(pre_activation), pre_activation)
    return torch.where(zero, slope0, value / safe), g0


def activation(
    decomposition: Decomposition,
    fn: ActivationFn,
    pre_activation: Tensor | None = None,
    route: str = "closed_form",
    method: str = "gausslegendre",
    n_steps: int = 50,
    internal_batch_size: int | None = None,
) -> Decomposition:
    r"""Decompose an element-wise activation ``g(S)`` with Integrated Gradients.

    The players are the tokens' shares ``u_j`` of the pre-activation and the bias share
    ``u_b``; the baseline is zero and the path straight. ``g(0)`` (zero for GELU, ReLU, SiLU)
    joins the bias, so completeness holds exactly.

    Args:
        decomposition (Decomposition): decomposition of the pre-activation ``S``.
        fn (Callable): the activation ``g``.
        pre_activation (Tensor, optional): the real ``S`` ``(B, n_out, d)``; by default the
                    decomposition's own total.
        route (str): ``"closed_form"`` (default, exact) or ``"captum"`` (numeric integral with
                    :class:`captum.attr.IntegratedGradients`).
        method (str): Captum's integration method for the ``"captum"`` route.
        n_steps (int): Captum's number of steps for the ``"captum"`` route.
        internal_batch_size (int, optional): Captum's ``internal_batch_size`` for that route.

    Returns:
        Dense decomposition of ``g(S)``.
    """
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    if route == "captum":
        return _captum_activation(decomposition, fn, method, n_steps, internal_batch_size)
    total = decomposition.total() if pre_activation is None else pre_activation
    coeff, g0 = activation_coefficients(fn, total.to(decomposition.bias.dtype))
    if isinstance(decomposition, TokenwiseDecomposition):
        return TokenwiseDecomposition(
            decomposition.vectors * coeff, decomposition.bias * coeff + g0, decomposition.token_mask
        )
    if isinstance(decomposition, FactoredDecomposition):
        terms = decomposition.terms  # materialised afresh: scale it in place
        terms.mul_(coeff[:, :, None, :])
    else:  # stored terms: leave them untouched
        terms = decomposition.terms * coeff[:, :, None, :]
    return Decomposition(terms, decomposition.bias * coeff + g0, decomposition.token_mask)


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


def gated_activation(
    gate: Decomposition,
    up: Decomposition,
    fn: ActivationFn,
    real_gate: Tensor | None = None,
    real_up: Tensor | None = None,
    n_points: int = 32,
    mean_value: Callable[[Tensor], Tensor] | None = None,
    route: str = "closed_form",
    method: str = "gausslegendre",
    n_steps: int = 50,
) -> Decomposition:
    r"""Decompose a gated activation ``g(A) ⊙ B`` (SwiGLU, GeGLU) with Integrated Gradients.

    With zero baseline over the shares of ``A`` and ``B``:
    ``IG_{a_j} = a_j · ∫₀¹ t g'(tA) B dt`` and ``IG_{b_j} = b_j · ∫₀¹ g(tA) dt``. Neither
    integral depends on ``j``; with ``m = ∫₀¹ g(tA) dt`` (one quadrature per output element)
    integration by parts gives ``∫₀¹ t g'(tA) dt = (g(A) − m) / A``, so the two coefficients
    add up to ``g(A)·B`` exactly.

    Args:
        gate (Decomposition): decomposition of ``A`` (the gate projection).
        up (Decomposition): decomposition of ``B`` (the up projection), same rows and tokens.
        fn (Callable): ``g``.
        real_gate (Tensor, optional): the real ``A``; by default ``gate``'s total.
        real_up (Tensor, optional): the real ``B``; by default ``up``'s total.
        n_points (int): Gauss–Legendre nodes for ``m``.
        mean_value (Callable, optional): a closed form of ``A ↦ ∫₀¹ g(tA) dt``, used instead
                    of quadrature (by default one is looked up for ``g``, see
                    :func:`mean_value_closed_form`).
        route (str): ``"closed_form"`` (the formulas above, default) or ``"captum"``
                    (Captum's ``IntegratedGradients`` over the pairs ``(a_j, b_j)``, for checking).
        method (str): Captum's integration method for the ``"captum"`` route.
        n_steps (int): Captum's number of steps for the ``"captum"`` route.
    """
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    if route == "captum":
        return _captum_gated(gate, up, fn, method, n_steps)
    mean_value = mean_value or mean_value_closed_form(fn)
    dtype = gate.bias.dtype
    a = (gate.total() if real_gate is None else real_gate).to(dtype)
    b = (up.total() if real_up is None else real_up).to(dtype)
    m = mean_value(a) if mean_value is not None else gate_mean_value(fn, a, n_points)
    _, slope0 = _value_at_zero(fn, a)
    zero = a == 0
    safe = torch.where(zero, torch.ones_like(a), a)
    coeff_gate = b * torch.where(zero, slope0 / 2, (fn(a) - m) / safe)
    coeff_up = m
    bias = gate.bias * coeff_gate + up.bias * coeff_up
    if isinstance(gate, TokenwiseDecomposition) and isinstance(up, TokenwiseDecomposition):
        vectors = gate.vectors * coeff_gate + up.vectors * coeff_up
        return TokenwiseDecomposition(vectors, bias, gate.token_mask)
    terms = _fresh_terms(gate)
    terms.mul_(coeff_gate[:, :, None, :])
    terms.addcmul_(_fresh_terms(up), coeff_up[:, :, None, :])
    return Decomposition(terms, bias, gate.token_mask)


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
    return Decomposition(total[:, :, :n_in].contiguous(), total[:, :, n_in], gate.token_mask)


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


def mean_value_closed_form(fn: ActivationFn) -> Callable[[Tensor], Tensor] | None:
    """A closed form of ``A ↦ ∫₀¹ g(tA) dt`` for activations that have one (exact GELU,
    ReLU), else ``None`` (then quadrature is used)."""
    if isinstance(fn, torch.nn.ReLU) or fn is torch.relu:
        return _relu_mean_value
    name = type(fn).__name__
    approximate = getattr(fn, "approximate", "none")
    if name == "GELU" and approximate == "none":
        return _exact_gelu_mean_value
    if name == "GELUActivation" and getattr(fn, "act", None) is torch.nn.functional.gelu:
        return _exact_gelu_mean_value
    return None
