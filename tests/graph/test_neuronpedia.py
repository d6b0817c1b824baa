"""Graph files for Neuronpedia: its own JSON schema (vendored in tests/data/neuronpedia), the
influence its pruning slider reads, clean tokens, names not paths, pins and supernodes both
ways, query–key results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.cli import main
from captum_ffb.viz.neuronpedia import (
    cumulative_influence,
    neuronpedia_graph,
    neuronpedia_token,
    read_neuronpedia_state,
    save_neuronpedia_graph,
)
from tests.models import byte_level_tokenizer, save_tiny_lm, tiny_lm

SCHEMA = Path(__file__).resolve().parents[1] / "data" / "neuronpedia" / "graph-schema.json"
TEXT = "the cat sat on the mat because it was"


def validate(found: dict) -> dict:
    """``found`` checked against Neuronpedia's schema, and every id it refers to resolved."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(found), key=str)
    assert not errors, errors[0].message
    nodes = {n["node_id"]: n for n in found["nodes"]}
    assert len(nodes) == len(found["nodes"])
    assert all(link["source"] in nodes and link["target"] in nodes for link in found["links"])
    extra = found.get("qk_only_nodes", {})
    assert not set(extra) & set(nodes)
    for node in nodes.values():
        results = node.get("qk_tracing_results")
        if results:  # every contributor resolves to a node or a qk-only node (the schema's promise)
            named = [i for q, k, _ in results["pair_wise_contributors"] for i in (q, k)]
            named += [i for i, _ in results["top_q_marginal_contributors"] + results["top_k_marginal_contributors"]]
            assert all(i in nodes or i in extra for i in named)
    assert json.loads(json.dumps(found)) == found
    return nodes


@pytest.fixture(scope="module")
def byte_level():
    """A tiny Llama with a byte-level BPE tokenizer (pieces like ``Ġcat``) and its graph."""
    tokenizer = byte_level_tokenizer()
    nd = NormDecomposition(tiny_lm("llama"), tokenizer=tokenizer)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    return nd, tokenizer, ids, nd.attribute_graph(ids, node_threshold=0.95)


def test_the_file_validates_against_neuronpedias_schema(byte_level):
    nd, _, _, graph = byte_level
    nodes = validate(neuronpedia_graph(graph, TEXT))
    assert len(nodes) == int(graph.node_mask.sum())
    assert validate(neuronpedia_graph(nd.attribute_graph(byte_level[2], prune=False), TEXT))  # unpruned too


def test_influence_is_circuit_tracers_cumulative_share_so_the_slider_keeps_the_largest_first(byte_level):
    """Loaded with the viewer's rule (keep ``influence <= threshold``, tokens and logits always),
    every threshold keeps the writers of largest influence, a prefix of their order."""
    graph = byte_level[3]
    found = neuronpedia_graph(graph, TEXT)
    writers = [n for n in found["nodes"] if n["feature_type"] not in ("embedding", "logit")]
    raw = {n["node_id"]: float(graph.influence[k]) for n, k in zip(
        found["nodes"], graph.node_mask.nonzero()[:, 0].tolist()) if n in writers}
    by_influence = sorted(raw, key=lambda i: -raw[i])
    for threshold in (0.05, 0.2, 0.5, 0.8, 0.95, 1.0):
        kept = {n["node_id"] for n in writers if n["influence"] <= threshold}
        assert kept == set(by_influence[:len(kept)]), threshold
    most = min(writers, key=lambda n: n["influence"])
    assert most["node_id"] == by_influence[0]
    assert found["metadata"]["node_threshold"] == graph.thresholds["node_threshold"] == 0.95
    assert found["metadata"]["pruning_settings"] == {"node_threshold": 0.95, "edge_threshold": 0.98}


def test_cumulative_influence_by_hand():
    found = cumulative_influence(torch.tensor([1.0, 3.0, 0.0, 4.0]))
    assert found.tolist() == pytest.approx([1.0, 7 / 8, 1.0, 0.5])


def test_prompt_tokens_are_text_not_the_tokenizers_pieces(byte_level):
    nd, tokenizer, ids, graph = byte_level
    assert any(t.startswith("Ġ") for t in graph.tokens)  # the graph keeps the pieces
    decoded = [tokenizer.decode([i]) for i in ids[0].tolist()]
    for found in (neuronpedia_graph(graph, TEXT), neuronpedia_graph(graph, TEXT, tokenizer=tokenizer)):
        assert found["metadata"]["prompt_tokens"] == decoded
        assert not any("Ġ" in n["clerp"] for n in found["nodes"])
    tokens = {n["ctx_idx"]: n["clerp"] for n in neuronpedia_graph(graph, TEXT)["nodes"]
              if n["feature_type"] == "embedding"}
    assert tokens == dict(enumerate(decoded))


@pytest.mark.parametrize(("piece", "text"), [
    ("ĠParis", " Paris"), ("Ċ", "⏎"), ("ĉ", "→"), ("Ã©", "é"), ("Ġ", " "), ("▁Paris", " Paris"),
    ("<0x0A>", "⏎"), ("hello", "hello"), ("##ing", "##ing"), ("[CLS]", "[CLS]"),
])
def test_a_piece_is_decoded_as_circuit_tracer_writes_tokens(piece, text):
    assert neuronpedia_token(piece) == text


