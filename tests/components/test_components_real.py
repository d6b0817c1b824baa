"""Token × component attributions on real weights: SmolLM2 (Pre-LN, RMSNorm, GQA) and
all-MiniLM-L6-v2 with the bundled sentiment head (Post-LN, a pooled read-out)."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.evaluation.minilm_head import minilm_sentiment_readout
from captum_ffb.explained.models import load_model

pytestmark = pytest.mark.real_weights


def _check(found, tokens: torch.Tensor, value: torch.Tensor) -> None:
    scale = float(tokens.abs().max())
    assert float((found.token_contributions() - tokens).abs().max()) <= 1e-5 * scale + 1e-6
    torch.testing.assert_close(found.value, value, atol=1e-4, rtol=1e-4)
    assert float(found.delta.max()) < 1e-3 * float(value.abs().max()) + 1e-4


def test_smollm2_components(smollm2):
    model, tokenizer = smollm2.model, smollm2.tokenizer
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    token = int(logits.argmax())
    nd = NormDecomposition(model)
    tokens = nd.attribute(ids, target=token, route="forward")
    found = nd.attribute_components(ids, target=token, granularity="head")
    _check(found, tokens, logits[token].reshape(1))
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    assert len(found.select(r"\.head\.\d+$")) == layers * heads
    question = found.ff_question()
    assert question.layer_share.shape == (1, layers, ids.shape[1])


def test_minilm_components_with_its_sentiment_head():
    loaded = load_model()
    enc = loaded.tokenizer(["a charming and often affecting journey.", "dull, lifeless and far too long."],
                           return_tensors="pt", padding=True)
    readout = minilm_sentiment_readout()
    nd = NormDecomposition(loaded.model)
    kwargs = {"attention_mask": enc.attention_mask}
    tokens = nd.attribute(enc.input_ids, target=readout, forward_kwargs=kwargs, route="forward")
    found = nd.attribute_components(enc.input_ids, target=readout, forward_kwargs=kwargs)
    with torch.no_grad():
        outputs = loaded.model(**enc)
    _check(found, tokens, readout.value(outputs, enc.attention_mask))
    assert found.select(r"^block\.5\.norm2$")  # Post-LN: the last norm's β is a component
    padded = enc.attention_mask == 0
    assert torch.all(found.contributions[padded] == 0)
