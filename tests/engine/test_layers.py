"""The per-layer capture (``engine/layers.py``): one forward pass for every layer and scope,
and a warning for padding without an attention mask."""

from __future__ import annotations

import warnings

import pytest

from captum_ffb import LayerNormDecomposition
from tests.models import TINY_MODELS, token_ids


def test_one_forward_pass_serves_every_layer_and_scope():
    tiny = TINY_MODELS["gpt2"]
    model = tiny.build()
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        lnd = LayerNormDecomposition(model, list(tiny.blocks(model)))
        results = list(lnd.iter_layers(token_ids(), scope=[*lnd.scopes, "AtbLnFfResLn"],
                                       convergence_delta=True))
    finally:
        handle.remove()
    assert len(calls) == 1 and len(results) == 2
    for _, result in results:
        assert set(result.decompositions) == {*lnd.scopes, "AtbLnFfResLn"}
        assert float(result.delta["AtbLnFfResLn"].max()) < 1e-4


def test_a_padded_batch_without_an_attention_mask_warns():
    tiny = TINY_MODELS["llama"]
    model = tiny.build()  # pad_token_id = 0
    lnd = LayerNormDecomposition(model, model.layers[0])
    ids = token_ids()
    ids[1, -2:] = 0
    with pytest.warns(UserWarning, match="pad token"):
        lnd.attribute(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lnd.attribute(ids, forward_kwargs={"attention_mask": (ids != 0).long()})
        lnd.attribute(token_ids())
        inside = token_ids()
        inside[:, 3] = 0  # the pad token as text (a chat template's end of turn): not padding
        lnd.attribute(inside)
    left = token_ids()
    left[0, :2] = 0
    with pytest.warns(UserWarning, match="pad token"):
        lnd.attribute(left)
