"""MIB's circuit protocol (:mod:`captum_ffb.patching.circuits`) on a hand-sized Llama (2 blocks,
4 heads): the circuit's pass against passes built by hand from the model's own weights, the
summaries against hand-made curves, the pruning, the export and the refusals."""

from __future__ import annotations

import math

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.engine.head import target_value
from captum_ffb.engine.passes import ModelPass
from captum_ffb.patching import circuits as C
from captum_ffb.patching.estimators.edges import Link, link_values
from captum_ffb.patching.estimators.recorded import differences, record
from captum_ffb.patching.real import patched_values, real_writers, writer_patch
from tests.models import tiny_task_model, token_ids


def _case(name: str = "llama"):
    nd = NormDecomposition(tiny_task_model(name, "causal_lm").double())
    ids = token_ids()[:1, :7]
    corrupted = ids.clone()
    corrupted[0, 1], corrupted[0, 3] = 11, 13
    request = nd.request(ids, 5)
    return nd, request, nd.request(corrupted, request.target)


@pytest.fixture(scope="module")
def llama():
    return _case("llama")


def _value(nd, request, hooks=()) -> float:
    with ModelPass(nd.model) as run:
        for module, hook in hooks:
            run.before(module, hook)
        output = run.run(*request.args, **request.kwargs)
        return float(target_value(nd.engine.head, output, request.target, dtype=torch.float64)[0])


def _mask(graph: C.ComponentGraph, cut: set[tuple[str, str]] | None = None, keep: set[tuple[str, str]] | None = None
          ) -> torch.Tensor:
    names = [(graph.sources[s], graph.readers[r]) for s, r in graph.edges.tolist()]
    if keep is not None:
        return torch.tensor([[name in keep for name in names]])
    return torch.tensor([[name not in cut for name in names]])


def test_the_graph_names_its_nodes_as_mib_does(llama):
    nd, _, _ = llama
    graph = C.ComponentGraph.of(nd.engine, "head")
    assert graph.sources == ("input", *(f"a0.h{h}" for h in range(4)), "m0", *(f"a1.h{h}" for h in range(4)), "m1")
    assert graph.readers == (*graph.sources[1:], "logits")
    # a head of block 1 reads the input, block 0's heads and FF; the logits read everything
    into = {graph.readers[r]: sum(1 for _, rr in graph.edges.tolist() if rr == r) for r in range(len(graph.readers))}
    assert into["a0.h2"] == 1 and into["m0"] == 5 and into["a1.h0"] == 6 and into["m1"] == 10 and into["logits"] == 11
    assert graph.n_edges == 4 * 1 + 5 + 4 * 6 + 10 + 11
    sub = C.ComponentGraph.of(nd.engine, "sublayer")
    assert sub.sources == ("input", "a0", "m0", "a1", "m1") and sub.n_edges == 1 + 2 + 3 + 4 + 5


@pytest.mark.parametrize("granularity", ["head", "sublayer"])
def test_every_edge_gives_the_clean_value_and_none_the_counterfactual_one(llama, granularity):
    nd, request, corrupted = llama
    graph = C.ComponentGraph.of(nd.engine, granularity)
    full = torch.ones(1, graph.n_edges, dtype=torch.bool)
    found = C.circuit_values(nd.engine, request, corrupted, graph, torch.cat([full, ~full]))
    assert found[0].item() == pytest.approx(_value(nd, request), abs=1e-12)
    assert found[1].item() == pytest.approx(_value(nd, corrupted), abs=1e-12)
    assert _value(nd, request) != pytest.approx(_value(nd, corrupted), abs=1e-6)


@pytest.mark.parametrize("reader", ["a1.h2", "a0.h1", "m1", "m0"])
def test_cutting_every_edge_into_a_component_is_activation_patching_it(llama, reader):
    """Its input is then the counterfactual stream, so it computes its counterfactual output."""
    nd, request, corrupted = llama
    graph = C.ComponentGraph.of(nd.engine, "head")
    r = graph.readers.index(reader)
    mask = (graph.edges[:, 1] != r)[None]
    (found,) = C.circuit_values(nd.engine, request, corrupted, graph, mask).tolist()
    base = real_writers(nd.engine, corrupted, request.target, "head")
    layer = int(reader[1])
    writer = nd.engine.points.writer(layer, "attention" if reader[0] == "a" else "ff")
    part = int(reader.split(".h")[1]) if ".h" in reader else -1
    (expected,) = patched_values(nd.engine, request, request.target, [writer_patch(writer, part, base)])
    assert found == pytest.approx(expected, abs=1e-8)  # patched_values reads the value out in float32
    assert abs(found - _value(nd, request)) > 1e-6


