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


# --------------------------------------------------------------------------- every feature on CUDA
def _llama_pair():
    cpu = tiny_task_model("llama")
    gpu = tiny_task_model("llama").to(CUDA)
    gpu.load_state_dict(cpu.state_dict())
    return NormDecomposition(cpu), NormDecomposition(gpu)


def test_the_graph_on_cuda_equals_the_cpus():
    cpu, gpu = _llama_pair()
    ids = token_ids()[:1, :7]
    corrupted = ids.flip(1)
    for granularity in ("sublayer", "head", "neuron"):
        on_cpu = cpu.attribute_graph(ids, 5, granularity=granularity, prune=False, corrupted_inputs=corrupted)
        on_gpu = gpu.attribute_graph(ids.to(CUDA), 5, granularity=granularity, prune=False,
                                     corrupted_inputs=corrupted.to(CUDA))
        assert on_gpu.data.values.device.type == "cpu" and on_gpu.flow_residual() < 1e-4
        torch.testing.assert_close(on_gpu.data.values, on_cpu.data.values, atol=1e-4, rtol=1e-3)
        for name in on_cpu.patch_estimates:
            torch.testing.assert_close(on_gpu.patch_estimates[name], on_cpu.patch_estimates[name],
                                       atol=1e-3, rtol=1e-2)
    split_cpu = on_cpu.score_split(1, 0, 6, 2)
    split_gpu = on_gpu.score_split(1, 0, 6, 2)
    assert abs(sum(split_cpu.values()) - sum(split_gpu.values())) < 1e-4
    assert on_gpu.query_key_pairs(heads=2)
    pruned = gpu.attribute_graph(ids.to(CUDA), 5)
    assert pruned.kept_share > 0 and pruned.flow_residual() < 1e-4


def test_activation_patching_and_context_on_cuda(tmp_path):
    from captum_ffb import activation_patching
    from captum_ffb.long_context.attribution import context_attribution
    from tests.models import load_saved, save_tiny_lm

    cpu, gpu = _llama_pair()
    ids = token_ids()[:1, :7]
    corrupted = ids.flip(1)
    on_cpu = activation_patching(cpu, ids, corrupted, 5, show_progress=False)
    on_gpu = activation_patching(gpu, ids.to(CUDA), corrupted.to(CUDA), 5, show_progress=False)
    assert set(on_cpu.effects) == set(on_gpu.effects)
    assert all(abs(on_cpu.effects[k] - on_gpu.effects[k]) < 1e-3 for k in on_cpu.effects)
    loaded = load_saved(save_tiny_lm(tmp_path / "lm"))
    loaded.model.to(CUDA)
    found = context_attribution(NormDecomposition(loaded), loaded.tokenizer, "one two.\n\nthree four.", "five?")
    assert abs(found.delta) < 1e-4


def test_generation_and_the_recompute_path_on_cuda():
    cpu, gpu = _llama_pair()
    ids = token_ids()
    out = gpu.explain_generation(ids[:1, :4].to(CUDA), max_new_tokens=3)
    assert out.contributions.device.type == "cuda" and float(out.delta.max()) < 1e-4
    recomputing = NormDecomposition(gpu.model, memory_budget=1)
    torch.testing.assert_close(recomputing.attribute(ids.to(CUDA), target=5).cpu(),
                               cpu.attribute(ids, target=5), atol=1e-4, rtol=1e-3)


def test_bfloat16_long_input_recomputed_on_cuda():
    """The path that raised torch.utils.checkpoint's CheckpointError on an H100 (long inputs,
    blocks recomputed, bfloat16): now the same numbers as keeping every block."""
    model = tiny_task_model("llama").to(CUDA, torch.bfloat16)
    ids = torch.randint(4, 50, (1, 2048), device=CUDA)
    kept = NormDecomposition(model, memory_budget=1 << 40).attribute(ids, target=5)
    recomputed = NormDecomposition(model, memory_budget=1).attribute(ids, target=5)
    torch.testing.assert_close(recomputed.float(), kept.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("command", ["maps", "compare", "explain", "graph"])
def test_every_subcommand_with_device_cuda(command, tmp_path):
    from captum_ffb.cli import main
    from tests.models import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "lm")
    text = "the cat sat on the mat"
    extra: list[str] = []
    assert main([command, text, "--model", str(folder), "--device", "cuda", "--out", str(tmp_path / command),
                 "--quiet", *extra]) == 0


def test_the_fused_coefficients_compiled_on_cuda_equal_the_eager_ones(monkeypatch):
    """The coefficient functions compiled on CUDA (CAPTUM_FFB_COMPILE=auto) against their eager
    forms on the CPU, in float32 and from bfloat16 inputs."""
    from captum_ffb.rules import GatedIGActivation, IGActivation, RMSNorm
    from captum_ffb.rules.fused import COMPILE_VARIABLE

    monkeypatch.setenv(COMPILE_VARIABLE, "auto")
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 300, 512, generator=g) * 4, torch.randn(2, 300, 512, generator=g)
    for fn in (torch.nn.SiLU(), torch.nn.GELU()):
        for dtype in (torch.float32, torch.bfloat16):
            x, y = a.to(dtype).float(), b.to(dtype).float()
            for got, expected in zip(GatedIGActivation().slopes(fn, x.to(CUDA), y.to(CUDA)),
                                     GatedIGActivation().slopes(fn, x, y)):
                torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(IGActivation().slope(fn, x.to(CUDA)).cpu(), IGActivation().slope(fn, x),
                                       atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(RMSNorm().frozen_scale(a.to(CUDA), 1e-6).cpu(), RMSNorm().frozen_scale(a, 1e-6))
