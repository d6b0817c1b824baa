"""``captum-ffb maps`` on a saved model folder of the families that have no pretrained
weights here (MoE, fused projections, output-only norms)."""

from __future__ import annotations

import json

import pytest

from captum_ffb.cli import main
from tests.models import save_tiny


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "phi3", "olmo", "olmo2", "gptj"])
def test_maps_runs_on_a_saved_folder(name, tmp_path):
    folder = save_tiny(name, tmp_path / "model")
    out = tmp_path / "out"
    code = main(["maps", "the cat sat on the mat .", "--model", str(folder), "--out", str(out),
                 "--format", "json", "--quiet"])
    assert code == 0
    data = json.loads((out / "maps.json").read_text())
    assert data["model_type"] == name and len(data["layers"]) == 2
    for layer in data["layers"].values():
        assert max(layer["completeness_residual"].values()) < 1e-4
