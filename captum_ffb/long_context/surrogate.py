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
ablations is dropped, not turned round). Without a prior it is a ridge fit with an intercept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Surrogate", "ablated_context", "ablation_masks", "fit_surrogate"]

#: The ridge penalties tried, as multiples of the mean squared singular value of the centred
#: ablations (the scale at which shrinkage starts to matter).
PENALTIES = tuple(10.0 ** k for k in range(-3, 4))


@dataclass
class Surrogate:
    """A fitted surrogate: ``value ≈ bias + Σ_{kept} scores``.

    Attributes:
        scores (Tensor): ``(S,)`` each source's weight, ``c·prior + δ``.
        bias (float): the value with every source removed, by the fit.
        scale (float): ``c``, the prior's factor (0 without a prior).
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
    if prior is not None and prior.shape != (masks.shape[1],):
        raise ValueError(f"prior must be ({masks.shape[1]},), got {tuple(prior.shape)}")
    if not (torch.isfinite(values).all() and (prior is None or torch.isfinite(prior).all())):
        raise ValueError("values and prior must be finite")


def fit_surrogate(masks, values, prior=None) -> Surrogate:
    """Fit ``values ≈ b + masks @ (c·prior + δ)`` with ``δ`` ridge-penalised (see the module).

    Args:
        masks: ``(m, S)`` the ablations, true or 1 where a source is kept.
        values: ``(m,)`` the answer's value on each ablation.
        prior: ``(S,)`` the scores to shrink toward (``None``: toward zero).

    Returns:
        Surrogate
    """
    masks = torch.as_tensor(masks).to(torch.float64)
    values = torch.as_tensor(values).to(torch.float64)
    prior = None if prior is None else torch.as_tensor(prior).to(torch.float64)
    _check(masks, values, prior)
    m = masks.shape[0]
    free = torch.ones(m, 1, dtype=torch.float64)
    if prior is not None:
        free = torch.cat([free, (masks @ prior)[:, None]], 1)
    # the unpenalised columns projected out of both sides
    basis, _ = torch.linalg.qr(free)
    project = lambda x: x - basis @ (basis.T @ x)  # noqa: E731
    x, y = project(masks), project(values)
    u, d, _ = torch.linalg.svd(x, full_matrices=False)
    scale2 = float((d ** 2).mean()) or 1.0
    uy = u.T @ y
    best = None
    for factor in PENALTIES:
        penalty = factor * scale2
        shrink = d ** 2 / (d ** 2 + penalty)
        residual = float(((y - u @ (shrink * uy)) ** 2).sum())
        dof = free.shape[1] + float(shrink.sum())
        if m - dof <= 0.5:
            continue
        score = m * residual / (m - dof) ** 2
        if best is None or score < best[0]:
            best = (score, penalty)
    penalty = best[1] if best is not None else PENALTIES[-1] * scale2
    delta = torch.linalg.solve(x.T @ x + penalty * torch.eye(x.shape[1], dtype=torch.float64), x.T @ y)
    coefficients = torch.linalg.lstsq(free, (values - masks @ delta)[:, None]).solution[:, 0]
    bias, scale = float(coefficients[0]), float(coefficients[1]) if prior is not None else 0.0
    if scale < 0:  # the prior predicts against the ablations: fit without it
        return fit_surrogate(masks, values, None)
    scores = delta + (scale * prior if prior is not None else 0.0)
    fitted = bias + masks @ scores
    return Surrogate(scores=scores, bias=bias, scale=scale, penalty=penalty,
                     residual=float(((values - fitted) ** 2).mean().sqrt()))


def ablated_context(context: str, spans: Sequence[tuple[int, int]], keep: Sequence[bool]) -> str:
    """``context`` with only the kept groups, each kept group after the first with the white
    space before it (the convention of ContextCite's partitioner)."""
    if len(keep) != len(spans):
        raise ValueError(f"{len(keep)} keep flags for {len(spans)} groups")
    parts, end = [], 0
    for kept, (start, stop) in zip(keep, spans):
        if kept:
            parts.append((context[end:start] if parts else "") + context[start:stop])
        end = stop
    return "".join(parts)


def ablation_masks(n_groups: int, ablations: int, seed: int = 0) -> Tensor:
    """``(ablations, n_groups)`` booleans, each group kept with probability ½ (``torch``'s
    generator seeded with ``seed``)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(ablations, n_groups, generator=generator, dtype=torch.float64) < 0.5
