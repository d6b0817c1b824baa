"""The logit lens of a graph's writer nodes (``graph.lens``, :mod:`captum_ffb.graph.lens`): the
tokens each write promotes and suppresses, checked against the model's own tensors captured
in a forward pass (a head's slice of its output projection's input, an FF block's output),
read through the final norm's weight (centred for a LayerNorm) and the unembedding; none for
a classifier; kept by graph files, and a file's lens checked field by field."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.graph.record import AttributionGraph
from tests.models import tiny_task_model, token_ids

# where each family keeps a block's attention output projection, its FF block, the final norm
PLACES = {"llama": ("model.layers.{}.self_attn.o_proj", "model.layers.{}.mlp", "model.norm", False),
          "gpt2": ("transformer.h.{}.attn.c_proj", "transformer.h.{}.mlp", "transformer.ln_f", True)}


def _captured(model, name: str, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per block: the output projection's input ``(n, d)`` and the FF block's output ``(n, d)``."""
    project, ff, _, _ = PLACES[name]
    found, hooks = {}, []
    for layer in range(model.config.num_hidden_layers):
        hooks.append(model.get_submodule(project.format(layer)).register_forward_pre_hook(
            lambda m, args, layer=layer: found.__setitem__(("z", layer), args[0][0].detach())))
        hooks.append(model.get_submodule(ff.format(layer)).register_forward_hook(
            lambda m, args, out, layer=layer: found.__setitem__(("ff", layer), out[0].detach())))
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    return found


def _expected(model, name: str, write: torch.Tensor, k: int) -> tuple[list[int], list[int]]:
    _, _, norm, centred = PLACES[name]
    v = write - write.mean() if centred else write
    logits = model.lm_head.weight.detach() @ (v * model.get_submodule(norm).weight.detach())
    return logits.topk(k).indices.tolist(), (-logits).topk(k).indices.tolist()


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_lens_of_each_write_is_read_from_the_models_own_tensors(name):
    model = tiny_task_model(name, "causal_lm")
    ids = token_ids(1, 8, seed=2)
    graph = NormDecomposition(model).attribute_graph(ids, 3, prune=False)
    captured = _captured(model, name, ids)
    d, checked = graph.data, {"head": 0, "ff": 0}
    heads = model.config.num_attention_heads
    for k, (promoted, suppressed) in graph.lens.items():
        kind, layer, part, p = d.kinds[k], d.layers[k], d.heads[k], d.positions[k]
        if kind == "head":
            z = captured[("z", layer)][p]
            width = z.shape[-1] // heads
            projection = model.get_submodule(PLACES[name][0].format(layer))
            w = projection.weight.detach()
            w = w.T if name == "gpt2" else w  # GPT-2's Conv1D keeps (in, out)
            write = w[:, part * width:(part + 1) * width] @ z[part * width:(part + 1) * width]
        else:
            write = captured[("ff", layer)][p]
        up, down = _expected(model, name, write, len(promoted))
        assert [int(t[1:]) for t in promoted] == up, (kind, layer, part, p)
        assert [int(t[1:]) for t in suppressed] == down
        checked[kind] += 1
    assert checked["head"] == model.config.num_hidden_layers * heads * ids.shape[1]
    assert checked["ff"] == model.config.num_hidden_layers * ids.shape[1]
    node = next(n for n in graph.to_dict()["nodes"] if n["kind"] == "head")
    assert len(node["promotes"]) == 5 and node["promotes"][0].startswith("#")


def test_the_lens_covers_the_writers_whose_edges_were_computed():
    """With ``max_nodes``, only the writers whose edges were computed can be kept: the lens reads
    exactly those (not the 1,024 largest), and every writer a pruned graph keeps has one."""
    model = tiny_task_model("llama", "causal_lm")
    nd, ids = NormDecomposition(model), token_ids(1, 8, seed=2)
    graph = nd.attribute_graph(ids, 3, max_nodes=10, prune=False)
    d = graph.data
    computed = {k for k in d.computed.nonzero()[:, 0].tolist() if d.kinds[k] in ("head", "ff", "attention")}
    assert len(computed) == 10 and set(graph.lens) == computed
    whole = nd.attribute_graph(ids, 3, prune=False)
    assert all(graph.lens[k] == whole.lens[k] for k in computed)
    pruned = nd.attribute_graph(ids, 3, max_nodes=10)
    kept = [k for k in pruned.node_mask.nonzero()[:, 0].tolist() if d.kinds[k] in ("head", "ff", "attention")]
    assert kept and all(k in pruned.lens for k in kept)


def test_a_classifier_has_no_lens():
    nd = NormDecomposition(tiny_task_model("bert", "sequence_classification"))
    graph = nd.attribute_graph(token_ids(1, 6), 1)
    assert graph.lens == {} and not any("promotes" in n for n in graph.to_dict()["nodes"])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    graph = NormDecomposition(tiny_task_model("llama", "causal_lm")).attribute_graph(token_ids(1, 6), 4)
    path = graph.save(tmp_path_factory.mktemp("lens") / "graph.npz")
    return graph, path


def test_graph_files_keep_the_lens(saved):
    graph, path = saved
    loaded = AttributionGraph.load(path)
    assert loaded.lens == graph.lens and len(loaded.lens) > 0
    assert loaded.to_dict()["nodes"] == graph.to_dict()["nodes"]


@pytest.mark.parametrize("lens, match", [
    ({"a": 1}, "lens must be a list"),
    ([[0, ["a"]]], r"lens\[0\] must be \[node, promoted, suppressed\]"),
    ([[10 ** 6, [], []]], r"lens\[0\]\[0\] is 1000000, outside"),
    ([[1, [], []], [1, [], []]], r"lens\[1\] repeats node 1"),
    ([[1, ["x"] * 21, []]], r"lens\[0\]\[1\] must be at most 20 strings"),
    ([[1, [], [3]]], r"lens\[0\]\[2\] must be at most 20 strings"),
    ([[1, ["x" * 201], []]], "of at most 200 characters"),
    ([[k, [], []] for k in range(10 ** 4)], "entries for"),
], ids=["not-a-list", "short", "node-out-of-range", "repeated", "too-many", "not-strings", "too-long", "too-many-entries"])
def test_a_files_lens_is_checked(saved, tmp_path, lens, match):
    _, path = saved
    bad = tmp_path / "bad.npz"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(bad, "w") as target:
        for item in source.namelist():
            data = source.read(item)
            if item == "metadata.json":
                meta = json.loads(data)
                meta["lens"] = lens
                data = json.dumps(meta)
            target.writestr(item, data)
    with pytest.raises(ValueError, match=match):
        AttributionGraph.load(bad)


def test_neuronpedia_labels_say_what_a_writer_writes(saved):
    from captum_ffb.viz.neuronpedia import neuronpedia_graph

    graph, _ = saved
    found = neuronpedia_graph(graph, "a prompt")
    ids = graph.ids()
    clerps = {n["ctx_idx"]: [] for n in found["nodes"]}
    for node in found["nodes"]:
        clerps[node["ctx_idx"]].append(node["clerp"])
    for k, (promoted, _) in graph.lens.items():
        if graph.node_mask[k]:
            place = ids[k].split("@")[0]
            assert any(c.startswith(place) and c.endswith(f" ↑ {promoted[0]}") for c in clerps[graph.data.positions[k]])
