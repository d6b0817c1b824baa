"""What the spec knows of a family: causality, and configurations it refuses."""

from __future__ import annotations

import pytest

from captum_ffb import LayerNormDecomposition, get_architecture
from tests.models import TINY_MODELS

NAMES = sorted(TINY_MODELS)


@pytest.mark.parametrize("name", NAMES)
def test_causality_comes_from_the_spec(name):
    tiny = TINY_MODELS[name]
    model = tiny.build()
    assert get_architecture(model.config.model_type).is_causal(model.config) == tiny.causal


def test_a_bert_decoder_is_causal():
    from transformers import BertConfig

    spec = get_architecture("bert")
    assert not spec.is_causal(BertConfig())
    assert spec.is_causal(BertConfig(is_decoder=True))


def test_olmo_value_clipping_is_refused():
    from transformers import OlmoConfig, OlmoModel

    model = OlmoModel(OlmoConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, clip_qkv=8.0, pad_token_id=0))
    with pytest.raises(ValueError, match="clip_qkv"):
        LayerNormDecomposition(model, model.layers[0])
