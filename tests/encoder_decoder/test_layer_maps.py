"""Layer maps of encoder–decoders: every scope of both stacks reproduces the model's own
tensors, decoder maps cover the players ``[source | target]``, and padding owns nothing."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import LayerNormDecomposition
from tests.models import TINY_SEQ2SEQ, seq2seq_inputs, split_source

FAMILIES = sorted(TINY_SEQ2SEQ)
pytestmark = pytest.mark.smoke  # every family, also on the lowest supported versions


def _run(model, layer, inputs):
    lnd = LayerNormDecomposition(model, layer)
    first, kwargs = split_source(inputs)
    maps, delta = lnd.attribute(first, forward_kwargs=kwargs, scope=list(lnd.scopes), return_convergence_delta=True)
    return lnd, maps, delta


@pytest.mark.parametrize("name", FAMILIES)
def test_decoder_scopes_reproduce_the_models_tensors(name):
    family = TINY_SEQ2SEQ[name]
    model = family.build()
    inputs = seq2seq_inputs(family)
    n_target = inputs["decoder_input_ids"].shape[1]
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    n_source = out.encoder_last_hidden_state.shape[1]
    blocks = family.decoder_blocks(model)
    for index, block in enumerate(blocks):
        lnd, maps, delta = _run(model, block, inputs)
        assert lnd.spec.has_cross_attention and lnd.chain.name.endswith("_cross")
        for scope, value in delta.items():
            assert value.max() < 1e-5, (name, index, scope, value)
        for scope, value in maps.items():
            assert value.shape == (2, n_target, n_target + n_source), (scope, value.shape)
        # the cross-attention alone reads the source only (the players: [source | target])
        assert maps["Cross"][:, :, n_source:].abs().max() == 0
        assert maps["Cross"][:, :, :n_source].abs().max() > 0
        # the target's padded row and (token sources) the source's padded columns own nothing
        last = maps[lnd.chain.output_scope]
        assert last[1, -1].abs().max() == 0
        if not family.audio:
            assert last[1, :, n_source - 2:n_source].abs().max() == 0
            assert last[0, :, n_source - 2:n_source].abs().min() > 0
        # the whole layer is the next hidden state (the last one is after the final norm)
        if index + 1 < len(blocks):
            first, kwargs = split_source(inputs)
            dec = lnd.decompose(first, forward_kwargs=kwargs)
            real = out.decoder_hidden_states[index + 1]
            rows = inputs["decoder_attention_mask"].bool()
            assert torch.allclose(dec.total()[rows], real[rows], atol=1e-5)




@pytest.mark.parametrize("name", FAMILIES)
def test_encoder_scopes_reproduce_the_models_tensors(name):
    family = TINY_SEQ2SEQ[name]
    model = family.build()
    inputs = seq2seq_inputs(family)
    for block in family.encoder_blocks(model):
        lnd, maps, delta = _run(model, block, inputs)
        assert not lnd.spec.has_cross_attention
        for scope, value in delta.items():
            assert value.max() < 1e-5, (name, scope, value)
        n_source = next(iter(maps.values())).shape[-1]
        assert next(iter(maps.values())).shape == (2, n_source, n_source)


def test_cross_map_is_the_norm_based_cross_attention():
    """Scope ``Cross`` is Kobayashi et al.'s norm-based map of the cross-attention,
    ``‖Σ_h α^h_is e_s W_V^h W_O^h‖``, recomputed here from the eager cross-attention weights."""
    family = TINY_SEQ2SEQ["bart"]
    model = family.build()
    model.config._attn_implementation = "eager"
    inputs = seq2seq_inputs(family)
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    block = family.decoder_blocks(model)[1]
    _, maps, _ = _run(model, block, inputs)
    probs = out.cross_attentions[1]  # (B, H, n_t, n_s)
    encoder = out.encoder_last_hidden_state
    attention = block.encoder_attn
    heads, head_dim = probs.shape[1], attention.head_dim
    values = (encoder @ attention.v_proj.weight.t()).unflatten(-1, (heads, head_dim))  # (B, n_s, H, e)
    w_o = attention.out_proj.weight.t().unflatten(0, (heads, head_dim))  # (H, e, d)
    per_head = torch.einsum("bshe,hed->bhsd", values, w_o)
    terms = torch.einsum("bhts,bhsd->btsd", probs, per_head)
    expected = terms.norm(dim=-1) * inputs["attention_mask"][:, None, :] * inputs["decoder_attention_mask"][:, :, None]
    n_target = inputs["decoder_input_ids"].shape[1]
    n_source = maps["Cross"].shape[-1] - n_target
    assert torch.allclose(maps["Cross"][:, :, :n_source], expected.detach(), atol=1e-5)


def test_layers_of_both_stacks_at_once_are_refused():
    family = TINY_SEQ2SEQ["bart"]
    model = family.build()
    with pytest.raises(ValueError, match="one stack"):
        LayerNormDecomposition(model, [family.encoder_blocks(model)[0], family.decoder_blocks(model)[0]])


def test_a_decoder_block_without_its_source_says_so():
    family = TINY_SEQ2SEQ["bart"]
    model = family.build()
    decoder = model.get_decoder()
    lnd = LayerNormDecomposition(decoder, family.decoder_blocks(model)[0])
    with pytest.raises(RuntimeError, match="cross-attention"):
        lnd.attribute(torch.tensor([[3, 4, 5]]))
