"""NormDecomposition on real weights, checked against the test's own forward pass."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.evaluation.minilm_head import load_minilm_sentiment_head, minilm_sentiment_logit
from captum_ffb.explained.models import load_model

pytestmark = pytest.mark.real_weights


def test_minilm_with_its_sentiment_head():
    loaded = load_model()
    head = load_minilm_sentiment_head()
    texts = ["a charming and often affecting journey.", "dull, lifeless and far too long."]
    enc = loaded.tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        real = minilm_sentiment_logit(loaded.model, enc.input_ids, enc.attention_mask, head)
    nd = NormDecomposition(loaded.model)
    answers = {}
    for route in ("backward", "forward"):
        contributions, bias, delta = nd.attribute(
            enc.input_ids, target=head.direction(), forward_kwargs={"attention_mask": enc.attention_mask},
            route=route, return_bias=True, return_convergence_delta=True)
        torch.testing.assert_close(contributions.sum(1) + bias, real, atol=1e-4, rtol=1e-4)
        assert float(delta.max()) < 1e-4
        answers[route] = contributions
    torch.testing.assert_close(answers["backward"], answers["forward"], atol=1e-5, rtol=1e-4)
    assert float(real[0]) > 0 > float(real[1])  # the head reads the sentiment right


def test_smollm2_next_token(smollm2):
    loaded = smollm2
    ids = loaded.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = loaded.model(ids).logits[0, -1]
    token = int(logits.argmax())
    nd = NormDecomposition(loaded.model)
    backward, bias, delta = nd.attribute(ids, target=token, return_bias=True,
                                         return_convergence_delta=True)
    forward, forward_bias, forward_delta = nd.attribute(ids, target=token, route="forward",
                                                        return_bias=True, return_convergence_delta=True)
    scale = float(logits.abs().max())
    assert abs(float(forward.sum() + forward_bias - logits[token])) < 1e-5 * scale
    assert float(forward_delta.max()) < 1e-5 * scale
    assert float((backward - forward).abs().max()) < 1e-5 * float(forward.abs().max())
    torch.testing.assert_close(bias, forward_bias, atol=1e-4 * scale, rtol=0)
