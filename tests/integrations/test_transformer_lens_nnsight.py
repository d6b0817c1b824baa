"""Where researchers already are: a TransformerLens 4 ``TransformerBridge`` and an nnsight
``LanguageModel`` accepted wherever a model is, and each graph node's TransformerLens hook.

Both are optional (never required by the package): each test skips where its library is not
installed."""

from __future__ import annotations

import copy

import pytest
import torch

from captum_ffb import NormDecomposition, activation_patching
from tests.models import causal_tokenizer, tiny_lm

TEXT = "the cat sat on the mat because"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    causal_tokenizer().save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)  # a bridge wants one read from a folder


@pytest.fixture(scope="module")
def bridged(tokenizer):
    pytest.importorskip("transformer_lens.model_bridge", reason="TransformerLens 4 is not installed")
    from transformer_lens.model_bridge import TransformerBridge

    model = tiny_lm("llama").eval()
    reference = copy.deepcopy(model)  # booting rewrites the model in place
    bridge = TransformerBridge.boot_transformers("tiny-llama", hf_model=model, tokenizer=tokenizer)
    # booting switches the model to eager attention: the reference runs the same kernel
    reference.set_attn_implementation(bridge.original_model.config._attn_implementation)
    return bridge, reference


def _same_graph(a, b):
    assert a.ids() == b.ids()
    torch.testing.assert_close(a.data.values, b.data.values, rtol=0, atol=1e-6)
    torch.testing.assert_close(a.data.weights, b.data.weights, rtol=0, atol=1e-6)


def test_a_transformer_bridge_is_explained_as_its_hugging_face_model(bridged, tokenizer, tmp_path):
    bridge, reference = bridged
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    nd = NormDecomposition(bridge)
    assert nd.tokenizer is bridge.tokenizer and nd.model is NormDecomposition(bridge).model  # one view, one lock
    assert all(p is q for p, q in zip(nd.model.parameters(), bridge.original_model.parameters()))  # nothing copied
    torch.testing.assert_close(nd.attribute(ids, target=" cat"),
                               NormDecomposition(reference, tokenizer=tokenizer).attribute(ids, target=" cat"))
    graph = nd.attribute_graph(ids, " cat", prune=False)
    _same_graph(graph, NormDecomposition(reference, tokenizer=tokenizer).attribute_graph(ids, " cat", prune=False))
    assert graph.score_split(1, 0, 6, 2) == NormDecomposition(reference).attribute_graph(
        ids, graph.target.units[0], prune=False).score_split(1, 0, 6, 2)
    from captum_ffb.attr import AttributionGraph

    again = AttributionGraph.load(graph.save(tmp_path / "graph.npz"), model=reference)  # the same weights
    assert again.score_split(1, 0, 6, 2) == graph.score_split(1, 0, 6, 2)
    with torch.no_grad():  # the bridge is as it was: its hooks still fire, its logits are the model's
        logits, cache = bridge.run_with_cache(ids)
        torch.testing.assert_close(logits, reference(ids).logits, rtol=0, atol=1e-5)
    assert "blocks.1.attn.hook_z" in cache
    corrupted = tokenizer("the dog sat on the mat because", return_tensors="pt").input_ids
    effects = activation_patching(bridge, ids, corrupted, " cat", show_progress=False).effects
    assert effects == pytest.approx(activation_patching(reference, ids, corrupted, " cat", tokenizer=tokenizer,
                                                        show_progress=False).effects, abs=1e-5)


