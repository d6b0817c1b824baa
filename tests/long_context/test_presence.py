"""Presence attribution (``context_attribution(..., method="presence")``): the groups' presence
in attention as players, checked against the model's own passes (its ordinary attention mask
for the value without the context, its logits for an answer's log-probability), by finite
differences, and through the command line and the views."""

from __future__ import annotations

import json

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.explained.readouts import AnswerLogProbability, NextToken, TokenLogProbability
from captum_ffb.long_context.attribution import context_attribution
from captum_ffb.long_context.presence import _log_mask, _scalar, presence_attribution
from tests.long_context.test_context import CONTEXT, QUESTION
from tests.models import byte_level_tokenizer, causal_tokenizer, save_tiny_lm, tiny_lm


@pytest.fixture(scope="module")
def lm():
    return NormDecomposition(tiny_lm("llama")), causal_tokenizer(bos=True)


def prompt_ids(tokenizer, context=CONTEXT, question=QUESTION):
    return tokenizer(context + "\n\n" + question, return_tensors="pt").input_ids


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen2", "falcon"])
def test_the_value_and_the_value_without_the_context_are_the_models_own(name):
    """``value`` is the model's logit; ``bias`` is its logit with every context token masked by
    its ordinary (2D) attention mask, a mechanism the presences do not use."""
    model, tokenizer = tiny_lm(name), causal_tokenizer(bos=True)
    found = context_attribution(model, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=7,
                                method="presence")
    ids = prompt_ids(tokenizer)
    in_context = torch.tensor(found.token_groups) >= 0
    with torch.no_grad():
        own = float(model(ids).logits[0, -1, 7])
        without = float(model(ids, attention_mask=(~in_context).long()[None]).logits[0, -1, 7])
    assert found.method == "presence" and found.value == pytest.approx(own, abs=1e-6)
    assert found.bias == pytest.approx(without, abs=1e-5)
    assert found.delta == pytest.approx(abs(float(found.contributions.sum()) + found.bias - found.value), abs=1e-9)
    assert found.token_contributions is None and found.question == found.rest == found.answer == 0.0


def test_the_rule_converges_to_completeness(lm):
    nd, tokenizer = lm
    deltas = [context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=7,
                                  method="presence", steps=steps).delta for steps in (1, 4, 32)]
    assert deltas[2] < deltas[1] < deltas[0] and deltas[2] < 2e-4


@pytest.mark.parametrize("steps, points", [(1, (0.5,)), (2, (0.25, 0.75))])
def test_each_step_is_the_gradient_at_its_midpoint(lm, steps, points):
    """Each group's attribution is the mean of ``∂f/∂t_g`` at the rule's midpoints (``t = ½``
    for one step, ``¼`` and ``¾`` for two, the default), by central differences."""
    _, tokenizer = lm
    model = tiny_lm("llama").double()
    found = context_attribution(model, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=7,
                                method="presence", steps=steps)
    ids = prompt_ids(tokenizer)
    groups, n = torch.tensor(found.token_groups), len(found.groups)

    def f(t):
        with torch.no_grad():
            out = model(ids, attention_mask=_log_mask(groups, t.log()[None], torch.float64))
        return float(_scalar(NextToken(7), out)[0])

    for g in (0, 2, n - 1):
        slopes = []
        for point in points:
            up, down = torch.full((n,), point, dtype=torch.float64), torch.full((n,), point, dtype=torch.float64)
            up[g], down[g] = point + 1e-2, point - 1e-2  # wide: the rotary tables are float32 in a float64 model
            slopes.append((f(up) - f(down)) / 2e-2)
        assert float(found.contributions[g]) == pytest.approx(sum(slopes) / steps, rel=2e-4, abs=1e-8)
    assert float(found.contributions.abs().min()) > 0


def test_an_answer_of_several_tokens_is_its_log_probability():
    from tests.attr.test_answers import log_probability

    tokenizer = byte_level_tokenizer()
    model = tiny_lm("llama")
    context, answer = "the cat sat on the mat.\n\nthe dog ran fast.\n\nhello world", " mat because it"
    found = context_attribution(model, tokenizer, context, "the cat", target=answer, method="presence", steps=16)
    ids = tokenizer(context + "\n\nthe cat", return_tensors="pt").input_ids
    answer_ids = tokenizer(answer).input_ids
    assert found.value == pytest.approx(log_probability(model, ids, answer_ids), abs=1e-5)
    assert found.target == f"log p({answer!r})" and found.delta < 1e-2
    assert found.token_groups.count(-3) == len(answer_ids) - 1 and len(found.tokens) == len(found.token_groups)


def test_the_predicted_token_is_explained_by_default(lm):
    nd, tokenizer = lm
    found = context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="presence")
    with torch.no_grad():
        predicted = int(nd.model(prompt_ids(tokenizer)).logits[0, -1].argmax())
    assert found.target == repr(tokenizer.decode([predicted]))


def test_models_whose_attention_cannot_take_presences_are_refused():
    tokenizer = causal_tokenizer(bos=True)
    with pytest.raises(ValueError, match="window of 4 tokens"):
        context_attribution(tiny_lm("mistral"), tokenizer, CONTEXT, QUESTION, method="presence")
    with pytest.raises(ValueError, match="custom 4D attention mask"):
        context_attribution(tiny_lm("opt"), tokenizer, CONTEXT, QUESTION, method="presence")