def test_pins_supernodes_and_the_clicked_node_go_out_and_come_back(byte_level, tmp_path):
    graph = byte_level[3]
    kept = [i for i, keep in zip(graph.ids(), graph.node_mask.tolist()) if keep]
    writers = [i for i in kept if i.startswith("block.")]
    assert len(writers) >= 3
    pinned, group = [writers[0], "output"], ("the largest writers", writers[:3])
    path = save_neuronpedia_graph(graph, tmp_path / "g.json", TEXT, pinned=pinned, supernodes=[group],
                                  clicked=writers[1])
    found = json.loads(path.read_text())
    nodes = validate(found)
    params = found["qParams"]
    assert all(i in nodes for i in params["pinnedIds"] + params["supernodes"][0][1:] + [params["clickedId"]])
    assert params["supernodes"][0][0] == "the largest writers"
    state = read_neuronpedia_state(path, graph)
    assert state.pinned == pinned and state.supernodes == [group] and state.clicked == writers[1]
    assert state.unknown == []
    theirs = read_neuronpedia_state(found)  # without the graph: Neuronpedia's ids
    assert theirs.pinned == params["pinnedIds"]
    found["qParams"]["pinnedIds"].append("99_1_1")  # a node this graph does not have
    assert read_neuronpedia_state(found, graph).unknown == ["99_1_1"]
    with pytest.raises(ValueError, match="has no node"):
        neuronpedia_graph(graph, TEXT, pinned=["block.99.ff@0"])


@pytest.mark.parametrize(("params", "message"), [
    ({"pinnedIds": "1_2_3"}, "pinnedIds must be a list"),
    ({"pinnedIds": [3]}, "node ids are strings"),
    ({"supernodes": [[]]}, "does not start with its name"),
    ({"supernodes": [["name", {"x": 1}]]}, "node ids are strings"),
    ({"pinnedIds": ["a"] * 10_001}, "more than 10,000"),
])
def test_a_strangers_state_is_checked(params, message):
    with pytest.raises(ValueError, match=message):
        read_neuronpedia_state({"qParams": params})


def test_a_file_too_large_or_not_json_is_refused(tmp_path, monkeypatch):
    from captum_ffb.viz import neuronpedia

    path = tmp_path / "g.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON file"):
        read_neuronpedia_state(path)
    path.write_text(json.dumps({"qParams": {}, "padding": "x" * 200}))
    monkeypatch.setattr(neuronpedia, "MAX_STATE_BYTES", 100)
    with pytest.raises(ValueError, match="read up to 100"):
        read_neuronpedia_state(path)


def test_heads_carry_their_query_key_results(byte_level):
    graph = byte_level[3]
    pairs = graph.query_key_pairs()
    found = neuronpedia_graph(graph, TEXT, query_key=pairs)
    nodes = validate(found)
    carrying = {i: n["qk_tracing_results"] for i, n in nodes.items() if "qk_tracing_results" in n}
    assert len(carrying) == len(pairs) > 0
    for entries in pairs.values():
        values = sorted(p["value"] for e in entries for p in e["pairs"])
        (results,) = [r for r in carrying.values()
                      if sorted(v for _, _, v in r["pair_wise_contributors"]) == pytest.approx(values)]
        total = sum(values)
        assert sum(v for _, v in results["top_q_marginal_contributors"]) == pytest.approx(total, abs=1e-6)
        assert sum(v for _, v in results["top_k_marginal_contributors"]) == pytest.approx(total, abs=1e-6)
    assert "qk_tracing_results" not in json.dumps(neuronpedia_graph(graph, TEXT, query_key={}))


def test_scan_is_a_name_not_a_path(byte_level):
    graph = byte_level[3]
    assert neuronpedia_graph(graph, TEXT)["metadata"]["scan"] == "captum-ffb"
    assert neuronpedia_graph(graph, TEXT, scan="smollm2-135m")["metadata"]["scan"] == "smollm2-135m"
    with pytest.raises(ValueError, match="not a path"):
        neuronpedia_graph(graph, TEXT, scan="/home/me/models/smollm2")


def test_the_command_line_writes_the_folders_name_clean_tokens_and_no_path(tmp_path):
    model = save_tiny_lm(tmp_path / "my-tiny-llama", byte_level=True)
    out = tmp_path / "out"
    assert main(["graph", TEXT, "--model", str(model), "--out", str(out), "--format", "neuronpedia",
                 "--quiet"]) == 0
    text = (out / "graph_neuronpedia.json").read_text()
    found = json.loads(text)
    validate(found)
    assert found["metadata"]["scan"] == "my-tiny-llama"
    assert str(tmp_path) not in text
    tokenizer = byte_level_tokenizer()
    assert found["metadata"]["prompt_tokens"] == [tokenizer.decode([i]) for i in tokenizer(TEXT).input_ids]
    assert main(["graph", TEXT, "--model", str(model), "--out", str(tmp_path / "o2"), "--format", "neuronpedia",
                 "--model-name", "tiny", "--quiet"]) == 0
    assert json.loads((tmp_path / "o2" / "graph_neuronpedia.json").read_text())["metadata"]["scan"] == "tiny"


def test_a_model_name_that_is_a_path_is_one_line(one_line, tmp_path):
    message = one_line(["graph", TEXT, "--model", str(tmp_path), "--model-name", "a/b", "--out", str(tmp_path / "o")])
    assert message == "--model-name is a name, not a path, got 'a/b'"