def test_every_node_names_the_bridge_hook_that_holds_it(bridged, tokenizer):
    """``hook_name``: the activation at the named hook, position and index is the node's own
    tensor in the Hugging Face model (a head's slice of the output projection's input, an FF
    block's output, a neuron's activation, the first block's input, the logits)."""
    bridge, reference = bridged
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    graph = NormDecomposition(bridge).attribute_graph(ids, " cat", granularity="neuron", prune=False)
    seen = {}

    def keep(name, pick):
        def hook(*arguments):
            seen.setdefault(name, pick(*arguments))
        return hook

    layer = reference.model.layers[1]
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(keep("z", lambda m, a: a[0])),
             layer.mlp.register_forward_hook(keep("mlp", lambda m, a, o: o)),
             layer.self_attn.register_forward_hook(keep("attn", lambda m, a, o: o[0])),
             layer.mlp.down_proj.register_forward_pre_hook(keep("post", lambda m, a: a[0])),
             reference.model.layers[0].register_forward_pre_hook(
                 keep("resid", lambda m, a, k: (a or (k["hidden_states"],))[0]), with_kwargs=True)]
    with torch.no_grad():
        logits = reference(ids).logits
        _, cache = bridge.run_with_cache(ids)
    for h in hooks:
        h.remove()
    heads = reference.config.num_attention_heads
    sublayer = NormDecomposition(bridge).attribute_graph(ids, " cat", granularity="sublayer", prune=False)
    expected = {"block.1.attention.head.2@4": (graph, seen["z"].reshape(1, ids.shape[1], heads, -1)[0, 4, 2]),
                "block.1.ff.neuron.7@4": (graph, seen["post"][0, 4, 7]), "token@3": (graph, seen["resid"][0, 3]),
                "output": (graph, logits[0, -1, graph.target.units[0]]),
                "block.1.ff@4": (sublayer, seen["mlp"][0, 4]), "block.1.attention@4": (sublayer, seen["attn"][0, 4])}
    for node, (chosen, tensor) in expected.items():
        site = chosen.hook_name(node)
        assert site.name in bridge.hook_dict, site
        found = cache[site.name][0, site.position]
        found = found if site.index is None else found[site.index]
        torch.testing.assert_close(found, tensor, rtol=0, atol=1e-5)
    assert graph.hook_name("block.1.attention.head.2@4") == ("blocks.1.attn.hook_z", 4, 2)
    assert sublayer.hook_name("block.0.ff@1") == ("blocks.0.hook_mlp_out", 1, None)
    assert sublayer.hook_name("block.1.attention@4") == ("blocks.1.hook_attn_out", 4, None)
    with pytest.raises(ValueError, match="bias node"):
        graph.hook_name("bias")
    with pytest.raises(ValueError, match="no node"):
        graph.hook_name("block.9.ff@1")


def test_a_bridge_in_compatibility_mode_is_refused(tokenizer):
    pytest.importorskip("transformer_lens.model_bridge", reason="TransformerLens 4 is not installed")
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers("tiny-llama", hf_model=tiny_lm("llama").eval(), tokenizer=tokenizer)
    bridge.enable_compatibility_mode(no_processing=True)
    with pytest.raises(ValueError, match="compatibility mode"):
        NormDecomposition(bridge)


def test_an_nnsight_language_model_is_explained_as_its_model(tokenizer):
    nnsight = pytest.importorskip("nnsight", reason="nnsight is not installed")
    import warnings

    model = tiny_lm("llama").eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LanguageModel gives way to TransformersModel
        wrapped = nnsight.LanguageModel(model, tokenizer=tokenizer)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    nd = NormDecomposition(wrapped)
    assert nd.model is model and nd.tokenizer is tokenizer
    _same_graph(nd.attribute_graph(ids, " cat"), NormDecomposition(model, tokenizer=tokenizer).attribute_graph(ids, " cat"))
    corrupted = tokenizer("the dog sat on the mat because", return_tensors="pt").input_ids
    assert activation_patching(wrapped, ids, corrupted, " cat", show_progress=False).effects == pytest.approx(
        activation_patching(model, ids, corrupted, " cat", tokenizer=tokenizer, show_progress=False).effects)
    with wrapped.trace(ids):  # nnsight still traces it afterwards
        saved = wrapped.lm_head.output.save()
    with torch.no_grad():
        torch.testing.assert_close(saved, model(ids).logits)
