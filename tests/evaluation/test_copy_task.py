"""The copy task: the generator, and a hand-built induction model on which the answer's
source positions are known."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.evaluation import copy_task
from captum_ffb.rules import Attention, AttnLRPAttention, IGAttention
from tests.models import induction_gpt2


def test_copy_task_generator():
    task = copy_task(20, n_sequences=5, length=8, repeated=3, seed=1, prefix=[0], exclude=[0, 1])
    assert task.input_ids.shape == (5, 1 + 8 + 3) and len(task) == 5
    rows = torch.arange(5)
    assert torch.equal(task.input_ids[rows, task.answer_positions], task.targets)
    assert torch.equal(task.input_ids[rows, task.previous_positions], task.input_ids[:, -1])
    body = task.input_ids[:, 1:9]
    assert all(len(set(row.tolist())) == 8 for row in body)
    assert not bool(((body == 0) | (body == 1)).any()) and bool((task.input_ids[:, 0] == 0).all())
    with pytest.raises(ValueError):
        copy_task(5, length=8)


@pytest.fixture(scope="module")
def induction():
    model = induction_gpt2(sharpness=10.0)
    task = copy_task(16, n_sequences=6, length=10, repeated=4, seed=0, exclude=[0])
    with torch.no_grad():
        logits = model(task.input_ids).logits[:, -1]
    assert torch.equal(logits.argmax(-1), task.targets)  # the model copies
    return model, task


@pytest.mark.parametrize("rule", [Attention(), IGAttention(n_steps=128), AttnLRPAttention()], ids=repr)
def test_every_rule_ranks_the_copied_token_first(induction, rule):
    model, task = induction
    nd = NormDecomposition(model, rules={"attention": rule})
    contributions, bias, delta = nd.attribute(task.input_ids, target=task.targets, route="forward",
                                              return_bias=True, return_convergence_delta=True)
    logit = contributions.sum(1) + bias
    assert float(delta.max()) < 1e-5 * float(logit.abs().max())
    assert torch.equal(contributions.argmax(1), task.answer_positions)


def test_only_the_ig_rule_credits_the_whole_induction_circuit(induction):
    """The answer is copied from position m (values), found because the current token (the
    query, last position) matches the token at m − 1 (the key, moved to m by the
    previous-token head). Crediting queries and keys, IG ranks all three on top; the
    frozen-probability rule and AttnLRP (whose softmax Jacobian vanishes on saturated
    attention) give the query and key sources nothing positive."""
    model, task = induction
    last = task.input_ids.shape[1] - 1
    circuit = torch.stack([task.answer_positions, task.previous_positions, torch.full_like(task.targets, last)], 1)
    ig = NormDecomposition(model, rules={"attention": IGAttention(n_steps=128)}).attribute(
        task.input_ids, target=task.targets)
    top3 = ig.argsort(1, descending=True)[:, :3]
    assert torch.equal(top3.sort(1).values, circuit.sort(1).values)
    for rule in (Attention(), AttnLRPAttention()):
        c = NormDecomposition(model, rules={"attention": rule}).attribute(task.input_ids, target=task.targets)
        rows = torch.arange(len(task))
        assert float(c[rows, task.previous_positions].max()) <= 0.0
        assert float(c[:, last].max()) <= 0.0
