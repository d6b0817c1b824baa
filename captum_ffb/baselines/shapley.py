r"""Shapley values over a layer's input tokens, through the ``shap`` library and Captum.

The game: the players are the real input tokens ``j`` of one example; a coalition ``S``
plays the layer on ``X_S``, the input with every token outside ``S`` replaced by the **zero
vector** (an *absent token* is a zero input vector, the baseline of zero-baseline IG as
well); padded positions keep their value and never play. The value is the whole output,
``v(S) = L(X_S) ∈ R^{n×d}``, one game per output element sharing all evaluations. The
Shapley value of token ``j`` is then a vector per output row,

    φ_j[i] = Σ_{S ∌ j} |S|! (p − |S| − 1)! / p! · (L(X_{S∪j})_i − L(X_S)_i),

complete by construction (``Σ_j φ_j[i] = y_i − L(0)_i``), and the map is
``M[i, j] = ‖φ_j[i]‖₂``.

Methods (the game solver of :mod:`captum_ffb.rules.shapley`, with the zero baseline as the
only background sample):

* ``"exact"``: ``shap.explainers.Exact``, all ``2^p`` coalitions (gray-code order).
* ``"permutation"``: ``shap.explainers.Permutation`` (antithetic permutation sampling);
  ``n_samples`` = model evaluations (shap's ``max_evals``; default ``10·(2p+1)``).
* ``"sampling"``: ``shap.explainers.Sampling`` (Štrumbelj & Kononenko's IME);
  ``n_samples`` = evaluations (default ``2p + 2048``, as in the paper's App. E).
* ``"kernel"``: ``shap.KernelExplainer`` without L1 selection; ``n_samples`` = coalitions
  (default ``2p + 2048``; all of them when ``2^p`` is smaller, which makes it exact).
* ``"captum"``: Captum's ``ShapleyValueSampling``; ``n_samples`` = permutations (default 25).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from captum_ffb.baselines.captured import CapturedLayer, mask_maps
from captum_ffb.rules.shapley import MAX_EXACT_PLAYERS, shapley_values


def shapley_vectors(
    layer_fn: Callable[[Tensor], Tensor],
    x: Tensor,
    method: str = "exact",
    players: Sequence[int] | Tensor | None = None,
    n_samples: int | None = None,
    seed: int | None = 0,
    batch_size: int = 256,
    max_exact_players: int = MAX_EXACT_PLAYERS,
) -> Tensor:
    r"""Shapley vectors ``V[i, j] = φ_j[i]`` of a layer over its input tokens, ``(n_out, n_in, d)``.

    Args:
        layer_fn (Callable): the layer ``(N, n, d) → (N, n_out, d_out)``.
        x (Tensor): one example's input vectors ``(n, d)``.
        method (str): see :func:`shapley_values`.
        players (list[int], optional): the tokens that play (default all); the others keep
                    their value in every coalition and get zero vectors.
        n_samples (int, optional): the method's budget.
        seed (int, optional): seed of the sampling methods.
        batch_size (int): coalitions per forward pass of the layer.
        max_exact_players (int): refuse ``"exact"`` above this many players.
    """
    x = x.detach().float()
    n = x.shape[0]
    chosen = list(range(n)) if players is None else [int(j) for j in players]
    if not chosen:
        raise ValueError("no token plays: the example has no real tokens")
    index = torch.tensor(chosen, device=x.device)
    with torch.no_grad():
        n_out, width = layer_fn(x[None]).shape[1:]
    # Only the players' own output rows enter the game (with n_out == n): the other rows are
    # padding, and some estimators (shap's Sampling) share their budget across all outputs.
    rows = index if n_out == n else torch.arange(n_out, device=x.device)

    def value_fn(masks: Tensor) -> Tensor:
        full = torch.ones(masks.shape[0], n, dtype=x.dtype, device=x.device)
        full[:, index] = masks.to(x)
        return layer_fn(full[:, :, None] * x)[:, rows].reshape(masks.shape[0], -1)

    phi = shapley_values(
        value_fn, len(chosen), method, n_samples, seed, batch_size, x.dtype, max_exact_players
    ).float()
    if not bool(torch.isfinite(phi).all()):
        raise ValueError(f"the {method!r} Shapley estimate is not finite for this input")
    vectors = torch.zeros(n_out, n, width, dtype=torch.float32, device="cpu")
    vectors[rows.cpu()[:, None], index.cpu()[None, :]] = (
        phi.reshape(len(chosen), len(rows), width).transpose(0, 1)
    )
    return vectors


def shapley_maps(
    context: CapturedLayer,
    method: str = "exact",
    n_samples: int | None = None,
    seed: int | None = 0,
    batch_size: int = 256,
    max_exact_players: int = MAX_EXACT_PLAYERS,
    show_progress: bool = False,
) -> Tensor:
    r"""Shapley maps ``M[b, i, j] = ‖φ_j[i]‖`` ``(B, n, n)`` over a captured layer's tokens.

    Players are each example's real tokens; an absent token is a zero input vector (see the
    module documentation). Arguments as in :func:`shapley_vectors`.
    """
    maps = []
    examples = range(context.batch_size)
    if show_progress:
        from tqdm.auto import tqdm

        examples = tqdm(examples, desc=f"shapley ({method})", unit="example")
    for example in examples:
        vectors = shapley_vectors(
            context.layer_function(example), context.inputs[example], method,
            context.real_tokens(example), n_samples, seed, batch_size, max_exact_players,
        )
        maps.append(torch.linalg.vector_norm(vectors, dim=-1))
    return mask_maps(torch.stack(maps), context.token_mask)
