"""Read-outs: each computes its value from the model's outputs and names what the head's
rules read; NormDecomposition takes them as it takes indices, Contrast and Direction."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import Contrast, Direction, NormDecomposition
from captum_ffb.architectures.heads import task_of
from captum_ffb.explained.readouts import (
    BinaryDirection,
    ClassLogit,
    NextToken,
    PromptContrast,
    as_readout,
    mean_pool,
)
from tests.models import TINY_MODELS, tiny_lm, tiny_task_model, token_ids


def _values(nd, ids, target, **kwargs):
    c, bias = nd.attribute(ids, target=target, return_bias=True, **kwargs)
    return c.sum(1) + bias


def test_next_token_and_class_logit_are_the_plain_indices():
    ids = token_ids(2, 7)
    lm = NormDecomposition(tiny_lm())
    assert torch.equal(lm.attribute(ids, target=5), lm.attribute(ids, target=NextToken(5)))
    assert torch.equal(lm.attribute(ids, target=5, target_position=3),
                       lm.attribute(ids, target=NextToken(5, position=3)))
    classifier = NormDecomposition(tiny_task_model("bert", "sequence_classification"))
    assert torch.equal(classifier.attribute(ids, target=1), classifier.attribute(ids, target=ClassLogit(1)))


def test_values_are_what_the_decomposition_adds_up_to():
    ids = token_ids(2, 7)
    mask = torch.ones_like(ids)
    model = tiny_lm()
    nd = NormDecomposition(model)
    with torch.no_grad():
        outputs = model(ids)
    for readout in (NextToken(5), NextToken(torch.tensor([5, 6]), position=2), Contrast(5, 6),
                    PromptContrast(5, 6)):
        torch.testing.assert_close(readout.value(outputs, mask), _values(nd, ids, readout), rtol=1e-4, atol=1e-4)
    base = TINY_MODELS["bert"].build().eval()
    vector = torch.randn(base.config.hidden_size)
    with torch.no_grad():
        hidden = base(ids)
    for pooling in ("mean", "first", "last", 3):
        readout = Direction(vector, pooling=pooling, bias=0.5)
        torch.testing.assert_close(readout.value(hidden, mask), _values(NormDecomposition(base), ids, readout),
                                   rtol=1e-4, atol=1e-4)


def test_predicted_units_are_resolved_from_the_outputs():
    logits = torch.tensor([[[0.0, 1.0, 3.0], [2.0, 0.0, 1.0]]])
    outputs = type("Out", (), {"logits": logits})()
    mask = torch.ones(1, 2)
    assert int(NextToken().resolve(outputs, mask).token) == 0  # the last position
    assert int(NextToken(position=0).resolve(outputs, mask).token) == 2
    assert int(ClassLogit().resolve(type("Out", (), {"logits": logits[:, 0]})(), mask).index) == 2
    assert NextToken(1).resolve(outputs, mask) == NextToken(1)


def test_two_class_readouts():
    logits = torch.tensor([[[0.0, 1.0, 3.0]], [[2.0, 0.0, 1.0]]])
    outputs = type("Out", (), {"logits": logits})()
    mask = torch.ones(2, 4)
    prompt = PromptContrast(2, 0)
    d = torch.tensor([3.0, -1.0])
    assert torch.equal(prompt.class_logits(outputs, mask), torch.stack([-d, d], -1))
    assert torch.allclose(prompt.class_probabilities(prompt.class_logits(outputs, mask))[:, 1], torch.sigmoid(d))
    swapped, sign = prompt.for_class(torch.tensor([1, 0]))
    assert swapped.positive.tolist() == [2, 0] and swapped.negative.tolist() == [0, 2]
    assert sign.tolist() == [1.0, 1.0]
    head = BinaryDirection(torch.ones(3), bias=1.0)
    assert isinstance(head, Direction)
    same, sign = head.for_class(torch.tensor([1, 0]))
    assert same is head and sign.tolist() == [1.0, -1.0]
    hidden = torch.arange(12.0).reshape(2, 2, 3)
    z = head.value(hidden, torch.tensor([[1, 1], [1, 0]]))
    assert z.tolist() == [(1.5 + 2.5 + 3.5) + 1.0, (6.0 + 7.0 + 8.0) + 1.0]  # padding left out
    assert head.query_row == "mean" and PromptContrast(1, 2).query_row == "last"
    assert ClassLogit().query_row == "first"


def test_mean_pool_and_plain_targets():
    hidden = torch.ones(1, 3, 2)
    assert mean_pool(hidden, torch.tensor([[1, 1, 0]])).tolist() == [[1.0, 1.0]]
    assert as_readout(3, "causal_lm") == NextToken(3)
    assert as_readout(3, "sequence_classification") == ClassLogit(3)
    with pytest.raises(ValueError, match="Direction"):
        as_readout(3, "base")


def test_the_task_is_inferred_from_a_model_a_class_name_or_a_configuration():
    lm = tiny_lm()
    assert task_of(lm) == task_of("LlamaForCausalLM") == task_of(lm.config) == "causal_lm"
    classifier = tiny_task_model("bert", "sequence_classification")
    assert task_of(classifier) == "sequence_classification"
    assert task_of(TINY_MODELS["bert"].build()) == "base"
    config = lm.config
    config.architectures = None  # a GGUF file's configuration: a causal family is a causal LM
    assert task_of(config) == "causal_lm"
