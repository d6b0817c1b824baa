"""Cross-check against TransformerLens: each component's direct effect (its column summed over
the tokens plus its bias) equals TransformerLens's direct logit attribution of that component
with the final norm's scale frozen (``apply_ln_to_stack`` with the cached scale).

Needs the optional extra ``captum_ffb[lens]`` (``transformer-lens``); skipped without it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.utils import logging as hf_logging

from captum_ffb import NormDecomposition
from tests.models import tiny_task_model, token_ids

_VERBOSITY = hf_logging.get_verbosity()
pytest.importorskip("transformer_lens", reason="the cross-check needs pip install 'captum_ffb[lens]'")
hf_logging.set_verbosity(_VERBOSITY)  # importing transformer_lens silences transformers process-wide


@pytest.fixture(autouse=True)
def _transformers_logging_kept():
    yield
    hf_logging.set_verbosity(_VERBOSITY)


def _lens_direct_logits(model, ids: torch.Tensor, token: int) -> dict[str, float]:
    """TransformerLens's per-component direct logit attribution at the last position: each
    component's output through the final norm at its cached (real) scale, then γ and the
    unembedding row of ``token`` (no β, no unembedding bias)."""
    from transformer_lens.model_bridge.sources import build_bridge_from_module

    copied = copy.deepcopy(model).eval()  # the bridge rewrites the model it wraps
    bridge = build_bridge_from_module(copied, type(copied).__name__, hf_config=copied.config)
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids)
        gamma = getattr(bridge.ln_final, "w", None)
        direction = bridge.W_U[:, token] * (1 if gamma is None else gamma)

        def logit(stack: torch.Tensor) -> torch.Tensor:
            return cache.apply_ln_to_stack(stack, layer=-1, pos_slice=-1)[:, 0] @ direction

        stack, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
        values = dict(zip(labels, logit(stack).tolist()))
        heads = logit(cache.stack_head_results(layer=-1, pos_slice=-1)).view(bridge.cfg.n_layers, bridge.cfg.n_heads)
    out = {"embeddings": values["embed"] + values.get("pos_embed", 0.0)}
    for layer in range(bridge.cfg.n_layers):
        out[f"block.{layer}.attention"] = values[f"{layer}_attn_out"]
        out[f"block.{layer}.ff"] = values[f"{layer}_mlp_out"]
        for head in range(bridge.cfg.n_heads):
            out[f"block.{layer}.attention.head.{head}"] = float(heads[layer, head])
    return out


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_direct_effects_equal_transformer_lens(name):
    model = tiny_task_model(name)
    ids = token_ids(batch=1)
    token = 7
    lens = _lens_direct_logits(model, ids, token)
    nd = NormDecomposition(model)
    for granularity in ("sublayer", "head"):
        found = nd.attribute_components(ids, target=token, granularity=granularity)
        totals = found.component_totals()[0]
        compared = [c for c in found.components if c in lens]
        left = {c for c in found.components if c not in lens}
        assert left == {"output_head"} | {c for c in found.components if c.endswith(".attention.bias")}
        ours = torch.stack([totals[found.components.index(c)] for c in compared])
        theirs = torch.tensor([lens[c] for c in compared], dtype=ours.dtype)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