def test_a_circuit_cut_into_two_readers_is_the_pass_built_by_hand(llama):
    """Cut ``input → m0`` and ``a0.h1 → m1``: block 0's FF norm reads ``x − (x_in − x_in^c)``
    and block 1's FF norm reads the stream less head 1's write in block 0 (``W_O[:, h] z_h``,
    the same in this pass as in the clean one, since block 0's attention is untouched) less
    that write on the counterfactual input."""
    nd, request, corrupted = llama
    graph = C.ComponentGraph.of(nd.engine, "head")
    (found,) = C.circuit_values(nd.engine, request, corrupted, graph,
                                _mask(graph, cut={("input", "m0"), ("a0.h1", "m1")})).tolist()
    model = nd.model.model
    seen: dict[str, dict[str, torch.Tensor]] = {}
    for name, one in (("clean", request), ("counterfactual", corrupted)):
        kept: dict[str, torch.Tensor] = {}
        hooks = [(model.layers[0], lambda m, a, kept=kept: kept.__setitem__("x", a[0].detach())),
                 (model.layers[0].self_attn.o_proj, lambda m, a, kept=kept: kept.__setitem__("z", a[0].detach()))]
        _value(nd, one, hooks)
        seen[name] = kept
    heads = model.config.num_attention_heads
    e = model.config.hidden_size // heads
    w_o = model.layers[0].self_attn.o_proj.weight[:, e:2 * e]

    def head_write(z):
        return z[..., e:2 * e] @ w_o.T

    cut_input = seen["clean"]["x"] - seen["counterfactual"]["x"]
    cut_head = head_write(seen["clean"]["z"]) - head_write(seen["counterfactual"]["z"])
    expected = _value(nd, request, [(model.layers[0].post_attention_layernorm, lambda m, a: (a[0] - cut_input,)),
                                    (model.layers[1].post_attention_layernorm, lambda m, a: (a[0] - cut_head,))])
    assert found == pytest.approx(expected, abs=1e-12)
    assert abs(found - _value(nd, request)) > 1e-6


def test_batched_circuits_are_the_circuits_one_by_one(llama):
    nd, request, corrupted = llama
    graph = C.ComponentGraph.of(nd.engine, "head")
    masks = torch.rand(5, graph.n_edges, generator=torch.Generator().manual_seed(0)) > 0.5
    together = C.circuit_values(nd.engine, request, corrupted, graph, masks, batch_size=3)
    alone = torch.cat([C.circuit_values(nd.engine, request, corrupted, graph, m[None]) for m in masks])
    assert torch.allclose(together, alone, atol=1e-12)


def test_summaries_of_hand_made_curves():
    shares = C.MIB_EDGE_SHARES
    cpr, cmd = C.mib_summaries(shares, [1.0] * len(shares))
    assert cpr == pytest.approx(1 - 0.001) and cmd == 0.0
    cpr, cmd = C.mib_summaries(shares, list(shares))  # f(x) = x: the trapezoids are exact
    assert cpr == pytest.approx((1 - 0.001 ** 2) / 2) and cmd == pytest.approx((1 - 0.001) - cpr)
    cpr, cmd = C.mib_summaries((0.0, 0.5, 1.0), (0.0, 2.0, 1.0))  # overshoot counts in CMD
    assert cpr == pytest.approx(0.25 * 2 + 0.25 * 3) and cmd == pytest.approx(0.25 * (1 + 1) + 0.25 * (1 + 0))
    with pytest.raises(ValueError, match="same length"):
        C.mib_summaries((0.1, 0.2), (1.0,))


