"""Encoder families run as causal LMs (``BertLMHeadModel``, ``RobertaForCausalLM``, ...): their
language-model head's dense layer, GELU and LayerNorm are decomposed, so the players and the
bias give the model's own logit on both routes."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from tests.models import tiny_task_model, token_ids


@pytest.mark.parametrize("name", ["bert", "roberta", "xlm-roberta", "camembert", "electra"])
def test_an_encoder_lm_head_is_decomposed_to_the_models_logit(name):
    model = tiny_task_model(name)
    nd = NormDecomposition(model)
    assert [kind for kind, _, _ in nd.engine.head.steps] == ["linear", "activation", "norm"]
    ids = token_ids()
    with torch.no_grad():
        logits = model(ids).logits[:, -1, 3]
    scale = float(logits.abs().max())
    for route in ("backward", "forward"):
        tokens, bias, delta = nd.attribute(ids, target=3, route=route, return_bias=True,
                                           return_convergence_delta=True)
        torch.testing.assert_close(tokens.sum(-1) + bias, logits, atol=1e-5 * scale, rtol=0)
        assert float(delta.max()) < 1e-5 * scale
    table = nd.attribute_components(ids, target=3)
    torch.testing.assert_close(table.contributions.sum((1, 2)) + table.bias.sum(-1), logits,
                               atol=1e-5 * scale, rtol=0)
