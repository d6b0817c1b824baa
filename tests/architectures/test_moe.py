"""The MoE adapter: transformers' fused-experts layout, read in one place by both routes."""

from __future__ import annotations

import pytest
import torch

from captum_ffb.architectures import get_architecture
from captum_ffb.architectures.moe import MoEAdapter
from tests.models import TINY_MODELS


def _model(name: str) -> torch.nn.Module:
    return TINY_MODELS[name].build()


def _by_hand(moe: MoEAdapter, x: torch.Tensor) -> torch.Tensor:
    """Σ_e w_e(x) · down_e(g(gate_e x) ⊙ up_e x) (+ σ(gate_s x) · shared(x)) from the adapter."""
    top_weights, top_index = moe.routing(moe.router(x))
    weights = moe.dense_routing(top_weights, top_index)
    out = torch.zeros_like(x)
    for expert in range(moe.num_experts):
        w_gate, w_up, w_down = moe.expert_weights(expert)
        out = out + weights[:, expert, None] * ((moe.activation(x @ w_gate) * (x @ w_up)) @ w_down)
    if moe.shared_expert is not None:
        w_gate, w_up, w_down = moe.shared_expert.weights()
        shared = (moe.shared_expert.activation(x @ w_gate) * (x @ w_up)) @ w_down
        out = out + torch.sigmoid(moe.shared_expert_gate(x)) * shared
    return out


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_the_adapter_reproduces_the_moe_block(name):
    model = _model(name)
    moe = MoEAdapter.of(model.layers[0], get_architecture(name))
    assert moe is not None and moe.num_experts == 4
    assert (moe.shared_expert is not None) == (name == "qwen2_moe")
    x = torch.randn(7, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        real = moe.module(x[None])[0]
        torch.testing.assert_close(_by_hand(moe, x), real, atol=1e-6, rtol=1e-5)


def test_dense_layers_have_no_adapter():
    qwen = _model("qwen2_moe")  # its layer 1 is an mlp-only (dense) layer
    assert MoEAdapter.of(qwen.layers[1], get_architecture("qwen2_moe")) is None
    llama = _model("llama")
    assert MoEAdapter.of(llama.layers[0], get_architecture("llama")) is None


def test_expert_weights_follow_the_fused_layout():
    moe = MoEAdapter.of(_model("mixtral").layers[0], get_architecture("mixtral"))
    gate_up, down = moe.experts.gate_up_proj, moe.experts.down_proj  # (E, 2I, d), (E, d, I)
    width = gate_up.shape[1] // 2
    w_gate, w_up, w_down = moe.expert_weights(2)
    assert torch.equal(w_gate, gate_up[2, :width].t()) and torch.equal(w_up, gate_up[2, width:].t())
    assert torch.equal(w_down, down[2].t())
    assert w_gate.shape == (gate_up.shape[2], width) and w_down.shape == (width, gate_up.shape[2])


def test_routing_and_experts_arguments():
    moe = MoEAdapter.of(_model("mixtral").layers[0], get_architecture("mixtral"))
    top_weights = torch.tensor([[0.7, 0.3], [0.6, 0.4]])
    top_index = torch.tensor([[2, 0], [1, 3]])
    assert moe.routing((torch.zeros(2, 4), top_weights, top_index)) == (top_weights, top_index)
    dense = moe.dense_routing(top_weights, top_index, torch.float64)
    expected = torch.tensor([[0.3, 0.0, 0.7, 0.0], [0.0, 0.6, 0.0, 0.4]], dtype=torch.float64)
    assert dense.dtype == torch.float64 and torch.allclose(dense, expected)
    x = torch.zeros(2, 3)
    positional = moe.experts_arguments((x, top_index, top_weights), {})
    keywords = moe.experts_arguments((x,), {"top_k_index": top_index, "top_k_weights": top_weights})
    assert all(a is b for a, b in zip(positional, keywords)) and positional[1] is top_index
