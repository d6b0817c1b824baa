"""Token × component tables of encoder–decoders: the decoder's self-attention, cross-attention
and FF writers (and heads), complete, equal to the token contributions, and each cross-attention's
total equal to its direct logit computed from the model's own tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from captum_ffb import NormDecomposition
from tests.models import TINY_SEQ2SEQ, seq2seq_inputs, split_source


@pytest.mark.parametrize("name", sorted(TINY_SEQ2SEQ))
@pytest.mark.parametrize("granularity", ["block", "sublayer", "head"])
def test_tables_add_up_to_the_token_contributions(name, granularity):
    family = TINY_SEQ2SEQ[name]
    model = family.build()
    nd = NormDecomposition(model)
    source, kwargs = split_source(seq2seq_inputs(family))
    (src, tgt), bias = nd.attribute(source, target=6, forward_kwargs=kwargs, return_bias=True)
    table = nd.attribute_components(source, target=6, forward_kwargs=kwargs, granularity=granularity)
    assert float(table.delta.max()) < 2e-5
    n_source = src.shape[1]  # the players are [source | target]
    per_player = table.contributions.sum(-1)
    torch.testing.assert_close(per_player[:, :n_source], src, atol=2e-6, rtol=1e-4)
    torch.testing.assert_close(per_player[:, n_source:], tgt, atol=2e-6, rtol=1e-4)
    torch.testing.assert_close(table.bias.sum(1), bias, atol=2e-6, rtol=1e-4)
    layers = len(family.decoder_blocks(model))
    if granularity != "block":
        crossing = [k for k, c in enumerate(table.components) if ".cross_attention" in c]
        expected = layers * (4 if granularity == "head" else 1)  # the tiny models have four heads
        assert len([c for c in crossing if not table.components[c].endswith(".bias")]) == expected
        # the source enters through the first cross-attention: what is written before owes it nothing
        before = table.components.index("block.0.cross_attention" if granularity == "sublayer"
                                        else "block.0.cross_attention.head.0")
        assert table.contributions[:, :n_source, :before].abs().max() == 0
        assert table.contributions[:, :n_source, crossing].abs().max() > 0


@pytest.mark.parametrize("name", ["t5-gated", "m2m_100", "whisper"])
def test_cross_attention_totals_are_their_direct_logits(name):
    """Pre-LN decoders: block ``l``'s cross-attention writes ``o_l`` at the read position; its
    direct logit is the output row read through the final norm with its scale frozen."""
    family = TINY_SEQ2SEQ[name]
    model = family.build()
    source, kwargs = split_source(seq2seq_inputs(family))
    token, position = 6, kwargs["decoder_attention_mask"].sum(1) - 1  # each row's last real position
    blocks = family.decoder_blocks(model)
    cross = [getattr(b, "encoder_attn", None) or b.layer[1].EncDecAttention for b in blocks]
    final = model.get_decoder().layer_norm if hasattr(model.get_decoder(), "layer_norm") \
        else model.get_decoder().final_layer_norm
    seen = {}

    def keep(key, value) -> None:  # hooks must return None (a value would replace the output)
        seen.setdefault(key, value[0].detach())

    handles = [module.register_forward_hook(lambda m, a, o, k=k: keep(k, o)) for k, module in enumerate(cross)]
    handles.append(final.register_forward_pre_hook(lambda m, a: keep("final", a)))
    with torch.no_grad():
        model(source, **kwargs)
    for handle in handles:
        handle.remove()
    rows = torch.arange(2)
    y = seen["final"][rows, position]
    if isinstance(final, nn.LayerNorm):
        scale = 1 / torch.sqrt(y.var(-1, unbiased=False, keepdim=True) + final.eps)
    else:  # T5's RMSNorm
        scale = torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + final.variance_epsilon)
    row = model.get_output_embeddings().weight[token].detach()
    factor = model.config.d_model ** -0.5 if name.startswith("t5") else 1.0
    table = NormDecomposition(model, reference="zero").attribute_components(
        source, target=token, forward_kwargs=kwargs, granularity="sublayer")
    for k in range(len(blocks)):
        o = seen[k][rows, position]
        if isinstance(final, nn.LayerNorm):
            o = o - o.mean(-1, keepdim=True)
        expected = factor * ((o * scale * final.weight.detach()) @ row)
        column = table.components.index(f"block.{k}.cross_attention")
        got = table.contributions[:, :, column].sum(1) + table.bias[:, column]
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-4)


def test_the_backward_route_is_refused_with_a_clear_line():
    family = TINY_SEQ2SEQ["bart"]
    source, kwargs = split_source(seq2seq_inputs(family))
    with pytest.raises(ValueError, match="forward route"):
        NormDecomposition(family.build()).attribute_components(source, target=3, forward_kwargs=kwargs,
                                                               route="backward")
