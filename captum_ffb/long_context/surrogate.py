r"""A linear surrogate of the answer over ablations of the context, fitted around a prior.

ContextCite (Cohen-Wang, Shah, Georgiev and Mądry 2024, arXiv:2409.00729) fits the answer's
value on random ablations (each source kept with probability ½) by a sparse linear model:
a source's score is its weight. With few ablations the fit is noisy. Here the weights are
shrunk toward a prior instead of toward zero, the prior being a few gradients' scores
(``context_attribution`` by presence, the default, or by the decomposition): on ``m`` ablations
``M`` (``m × S``, 1 = kept) with values ``y``,

.. math::
    y ≈ b + M (c\,s + δ), \qquad \min_{b, c, δ} \|y − b − c\,M s − M δ\|^2 + λ \|δ\|^2,

``b`` and ``c`` unpenalised, ``λ`` chosen by generalised cross-validation over a grid (no
held-out ablation is spent on it), ``c`` kept ≥ 0 (a prior that predicts against the
ablations is dropped, not turned round). Several priors (rows ``s_k``) enter as ``Σ_k c_k s_k``,
each factor fitted and kept ≥ 0. Without a prior it is a ridge fit with an intercept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Surrogate", "ablated_context", "ablated_spans", "ablation_masks", "fit_surrogate", "focus_groups"]

#: The ridge penalties tried, as multiples of the mean squared singular value of the centred
#: ablations (the scale at which shrinkage starts to matter).
PENALTIES = tuple(10.0 ** k for k in range(-3, 4))


@dataclass
class Surrogate:
    """A fitted surrogate: ``value ≈ bias + Σ_{kept} scores``.

    Attributes:
        scores (Tensor): ``(S,)`` each source's weight, ``c·prior + δ``.
        bias (float): the value with every source removed, by the fit.
        scale (float or tuple): ``c``, the prior's factor (0 without a prior; one per prior
                    when several were given, 0 for one dropped).
        penalty (float): the chosen ``λ``.
        residual (float): the root mean square of the fit's residuals on the ablations.
    """

    scores: Tensor
    bias: float
    scale: float
    penalty: float
    residual: float


def _check(masks: Tensor, values: Tensor, prior: Tensor | None) -> None:
    if masks.dim() != 2 or values.dim() != 1 or masks.shape[0] != values.shape[0]:
        raise ValueError(f"masks must be (m, S) and values (m,), got {tuple(masks.shape)} and {tuple(values.shape)}")
    if masks.shape[0] < 3:
        raise ValueError(f"at least 3 ablations are needed to fit, got {masks.shape[0]}")
    if prior is not None and (prior.dim() not in (1, 2) or prior.shape[-1] != masks.shape[1]):
        raise ValueError(f"prior must be ({masks.shape[1]},) or (K, {masks.shape[1]}), got {tuple(prior.shape)}")
    if not (torch.isfinite(values).all() and (prior is None or torch.isfinite(prior).all())):
        raise ValueError("values and prior must be finite")


def fit_surrogate(masks, values, prior=None) -> Surrogate:
    """Fit ``values ≈ b + masks @ (c·prior + δ)`` with ``δ`` ridge-penalised (see the module).

    Args:
        masks: ``(m, S)`` the ablations, true or 1 where a source is kept.
        values: ``(m,)`` the answer's value on each ablation.
        prior: ``(S,)`` the scores to shrink toward, or ``(K, S)`` several, each with its own
                    factor (``None``: toward zero).

    Returns:
        Surrogate
    """
    masks = torch.as_tensor(masks).to(torch.float64)
    values = torch.as_tensor(values).to(torch.float64)
    prior = None if prior is None else torch.as_tensor(prior).to(torch.float64)
    _check(masks, values, prior)
    if prior is None:
        fit = _fit_combined(masks, values, masks.new_zeros(0, masks.shape[1]))
        fit.scale = 0.0
        return fit
    if prior.dim() == 2:
        return _fit_several(masks, values, prior)
    fit = _fit_several(masks, values, prior[None])
    fit.scale = fit.scale[0]
    return fit


def _fit_several(masks: Tensor, values: Tensor, priors: Tensor) -> Surrogate:
    """:func:`fit_surrogate` toward ``Σ_k c_k priors[k]``, every ``c_k`` fitted with the
    others; a prior whose factor comes out negative is dropped (the most negative first)."""
    kept = list(range(priors.shape[0]))
    while True:
        fit = _fit_combined(masks, values, priors[kept])
        factors = fit.scale
        if not kept or min(factors) >= 0:  # a prior predicting against the ablations is dropped
            scale = [0.0] * priors.shape[0]
            for k, factor in zip(kept, factors):
                scale[k] = factor
            fit.scale = tuple(scale)
            return fit
        kept.pop(min(range(len(kept)), key=factors.__getitem__))


def _fit_combined(masks: Tensor, values: Tensor, priors: Tensor) -> Surrogate:
    """The fit toward ``Σ_k c_k priors[k]`` with every ``c_k`` free (sign unchecked); ``scale``
    the list of factors."""
    m = masks.shape[0]
    free = torch.cat([torch.ones(m, 1, dtype=torch.float64), masks @ priors.T], 1)
    basis, _ = torch.linalg.qr(free)
    x = masks - basis @ (basis.T @ masks)
    y = values - basis @ (basis.T @ values)
    penalty = _penalty(x, y, free.shape[1])
    delta = torch.linalg.solve(x.T @ x + penalty * torch.eye(x.shape[1], dtype=torch.float64), x.T @ y)
    coefficients = torch.linalg.lstsq(free, (values - masks @ delta)[:, None]).solution[:, 0]
    scores = delta + coefficients[1:] @ priors
    fitted = float(coefficients[0]) + masks @ scores
    return Surrogate(scores=scores, bias=float(coefficients[0]), scale=coefficients[1:].tolist(),
                     penalty=penalty, residual=float(((values - fitted) ** 2).mean().sqrt()))


def _penalty(x: Tensor, y: Tensor, unpenalised: int) -> float:
    """The ridge penalty of :data:`PENALTIES` with the lowest generalised cross-validation
    error, for ``x``, ``y`` with the ``unpenalised`` columns projected out."""
    m = x.shape[0]
    u, d, _ = torch.linalg.svd(x, full_matrices=False)
    scale2 = float((d ** 2).mean()) or 1.0
    uy = u.T @ y
    best = None
    for factor in PENALTIES:
        penalty = factor * scale2
        shrink = d ** 2 / (d ** 2 + penalty)
        residual = float(((y - u @ (shrink * uy)) ** 2).sum())
        dof = unpenalised + float(shrink.sum())
        if m - dof <= 0.5:
            continue
        score = m * residual / (m - dof) ** 2
        if best is None or score < best[0]:
            best = (score, penalty)
    return best[1] if best is not None else PENALTIES[-1] * scale2


def ablated_context(context: str, spans: Sequence[tuple[int, int]], keep: Sequence[bool]) -> str:
    """``context`` with only the kept groups, each kept group after the first with the white
    space before it (the convention of ContextCite's partitioner)."""
    return ablated_spans(context, spans, keep)[0]


def ablated_spans(context: str, spans: Sequence[tuple[int, int]], keep: Sequence[bool]
                  ) -> tuple[str, list[tuple[int, int]]]:
    """:func:`ablated_context` and the kept groups' spans ``(start, end)`` in it."""
    if len(keep) != len(spans):
        raise ValueError(f"{len(keep)} keep flags for {len(spans)} groups")
    parts, kept_spans, end, length = [], [], 0, 0
    for kept, (start, stop) in zip(keep, spans):
        if kept:
            before = context[end:start] if parts else ""
            kept_spans.append((length + len(before), length + len(before) + stop - start))
            parts.append(before + context[start:stop])
            length += len(parts[-1])
        end = stop
    return "".join(parts), kept_spans


def ablation_masks(n_groups: int, ablations: int, seed: int = 0, among: Sequence[int] | None = None) -> Tensor:
    """``(ablations, n_groups)`` booleans, each group kept with probability ½ (``torch``'s
    generator seeded with ``seed``); with ``among``, only those groups are drawn, every other
    one kept."""
    generator = torch.Generator().manual_seed(seed)
    if among is None:
        return torch.rand(ablations, n_groups, generator=generator, dtype=torch.float64) < 0.5
    among = torch.as_tensor(list(among), dtype=torch.long)
    if among.numel() and (among.min() < 0 or among.max() >= n_groups or among.unique().numel() != among.numel()):
        raise ValueError(f"among must name distinct groups of 0…{n_groups - 1}")
    keep = torch.ones(ablations, n_groups, dtype=torch.bool)
    keep[:, among] = torch.rand(ablations, among.numel(), generator=generator, dtype=torch.float64) < 0.5
    return keep


def focus_groups(prior, other, focus: int, leading: Sequence[int] = ()) -> list[int]:
    """The candidate groups of a focused design: the ``focus // 2`` of largest score in
    ``prior`` and in ``other`` (the decomposition; ``leading`` groups, its greedy picks, ranked
    before its order), then ``prior``'s next ones up to ``focus`` (ties: the earlier group
    first)."""
    prior, other = torch.as_tensor(prior, dtype=torch.float64), torch.as_tensor(other, dtype=torch.float64)
    if prior.dim() != 1 or prior.shape != other.shape:
        raise ValueError(f"prior and other must be (S,) alike, got {tuple(prior.shape)} and {tuple(other.shape)}")
    if any(not 0 <= j < prior.shape[0] for j in leading):
        raise ValueError(f"leading must name groups of 0…{prior.shape[0] - 1}")
    by_prior = _ranked(prior)
    by_other = list(dict.fromkeys([*map(int, leading), *_ranked(other)]))
    chosen = list(dict.fromkeys([*by_prior[:focus // 2], *by_other[:focus // 2]]))
    chosen += [j for j in by_prior if j not in chosen][:max(0, focus - len(chosen))]
    return chosen


def _ranked(scores: Tensor) -> list[int]:
    """The groups by decreasing score, ties in order (a stable sort)."""
    return torch.sort(-scores, stable=True).indices.tolist()
