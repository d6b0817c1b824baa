"""The analysis on the bundled all-MiniLM-L6-v2 (real weights, a few demo sentences)."""

from __future__ import annotations

import math

import pytest

from captum_ffb.analysis import AnalysisConfig, analyze_corpus, load_corpus
from captum_ffb.explained.models import load_model


@pytest.mark.real_weights
def test_minilm_on_demo_sentences(tmp_path):
    loaded = load_model()
    summary = analyze_corpus(loaded, load_corpus("demo").lines, tmp_path,
                             AnalysisConfig(max_seqs=6, batch_size=6), show_progress=False)
    assert summary["chain"] == "post_ln" and not summary["causal"]
    assert summary["masked_tokens"] > 0  # a BERT tokenizer: masked LM, 12 % masked
    assert len(summary["layers"]) == 6
    for layer in summary["layers"]:
        assert layer["completeness_residual_max"] < 1e-4
        assert all(math.isfinite(c["mean"]) for c in layer["changes"])
        assert len(layer["outliers"]["ignored_dims"]) == 3  # 1 % of 384
        assert layer["norms"]["ff_output"] > 0 and layer["norms"]["bypassed"] > 0
