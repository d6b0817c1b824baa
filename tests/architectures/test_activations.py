"""The one table of the functions a head names, used by both routes."""

from __future__ import annotations

import pytest
import torch

from captum_ffb.architectures.activations import ACTIVATIONS, activation_function
from captum_ffb.architectures.heads import HeadActivation
from tests.models import tiny_task_model


def test_the_named_functions():
    x = torch.linspace(-3, 3, 13)
    expected = {"tanh": torch.tanh(x), "relu": x.clamp_min(0), "sigmoid": 1 / (1 + torch.exp(-x)),
                "gelu": 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))}
    assert set(ACTIVATIONS) == set(expected)
    for name, values in expected.items():
        torch.testing.assert_close(activation_function(name)(x), values)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown head activation function 'swish'; known: tanh, relu"):
        activation_function("swish")


def test_the_head_reads_its_functions_from_the_table(monkeypatch):
    from captum_ffb.architectures import get_architecture
    from captum_ffb.architectures.heads import get_head
    from captum_ffb.engine.whole import resolve_head

    model = tiny_task_model("distilbert", "sequence_classification")
    assert HeadActivation(function="relu") in get_head("distilbert", "sequence_classification").layers

    def replaced(t: torch.Tensor) -> torch.Tensor:
        return t

    monkeypatch.setitem(ACTIVATIONS, "relu", replaced)
    steps = resolve_head(model, get_architecture("distilbert")).steps
    assert [item for kind, item, _ in steps if kind == "activation"] == [replaced]
