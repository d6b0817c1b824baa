r"""The paper's App. E: Integrated Gradients against Shapley values for the FF activation.

The decomposition splits the FF pre-activation of output row ``i`` into the tokens' shares
and a bias share, ``S_i = Σ_j u_ij + u_ib``, and must split ``g(S_i)`` the same way. The core
uses Integrated Gradients (closed form ``u_ij · g(S_i)/S_i``). Here the same split is made
with Shapley values: per row ``i`` one cooperative game whose players are the real tokens
and the bias, with value ``v(C) = g(Σ_{j∈C} u_ij) − g(0)`` (an absent player contributes a
zero share; every FF dimension is its own game and all share the evaluations). ``g(0)``
joins the bias, so the result is complete like the IG rule. For a linear ``g`` every method
gives ``u_ij · g(S)/S``; for GELU they differ, and App. E asks by how much the maps differ
and what each costs.

:class:`~captum_ffb.rules.ShapleyActivation` is the rule that splits ``g(S)`` by Shapley
values; :func:`activation_study` runs a block's chain once per method, swapping only the
``"activation"`` rule, and compares the maps and the time the activation step takes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from captum_ffb.baselines.captured import CapturedLayer
from captum_ffb.baselines.compare import ComparisonTable, compare, compare_methods
from captum_ffb.core.decomposition import Decomposition
from captum_ffb.engine import Outputs, run_block
from captum_ffb.rules import IGActivation, ShapleyActivation, TimedRule

ActivationFn = Callable[[Tensor], Tensor]

#: Activation decompositions: ``"ig"`` closed form (the core's rule), ``"ig_captum"`` Captum's
#: IntegratedGradients (Gauss–Legendre, as the paper ran it), and Shapley values.
ACTIVATION_METHODS = (
    "ig",
    "ig_captum",
    "shap_exact",
    "shap_permutation",
    "shap_sampling",
    "shap_kernel",
    "captum_shapley",
)


def activation_rule(
    method: str = "ig",
    n_samples: int | None = None,
    seed: int | None = 0,
    n_steps: int = 50,
    show_progress: bool = False,
) -> Callable:
    r"""The ``"activation"`` rule of one of ``ACTIVATION_METHODS``.

    Args:
        method (str): one of ``ACTIVATION_METHODS``.
        n_samples (int, optional): budget of the Shapley methods.
        seed (int, optional): seed of the sampling methods.
        n_steps (int): steps of ``"ig_captum"``.
        show_progress (bool): show a progress bar (Shapley methods).
    """
    if method not in ACTIVATION_METHODS:
        raise ValueError(f"method must be one of {ACTIVATION_METHODS}, got {method!r}")
    if method == "ig":
        return IGActivation()
    if method == "ig_captum":
        return IGActivation(route="captum", method="gausslegendre", n_steps=n_steps)
    shapley = {
        "shap_exact": "exact",
        "shap_permutation": "permutation",
        "shap_sampling": "sampling",
        "shap_kernel": "kernel",
        "captum_shapley": "captum",
    }[method]
    return ShapleyActivation(shapley, n_samples, seed, show_progress=show_progress)


def activation_decomposition(
    decomposition: Decomposition,
    fn: ActivationFn,
    method: str = "ig",
    pre_activation: Tensor | None = None,
    n_samples: int | None = None,
    seed: int | None = 0,
    n_steps: int = 50,
    show_progress: bool = False,
) -> Decomposition:
    r"""Decompose ``g(S)`` with one of ``ACTIVATION_METHODS`` (the rule of
    :func:`activation_rule` applied once).

    Args:
        decomposition (Decomposition): decomposition of the pre-activation ``S``.
        fn (Callable): the activation ``g``.
        method (str): one of ``ACTIVATION_METHODS``.
        pre_activation (Tensor, optional): the real ``S`` (used by the IG closed form).
        n_samples, seed, n_steps, show_progress: see :func:`activation_rule`.
    """
    rule = activation_rule(method, n_samples, seed, n_steps, show_progress)
    return rule(decomposition, fn, pre_activation)


def _warm_up(methods: Sequence[str]) -> None:
    """Run every method once on a toy input, so that imports and shap's numba compilation
    (seconds, on first use) are not timed."""
    toy = Decomposition(torch.ones(1, 1, 2, 3), torch.ones(1, 1, 3))
    for method in methods:
        activation_decomposition(toy, torch.tanh, method, n_samples=8, n_steps=2)


def scopes_with_activation(
    context: CapturedLayer,
    method: str = "ig",
    n_samples: int | None = None,
    seed: int | None = 0,
    n_steps: int = 50,
    show_progress: bool = False,
) -> tuple[dict[str, Decomposition], float]:
    r"""The block's decompositions at every scope with the activation split by ``method``.

    The block's own chain runs on the tensors already captured in ``context``, with the
    ``"activation"`` rule replaced; all output rows are computed at once (meant for the short
    inputs of this study).

    Returns:
        ``(scope → dense Decomposition, seconds spent in the activation step)``.
    """
    decomposer = context.decomposer
    if "activation" not in decomposer.roles:
        raise ValueError(
            f"the activation study splits an element-wise activation; a {decomposer.model_type} "
            f"block calls the roles {', '.join(decomposer.roles)}"
        )
    timed = TimedRule(activation_rule(method, n_samples, seed, n_steps, show_progress))
    rules = {**decomposer.rules, "activation": timed}
    result = run_block(context.block, decomposer.chain, rules, list(context.scopes),
                       [slice(None)], Outputs(decompositions=True))
    return dict(result.decompositions), timed.seconds


@dataclass
class ActivationStudy:
    r"""App. E for one block and one batch: maps, times and agreement per method.

    Attributes:
        n_tokens (int): sequence length (with padding).
        methods (list[str]): the methods run.
        reference (str): the method the others are compared with.
        scopes (tuple[str, ...]): the block's scopes.
        maps (dict): method → scope → ``(B, n, n)`` maps.
        seconds (dict): method → seconds spent decomposing the activation.
        agreement (ComparisonTable): each method against ``reference``, per scope.
        contextualization (ComparisonTable): per method, ``1 − ρ`` between consecutive
                    scopes from the FF input on (the paper's Fig. 11: FF, RES, LN).
    """

    n_tokens: int
    methods: list[str]
    reference: str
    scopes: tuple[str, ...]
    maps: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    agreement: ComparisonTable = field(default_factory=ComparisonTable)
    contextualization: ComparisonTable = field(default_factory=ComparisonTable)


def activation_study(
    context: CapturedLayer,
    methods: Sequence[str] = ("ig", "shap_exact", "shap_sampling", "shap_kernel"),
    reference: str = "ig",
    n_samples: int | None = None,
    seed: int | None = 0,
    n_steps: int = 50,
    k: int = 3,
    extra: dict[str, Any] | None = None,
    show_progress: bool = False,
) -> ActivationStudy:
    r"""Run the block's chain with each activation method; compare maps and time.

    Args:
        context (CapturedLayer): from :func:`~captum_ffb.baselines.capture_layer`.
        methods (list[str]): among ``ACTIVATION_METHODS``; ``reference`` is added if
                    missing.
        reference (str): the method the others are compared with (IG by default).
        n_samples (int, optional): budget of the Shapley methods.
        seed (int, optional): seed of the sampling methods.
        n_steps (int): steps of ``"ig_captum"``.
        k (int): top-k size of the comparison.
        extra (dict, optional): constant leading columns of the tables (e.g. the layer).
        show_progress (bool): show progress bars.
    """
    methods = list(dict.fromkeys([reference, *methods]))
    unknown = [m for m in methods if m not in ACTIVATION_METHODS]
    if unknown:
        raise ValueError(f"unknown activation method {unknown[0]!r}; choose from {ACTIVATION_METHODS}")
    study = ActivationStudy(context.n_tokens, methods, reference, context.scopes)
    _warm_up(methods)
    for method in methods:
        decs, seconds = scopes_with_activation(context, method, n_samples, seed, n_steps, show_progress)
        study.maps[method] = {scope: dec.maps() for scope, dec in decs.items()}
        study.seconds[method] = seconds

    extra = dict(extra or {})
    agreement = ComparisonTable(k=k)
    first = context.scopes.index(context.ff_pair[0])
    for scope in context.scopes[first + 1 :]:  # the scopes before the FF do not change
        per_method = {m: study.maps[m][scope] for m in methods}
        agreement.extend(compare_methods(
            per_method, reference, context.token_mask, context.causal, k,
            {**extra, "n": context.n_tokens, "scope": scope},
        ))
    for row in agreement.rows:
        row["seconds"] = study.seconds[row["method"]]
    agreement.columns.append("seconds")
    study.agreement = agreement

    steps = list(zip(context.scopes[first:], context.scopes[first + 1 :]))
    table = ComparisonTable(columns=[*extra, "n", "method", *[f"{a}->{b}" for a, b in steps]], k=k)
    for method in methods:
        row: dict[str, Any] = {**extra, "n": context.n_tokens, "method": method}
        for a, b in steps:
            change = compare(study.maps[method][a], study.maps[method][b],
                             context.token_mask, context.causal, k)["1-spearman"]
            row[f"{a}->{b}"] = float(change[~torch.isnan(change)].mean())
        table.rows.append(row)
    study.contextualization = table
    return study
