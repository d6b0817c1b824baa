"""``explain_text`` runs the model as few times as it can: the forward route's recording
(which also gives the real values, the prediction, the bias player, the maps and the check)
and the backward pass."""

from __future__ import annotations

import pytest

from captum_ffb.explain import CHECK_UP_TO, explain_text
from captum_ffb.explained.models import LoadedModel
from tests.models import causal_tokenizer, tiny_lm, tiny_task_model, wordpiece_tokenizer

SHORT = "the cat sat on the mat"
LONG = " ".join(["the cat sat on the mat because it was tired ."] * 8)  # 88 tokens


def _passes(loaded: LoadedModel, text: str, **options) -> tuple[int, object]:
    calls: list[int] = []
    handle = loaded.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        explanation = explain_text(text, loaded, **options)
    finally:
        handle.remove()
    return len(calls), explanation


@pytest.fixture(scope="module")
def lm() -> LoadedModel:
    model = tiny_lm("llama")
    model.config.max_position_embeddings = 256  # rotary positions: the limit is the config's
    return LoadedModel(model, causal_tokenizer(), "tiny-llama", causal_lm=True, task="causal_lm")


def test_a_short_text_takes_two_passes_with_the_check_and_the_maps(lm):
    passes, explanation = _passes(lm, SHORT)
    assert passes == 2
    assert explanation.check is not None and explanation.maps is not None
    assert float(explanation.delta.max()) < 1e-4


def test_a_text_over_the_check_length_takes_two_passes_without_the_check(lm):
    # the bias player (and the maps, up to MAPS_UP_TO tokens) need the forward route's recording
    passes, explanation = _passes(lm, LONG)
    assert len(explanation.tokens) > CHECK_UP_TO
    assert passes == 2
    assert explanation.check is None and explanation.maps is not None
    assert _passes(lm, LONG, maps=False)[0] == 2


def test_the_forward_route_takes_one_pass(lm):
    passes, explanation = _passes(lm, SHORT, route="forward")
    assert passes == 1
    assert explanation.check is None and explanation.maps is not None


def test_a_classifier_takes_two_passes():
    loaded = LoadedModel(tiny_task_model("bert", "sequence_classification", num_labels=2),
                         wordpiece_tokenizer(), "tiny-bert", task="sequence_classification")
    passes, explanation = _passes(loaded, SHORT)
    assert passes == 2
    assert explanation.steps == 1 and explanation.check is not None
