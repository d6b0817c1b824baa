"""A new encoder–decoder family is one registration: a BART under a model type of its own,
registered here and nowhere else (its encoder's spec with the decoder's inside), decomposes
layer by layer and as a whole model exactly as the same weights do under ``bart``."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, BartConfig, BartForConditionalGeneration

from captum_ffb import (
    ArchitectureSpec,
    LayerNormDecomposition,
    NormDecomposition,
    Projection,
    register_architecture,
)
from captum_ffb.architectures import registry
from tests.models import TINY_SEQ2SEQ, seq2seq_inputs


class RenamedBartConfig(BartConfig):
    """BART under a model type no module of the package names."""

    model_type = "renamed_bart"


class RenamedBartForConditionalGeneration(BartForConditionalGeneration):
    config_class = RenamedBartConfig


AutoConfig.register("renamed_bart", RenamedBartConfig, exist_ok=True)

_ENCODER = dict(
    chain="post_ln", blocks="encoder.layers", causal=False,
    attention="self_attn", value=Projection("self_attn.v_proj"), attention_output=Projection("self_attn.out_proj"),
    norm1="self_attn_layer_norm", norm2="final_layer_norm",
    ff_in=Projection("fc1"), activation="activation_fn", ff_out=Projection("fc2"),
)
#: The whole registration of the new family.
RENAMED_BART = ArchitectureSpec(
    **_ENCODER, description="a renamed BART",
    decoder=ArchitectureSpec(**{**_ENCODER, "chain": "post_ln_cross", "blocks": "decoder.layers", "causal": True},
                             cross_attention="encoder_attn", cross_value=Projection("encoder_attn.v_proj"),
                             cross_output=Projection("encoder_attn.out_proj"), cross_norm="encoder_attn_layer_norm"),
)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_architecture("renamed_bart", RENAMED_BART)


def _pair():
    bart = TINY_SEQ2SEQ["bart"].build()
    fields = {k: v for k, v in bart.config.to_diff_dict().items() if k != "model_type"}
    renamed = RenamedBartForConditionalGeneration(RenamedBartConfig(**fields)).eval()
    renamed.load_state_dict(bart.state_dict())
    assert renamed.config.model_type == "renamed_bart"
    return renamed, bart


@pytest.mark.usefixtures("registered")
def test_a_new_encoder_decoder_family_equals_the_known_one():
    renamed, bart = _pair()
    inputs = seq2seq_inputs(TINY_SEQ2SEQ["bart"])
    source = inputs.pop("input_ids")
    new, known = renamed, bart
    maps = LayerNormDecomposition(new, new.model.decoder.layers[1]).attribute(
        source, scope="AtbCatbFfResLn", forward_kwargs=inputs)
    expected = LayerNormDecomposition(known, known.model.decoder.layers[1]).attribute(
        source, scope="AtbCatbFfResLn", forward_kwargs=inputs)
    torch.testing.assert_close(maps, expected, rtol=0, atol=0)
    for route in ("backward", "forward"):
        (src, tgt), delta = NormDecomposition(new).attribute(
            source, target=5, forward_kwargs=inputs, route=route, return_convergence_delta=True)
        (src_b, tgt_b) = NormDecomposition(known).attribute(source, target=5, forward_kwargs=inputs, route=route)
        assert float(delta.max()) < 1e-5
        torch.testing.assert_close(src, src_b, rtol=0, atol=0)
        torch.testing.assert_close(tgt, tgt_b, rtol=0, atol=0)
