"""``captum-ffb maps`` on a saved model folder of the families that have no pretrained
weights here (MoE, fused projections, output-only norms, scaled branches, an encoder
without a first attention norm)."""

from __future__ import annotations

import json

import pytest

from captum_ffb.cli import main
from tests.models import TINY_MODELS, save_tiny


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "qwen3_moe", "phi3", "olmo", "olmo2", "gptj",
                                  "granite", "cohere", "starcoder2", "modernbert"])
def test_maps_runs_on_a_saved_folder(name, tmp_path):
    folder = save_tiny(name, tmp_path / "model")
    out = tmp_path / "out"
    code = main(["maps", "the cat sat on the mat .", "--model", str(folder), "--out", str(out),
                 "--format", "json", "--quiet"])
    assert code == 0
    data = json.loads((out / "maps.json").read_text())
    layers = TINY_MODELS[name].build().config.num_hidden_layers
    assert data["model_type"] == name and len(data["layers"]) == layers
    for layer in data["layers"].values():
        assert max(layer["completeness_residual"].values()) < 1e-4
