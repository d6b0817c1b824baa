"""Everything on the model's device, checked on the CPU: every entry point runs a CPU model with
torch's default device set to ``meta``. A tensor made without a device (where the code forgot
the model's) is then a meta tensor, and the first operation that mixes it with the model's
tensors fails; so an entry point that passes here makes every tensor on the model's device, as
a GPU run needs (``tests/test_gpu.py`` repeats them on CUDA where a GPU is lent)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from captum_ffb import LayerNormDecomposition, NormDecomposition, activation_patching
from captum_ffb.long_context.attribution import context_attribution
from tests.models import TINY_SEQ2SEQ, seq2seq_inputs, split_source, tiny_task_model, token_ids


@pytest.fixture(autouse=True)
def _tokenizers_on_the_cpu(monkeypatch):
    """A tokenizer makes its tensors where torch's default device says: on the cpu in real use
    (the library then moves them to the model's device)."""
    from transformers.tokenization_utils_base import BatchEncoding

    to_tensors = BatchEncoding.convert_to_tensors

    def cpu_tensors(self, *args, **kwargs):
        with torch.device("cpu"):
            return to_tensors(self, *args, **kwargs)

    monkeypatch.setattr(BatchEncoding, "convert_to_tensors", cpu_tensors)


@contextlib.contextmanager
def _meta_default():
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def _on_cpu(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        assert tensor.device.type == "cpu", tensor.device


@pytest.fixture(scope="module")
def llama():
    return NormDecomposition(tiny_task_model("llama"))


def test_whole_model_routes_and_references(llama):
    ids = token_ids()
    with _meta_default():
        for route in ("backward", "forward"):
            for reference in ("centered", "zero", "mean", 3):
                c, bias, delta = llama.attribute(ids, target=5, route=route, reference=reference, return_bias=True,
                                                 return_convergence_delta=True)
                _on_cpu(c, bias, delta)
                assert float(delta.max()) < 1e-4
        _on_cpu(llama.attribute(ids))  # the prediction
        recomputing = NormDecomposition(llama.model, memory_budget=1)
        _on_cpu(recomputing.attribute(ids, target=5))
        _on_cpu(llama.maps(ids))


def test_components_both_routes(llama):
    ids = token_ids()
    with _meta_default():
        for route in ("backward", "forward"):
            table = llama.attribute_components(ids, target=5, route=route, granularity="head")
            _on_cpu(table.contributions, table.delta)
            assert float(table.delta.max()) < 1e-4


def test_graph_score_split_patching(llama):
    ids = token_ids()[:1, :7]
    corrupted = ids.flip(1)
    with _meta_default():
        graph = llama.attribute_graph(ids, 5, corrupted_inputs=corrupted)
        _on_cpu(graph.data.values, graph.data.weights, graph.node_mask)
        assert graph.flow_residual() < 1e-4
        neurons = llama.attribute_graph(ids, 5, granularity="neuron", max_nodes=20)
        _on_cpu(neurons.data.weights)
        split = graph.score_split(1, 0, 6, 2)
        assert split
        graph.query_key_pairs(heads=2)
        result = activation_patching(llama, ids, corrupted, 5, show_progress=False)
        assert result.effects


def test_generation_layer_maps_and_context(llama, tmp_path):
    from tests.models import load_saved, save_tiny_lm

    ids = token_ids()
    with _meta_default():
        out = llama.explain_generation(ids[:1, :4], max_new_tokens=2)
        _on_cpu(out.contributions)
        lnd = LayerNormDecomposition(llama.model, llama.model.model.layers[1])
        maps, delta = lnd.attribute(ids, return_convergence_delta=True)
        _on_cpu(maps, delta)
    loaded = load_saved(save_tiny_lm(tmp_path / "lm"))
    with _meta_default():
        found = context_attribution(NormDecomposition(loaded), loaded.tokenizer, "one two.\n\nthree four.",
                                    "five?")
        assert abs(found.delta) < 1e-4


@pytest.mark.parametrize("name", ["bart", "t5-gated"])
def test_an_encoder_decoder(name):
    family = TINY_SEQ2SEQ[name]
    nd = NormDecomposition(family.build())
    source, kwargs = split_source(seq2seq_inputs(family))
    with _meta_default():
        for route in ("backward", "forward"):
            (src, tgt), delta = nd.attribute(source, target=5, forward_kwargs=kwargs, route=route,
                                             return_convergence_delta=True)
            _on_cpu(src, tgt)
            assert float(delta.max()) < 1e-4
        graph = nd.attribute_graph(source[:1], 5, forward_kwargs={k: v[:1] for k, v in kwargs.items()})
        _on_cpu(graph.data.weights)


@pytest.mark.parametrize("command", ["maps", "explain", "graph", "compare"])
def test_every_subcommand_keeps_its_tensors_on_the_models_device(command, tmp_path, monkeypatch):
    """The command line's subcommands with the default device ``meta`` once the model is loaded
    (on the cpu): what ``--device cuda`` needs."""
    import captum_ffb.explained.models as models
    from captum_ffb.cli import main
    from tests.models import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "lm")
    original = models.load_model

    def load(*args, **kwargs):
        loaded = original(*args, **kwargs)
        torch.set_default_device("meta")
        return loaded

    monkeypatch.setattr(models, "load_model", load)
    try:
        code = main([command, "the cat sat on the mat", "--model", str(folder), "--out", str(tmp_path / "out"),
                     "--quiet"])
    finally:
        torch.set_default_device(None)
    assert code == 0
