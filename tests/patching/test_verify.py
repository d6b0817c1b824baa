"""``"atp+verify"``: ``"atp+exact"`` with the components that AtP's and the frozen estimates
flag most patched for real, checked against real activation patching on tiny models."""

from __future__ import annotations

import math

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.attr.patching import activation_patching
from captum_ffb.patching.estimators import verify_scores
from captum_ffb.patching.patches import VERIFY_TOP
from tests.models import tiny_task_model, token_ids


def _inputs():
    ids = token_ids()[:1, :7]
    baseline = ids.clone()
    baseline[0, 1], baseline[0, 3] = 11, 13
    return ids, baseline


def _kind(component: str) -> str:
    return "head" if ".head." in component else component.split(".")[2]


def _component_kappas(graph) -> dict[str, float]:
    """Component id → the largest κ of its nodes."""
    from captum_ffb.core.vocabulary import component_of

    d, found = graph.data, {}
    for k, kind in enumerate(d.kinds):
        if kind in ("head", "attention", "ff"):
            name = component_of(kind, d.layers[k], d.heads[k])
            found[name] = max(found.get(name, 0.0), float(graph.patch_kappa[k]))
    return found


@pytest.mark.parametrize("name, granularity", [("llama", "head"), ("gpt2", "sublayer")])
def test_verify_patches_the_flagged_components_of_each_kind_for_real(name, granularity):
    """With κ never above its threshold, ``"atp+verify"`` patches exactly ``verify_top``
    components of each kind, those of largest ``|a − f| + (|a| + |f|)/2``, and of the others
    the one of largest κ; each one's effect is real activation patching's, every other
    component keeps AtP's sum, every node AtP's."""
    nd = NormDecomposition(tiny_task_model(name, "causal_lm"))
    ids, baseline = _inputs()
    graph = nd.attribute_graph(ids, 5, granularity=granularity, prune=False, corrupted_inputs=baseline,
                               exact_above=math.inf, estimators="atp+verify", verify_top=3)
    whole = graph.patch_components["atp+verify"]
    kinds = {"head": ("head", "ff"), "sublayer": ("attention", "ff")}[granularity]
    atp, frozen = graph.component_estimates("atp"), graph.component_estimates("frozen")
    scores = verify_scores(atp, frozen)
    assert {_kind(c) for c in scores} == set(kinds)
    kappa = _component_kappas(graph)
    for kind in kinds:
        ranked = sorted((c for c in scores if _kind(c) == kind), key=lambda c: -scores[c])
        moved = max(ranked[3:], key=lambda c: kappa[c], default=None)  # the next by κ
        assert set(ranked[:3]) | ({moved} - {None}) == {c for c in whole if _kind(c) == kind}
    real = activation_patching(nd, ids, baseline, 5, granularity, show_progress=False).effects
    verified = graph.component_estimates("atp+verify")
    for component, value in verified.items():
        expected = real[component] if component in whole else atp[component]
        assert value == pytest.approx(expected, abs=1e-5)
    assert torch.equal(graph.patch_estimates["atp+verify"], graph.patch_estimates["atp"])
    assert graph.patch_passes["atp+verify"] == graph.patch_passes["atp+exact"] + 2 + len(whole)
    assert len(whole) == sum(min(3 + 1, sum(_kind(c) == kind for c in scores)) for kind in kinds)


def test_verify_leaves_what_exact_patched_and_takes_the_next():
    """Components that ``"atp+exact"`` patched already (κ above its threshold) keep that pass
    and are not counted: ``verify_top`` more of each kind are patched; ``verify_top=0`` is
    ``"atp+exact"``."""
    nd = NormDecomposition(tiny_task_model("llama", "causal_lm"))
    ids, baseline = _inputs()
    kappa = nd.attribute_graph(ids, 5, prune=False, corrupted_inputs=baseline, exact_above=math.inf).patch_kappa
    threshold = float(kappa[kappa > 0].quantile(0.97))
    graph = nd.attribute_graph(ids, 5, prune=False, corrupted_inputs=baseline, exact_above=threshold,
                               estimators="atp+verify", verify_top=2)
    exact, verified = graph.patch_components["atp+exact"], graph.patch_components["atp+verify"]
    assert exact and set(exact) < set(verified)
    added = set(verified) - set(exact)
    heads = [c for c in graph.component_estimates("atp") if _kind(c) == "head" and c not in exact]
    assert sum(_kind(c) == "head" for c in added) == min(3, len(heads)) > 0  # two by the estimates, one by κ
    assert sum(_kind(c) == "ff" for c in added) <= 3
    assert all(verified[c] == exact[c] for c in exact)
    none = nd.attribute_graph(ids, 5, prune=False, corrupted_inputs=baseline, exact_above=threshold,
                              estimators="atp+verify", verify_top=0)
    assert none.patch_components["atp+verify"] == none.patch_components["atp+exact"]
    assert none.component_estimates("atp+verify") == none.component_estimates("atp+exact")


def test_verify_top_is_checked():
    nd = NormDecomposition(tiny_task_model("llama", "causal_lm"))
    ids, baseline = _inputs()
    assert isinstance(VERIFY_TOP, int) and VERIFY_TOP > 0
    for bad in (-1, 1.5, True, "4"):
        with pytest.raises(ValueError, match="verify_top"):
            nd.attribute_graph(ids, 5, corrupted_inputs=baseline, verify_top=bad)
    with pytest.raises(ValueError, match="verify_top .*corrupted_inputs"):
        nd.attribute_graph(ids, 5, verify_top=2)
