"""Several outputs at once (:class:`~captum_ffb.TopLogits`, circuit-tracer's ``max_n_logits`` /
``desired_logit_prob``): the most probable next tokens until a probability mass, a ``logit``
node each whose value is ``p · logit`` (read from the model's own logits) and whose direct
edges are exactly ``p`` times those of that token's own graph; flow conserved; kept by graph
files, written as Neuronpedia's logit nodes, run from the command line; bad input refused."""

from __future__ import annotations

import json

import pytest
import torch

from captum_ffb import NormDecomposition, TopLogits
from captum_ffb.graph.record import AttributionGraph
from tests.models import tiny_task_model, token_ids


@pytest.fixture(scope="module")
def several():
    model = tiny_task_model("llama", "causal_lm")
    nd = NormDecomposition(model)
    ids = token_ids(1, 9, seed=4)
    return model, nd, ids, nd.attribute_graph(ids, TopLogits(4, 0.99), prune=False)


def test_the_tokens_are_the_most_probable_until_the_mass(several):
    model, _, ids, _ = several
    with torch.no_grad():
        p = model(ids).logits[0, -1].softmax(-1)
    top = p.sort(descending=True)
    for mass, most in ((0.01, 10), (0.05, 10), (0.2, 3), (1.0, 5)):
        chosen = TopLogits(most, mass).resolve(model(ids), torch.ones_like(ids))
        expected = min(most, int((top.values.cumsum(0) < mass).sum()) + 1)
        assert chosen.tokens.shape == (1, expected) and chosen.tokens[0].tolist() == top.indices[:expected].tolist()
        assert torch.allclose(chosen.weights[0], top.values[:expected])


def test_each_logit_node_is_p_times_its_logit_and_its_edges_p_times_its_own_graphs(several):
    model, nd, ids, graph = several
    d = graph.data
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    p = logits.softmax(-1)
    ids_of = graph.ids()
    logit_nodes = [k for k, kind in enumerate(d.kinds) if kind == "logit"]
    assert len(logit_nodes) == 4
    for k in logit_nodes:
        unit = d.heads[k]
        assert float(d.values[k]) == pytest.approx(float(p[unit] * logits[unit]), rel=1e-5)
        alone = nd.attribute_graph(ids, unit, prune=False)
        own = {alone.ids()[int(s)]: float(w) for s, t, w in zip(alone.data.sources, alone.data.targets, alone.data.weights)
               if int(t) == alone.data.output and alone.data.kinds[int(s)] != "bias"}
        here = {ids_of[int(s)]: float(w) for s, t, w in zip(d.sources, d.targets, d.weights)
                if int(t) == k and d.kinds[int(s)] != "bias"}
        assert here.keys() == own.keys() and len(here) > 10
        for node, w in own.items():
            assert here[node] == pytest.approx(float(p[unit]) * w, rel=1e-4, abs=1e-9)
    into_output = {ids_of[int(s)]: float(w) for s, t, w in zip(d.sources, d.targets, d.weights) if int(t) == d.output}
    assert set(into_output) <= {ids_of[k] for k in logit_nodes} | {"bias"}
    assert sum(float(d.values[k]) for k in logit_nodes) == pytest.approx(graph.value, rel=1e-6)
    assert graph.flow_residual() < 1e-5 and graph.kept_share == pytest.approx(1.0)
    pruned = graph.prune(0.5, 0.9)
    assert all(pruned.node_mask[k] for k in logit_nodes) and 0 < pruned.kept_share
    assert graph.hook_name(ids_of[logit_nodes[0]]) == ("unembed.hook_out", ids.shape[1] - 1, d.heads[logit_nodes[0]])


def test_files_and_neuronpedia_keep_the_logit_nodes(several, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from captum_ffb.viz.neuronpedia import neuronpedia_graph
    from tests.graph.test_neuronpedia import SCHEMA

    _, _, _, graph = several
    pruned = graph.prune()
    loaded = AttributionGraph.load(pruned.save(tmp_path / "g.npz"))
    assert loaded.to_dict()["nodes"] == pruned.to_dict()["nodes"]
    found = neuronpedia_graph(loaded, "the prompt", slug="several")
    jsonschema.Draft7Validator(json.loads(SCHEMA.read_text(encoding="utf-8"))).validate(found)
    logits = [n for n in found["nodes"] if n["feature_type"] == "logit"]
    assert len(logits) == 4 and sum(n["is_target_logit"] for n in logits) == 1
    assert max(logits, key=lambda n: n["token_prob"])["is_target_logit"]
    ids = {n["node_id"] for n in found["nodes"]}
    assert all(link["source"] in ids and link["target"] in ids for link in found["links"])
    assert len(ids) == len(found["nodes"])  # the logits' sum shares no id with the target logit
    # the sum is not written: pinned, chosen or in a supernode, it stands for its logit nodes
    output = next(n["id"] for n in loaded.to_dict()["nodes"] if n["kind"] == "output")
    writer = next(n["id"] for n in loaded.to_dict()["nodes"] if n["kind"] == "token")
    state = neuronpedia_graph(loaded, "the prompt", pinned=[output, writer], supernodes=[("out", [output])],
                              clicked=output)["qParams"]
    target = next(n["node_id"] for n in logits if n["is_target_logit"])
    assert set(state["pinnedIds"]) == {n["node_id"] for n in logits} | {state["pinnedIds"][-1]}
    assert state["pinnedIds"][0] == target and len(state["pinnedIds"]) == 5 and state["clickedId"] == target
    assert state["supernodes"] == [["out", *state["pinnedIds"][:4]]]
    assert all(pin in ids for pin in state["pinnedIds"])


@pytest.mark.parametrize("options, match", [
    (dict(max_n_logits=0), "max_n_logits must be"), (dict(max_n_logits=True), "max_n_logits must be"),
    (dict(desired_logit_prob=0.0), "desired_logit_prob must be"), (dict(desired_logit_prob=1.5), "desired_logit_prob"),
])
def test_bad_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        TopLogits(**options)


def test_a_classifier_has_no_several_logits():
    nd = NormDecomposition(tiny_task_model("bert", "sequence_classification"))
    with pytest.raises(ValueError, match="TopLogits reads a causal LM"):
        nd.attribute_graph(token_ids(1, 6), TopLogits(3))


def test_the_command_line_writes_several_outputs(tmp_path):
    from captum_ffb.cli import main
    from tests.models import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "lm", byte_level=True)
    out = tmp_path / "g"
    assert main(["graph", "the cat sat on the mat", "--model", str(folder), "--out", str(out), "--quiet",
                 "--max-n-logits", "3", "--desired-logit-prob", "0.99", "--format", "json"]) == 0
    saved = json.loads((out / "graph.json").read_text(encoding="utf-8"))
    logits = [n for n in saved["nodes"] if n["kind"] == "logit"]
    assert len(logits) == 3 and all(isinstance(n["token"], str) and 0 < n["probability"] < 1 for n in logits)
    assert saved["output"].startswith("Σ p·logit of ")
    assert main(["graph", "the cat", "--model", str(folder), "--out", str(out), "--max-n-logits", "3",
                 "--target", " cat"]) == 2
