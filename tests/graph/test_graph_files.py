"""Graphs as files (save, load, bind), their rankings, the positions set aside, the shares the
kept graph holds, and what the default pruning is against pruning the whole graph."""

from __future__ import annotations

import dataclasses
import json
import math
import zipfile

import numpy as np
import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.attr import AttributionGraph, graph_files
from captum_ffb.explained.readouts import Contrast
from captum_ffb.graph.build import prune_masks
from captum_ffb.patching.patches import DEFAULT_EDGE_ESTIMATOR
from tests.models import tiny_task_model, token_ids

WRITERS = ("head", "attention", "ff", "neuron")


@pytest.fixture(scope="module")
def built():
    model = tiny_task_model("llama", "causal_lm")
    nd = NormDecomposition(model)
    ids = token_ids()[:1, :7]
    corrupted = ids.clone()
    corrupted[0, 1], corrupted[0, 3] = 11, 13
    graph = nd.attribute_graph(ids, 5, corrupted_inputs=corrupted, max_nodes=30, exclude_positions=[0],
                               node_threshold=0.6)
    graph.attach_score_pairs(1, 0, 6, 2, top=3)
    return model, nd, ids, graph


def _same(a: AttributionGraph, b: AttributionGraph) -> None:
    """Every field of two graphs equal (arrays exactly)."""
    for name in ("values", "sources", "targets", "weights", "left_out", "computed"):
        x, y = getattr(a.data, name), getattr(b.data, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert torch.equal(x, y), name
    for name in ("kinds", "layers", "heads", "positions", "bias", "output"):
        assert getattr(a.data, name) == getattr(b.data, name), name
    for name in ("node_mask", "edge_mask", "influence", "patch_kappa"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.patch_estimates.keys() == b.patch_estimates.keys()
    assert all(torch.equal(a.patch_estimates[k], b.patch_estimates[k]) for k in a.patch_estimates)
    assert a.edge_patches.keys() == b.edge_patches.keys() and a.patch_passes == b.patch_passes
    assert all(torch.allclose(a.edge_patches[k], b.edge_patches[k], equal_nan=True) for k in a.edge_patches)
    for name in ("tokens", "output_label", "granularity", "patch_components", "thresholds", "qk_links", "probability",
                 "token_ids", "n_source", "target", "excluded_positions", "lens"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.ids() == b.ids()


def test_a_saved_graph_loads_equal_and_prunes_ranks_and_splits_as_before(built, tmp_path):
    model, nd, ids, graph = built
    graph.edge_patch_estimates()  # computed first (saving runs no model), then saved with the graph
    path = graph.save(tmp_path / "graph.npz")
    loaded = AttributionGraph.load(path)
    _same(graph, loaded)
    assert graph.edge_patches and not torch.isnan(graph.edge_patches[DEFAULT_EDGE_ESTIMATOR]).all()
    assert loaded.to_dict() == graph.to_dict()
    assert loaded.flow_residual() == graph.flow_residual()
    for options in ({}, {"node_threshold": 0.9, "edge_threshold": 0.99}, {"exclude_positions": ()}):
        _same(graph.prune(**options), loaded.prune(**options))
    for by in ("value", "patch"):
        for level in ("component", "node"):
            assert loaded.ranking(by, level, top=None) == graph.ranking(by, level, top=None)
    with pytest.raises(ValueError, match="not bound to one"):
        loaded.score_split(1, 0, 6, 2)
    assert type(loaded) is AttributionGraph and not loaded.bound and graph.bound
    bound = AttributionGraph.load(path, model=model)
    assert bound.score_split(1, 0, 6, 2) == graph.score_split(1, 0, 6, 2)
    assert bound.query_key_pairs(heads=2) == graph.query_key_pairs(heads=2)
    rebound = loaded.bind(nd)  # a new, bound graph: the loaded one stays passive
    assert rebound is not loaded and not loaded.bound and rebound.bound
    assert rebound.score_split(1, 2, 5, 1) == graph.score_split(1, 2, 5, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.tokens = []  # a record: views and pruning return new graphs
    again = rebound.save(tmp_path / "again.npz")  # a loaded graph, bound, saves what it loaded
    _same(graph, AttributionGraph.load(again))


def test_the_file_is_a_npz_of_arrays_and_metadata(built, tmp_path, monkeypatch):
    _, _, _, graph = built
    path = graph.save(tmp_path / "graph.npz")
    arrays = np.load(path)
    assert {"kinds", "layers", "heads", "positions", "values", "sources", "targets", "weights", "node_mask",
            "edge_mask", "influence", "left_out", "computed", "patch_kappa", "patch_estimates.atp+exact"} <= \
        set(arrays.files)
    assert arrays["sources"].dtype == np.int32 and arrays["node_mask"].dtype == np.bool_
    np.testing.assert_array_equal(arrays["weights"], graph.data.weights.numpy())
    with zipfile.ZipFile(path) as archive:
        meta = json.loads(archive.read("metadata.json"))
    assert meta["format"] == graph_files.FORMAT and meta["version"] == graph_files.VERSION
    assert meta["target"]["units"] == [5] and meta["excluded_positions"] == [0]
    assert meta["origin"]["fingerprint"] and meta["origin"]["model_type"] == "llama"
    # written in chunks (as an unpruned graph's millions of edges are): the same arrays
    monkeypatch.setattr(graph_files, "CHUNK", 7)
    _same(graph, AttributionGraph.load(graph.save(tmp_path / "chunked.npz", compress=False)))


def test_binding_refuses_another_model_other_weights_and_other_rules(built, tmp_path):
    from captum_ffb.rules.activation import LinearisedGatedActivation

    model, _, _, graph = built
    path = graph.save(tmp_path / "graph.npz")
    edited = tiny_task_model("llama", "causal_lm")
    with torch.no_grad():
        edited.model.layers[1].mlp.down_proj.weight[3, 5] += 1e-3
    with pytest.raises(ValueError, match="not those this graph was built on .*down_proj"):
        AttributionGraph.load(path, model=edited)
    with pytest.raises(ValueError, match="built on a llama model"):
        AttributionGraph.load(path, model=tiny_task_model("gpt2", "causal_lm"))
    with pytest.raises(ValueError, match="other rules"):
        AttributionGraph.load(path, model=model, rules={"gated_activation": LinearisedGatedActivation()})
    # a model changed between the build and the save: the file says so, binding refuses
    copy = tiny_task_model("llama", "causal_lm")
    changed = NormDecomposition(copy).attribute_graph(token_ids()[:1, :7], 5)
    with torch.no_grad():
        copy.model.layers[0].self_attn.q_proj.weight.mul_(2)
    later = changed.save(tmp_path / "changed.npz")
    with pytest.raises(ValueError, match="changed after the graph was built"):
        AttributionGraph.load(later, model=copy)
    assert AttributionGraph.load(later).value == changed.value  # the numbers are the build's, kept


def test_bad_files_are_refused_in_one_line(built, tmp_path):
    _, _, _, graph = built
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match="not a graph file"):
        AttributionGraph.load(tmp_path / "text.npz")
    np.savez(tmp_path / "plain.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="no metadata.json"):
        AttributionGraph.load(tmp_path / "plain.npz")
    path = graph.save(tmp_path / "graph.npz")
    for change, match in ((lambda m: m.update(version=99), "version 99"),
                          (lambda m: m.update(format="other"), "format 'other'"),
                          (lambda m: m.update(nodes=m["nodes"] + 1), r"the array kinds has shape \(79,\), the metadata "
                                                                     r"says \(80,\)")):
        with zipfile.ZipFile(path) as source, zipfile.ZipFile(tmp_path / "bad.npz", "w") as target:
            for item in source.namelist():
                data = source.read(item)
                if item == "metadata.json":
                    meta = json.loads(data)
                    change(meta)
                    data = json.dumps(meta)
                target.writestr(item, data)
        with pytest.raises(ValueError, match=match):
            AttributionGraph.load(tmp_path / "bad.npz")
    with pytest.raises(IsADirectoryError, match="give a file name"):
        graph.save(tmp_path)


def test_to_dict_refuses_a_graph_too_large_for_dicts(built):
    _, nd, ids, _ = built
    full = nd.attribute_graph(ids, 5, prune=False)
    links = int(full.edge_mask.sum())
    with pytest.raises(ValueError, match=rf"keeps {links:,} links .* prune it .*graph.save\(path\)"):
        full.to_dict(max_links=links - 1)
    assert len(full.to_dict(max_links=links)["links"]) == links
    assert len(full.to_dict(max_links=None)["links"]) == links


def test_rankings_cover_every_computed_node_kept_or_not(built):
    _, _, _, graph = built
    d = graph.data
    writers = [k for k, kind in enumerate(d.kinds) if kind in WRITERS and d.positions[k] != 0]
    ids = graph.ids()
    nodes = graph.ranking("patch", "node", top=None)
    assert {name for name, _ in nodes} == {ids[k] for k in writers}  # kept or pruned away alike
    assert any(not graph.node_mask[ids.index(name)] for name, _ in nodes[:10])
    assert [abs(v) for _, v in nodes] == sorted((abs(v) for _, v in nodes), reverse=True)
    by_value = dict(graph.ranking("value", "component", top=None))
    expected: dict[str, float] = {}
    for k in writers:
        name = ids[k].split("@")[0]
        expected[name] = expected.get(name, 0.0) + float(d.values[k])
    assert by_value == pytest.approx(expected)
    assert len(graph.ranking("value", "node", top=3)) == 3
    everything = graph.prune(exclude_positions=())
    assert dict(everything.ranking("patch", top=None)) == pytest.approx(graph.component_estimates())
    for options, error, match in (({"by": "size"}, ValueError, "by must be"), ({"level": "head"}, ValueError, "level"),
                                  ({"top": 0}, ValueError, "top"), ({"by": "patch", "estimator": "x"}, ValueError,
                                                                     "estimator must be one of .*frozen")):
        with pytest.raises(error, match=match):
            graph.ranking(**options)
    plain = AttributionGraph.of(d, graph.tokens, "x", "head")
    with pytest.raises(ValueError, match="corrupted_inputs"):
        plain.ranking("patch")


def test_excluded_positions_are_set_aside_from_pruning_ranking_and_max_nodes(built):
    _, nd, ids, graph = built
    d = graph.data
    at_zero = [k for k, kind in enumerate(d.kinds) if kind in WRITERS and d.positions[k] == 0]
    assert graph.excluded_positions == (0,) and not graph.node_mask[at_zero].any()
    assert not d.computed[at_zero].any()  # max_nodes chose them last
    assert all(not name.endswith("@0") for name, _ in graph.ranking(level="node", top=None))
    with_them = nd.attribute_graph(ids, 5, max_nodes=30, node_threshold=0.6)
    assert with_them.excluded_positions == () and with_them.data.computed[at_zero].any()
    full = nd.attribute_graph(ids, 5, prune=False)
    assert full.prune(exclude_positions=[0]).excluded_positions == (0,)
    assert full.prune(exclude_positions=[-7]).excluded_positions == (0,)  # from the end
    assert full.prune(exclude_positions=torch.tensor([2, 0, 2])).excluded_positions == (0, 2)
    for bad, error in (("0", TypeError), ([1.5], TypeError), ([7], ValueError), (5, TypeError)):
        with pytest.raises(error, match="exclude_positions"):
            nd.attribute_graph(ids, 5, exclude_positions=bad)


def test_kept_share_of_a_contrast_and_the_share_of_absolute_weight():
    """A contrast's kept edges into the output may add up to more than its value (edges that
    pull the other way were pruned); the share of ``|weight|`` stays between 0 and 1."""
    model = tiny_task_model("llama", "causal_lm")
    nd = NormDecomposition(model)
    found = []
    for seed in range(1, 6):
        ids = token_ids(seed=seed)[:1, :7]
        full = nd.attribute_graph(ids, Contrast(5, 9), prune=False)
        assert full.kept_share == pytest.approx(1.0, rel=1e-4) and full.kept_abs_share == pytest.approx(1.0)
        pruned = full.prune(0.5, 0.8)
        d = pruned.data
        into = (d.targets == d.output) & pruned.edge_mask
        assert pruned.kept_abs_share == pytest.approx(
            float(d.weights[into].abs().sum()) / float(d.weights[d.targets == d.output].abs().sum()))
        assert 0 <= pruned.kept_abs_share <= 1
        found.append(pruned.kept_share)
    assert any(share > 1 or share < 0 for share in found), found  # signed shares leave [0, 1]
    assert not math.isnan(pruned.to_dict()["kept_abs_share"])


def test_the_default_pruning_is_the_whole_graphs_among_the_max_nodes_largest():
    """``attribute_graph()`` computes the edges of the ``max_nodes`` writers of largest
    ``|value|`` and prunes among them; ``attribute_graph(prune=False).prune()`` prunes among
    every writer with the same thresholds: the first is the second restricted to those writers
    (exactly), and keeps fewer nodes."""
    model = tiny_task_model("llama", "causal_lm")
    nd = NormDecomposition(model)
    ids = token_ids(n=9)[:1, :9]
    m = 10
    default = nd.attribute_graph(ids, 5, max_nodes=m, node_threshold=0.95)
    full = nd.attribute_graph(ids, 5, prune=False)
    d = full.data
    writers = [k for k, kind in enumerate(d.kinds) if kind in WRITERS]
    largest = sorted(writers, key=lambda k: -abs(float(d.values[k])))[:m]
    candidates = torch.tensor([kind in ("token", "bias", "output") for kind in d.kinds])
    candidates[largest] = True
    nodes, _, _ = prune_masks(d, candidates, torch.ones_like(full.edge_mask), 0.95, 0.98)
    assert torch.equal(nodes, default.node_mask)
    whole = full.prune(0.95)
    assert int(whole.node_mask.sum()) > int(default.node_mask.sum())
    assert default.thresholds["max_nodes"] == m and whole.thresholds["max_nodes"] is None
    # pruning a pruned graph starts again from every computed node
    assert torch.equal(whole.prune(0.5, 0.9).node_mask, full.prune(0.5, 0.9).node_mask)


def test_a_file_of_before_the_mixture_fields_still_loads_and_binds(built, tmp_path):
    """Files written before ``HeadTarget.mix`` and ``offset`` (0.5) have neither in ``origin.target``."""
    model, _, _, graph = built
    path = graph.save(tmp_path / "graph.npz")
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(tmp_path / "old.npz", "w") as target:
        for item in source.namelist():
            data = source.read(item)
            if item == "metadata.json":
                meta = json.loads(data)
                assert meta["origin"]["target"].pop("mix") is None
                assert meta["origin"]["target"].pop("offset") == 0.0
                data = json.dumps(meta)
            target.writestr(item, data)
    old = AttributionGraph.load(tmp_path / "old.npz", model=model)
    assert old.bound and old.value == graph.value
