"""NormDecomposition with the attention rules that credit queries and keys, on tiny models
of every family: complete against the model's own output on the forward route, the same
numbers on the one-backward-pass route, padding handled."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.rules import Attention, AttnLRPAttention, CompleteAttnLRPAttention, IGAttention
from tests.models import INLINE_ATTENTION, TINY_MODELS, padded_pair, tiny_task_model, token_ids

RULES = {"ig": lambda: IGAttention(n_steps=16), "attnlrp": AttnLRPAttention,
         "complete_attnlrp": CompleteAttnLRPAttention, "ig_exact": lambda: IGAttention(n_steps=2, exact=True)}
CASES = [(name, rule) for name in sorted(TINY_MODELS) if name not in INLINE_ATTENTION for rule in RULES]


@pytest.mark.parametrize("name", sorted(INLINE_ATTENTION))
def test_rules_crediting_queries_and_keys_are_refused_where_they_cannot_be_read(name):
    causal = TINY_MODELS[name].causal
    model = tiny_task_model(name, "causal_lm" if causal else "sequence_classification")
    nd = NormDecomposition(model, rules={"attention": AttnLRPAttention()})
    for route in ("forward", "backward"):
        with pytest.raises(ValueError, match="computes its probabilities inline"):
            nd.attribute(token_ids(), target=1, route=route)


@pytest.mark.parametrize("name, rule", CASES)
def test_complete_and_both_routes_agree(name, rule):
    task = "causal_lm" if TINY_MODELS[name].causal else "sequence_classification"
    model = tiny_task_model(name, task)
    ids = token_ids()
    nd = NormDecomposition(model, rules={"attention": RULES[rule]()})
    target = torch.tensor([7, 11]) if task == "causal_lm" else 1
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    real = logits[:, -1, [7, 11]].diagonal() if task == "causal_lm" else logits[:, 1]
    scale = float(real.abs().max()) + 1e-3
    forward, bias, delta = nd.attribute(ids, target=target, route="forward", return_bias=True,
                                        return_convergence_delta=True)
    assert float((forward.sum(1) + bias - real).abs().max()) < 1e-5 * scale
    assert float(delta.max()) < 1e-5 * scale
    backward, backward_bias = nd.attribute(ids, target=target, return_bias=True)
    assert float((forward - backward).abs().max()) < 1e-5 * float(forward.abs().max())
    torch.testing.assert_close(bias, backward_bias, atol=1e-5 * scale, rtol=0)
    # the rule changes the answer: it is not the frozen-probability rule
    frozen = NormDecomposition(model, rules={"attention": Attention()}).attribute(ids, target=target)
    assert float((frozen - backward).abs().max()) > 1e-6 * float(frozen.abs().max())


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_whole_model_default_is_the_papers_rules_from_the_centred_reference(name):
    task = "causal_lm" if TINY_MODELS[name].causal else "sequence_classification"
    model = tiny_task_model(name, task)
    ids = token_ids()
    nd = NormDecomposition(model)
    assert isinstance(nd.rules["attention"], Attention) and nd.reference == "centered"
    default = nd.attribute(ids, target=1)
    papers = NormDecomposition(model, rules={"attention": Attention()}).attribute(ids, target=1, reference="centered")
    lrp = NormDecomposition(model, rules={"attention": AttnLRPAttention()}).attribute(ids, target=1)
    zero = nd.attribute(ids, target=1, reference="zero")
    torch.testing.assert_close(default, papers, atol=0, rtol=0)
    for other in (lrp, zero):
        assert float((default - other).abs().max()) > 1e-6 * float(other.abs().max())


@pytest.mark.parametrize("name, side", [("llama", "left"), ("gemma2", "right"), ("qwen3", "left"), ("gpt2", "right"),
                                        ("bert", "right"), ("gptj", "right")])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_padding(name, side, rule):
    task = "sequence_classification" if name == "bert" else "causal_lm"
    model = tiny_task_model(name, task)
    nd = NormDecomposition(model, rules={"attention": RULES[rule]()})
    padded, mask, short, real_columns = padded_pair(side)
    for route in ("backward", "forward"):
        batch = nd.attribute(padded, target=2, forward_kwargs={"attention_mask": mask}, route=route)
        alone = nd.attribute(short, target=2, route=route)
        torch.testing.assert_close(batch[1, real_columns], alone[0], atol=1e-5, rtol=1e-4)
        padding = torch.ones(7, dtype=torch.bool)
        padding[real_columns] = False
        assert float(batch[1, padding].abs().max()) == 0.0


def test_backward_route_is_one_backward_pass():
    model = tiny_task_model("llama")
    calls = []
    handle = model.model.layers[0].register_full_backward_pre_hook(lambda *a: calls.append(1))
    try:
        NormDecomposition(model, rules={"attention": IGAttention()}).attribute(token_ids(), target=3)
    finally:
        handle.remove()
    assert len(calls) == 1


@pytest.mark.parametrize("name", ["llama", "gemma2", "bert", "gpt2"])
def test_the_complete_rules_owe_nothing_to_no_token(name):
    """On a model without bias terms, AttnLRP's remainder is the whole bias player; its
    complete variant and exact IG (even with 2 points on sharpened attention) leave it 0."""
    task = "causal_lm" if TINY_MODELS[name].causal else "sequence_classification"
    model = tiny_task_model(name, task)
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            if key.endswith("bias"):
                parameter.zero_()
            if any(part in key for part in ("q_proj.weight", "k_proj.weight", "query.weight", "key.weight",
                                            "c_attn.weight")):
                parameter.mul_(4.0)  # sharper attention: a linearisation leaves more behind
    ids = token_ids()
    scale = None
    for rule, owes in ((AttnLRPAttention(), True), (CompleteAttnLRPAttention(), False),
                       (IGAttention(n_steps=2, exact=True), False)):
        nd = NormDecomposition(model, rules={"attention": rule}, reference="zero")
        c, bias, delta = nd.attribute(ids, target=1, return_bias=True, return_convergence_delta=True)
        scale = scale or float(c.abs().sum(1).max())
        if owes:
            assert float(bias.abs().max()) > 1e-3 * scale, rule
        else:
            assert float(bias.abs().max()) < 1e-6 * scale and float(delta.max()) < 1e-5 * scale, rule