def test_a_model_whose_own_pass_the_mask_does_not_give_is_refused():
    """Mistral's sliding window hidden from its configuration: the window guard passes, but its
    own pass (windowed) differs from the pass with every group present (the 4D mask is not)."""
    model, tokenizer = tiny_lm("mistral"), causal_tokenizer(bos=True)  # a window of 4 tokens
    # the configuration the guard reads says nothing of the window; the model's layers keep it
    model.config = type(model.config)(**{**model.config.to_dict(), "sliding_window": None})
    assert model.model.config.sliding_window == 4
    with pytest.raises(ValueError, match="does not apply a custom attention mask as given"):
        context_attribution(model, tokenizer, CONTEXT, QUESTION, method="presence")


def test_the_mask_is_checked_the_first_time_a_model_is_seen():
    """One pass with every group present on the first call, not on the next (the same numbers)."""
    model, tokenizer = tiny_lm("llama"), causal_tokenizer(bos=True)
    rows = []
    model.get_input_embeddings().register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    first = context_attribution(model, tokenizer, CONTEXT, QUESTION, method="presence", target=7)
    seen, rows[:] = list(rows), []
    second = context_attribution(model, tokenizer, CONTEXT, QUESTION, method="presence", target=7)
    # own, (present,) absent, two steps (the first, by blocks, checked once against the mask's pass)
    assert seen == [1, 2, 1, 1, 1] and rows == [1, 1, 1, 1]
    # (the first call reads the absent pass from a batch of two, the next from a batch of one: rounding)
    assert torch.allclose(first.contributions, second.contributions, rtol=1e-5, atol=1e-7)
    assert first.bias == pytest.approx(second.bias, rel=1e-6)


def test_without_the_ends_only_the_steps_run_once_the_model_is_checked():
    """``ends=False``: the first time a model is seen the ends still run (its mask is checked
    there); after that only the two steps do, with the same attributions and no value."""
    import math

    model, tokenizer = tiny_lm("llama"), causal_tokenizer(bos=True)
    ids = prompt_ids(tokenizer)
    groups = [0] * 4 + [1] * (ids.shape[1] - 6) + [-1] * 2
    rows = []
    model.get_input_embeddings().register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    first = presence_attribution(model, ids, groups, 2, NextToken(7), ends=False)
    # unchecked: own, (present,) absent, two steps (by blocks: the first compared with the mask's pass)
    assert rows == [1, 2, 1, 1, 1] and not math.isnan(first.value)
    rows[:] = []
    both = presence_attribution(model, ids, groups, 2, NextToken(7))
    rows[:] = []
    steps_only = presence_attribution(model, ids, groups, 2, NextToken(7), ends=False)
    assert rows == [1, 1] and steps_only.unit == 7
    assert torch.equal(steps_only.contributions, both.contributions)
    assert all(math.isnan(x) for x in (steps_only.value, steps_only.without, steps_only.delta))
    rows[:] = []
    named = presence_attribution(model, ids, groups, 2, NextToken(None), ends=False)
    assert rows == [1, 1, 1, 1] and not math.isnan(named.value)  # a token to name: the ends run
    assert named.unit == int(model(ids).logits[0, -1].argmax())
    with pytest.raises(TypeError, match="ends must be True or False"):
        presence_attribution(model, ids, groups, 2, NextToken(7), ends=1)


def test_bad_requests_are_refused(lm):
    nd, tokenizer = lm
    with pytest.raises(ValueError, match="method must be one of"):
        context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="ablation")
    for steps in (0, 1.5, True):
        with pytest.raises(ValueError, match="steps must be a positive integer"):
            context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="presence", steps=steps)
    with pytest.raises(TypeError, match="presence attribution explains"):
        context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="presence", target=torch.tensor([7]))
    ids = prompt_ids(tokenizer)
    with pytest.raises(ValueError, match="token groups for"):
        presence_attribution(nd.model, ids, [0], 1, NextToken(7))
    with pytest.raises(ValueError, match="give its positions"):
        presence_attribution(nd.model, ids, [0] * ids.shape[1], 1, AnswerLogProbability((3, 4)))
    with pytest.raises(TypeError, match="not a TokenLogProbability"):
        presence_attribution(nd.model, ids, [0] * ids.shape[1], 1, TokenLogProbability(3, -1))


def test_the_command_line_and_the_views(tmp_path, capsys):
    from captum_ffb.cli import main
    from captum_ffb.viz.context import context_html, plot_context

    model = save_tiny_lm(tmp_path / "m")
    (tmp_path / "context.txt").write_text(CONTEXT)
    assert main(["explain", "--model", str(model), "--context", str(tmp_path / "context.txt"), "--question", QUESTION,
                 "--group-by", "sentence", "--context-method", "presence", "--presence-steps", "2",
                 "--out", str(tmp_path / "o"), "--format", "json,html"]) == 0
    written = json.loads((tmp_path / "o" / "context.json").read_text())
    assert written["method"] == "presence" and len(written["groups"]) == 6
    assert "without the context" in capsys.readouterr().out
    nd, tokenizer = NormDecomposition(tiny_lm("llama")), causal_tokenizer(bos=True)
    found = context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="presence")
    assert [name for name, _ in found.terms()] == ["without the context"]
    assert "without the context" in found.equation() and "question" not in found.equation()
    assert "<html" in context_html(found).lower()
    title = plot_context(found).axes[0].get_title()
    assert "without the context" in title and "question" not in title
