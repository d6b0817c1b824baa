"""The registry of patching estimators (``captum_ffb/patching/estimators/``): every estimator
is one registered class with a citation and a cost; names are unique and aliases resolve; an
unknown name is refused in one line naming the choices; and an estimator registered here, in
one small class, is computed by ``patch_estimates`` (through ``attribute_graph``), taken by
``check_estimators`` and by the edges' patcher, with its ``"+exact"`` variant."""

from __future__ import annotations

import re

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.patching.estimators import (
    Estimate,
    Estimator,
    computation_order,
    estimator_aliases,
    estimator_names,
    exact_variant,
    get_estimator,
    register_estimator,
    unregister_estimator,
)
from captum_ffb.patching.patches import (
    ALIASES,
    COMPUTED,
    DEFAULT_EDGE_ESTIMATOR,
    DEFAULT_ESTIMATOR,
    EDGE_ESTIMATORS,
    ESTIMATORS,
    LINEAR,
    check_estimators,
)
from tests.models import tiny_task_model, token_ids


@pytest.fixture(scope="module")
def llama():
    nd = NormDecomposition(tiny_task_model("llama", "causal_lm").double())
    ids = token_ids()[:1, :7]
    corrupted = ids.clone()
    corrupted[0, 1], corrupted[0, 3] = 11, 13
    return nd, ids, corrupted


def test_every_estimator_has_a_citation_a_cost_and_a_unique_name():
    names = estimator_names()
    assert len(names) == len(set(names))
    assert set(ESTIMATORS) | {"atp+qk"} == set(names)
    for name in names:
        estimator = get_estimator(name)
        assert estimator.name == name
        assert estimator.citation.strip() and estimator.cost.strip(), name
    for name in ("atp", "relp", "gim", "eap-ig", "atp*", "atp+qk"):  # the field's, cited by arXiv id
        assert re.search(r"arXiv:\d{4}\.\d{4,5}", get_estimator(name).citation), name
    assert LINEAR == ("frozen", "atp", "relp", "eap-ig", "gim", "gim-ig")
    assert all(get_estimator(f"{name}+exact").variant_of == name for name in LINEAR)
    assert EDGE_ESTIMATORS == LINEAR and DEFAULT_EDGE_ESTIMATOR in EDGE_ESTIMATORS
    assert {*COMPUTED, DEFAULT_ESTIMATOR} <= set(ESTIMATORS)
    with pytest.raises(ValueError, match="registered already"):
        register_estimator(type(get_estimator("atp")))


def test_aliases_resolve():
    assert estimator_aliases() == {"atp+qk": "atp*"}
    assert ALIASES == {"default": DEFAULT_ESTIMATOR, "atp+qk": "atp*"}
    for alias, name in ALIASES.items():
        assert name in ESTIMATORS
        assert name in check_estimators(alias) and alias not in check_estimators(alias)
    # AtP* reports its QK fix alone, after it; both after AtP, which they build on
    order = [e.name for e in computation_order(["atp+qk"])]
    assert order == ["atp", "atp*", "atp+qk"]
    assert [e.name for e in computation_order(["eap-ig+exact"])] == ["eap-ig", "eap-ig+exact"]


def test_an_unknown_name_is_refused_in_one_line_naming_the_choices():
    with pytest.raises(ValueError) as refused:
        check_estimators(["atp", "nope"])
    message = str(refused.value)
    assert "\n" not in message and "'nope'" in message
    assert all(name in message for name in (*ESTIMATORS, *ALIASES))
    with pytest.raises(ValueError) as refused:
        get_estimator("nope")
    assert "\n" not in str(refused.value) and all(name in str(refused.value) for name in estimator_names())
    with pytest.raises(ValueError, match="citation"):
        register_estimator(type("Uncited", (Estimator,), {"name": "uncited", "cost": "1"}))
    assert "uncited" not in estimator_names()


class Halved(Estimator):
    """A toy: half of attribution patching, for nodes and edges."""

    name = "halved-atp"
    citation = "none: a test of the registry"
    cost = "3 (AtP's)"
    linear = True
    edges = True
    requires = ("atp",)

    def passes(self, shared):
        return 3

    def estimate(self, shared):
        return Estimate({key: values / 2 for key, values in shared.results["atp"].nodes.items()})

    def estimate_edges(self, shared, links):
        return get_estimator("atp").estimate_edges(shared, links) / 2


def test_an_estimator_registered_in_one_class_is_computed(llama):
    nd, ids, corrupted = llama
    variant = exact_variant(Halved)
    register_estimator(Halved)
    register_estimator(variant)
    try:
        assert "halved-atp" in check_estimators("halved-atp")
        graph = nd.attribute_graph(ids, 5, granularity="head", prune=False, corrupted_inputs=corrupted,
                                   estimators=["halved-atp+exact"], exact_above=0.05)
        found = graph.patch_estimates
        assert torch.equal(found["halved-atp"], found["atp"] / 2)
        assert graph.patch_passes["halved-atp"] == 3 and graph.patch_seconds["halved-atp"] > 0
        # the "+exact" variant: the real patched nodes (those where atp+exact is not atp), AtP's half elsewhere
        real = found["atp+exact"] != found["atp"]
        assert real.any() and not real.all()
        assert torch.equal(found["halved-atp+exact"][real], found["atp+exact"][real])
        assert torch.equal(found["halved-atp+exact"][~real], found["halved-atp"][~real])
        assert graph.patch_components["halved-atp+exact"] == graph.patch_components["atp+exact"]
        assert graph.patch_passes["halved-atp+exact"] == graph.patch_passes["atp+exact"]
        edges = torch.arange(len(graph.data.weights))
        halved = graph.edge_patcher.estimates(graph.data, edges, ("halved-atp", "atp"))
        assert torch.allclose(halved["halved-atp"], halved["atp"] / 2, rtol=0, atol=0, equal_nan=True)  # nan: the bias
    finally:
        unregister_estimator("halved-atp+exact")
        unregister_estimator("halved-atp")
    assert "halved-atp" not in estimator_names()
    with pytest.raises(ValueError, match="estimators must be among"):
        check_estimators("halved-atp")


def test_the_estimates_come_in_the_registrys_order_whatever_the_order_asked():
    """Before 0.4 a graph's ``patch_estimates`` (and so its page data and file metadata) came in
    the order of a set, which changed with the hash seed; they are computed, and kept, in the
    registry's order."""
    from captum_ffb.patching.estimators import computation_order
    from captum_ffb.patching.patches import check_estimators

    asked = ["relp+exact", "eap-ig", "atp*", "frozen"]
    orders = {tuple(e.name for e in computation_order(check_estimators(names)))
              for names in (asked, list(reversed(asked)), sorted(asked))}
    assert len(orders) == 1
    (order,) = orders
    assert order.index("frozen") < order.index("atp") < order.index("relp") < order.index("eap-ig") < order.index("atp*")


def test_every_estimator_is_registered_after_those_it_requires():
    from captum_ffb.patching.estimators import estimator_names, get_estimator

    registered = list(estimator_names())
    for name in registered:
        for required in get_estimator(name).requires:
            assert registered.index(required) < registered.index(name), (name, required)