def test_the_top_edges_are_pruned_of_dangling_ones(llama):
    nd, _, _ = llama
    graph = C.ComponentGraph.of(nd.engine, "head")
    names = [f"{graph.sources[s]}->{graph.readers[r]}" for s, r in graph.edges.tolist()]
    scores = torch.zeros(graph.n_edges)
    order = ["a0.h0->logits", "m1->logits", "input->a0.h0", "input->m0", "a0.h2->a1.h1"]
    for rank, name in enumerate(order):
        scores[names.index(name)] = -(len(order) - rank)  # absolute values rank them
    masks = C.circuit_masks(graph, scores, shares=[1 / graph.n_edges, 3 / graph.n_edges, 5 / graph.n_edges])
    kept = [{names[k] for k in torch.nonzero(m).flatten().tolist()} for m in masks]
    assert kept[0] == set()  # a0.h0 → logits alone: a0.h0 reads nothing
    assert kept[1] == {"a0.h0->logits", "input->a0.h0"}  # m1 reads nothing either
    assert kept[2] == {"a0.h0->logits", "input->a0.h0"}  # m0 and a1.h1 lead nowhere; a0.h2 reads nothing
    unpruned = C.circuit_masks(graph, scores, shares=[3 / graph.n_edges], prune=False)
    assert int(unpruned.sum()) == 3
    with pytest.raises(ValueError, match="one value per edge"):
        C.circuit_masks(graph, scores[:-1])
    with pytest.raises(ValueError, match="finite"):
        C.circuit_masks(graph, torch.full((graph.n_edges,), math.nan))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        C.circuit_masks(graph, scores, shares=[1.5])


def test_position_agnostic_edges_are_the_sums_of_the_positions_edges(llama):
    nd, request, corrupted = llama
    clean = record(nd.engine, request, "head", reads=True)
    diff = differences(clean, record(nd.engine, corrupted, "head", grad=False))
    from captum_ffb.engine.tape import covectors

    cov = covectors(clean.tape)
    n = request.read_mask.shape[1]
    for source, target in ((("head", 0, 1), ("head", 1, 2)), (("token", -1, -1), ("ff", 1, -1)),
                           (("ff", 0, -1), ("output", -1, -1))):
        agnostic = link_values(clean.tape, cov, diff, [Link((*source, C.ALL), (*target, C.ALL))])
        q_range = [-1] if target[0] == "output" else range(n)
        each = [Link((*source, p), (*target, q)) for p in range(n) for q in q_range]
        assert agnostic.item() == pytest.approx(link_values(clean.tape, cov, diff, each).sum().item(), abs=1e-12)


def test_the_curve_of_scores_and_its_ends(llama):
    nd, request, corrupted = llama
    graph = C.ComponentGraph.of(nd.engine, "head")
    scores = C.edge_scores(nd.engine, request, corrupted, graph, ("atp", "eap-ig"))
    assert set(scores) == {"atp", "eap-ig"} and scores["atp"].shape == (graph.n_edges,)
    curve = C.faithfulness_curve(nd.engine, [(request, corrupted)] * 2, graph, scores["atp"])
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-9)
    assert curve.clean == pytest.approx(_value(nd, request), abs=1e-12)
    assert curve.counterfactual == pytest.approx(_value(nd, corrupted), abs=1e-12)
    assert curve.edges[-1] == graph.n_edges and list(curve.edges) == sorted(curve.edges)
    assert (curve.cpr, curve.cmd) == pytest.approx(C.mib_summaries(curve.shares, curve.faithfulness))


def test_signed_circuits_keep_the_top_scores_not_the_largest(llama):
    nd, _, _ = llama
    graph = C.ComponentGraph.of(nd.engine, "head")
    names = [f"{graph.sources[s]}->{graph.readers[r]}" for s, r in graph.edges.tolist()]
    scores = torch.zeros(graph.n_edges)
    for name, value in (("a0.h0->logits", -5), ("input->a0.h0", -4), ("m0->logits", 3), ("input->m0", 2)):
        scores[names.index(name)] = value
    share = [2 / graph.n_edges]
    signed = {names[k] for k in torch.nonzero(C.circuit_masks(graph, scores, share, absolute=False)[0]).flatten()}
    largest = {names[k] for k in torch.nonzero(C.circuit_masks(graph, scores, share)[0]).flatten()}
    assert signed == {"m0->logits", "input->m0"} and largest == {"a0.h0->logits", "input->a0.h0"}


