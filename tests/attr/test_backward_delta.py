"""The backward route's convergence delta is a real check: the bias player's contribution
comes from the forward route restricted to the bias player (``players=[]``), not from
``value − Σ_j c_j``."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.rules import AttnLRPAttention, IGAttention
from tests.models import TINY_MODELS, tiny_task_model, token_ids


def _sharpened(name: str) -> torch.nn.Module:
    """A tiny causal LM whose query and key projections are scaled up, so that its attention
    is sharp and a 2-point quadrature of ``IGAttention`` is visibly inexact."""
    model = tiny_task_model(name)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "q_proj") and hasattr(module, "k_proj"):
                module.q_proj.weight.mul_(30)
                module.k_proj.weight.mul_(30)
            elif hasattr(module, "c_attn"):  # GPT-2: queries and keys are the first 2 × d columns
                width = module.c_attn.weight.shape[0]
                module.c_attn.weight[:, : 2 * width].mul_(30)
    return model


def _real_logits(model: torch.nn.Module, ids: torch.Tensor, token: int) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits[:, -1, token]


@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt2", "bert", "gemma2"])
def test_backward_bias_is_the_forward_bias(name):
    task = "causal_lm" if TINY_MODELS[name].causal else "sequence_classification"
    model = tiny_task_model(name, task)
    ids = token_ids()
    nd = NormDecomposition(model)
    c, bias, delta = nd.attribute(ids, target=2, return_bias=True, return_convergence_delta=True)
    c_f, bias_f, delta_f = nd.attribute(ids, target=2, route="forward", return_bias=True,
                                        return_convergence_delta=True)
    scale = float((c.sum(1) + bias).abs().max()) + 1e-3
    torch.testing.assert_close(bias, bias_f, atol=1e-6 * scale, rtol=0)
    assert float(delta.max()) < 1e-5 * scale
    # the backward route's delta is computed, not set: it is the forward route's up to rounding
    torch.testing.assert_close(delta, delta_f, atol=1e-6 * scale, rtol=0)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_backward_delta_shows_the_quadrature_error(name):
    model = _sharpened(name)
    ids = token_ids()
    real = _real_logits(model, ids, 5)
    scale = float(real.abs().max())
    coarse = NormDecomposition(model, rules={"attention": IGAttention(n_steps=2)})
    c, bias, delta = coarse.attribute(ids, target=5, return_bias=True, return_convergence_delta=True)
    _, bias_f, delta_f = coarse.attribute(ids, target=5, route="forward", return_bias=True,
                                          return_convergence_delta=True)
    assert float(delta.min()) > 1e-3 * scale  # visibly incomplete: 2 points are too few
    torch.testing.assert_close(delta, delta_f, atol=1e-6 * scale, rtol=0)
    torch.testing.assert_close(delta, (c.sum(1) + bias - real).abs(), atol=1e-6 * scale, rtol=0)
    torch.testing.assert_close(bias, bias_f, atol=1e-6 * scale, rtol=0)
    # enough points: complete again, on the backward route too
    fine = NormDecomposition(model, rules={"attention": IGAttention(n_steps=32)})
    _, delta = fine.attribute(ids, target=5, return_convergence_delta=True)
    assert float(delta.max()) < 1e-5 * scale


def test_attribute_steps_backward_delta():
    model = _sharpened("llama")
    ids = token_ids(1, 8)
    targets, positions = [5, 9, 11], [3, 5, 7]
    nd = NormDecomposition(model, rules={"attention": IGAttention(n_steps=2)})
    c, bias, delta = nd.attribute_steps(ids, targets, positions, return_bias=True,
                                        return_convergence_delta=True)
    c_f, bias_f, delta_f = nd.attribute_steps(ids, targets, positions, route="forward",
                                              return_bias=True, return_convergence_delta=True)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    real = logits[positions, targets]
    scale = float(real.abs().max())
    assert float(delta.min()) > 1e-3 * scale
    torch.testing.assert_close(delta, delta_f, atol=1e-6 * scale, rtol=0)
    torch.testing.assert_close(c, c_f, atol=1e-6 * scale, rtol=0)
    torch.testing.assert_close(delta, (c.sum(1) + bias - real).abs(), atol=1e-6 * scale, rtol=0)


def _counted_forward(nd, monkeypatch) -> list:
    calls = []
    original = nd.engine.forward
    monkeypatch.setattr(nd.engine, "forward", lambda *a, **k: calls.append(k) or original(*a, **k))
    return calls


def test_plain_backward_runs_no_forward_route(monkeypatch):
    ids = token_ids()
    nd = NormDecomposition(tiny_task_model("llama"))
    calls = _counted_forward(nd, monkeypatch)
    nd.attribute(ids, target=3)
    nd.attribute_steps(ids[:1], [3], target_position=[4])
    assert not calls
    nd.attribute(ids, target=3, return_bias=True)  # no bias term: the bias player is 0, no pass of its own
    assert not calls
    biased = NormDecomposition(tiny_task_model("qwen2"))  # bias terms: the bias player's own pass
    calls = _counted_forward(biased, monkeypatch)
    biased.attribute(ids, target=3, return_bias=True)
    assert len(calls) == 1


@pytest.mark.parametrize("name", ["qwen2", "qwen2_moe"])  # biases: a non-zero bias player
def test_forward_route_with_no_player_is_the_bias(name):
    model = tiny_task_model(name)
    ids = token_ids()
    nd = NormDecomposition(model)
    none, bias_alone = nd.attribute(ids, target=4, route="forward", players=[], return_bias=True)
    whole, bias = nd.attribute(ids, target=4, route="forward", return_bias=True)
    assert float(none.abs().max()) == 0.0
    assert float(bias.abs().min()) > 1e-4
    torch.testing.assert_close(bias_alone, bias, atol=1e-6, rtol=1e-5)
    # every part carries the whole bias player and the parts add up (MoE experts included)
    first, first_bias = nd.attribute(ids, target=4, route="forward", players=[0, 1, 2], return_bias=True)
    rest = nd.attribute(ids, target=4, route="forward", players=list(range(3, ids.shape[1])))
    torch.testing.assert_close(first_bias, bias, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(first + rest, whole, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["gemma2", "qwen3", "bert", "qwen2"])
@pytest.mark.parametrize("rule", [lambda: IGAttention(n_steps=8), AttnLRPAttention])
def test_bias_alone_with_score_crediting_rules(name, rule):
    """The bias player propagated alone (one player: L applied to its scores) equals the bias
    of the full propagation (L's transpose applied to the values), and the backward route's
    delta is the forward route's."""
    task = "causal_lm" if TINY_MODELS[name].causal else "sequence_classification"
    model = tiny_task_model(name, task)
    ids = token_ids()
    nd = NormDecomposition(model, rules={"attention": rule()})
    _, alone = nd.attribute(ids, target=1, route="forward", players=[], return_bias=True)
    _, bias, delta_f = nd.attribute(ids, target=1, route="forward", return_bias=True,
                                    return_convergence_delta=True)
    c, bias_b, delta = nd.attribute(ids, target=1, return_bias=True, return_convergence_delta=True)
    scale = float((c.sum(1) + bias_b).abs().max()) + 1e-3
    torch.testing.assert_close(alone, bias, atol=1e-5 * scale, rtol=0)
    torch.testing.assert_close(bias_b, bias, atol=1e-5 * scale, rtol=0)
    torch.testing.assert_close(delta, delta_f, atol=1e-5 * scale, rtol=0)
