r"""Shapley values: a solver for vector-valued cooperative games, and the activation rule
that splits ``g(S)`` among the players by Shapley values (the paper's App. E).

A game is given on coalition masks: ``v(S) = value_fn(mask_S)`` with ``mask_S ∈ {0, 1}^p``;
the empty coalition is the baseline; every output element is its own game and all share
the evaluations. Methods (all with the empty coalition as the only background sample):

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from captum_ffb.core.decomposition import Decomposition
from captum_ffb.rules.base import Rule

ValueFn = Callable[[Tensor], Tensor]

#: How Shapley values are computed: exactly, by permutations, sampling, Kernel SHAP or Captum.
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
        masks_t = torch.as_tensor(np.asarray(masks, dtype=np.float64), device="cpu").to(dtype)
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


#: Most values an exact game may hold at once (coalitions × outputs); larger games are split
#: over the feature dimensions.
EXACT_CHUNK_VALUES = 1 << 25


@dataclass
class ShapleyActivation(Rule):
    r"""Shapley values for an element-wise ``g(S)``: one game per output row.

    Per output row ``i`` the players are the real tokens' shares ``u_ij`` of the
    pre-activation and the bias share; an absent player's share is zero, so the value of a
    coalition ``C`` is ``g(Σ_{j∈C} u_ij) − g(0)`` per feature (every feature is its own game;
    all share the evaluations). ``g(0)`` joins the bias, so the rule is complete. It looks
    at all players together, so it is not linear in them (no grouping, no backward route).

    Call as :class:`~captum_ffb.rules.IGActivation`.

    Args:
        method (str): ``"exact"``, ``"permutation"``, ``"sampling"``, ``"kernel"`` or
                    ``"captum"`` (see the module documentation).
        n_samples (int, optional): the method's budget.
        seed (int, optional): seed of the sampling methods.
        batch_size (int): coalitions per evaluation.
        max_exact_players (int): refuse ``"exact"`` above this many players.
        show_progress (bool): show a progress bar over rows.

    Examples::

        >>> lnd = LayerNormDecomposition(model, layer,
        ...                              rules={"activation": ShapleyActivation("permutation")})
    """

    method: str = "exact"
    n_samples: int | None = None
    seed: int | None = 0
    batch_size: int = 4096
    max_exact_players: int = MAX_EXACT_PLAYERS
    show_progress: bool = False

    role = "activation"
    linear_in_players = False

    def __post_init__(self) -> None:
        if self.method not in SHAPLEY_METHODS:
            raise ValueError(f"method must be one of {SHAPLEY_METHODS}, got {self.method!r}")

    def __call__(self, decomposition: Decomposition, fn: Callable[[Tensor], Tensor],
                 pre_activation: Tensor | None = None) -> Decomposition:
        terms = decomposition.terms.detach()
        bias = decomposition.bias.detach()
        batch, n_out, n_in, width = terms.shape
        players_mask = decomposition.player_mask
        new_terms = torch.zeros_like(terms)
        new_bias = torch.zeros_like(bias)
        g0 = fn(torch.zeros(1, dtype=bias.dtype, device=bias.device))[0]
        jobs: Any = [(b, i) for b in range(batch) for i in range(n_out)]
        if self.show_progress:
            from tqdm.auto import tqdm

            jobs = tqdm(jobs, desc=f"activation ({self.method})", unit="row")
        for b, i in jobs:
            players = (
                torch.arange(n_in) if players_mask is None
                else torch.nonzero(players_mask[b].cpu(), as_tuple=False).flatten()
            )
            shares = torch.cat([terms[b, i, players.to(terms.device)], bias[b, i][None]])  # (p, d)
            p = shares.shape[0]
            step = width if self.method != "exact" else max(1, min(width, EXACT_CHUNK_VALUES >> p))
            for start in range(0, width, step):
                cols = shares[:, start : start + step]

                def value_fn(masks: Tensor, cols: Tensor = cols) -> Tensor:
                    return fn(masks.to(cols) @ cols) - g0

                phi = shapley_values(
                    value_fn, p, self.method, self.n_samples, self.seed, self.batch_size,
                    cols.dtype, self.max_exact_players,
                ).to(terms.dtype)
                new_terms[b, i, players.to(terms.device), start : start + step] = phi[:-1]
                new_bias[b, i, start : start + step] = phi[-1] + g0
        return Decomposition(new_terms, new_bias, decomposition.token_mask,
                             decomposition.player_mask)