def test_mib_reads_cpr_from_the_signed_curve_and_cmd_from_the_absolute_one(llama):
    nd, request, corrupted = llama
    graph = C.ComponentGraph.of(nd.engine, "head")
    scores = C.edge_scores(nd.engine, request, corrupted, graph, ("atp",))["atp"]
    assert (scores < 0).any() and (scores > 0).any()
    pairs = [(request, corrupted)]
    got = C.mib_scores(nd.engine, pairs, graph, scores)
    assert (got.cpr, got.cmd) == (got.signed.cpr, got.absolute.cmd)
    assert not got.signed.absolute and got.absolute.absolute
    for curve in (got.signed, got.absolute):
        assert curve == C.faithfulness_curve(nd.engine, pairs, graph, scores, absolute=curve.absolute)
        masks = C.circuit_masks(graph, scores, absolute=curve.absolute)
        values = C.circuit_values(nd.engine, request, corrupted, graph, masks)
        by_hand = (values - _value(nd, corrupted)) / (_value(nd, request) - _value(nd, corrupted))
        assert list(curve.faithfulness) == pytest.approx(by_hand.tolist(), abs=1e-9)
    assert got.signed.faithfulness != got.absolute.faithfulness  # the two rankings cut other circuits here
    same = C.mib_scores(nd.engine, pairs, graph, scores.abs())  # one sign: one set of circuits, both readings
    assert same.signed.faithfulness == same.absolute.faithfulness == got.absolute.faithfulness


def test_a_tasks_scores_are_the_default_estimators_summed_over_its_prompts(llama):
    nd, request, corrupted = llama
    graph = C.ComponentGraph.of(nd.engine, "sublayer")
    name = C.DEFAULT_CIRCUIT_ESTIMATOR
    one = C.edge_scores(nd.engine, request, corrupted, graph, (name,))[name]
    assert torch.allclose(C.task_scores(nd.engine, [(request, corrupted)] * 2, graph), 2 * one)
    with pytest.raises(ValueError, match=r"pairs must hold at least one \(request, counterfactual\) pair"):
        C.task_scores(nd.engine, [], graph)


def test_mib_export_names_each_head_edge_three_times(llama):
    nd, _, _ = llama
    graph = C.ComponentGraph.of(nd.engine, "head")
    scores = torch.arange(graph.n_edges, dtype=torch.float64)
    kept = C.circuit_masks(graph, torch.rand(graph.n_edges, generator=torch.Generator().manual_seed(1)), [0.5])[0]
    out = C.mib_graph(graph, scores, {"n_layers": 2, "n_heads": 4, "d_model": 32, "parallel_attn_mlp": False}, kept)
    assert set(out) == {"cfg", "nodes", "edges"}
    into_heads = sum(1 for _, r in graph.edges.tolist() if ".h" in graph.readers[r])
    assert len(out["edges"]) == graph.n_edges + 2 * into_heads
    assert out["edges"]["input->a1.h3<k>"]["score"] == out["edges"]["input->a1.h3<q>"]["score"]
    assert out["edges"]["m1->logits"]["score"] == float(graph.n_edges - 1)
    for name, on in zip(graph.edge_names(), kept.tolist()):
        assert out["edges"][name if name.endswith(("logits", "m0", "m1")) else name + "<v>"]["in_graph"] is on
    assert 0 < int(kept.sum()) < graph.n_edges
    assert out["nodes"]["logits"]["in_graph"] and set(out["nodes"]) == {*graph.sources, "logits"}


@pytest.mark.parametrize("name, granularity, message", [
    ("gptj", "head", "parallel"), ("bert", "sublayer", "final norm"), ("gemma2", "head", "norms the attention"),
])
def test_models_the_circuit_pass_cannot_patch_are_refused(name, granularity, message):
    nd = NormDecomposition(tiny_task_model(name, "causal_lm"))
    with pytest.raises(ValueError, match=message):
        C.ComponentGraph.of(nd.engine, granularity)


def test_a_model_whose_ends_disagree_is_refused(llama):
    nd, request, corrupted = llama
    with pytest.raises(ValueError, match="plain sum"):
        C.check_ends(nd.engine, request, corrupted, torch.tensor([0.0, 1.0], dtype=torch.float64) + 123.0)
    with pytest.raises(ValueError, match="granularity"):
        C.ComponentGraph.of(nd.engine, "neuron")
