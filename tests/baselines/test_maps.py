"""``baseline_maps`` and ``resolve_baselines``: aliases expanded, every map named."""

from __future__ import annotations

import pytest

from captum_ffb.baselines import BASELINES, baseline_maps, capture_layer, resolve_baselines
from tests.models import TINY_MODELS, token_ids


def test_baseline_maps_expands_aliases_and_names_every_map():
    spec = TINY_MODELS["gpt2"]
    model = spec.build()
    ids = token_ids(1, 4)
    maps = baseline_maps(model, spec.blocks(model)[0], ids, methods="attention,norm,gradients,shap",
                         n_steps=4)
    assert list(maps) == ["attention_mean", "attention_sum", "norm", "saliency", "ixg", "ig", "shap_exact"]
    assert all(m.shape == (1, 4, 4) for m in maps.values())
    context = capture_layer(model, spec.blocks(model)[0], ids)
    again = baseline_maps(context, methods=["norm_bias", "captum_shapley"], n_samples=3)
    assert list(again) == ["norm_bias", "captum_shapley"]
    assert resolve_baselines("shap", 40) == ["shap_permutation"]
    assert resolve_baselines("all", 12) == list(BASELINES)  # every baseline, in table order
    assert resolve_baselines("all", 13) == [b for b in BASELINES if b != "shap_exact"]
    assert resolve_baselines("all,shap_exact", 13)[-1] == "shap_exact"  # asked for by name
    with pytest.raises(ValueError, match="unknown baseline 'lime'"):
        resolve_baselines("ig,lime", 3)
