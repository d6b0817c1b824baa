r"""Gradient baselines on a layer as a function of its n input vectors ``X ↦ Y``.

For an output scalar ``y_i[k]`` a Captum method gives attributions ``A^{ik}[j, e]`` to every
input element ``x_j[e]``. The per-token-pair score aggregates them into a vector over the
output dimensions, then takes its norm:

* Integrated Gradients (zero baseline, straight path) and InputXGradient:
  ``V[i, j][k] = Σ_e A^{ik}[j, e]`` and ``M[i, j] = ‖V[i, j]‖₂``. For IG the vectors are
  complete, ``Σ_j V[i, j] = y_i(X) − y_i(0)``: they decompose the layer like the core does,
  and for a linear layer IG, InputXGradient and the exact decomposition coincide.
* Saliency (absolute gradients): the attributions have no sign to sum, so they are
  aggregated by their Euclidean norm, ``M[i, j] = (Σ_k Σ_e (∂y_i[k]/∂x_j[e])²)^{1/2}``,
  the Frobenius norm of the Jacobian block ``∂y_i/∂x_j``.

Two routes give the same numbers. ``route="captum"`` calls Captum's ``Saliency``,
``InputXGradient`` and ``IntegratedGradients`` with one example per output scalar ``(i, k)``
(``n·d`` targets, batched ``batch_size`` at a time): it is literal but needs ``n·d`` backward
passes per integration step. ``route="forward"`` (default) uses forward-mode differentiation:
``Σ_e A^{ik}[j, e] = ∫ (∂Y/∂X)(αX) · x_j dα`` is a Jacobian–vector product along token
``j``, so IG costs ``n`` forward passes per step instead of ``n·d`` backward passes, with the
same integration nodes and weights as Captum. Saliency needs the whole Jacobian either way
(``n·d`` forward passes).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from captum_ffb.baselines.captured import CapturedLayer, mask_maps

LayerFn = Callable[[Tensor], Tensor]

#: The gradient baselines: saliency, input × gradient, Integrated Gradients.
GRADIENT_METHODS = ("saliency", "ixg", "ig")
ROUTES = ("forward", "captum")


def _check(method: str, route: str, x: Tensor, batch_size: int) -> None:
    if method not in GRADIENT_METHODS:
        raise ValueError(f"method must be one of {GRADIENT_METHODS}, got {method!r}")
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    if x.dim() != 2:
        raise ValueError(f"x must be the layer input of one example (n, d), got {tuple(x.shape)}")
    if batch_size < 1:
        raise ValueError("batch_size must be a positive number of examples")


#: Integration methods, by Captum's names.
INTEGRATION_METHODS = ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle",
                       "riemann_trapezoid")


def _integration(method: str, n_steps: int) -> tuple[list[float], list[float]]:
    """Nodes ``α`` on [0, 1] and weights of the integration methods Captum offers (the same
    rules: Gauss–Legendre, or Riemann sums with left, right, middle or trapezoid nodes)."""
    if n_steps < 1:
        raise ValueError("n_steps must be positive")
    if method not in INTEGRATION_METHODS:
        raise ValueError(f"unknown integration method {method!r}; choose from {INTEGRATION_METHODS}")
    n = n_steps
    if method == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(n)
        return list((nodes + 1) / 2), list(weights / 2)
    if method == "riemann_trapezoid":
        if n < 2:
            raise ValueError("the trapezoid rule needs at least 2 steps")
        weights = [1 / n] * n
        weights[0] /= 2
        weights[-1] /= 2
        return list(np.linspace(0, 1, n)), weights
    start = {"riemann_left": 0.0, "riemann_right": 1 / n, "riemann_middle": 1 / (2 * n)}[method]
    return list(start + np.arange(n) / n), [1 / n] * n


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="pass")


def _jvp(layer_fn: LayerFn, points: Tensor, tangents: Tensor) -> Tensor:
    """``(∂Y/∂X)(points) · tangents`` by forward-mode differentiation, ``(m, n_out, d_out)``."""
    with torch.no_grad(), fwAD.dual_level():
        out = layer_fn(fwAD.make_dual(points, tangents))
        tangent = fwAD.unpack_dual(out).tangent
    if tangent is None:  # the output does not depend on the input
        return torch.zeros_like(out)
    return tangent.float()


def _fall_back(error: Exception) -> None:
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    warnings.warn(
        f"forward-mode differentiation is not available for this layer ({first}); using "
        "Captum's reverse-mode route, which needs one backward pass per output element",
        stacklevel=3,
    )


def _players(players: Sequence[int] | Tensor | None, n: int) -> list[int]:
    if players is None:
        return list(range(n))
    chosen = [int(j) for j in players]
    if any(not 0 <= j < n for j in chosen):
        raise ValueError(f"players must be token indices in [0, {n})")
    return chosen


def _forward_vectors(
    layer_fn: LayerFn, x: Tensor, method: str, players: list[int], n_steps: int,
    integration: str, batch_size: int, show_progress: bool,
) -> Tensor:
    if method == "ig":
        alphas, weights = _integration(integration, n_steps)
    else:
        alphas, weights = [1.0], [1.0]
    pairs = [(a, w, j) for a, w in zip(alphas, weights) for j in players]
    vectors: Tensor | None = None
    progress = _progress(len(pairs), show_progress, method)
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        alpha = torch.tensor([p[0] for p in chunk], dtype=x.dtype, device=x.device)
        weight = torch.tensor([p[1] for p in chunk], dtype=torch.float32, device=x.device)
        tokens = torch.tensor([p[2] for p in chunk], device=x.device)
        points = alpha[:, None, None] * x
        tangents = torch.zeros_like(points)
        tangents[torch.arange(len(chunk)), tokens] = x[tokens]
        change = _jvp(layer_fn, points, tangents) * weight[:, None, None]  # (m, n_out, d)
        if vectors is None:
            vectors = change.new_zeros(change.shape[1], x.shape[0], change.shape[2])
        vectors.index_add_(1, tokens, change.transpose(0, 1))
        if progress is not None:
            progress.update(len(chunk))
    if progress is not None:
        progress.close()
    assert vectors is not None
    return vectors


def _forward_saliency(
    layer_fn: LayerFn, x: Tensor, players: list[int], batch_size: int, show_progress: bool
) -> Tensor:
    width = x.shape[1]
    pairs = [(j, e) for j in players for e in range(width)]
    squares: Tensor | None = None
    progress = _progress(len(pairs), show_progress, "saliency")
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        tokens = torch.tensor([p[0] for p in chunk], device=x.device)
        dims = torch.tensor([p[1] for p in chunk], device=x.device)
        points = x.expand(len(chunk), -1, -1).clone()
        tangents = torch.zeros_like(points)
        tangents[torch.arange(len(chunk)), tokens, dims] = 1.0
        column = _jvp(layer_fn, points, tangents).pow(2).sum(dim=-1)  # (m, n_out)
        if squares is None:
            squares = column.new_zeros(column.shape[1], x.shape[0])
        squares.index_add_(1, tokens, column.t())
        if progress is not None:
            progress.update(len(chunk))
    if progress is not None:
        progress.close()
    assert squares is not None
    return squares.sqrt()


def _captum_scores(
    layer_fn: LayerFn, x: Tensor, method: str, n_steps: int, integration: str,
    batch_size: int, show_progress: bool,
) -> Tensor:
    """Captum per output scalar: ``(n_out, d_out, n_in)`` summed (Saliency: squared) over e."""
    from captum.attr import InputXGradient, IntegratedGradients, Saliency

    with torch.no_grad():
        n_out, d_out = layer_fn(x[None]).shape[1:]
    targets = [(i, k) for i in range(n_out) for k in range(d_out)]
    scores = []
    progress = _progress(len(targets), show_progress, f"{method} (captum)")
    with torch.enable_grad():
        for start in range(0, len(targets), batch_size):
            chunk = targets[start : start + batch_size]
            inputs = x.expand(len(chunk), -1, -1).clone().requires_grad_()
            if method == "ig":
                attributions = IntegratedGradients(layer_fn).attribute(
                    inputs, baselines=0.0, target=chunk, n_steps=n_steps, method=integration,
                    internal_batch_size=batch_size,
                )
                scores.append(attributions.detach().sum(dim=-1))
            elif method == "ixg":
                attributions = InputXGradient(layer_fn).attribute(inputs, target=chunk)
                scores.append(attributions.detach().sum(dim=-1))
            else:
                attributions = Saliency(layer_fn).attribute(inputs, target=chunk, abs=True)
                scores.append(attributions.detach().pow(2).sum(dim=-1))
            if progress is not None:
                progress.update(len(chunk))
    if progress is not None:
        progress.close()
    return torch.cat(scores).reshape(n_out, d_out, x.shape[0]).float()


def gradient_vectors(
    layer_fn: LayerFn,
    x: Tensor,
    method: str = "ig",
    route: str = "forward",
    n_steps: int = 50,
    integration: str = "gausslegendre",
    players: Sequence[int] | Tensor | None = None,
    batch_size: int = 64,
    show_progress: bool = False,
) -> Tensor:
    r"""Token-level attribution vectors ``V[i, j][k] = Σ_e A^{ik}[j, e]``, ``(n_out, n_in, d_out)``.

    Args:
        layer_fn (Callable): the layer, ``(N, n, d) → (N, n_out, d_out)``.
        x (Tensor): the layer input of one example ``(n, d)``.
        method (str): ``"ig"`` (Integrated Gradients, zero baseline) or ``"ixg"``
                    (InputXGradient).
        route (str): ``"forward"`` (forward-mode products, default) or ``"captum"``.
        n_steps (int): IG integration steps.
        integration (str): Captum's integration method (``"gausslegendre"``, ``"riemann_*"``).
        players (list[int], optional): the tokens to attribute to (default all); the others
                    get zero vectors (the forward route skips them).
        batch_size (int): examples per forward pass.
        show_progress (bool): show a progress bar.
    """
    _check(method, route, x, batch_size)
    if method == "saliency":
        raise ValueError("saliency has no attribution vectors; use gradient_map")
    chosen = _players(players, x.shape[0])
    x = x.detach().float()
    if route == "forward":
        try:
            return _forward_vectors(
                layer_fn, x, method, chosen, n_steps, integration, batch_size, show_progress
            )
        except NotImplementedError as error:
            _fall_back(error)
    scores = _captum_scores(layer_fn, x, method, n_steps, integration, batch_size, show_progress)
    vectors = scores.permute(0, 2, 1).contiguous()
    keep = torch.zeros(x.shape[0], dtype=torch.bool)
    keep[chosen] = True
    return vectors * keep[None, :, None].to(vectors)


def completeness_residual(
    layer_fn: LayerFn,
    x: Tensor,
    vectors: Tensor,
    rows: Sequence[int] | Tensor | None = None,
    relative: bool = True,
) -> float:
    r"""How far attribution vectors are from complete: ``max_i |Σ_j V[i, j] − (y_i(X) − y_i(0))|``.

    Zero for exact Shapley vectors and, up to the integration error, for IG; a large value
    for IG means the straight path from the zero baseline is too rough for ``n_steps``
    (typical of Post-LN blocks, whose LayerNorm is nearly discontinuous at a zero input).

    Args:
        layer_fn (Callable): the layer.
        x (Tensor): one example's input ``(n, d)``.
        vectors (Tensor): ``(n_out, n_in, d_out)`` from :func:`gradient_vectors` or
                    :func:`~captum_ffb.baselines.shapley_vectors`.
        rows (list[int], optional): the output rows to check (default all; pass the real
                    tokens when there is padding).
        relative (bool): divide by ``max |y(X) − y(0)|``.
    """
    x = x.detach().float()
    with torch.no_grad():
        change = layer_fn(x[None])[0] - layer_fn(torch.zeros_like(x)[None])[0]
    error = (vectors.sum(dim=1) - change).abs()
    if rows is not None:
        index = torch.as_tensor(rows, dtype=torch.long)
        error, change = error[index], change[index]
    residual = float(error.max())
    if relative:
        residual /= max(float(change.abs().max()), torch.finfo(torch.float32).tiny)
    return residual


def gradient_map(
    layer_fn: LayerFn,
    x: Tensor,
    method: str = "ig",
    route: str = "forward",
    n_steps: int = 50,
    integration: str = "gausslegendre",
    players: Sequence[int] | Tensor | None = None,
    batch_size: int = 64,
    show_progress: bool = False,
) -> Tensor:
    r"""Token-to-token map ``(n_out, n_in)`` of a gradient method on one example.

    ``M[i, j] = ‖V[i, j]‖`` for ``"ig"`` and ``"ixg"`` (see :func:`gradient_vectors`);
    ``‖∂y_i/∂x_j‖_F`` for ``"saliency"``. Arguments as in :func:`gradient_vectors`.
    """
    _check(method, route, x, batch_size)
    if method != "saliency":
        vectors = gradient_vectors(
            layer_fn, x, method, route, n_steps, integration, players, batch_size, show_progress
        )
        return torch.linalg.vector_norm(vectors, dim=-1)
    chosen = _players(players, x.shape[0])
    x = x.detach().float()
    if route == "forward":
        try:
            return _forward_saliency(layer_fn, x, chosen, batch_size, show_progress)
        except NotImplementedError as error:
            _fall_back(error)
    squares = _captum_scores(layer_fn, x, method, n_steps, integration, batch_size, show_progress)
    keep = torch.zeros(x.shape[0], dtype=torch.bool)
    keep[chosen] = True
    return squares.sum(dim=1).sqrt() * keep[None].to(squares)


def gradient_maps(
    context: CapturedLayer,
    method: str = "ig",
    route: str = "forward",
    n_steps: int = 50,
    integration: str = "gausslegendre",
    batch_size: int = 64,
    show_progress: bool = False,
) -> Tensor:
    r"""A gradient method's maps ``(B, n, n)`` for a captured layer.

    Each example's block is differentiated as a function of its own input vectors (other
    examples of the batch play no part); padded tokens are not attributed to and their rows
    are zero. See :func:`gradient_map` for the score.

    Args:
        context (CapturedLayer): from :func:`~captum_ffb.baselines.capture_layer`.
        method (str): ``"saliency"``, ``"ixg"`` or ``"ig"``.
        route (str): ``"forward"`` (default) or ``"captum"``.
        n_steps (int): IG integration steps.
        integration (str): Captum's integration method.
        batch_size (int): examples per forward pass.
        show_progress (bool): show a progress bar.
    """
    maps = []
    for example in range(context.batch_size):
        maps.append(gradient_map(
            context.layer_function(example), context.inputs[example], method, route, n_steps,
            integration, context.real_tokens(example), batch_size, show_progress,
        ))
    return mask_maps(torch.stack(maps), context.token_mask)
