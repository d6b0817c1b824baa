"""Attention baselines against the model's own attentions and a per-head computation."""

from __future__ import annotations

import pytest
import torch

from captum_ffb.baselines import attention_norm_maps, attention_weight_maps, capture_layer
from tests.models import TINY_MODELS, token_ids

HEADS = 4


def _captured(name: str):
    spec = TINY_MODELS[name]
    model = spec.build()
    block = spec.blocks(model)[1]
    ids = token_ids(2, 5)
    mask = torch.ones_like(ids)
    mask[1, 3:] = 0
    return model, block, ids, mask, capture_layer(model, block, ids, forward_kwargs={"attention_mask": mask})


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_attention_weights_are_the_models_own(name):
    model, _, ids, mask, context = _captured(name)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        own = model(ids, attention_mask=mask, output_attentions=True).attentions[1]
    real = mask[:, :, None] * mask[:, None, :]
    mean = attention_weight_maps(context, "mean")
    torch.testing.assert_close(mean, own.mean(dim=1) * real)
    torch.testing.assert_close(attention_weight_maps(context, "sum"), HEADS * mean)
    rows = mean.sum(dim=-1)
    torch.testing.assert_close(rows, mask.float())  # each real row is a distribution
    with pytest.raises(ValueError, match="reduce must be one of"):
        attention_weight_maps(context, "max")


def _per_head_norms(probs, values, w_o, b_v=None):
    """‖Σ_h α^h_ij (v_j^h [+ b_V^h]) W_O^h‖ written as a loop over heads."""
    batch, n = values.shape[:2]
    head = values.shape[-1] // HEADS
    out = torch.zeros(batch, n, n, w_o.shape[-1])
    for h in range(HEADS):
        cols = slice(h * head, (h + 1) * head)
        v = values[..., cols] + (0 if b_v is None else b_v[cols])
        f = v @ w_o[cols]  # (B, n, d)
        out += probs[:, h, :, :, None] * f[:, None, :, :]
    return out.norm(dim=-1)


@pytest.mark.parametrize("with_bias", [False, True])
def test_attention_norms_of_a_post_ln_block(with_bias):
    _, block, _, mask, context = _captured("bert")
    attn = block.attention
    x = context.inputs
    values = x @ attn.self.value.weight.t()
    expected = _per_head_norms(
        context.block.probs, values, attn.output.dense.weight.t(),
        attn.self.value.bias if with_bias else None,
    ) * (mask[:, :, None] * mask[:, None, :])
    torch.testing.assert_close(attention_norm_maps(context, include_value_bias=with_bias), expected.detach())


def test_attention_norms_of_a_pre_ln_block_read_the_normed_input():
    _, block, _, mask, context = _captured("gpt2")
    with torch.no_grad():
        normed = block.ln_1(context.inputs)
        width = normed.shape[-1]
        values = normed @ block.attn.c_attn.weight[:, 2 * width :]
    expected = _per_head_norms(context.block.probs, values, block.attn.c_proj.weight.detach())
    expected = expected * (mask[:, :, None] * mask[:, None, :])
    torch.testing.assert_close(attention_norm_maps(context), expected)
    assert attention_norm_maps(context)[0].triu(1).abs().max() == 0
