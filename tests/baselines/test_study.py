"""The studies of ``captum-ffb compare`` as library functions: one forward pass, and the same
maps as the attribution and the baselines run on their own."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import LayerNormDecomposition
from captum_ffb.baselines import (
    activation_study_by_length,
    baseline_maps,
    compare_with_baselines,
    text_lengths,
)
from tests.models import tiny_loaded

TEXT = "the cat sat on the mat"


def _count_passes(model):
    passes = []
    handle = model.register_forward_hook(lambda *_: passes.append(1))
    return passes, handle


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_compare_with_baselines_runs_the_model_once(name):
    loaded = tiny_loaded(name)
    passes, handle = _count_passes(loaded.model)
    try:
        result = compare_with_baselines(TEXT, loaded, baselines="norm,saliency", k=2)
    finally:
        handle.remove()
    assert len(passes) == 1
    assert result.layers == [0, 1]
    assert result.baselines == ["norm", "saliency"]
    encoded = loaded.tokenizer(TEXT, return_tensors="pt")
    ids = encoded["input_ids"]
    kwargs = {k: v for k, v in encoded.items() if k != "input_ids"}
    for layer in result.layers:
        block = loaded.blocks[layer]
        ours = LayerNormDecomposition(loaded.model, block).attribute(
            ids, scope=result.scopes, forward_kwargs=kwargs)
        theirs = baseline_maps(loaded.model, block, ids, methods=result.baselines, forward_kwargs=kwargs)
        assert list(result.maps[layer]) == [*result.scopes, *result.baselines]
        for scope in result.scopes:
            assert torch.equal(result.maps[layer][scope], ours[scope])
        for baseline in result.baselines:
            torch.testing.assert_close(result.maps[layer][baseline], theirs[baseline])
    rows = [(r["layer"], r["reference"], r["method"]) for r in result.table.rows]
    assert rows == [(layer, scope, baseline) for layer in result.layers
                    for scope in result.scopes for baseline in result.baselines]


def test_compare_with_baselines_checks_before_the_forward_pass():
    loaded = tiny_loaded("llama")
    passes, handle = _count_passes(loaded.model)
    try:
        with pytest.raises(ValueError, match="unknown scope 'AtbFf' for a pre_ln model"):
            compare_with_baselines(TEXT, loaded, scopes=["Atb", "AtbFf"])
        with pytest.raises(ValueError, match="layer 2 does not exist"):
            compare_with_baselines(TEXT, loaded, layers=[2])
        with pytest.raises(ValueError, match="unknown baseline 'lime'"):
            compare_with_baselines(TEXT, loaded, baselines="lime")
    finally:
        handle.remove()
    assert passes == []
    # the scope after the next norm is asked for by name
    result = compare_with_baselines(TEXT, loaded, layers=[-1], scopes=["AtbLnFfResLn"],
                                    baselines="norm")
    assert list(result.maps[1]) == ["AtbLnFfResLn", "norm"]


def test_activation_study_runs_the_model_once_per_length():
    loaded = tiny_loaded("bert")
    full = text_lengths(TEXT, loaded)[0]
    with pytest.raises(ValueError, match=f"--lengths 40 is not possible: the text has {full} tokens"):
        text_lengths(TEXT, loaded, [3, 40], option="--lengths")
    passes, handle = _count_passes(loaded.model)
    try:
        study = activation_study_by_length(TEXT, loaded, layers="all", lengths=[3, 4],
                                           methods=["ig", "shap_exact"])
    finally:
        handle.remove()
    assert len(passes) == 2
    assert [(r["layer"], r["n"], r["method"]) for r in study.timing.rows] == [
        (layer, n, method) for layer in (0, 1) for n in (3, 4) for method in ("ig", "shap_exact")
    ]
    assert set(study.seconds) == {"ig", "shap_exact"} and set(study.seconds["ig"]) == {3, 4}
