"""The core checks on CUDA: every path runs on the model's device. Marked ``gpu``; skipped on a
machine without one (run them with ``python -m pytest -m gpu`` where a GPU is lent)."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import Direction, LayerNormDecomposition, NormDecomposition
from tests.models import (
    TINY_MODELS,
    TINY_SEQ2SEQ,
    seq2seq_inputs,
    split_source,
    tiny_task_model,
    token_ids,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")]
CUDA = torch.device("cuda")


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "mixtral"])
def test_layer_maps_on_cuda_equal_the_cpu_ones(name):
    model = TINY_MODELS[name].build()
    blocks = TINY_MODELS[name].blocks(model)
    ids = token_ids()
    cpu, cpu_delta = LayerNormDecomposition(model, blocks[1]).attribute(ids, return_convergence_delta=True)
    model = model.to(CUDA)
    maps, delta = LayerNormDecomposition(model, TINY_MODELS[name].blocks(model)[1]).attribute(
        ids.to(CUDA), return_convergence_delta=True)
    assert maps.device.type == "cuda" and float(delta.max()) < 1e-4
    torch.testing.assert_close(maps.cpu(), cpu, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("name, task", [("llama", "causal_lm"), ("gpt2", "causal_lm"),
                                        ("bert", "sequence_classification")])
def test_the_whole_model_on_cuda_both_routes(name, task):
    model = tiny_task_model(name, task)
    ids = token_ids()
    cpu = NormDecomposition(model).attribute(ids, target=1)
    nd = NormDecomposition(model.to(CUDA))
    for route in ("backward", "forward"):
        c, delta = nd.attribute(ids.to(CUDA), target=1, route=route, return_convergence_delta=True)
        assert c.device.type == "cuda" and float(delta.max()) < 1e-4
        torch.testing.assert_close(c.cpu(), cpu, atol=1e-4, rtol=1e-3)


def test_a_base_model_and_the_components_on_cuda():
    model = TINY_MODELS["bert"].build().to(CUDA)
    ids = token_ids().to(CUDA)
    nd = NormDecomposition(model)
    c, delta = nd.attribute(ids, target=Direction(torch.ones(32, device=CUDA)), return_convergence_delta=True)
    assert float(delta.max()) < 1e-4
    lm = NormDecomposition(tiny_task_model("llama").to(CUDA))
    for route in ("backward", "forward"):
        table = lm.attribute_components(ids, target=3, route=route, granularity="head")
        assert table.contributions.device.type == "cuda" and float(table.delta.max()) < 1e-4


@pytest.mark.parametrize("name", ["bart", "t5-gated"])
def test_an_encoder_decoder_on_cuda(name):
    family = TINY_SEQ2SEQ[name]
    model = family.build().to(CUDA)
    source, kwargs = split_source(seq2seq_inputs(family))
    source, kwargs = source.to(CUDA), {k: v.to(CUDA) for k, v in kwargs.items()}
    nd = NormDecomposition(model)
    for route in ("backward", "forward"):
        (src, tgt), delta = nd.attribute(source, target=5, forward_kwargs=kwargs, route=route,
                                         return_convergence_delta=True)
        assert src.device.type == "cuda" and float(delta.max()) < 1e-4
