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

Methods (all with the zero baseline as the only background sample):

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

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from captum_ffb.baselines.context import LayerContext, mask_maps

ValueFn = Callable[[Tensor], Tensor]

SHAPLEY_METHODS = ("exact", "permutation", "sampling", "kernel", "captum")

#: Most players the exact method accepts by default (it evaluates 2^p coalitions).
MAX_EXACT_PLAYERS = 16


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Seed numpy's and torch's global generators for the block; restore them afterwards."""
    if seed is None:
        yield
        return
    state = np.random.get_state()
    np.random.seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            yield
        finally:
            np.random.set_state(state)


def _numpy_model(value_fn: ValueFn, dtype: torch.dtype, batch_size: int) -> Callable[[np.ndarray], np.ndarray]:
    """Wrap ``value_fn`` (masks → values) as the numpy model the shap explainers call."""

    def model(masks: np.ndarray) -> np.ndarray:
        masks_t = torch.as_tensor(np.asarray(masks, dtype=np.float64)).to(dtype)
        outs = []
        with torch.no_grad():
            for start in range(0, masks_t.shape[0], batch_size):
                outs.append(value_fn(masks_t[start : start + batch_size]).double())
        return torch.cat(outs).reshape(masks_t.shape[0], -1).cpu().numpy()

    return model


def _shap_values(values: Any, n_players: int) -> np.ndarray:
    """Explanation or legacy output → ``(p, m)``."""
    array = np.asarray(getattr(values, "values", values), dtype=np.float64)
    if array.ndim == 3 and array.shape[0] == 1:  # (1, p, m)
        array = array[0]
    elif array.ndim == 3 and array.shape[-1] == 1:  # legacy (1?, p, m) transposed
        array = array[..., 0]
    if array.ndim == 1:
        array = array[:, None]
    if array.shape[0] != n_players:
        array = array.reshape(n_players, -1)
    return array


def shapley_values(
    value_fn: ValueFn,
    n_players: int,
    method: str = "exact",
    n_samples: int | None = None,
    seed: int | None = 0,
    batch_size: int = 256,
    dtype: torch.dtype = torch.float32,
    max_exact_players: int = MAX_EXACT_PLAYERS,
) -> Tensor:
    r"""Shapley values of a vector-valued game given on coalition masks, ``(p, m)``.

    The game is ``v(S) = value_fn(mask_S)`` with ``mask_S ∈ {0, 1}^p`` (a float row per
    coalition); the empty coalition is the baseline. Every output element is its own game;
    all share the same evaluations.

    Args:
        value_fn (Callable): ``(N, p)`` masks → ``(N, m)`` values.
        n_players (int): ``p``.
        method (str): ``"exact"``, ``"permutation"``, ``"sampling"``, ``"kernel"`` or
                    ``"captum"`` (see the module documentation).
        n_samples (int, optional): the method's budget (see the module documentation).
        seed (int, optional): seed of the sampling methods (``None`` leaves the global
                    generators alone).
        batch_size (int): coalitions per call of ``value_fn``.
        dtype (torch.dtype): dtype of the masks given to ``value_fn``.
        max_exact_players (int): refuse ``"exact"`` above this many players.

    Returns:
        Tensor ``(p, m)`` in float64.
    """
    if method not in SHAPLEY_METHODS:
        raise ValueError(f"method must be one of {SHAPLEY_METHODS}, got {method!r}")
    if n_players < 1:
        raise ValueError("a Shapley game needs at least one player")
    if n_samples is not None and n_samples < 1:
        raise ValueError("n_samples must be positive")
    p = n_players
    if method == "exact" and p > max_exact_players:
        raise ValueError(
            f"exact Shapley values of {p} players need 2^{p} evaluations; use a sampling "
            f"method or raise max_exact_players (now {max_exact_players})"
        )
    if method == "captum":
        return _captum_values(value_fn, p, n_samples, seed, batch_size, dtype)

    shap = _import_shap()
    model = _numpy_model(value_fn, dtype, batch_size)
    background = np.zeros((1, p))
    instance = np.ones((1, p))
    with _seeded(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "exact":
            explainer = shap.explainers.Exact(model, background)
            values = explainer(instance, max_evals=2**p + 1, batch_size=batch_size, silent=True)
        elif method == "permutation":
            explainer = shap.explainers.Permutation(model, background, seed=seed)
            budget = n_samples if n_samples is not None else 10 * (2 * p + 1)
            values = explainer(
                instance, max_evals=max(budget, 2 * p + 1), batch_size=batch_size, silent=True
            )
        elif method == "sampling":
            explainer = _sampling_explainer(shap)(model, background)
            budget = n_samples if n_samples is not None else 2 * p + 2048
            values = explainer.shap_values(instance, nsamples=budget, silent=True)
        else:
            explainer = shap.KernelExplainer(model, background)
            budget = n_samples if n_samples is not None else 2 * p + 2048
            values = explainer.shap_values(instance, nsamples=budget, l1_reg=False, silent=True)
    return torch.from_numpy(_shap_values(values, p))


def _import_shap() -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # shap's plotting colours warn on import
            import shap
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ValueError("the shap methods need shap: pip install 'captum_ffb[shap]'") from error
    return shap


def _sampling_explainer(shap: Any) -> type:
    """shap's Sampling explainer, guarded against outputs on which no player varies.

    shap normalises the per-player variances of every output by their sum to share its
    second-round budget; an output whose every marginal contribution is constant (a causal
    row that sees one token) gives 0/0 and poisons the estimate with NaN. A variance floor
    far below any real variance removes the division by zero and changes nothing else.
    """

    class GuardedSampling(shap.explainers.Sampling):
        def sampling_estimate(self, *args: Any, **kwargs: Any) -> Any:
            mean, var = super().sampling_estimate(*args, **kwargs)
            return mean, var + 1e-200

    return GuardedSampling


def _captum_values(
    value_fn: ValueFn, p: int, n_samples: int | None, seed: int | None, batch_size: int,
    dtype: torch.dtype,
) -> Tensor:
    from captum.attr import ShapleyValueSampling

    def forward(masks: Tensor) -> Tensor:
        return value_fn(masks.to(dtype)).reshape(masks.shape[0], -1).double()

    inputs = torch.ones(1, p, dtype=torch.float64)
    with _seeded(seed), torch.no_grad():
        attributions = ShapleyValueSampling(forward).attribute(
            inputs,
            baselines=0.0,
            n_samples=n_samples if n_samples is not None else 25,
            perturbations_per_eval=max(1, min(batch_size, p)),
        )
    # attributions: (1, m, p) in Captum's multi-output layout (output shape, then inputs)
    values = attributions.reshape(-1, p).t()
    return values.double()


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
    vectors = torch.zeros(n_out, n, width, dtype=torch.float32)
    vectors[rows.cpu()[:, None], index.cpu()[None, :]] = (
        phi.reshape(len(chosen), len(rows), width).transpose(0, 1)
    )
    return vectors


def shapley_maps(
    context: LayerContext,
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
