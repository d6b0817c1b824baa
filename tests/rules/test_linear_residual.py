"""Linear and residual rules."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from captum_ffb import Decomposition
from captum_ffb.architectures import Projection
from captum_ffb.engine.block import projection_weights
from captum_ffb.rules import Linear, Residual


def test_linear_matches_nn_linear_and_keeps_bias_separate():
    torch.manual_seed(0)
    layer = nn.Linear(6, 4)
    dec = Decomposition(torch.randn(2, 3, 3, 6), torch.randn(2, 3, 6))
    out = Linear()(dec, *projection_weights(layer, Projection("w")))
    with torch.no_grad():
        torch.testing.assert_close(out.total(), layer(dec.total()))
        torch.testing.assert_close(out.terms, dec.terms @ layer.weight.t())
        torch.testing.assert_close(out.bias, layer(dec.bias))


def test_conv1d_and_fused_slices():
    torch.manual_seed(0)
    fused = Conv1D(3 * 4, 6)  # GPT-2's c_attn: q, k, v side by side
    x = torch.randn(2, 5, 6)
    with torch.no_grad():
        _, _, v = fused(x).split(4, dim=-1)
        weight, bias = projection_weights(fused, Projection("c_attn", part=2, parts=3))
        torch.testing.assert_close(x @ weight + bias, v)


def test_linear_width_mismatch():
    dec = Decomposition(torch.randn(1, 2, 2, 5), torch.randn(1, 2, 5))
    with pytest.raises(ValueError, match="width"):
        Linear()(dec, torch.randn(4, 3))


def test_unsupported_projection_module():
    with pytest.raises(TypeError, match="unsupported projection"):
        projection_weights(nn.Conv2d(1, 1, 1), Projection("conv"))


def test_residual_adds_term_by_term():
    a = Decomposition(torch.randn(1, 3, 3, 4), torch.randn(1, 3, 4))
    b = Decomposition.identity(torch.randn(1, 3, 4))
    out = Residual()(a, b)
    torch.testing.assert_close(out.terms, a.terms + b.terms)
    torch.testing.assert_close(out.total(), a.total() + b.total())


def test_per_head_fused_projection_matches_gpt_neox_value_states():
    from transformers import GPTNeoXConfig, GPTNeoXModel

    torch.manual_seed(0)
    model = GPTNeoXModel(GPTNeoXConfig(vocab_size=20, hidden_size=16, num_attention_heads=4,
                                       num_hidden_layers=1, intermediate_size=32)).eval()
    fused = model.layers[0].attention.query_key_value
    x = torch.randn(1, 3, 16)
    with torch.no_grad():
        qkv = fused(x).view(1, 3, 4, 12)  # (batch, n, heads, q|k|v per head)
        expected = qkv[..., 8:].reshape(1, 3, 16)
        weight, bias = projection_weights(fused, Projection("qkv", part=2, parts=3, groups=4))
        torch.testing.assert_close(x @ weight + bias, expected)


def test_unequal_fused_columns_match_phi3_value_states():
    from transformers import Phi3Config, Phi3Model

    from captum_ffb import get_architecture

    torch.manual_seed(0)
    config = Phi3Config(vocab_size=20, hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
                        num_hidden_layers=1, intermediate_size=32, pad_token_id=0)
    model = Phi3Model(config).eval()
    fused = model.layers[0].self_attn.qkv_proj
    x = torch.randn(1, 3, 16)
    spec = get_architecture("phi3")
    with torch.no_grad():
        qkv = fused(x)
        expected = qkv[..., 16 + 8:]  # q: 4 heads × 4, k: 2 × 4, v: 2 × 4
        weight, bias = projection_weights(fused, spec.value, config)
        assert bias is None and weight.shape == (16, 8)
        torch.testing.assert_close(x @ weight, expected)
        gate, up = model.layers[0].mlp.gate_up_proj(x).chunk(2, dim=-1)
        w_gate, _ = projection_weights(model.layers[0].mlp.gate_up_proj, spec.ff_gate, config)
        w_up, _ = projection_weights(model.layers[0].mlp.gate_up_proj, spec.ff_in, config)
        torch.testing.assert_close(x @ w_gate, gate)
        torch.testing.assert_close(x @ w_up, up)
