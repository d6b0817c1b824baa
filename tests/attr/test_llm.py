"""LLMNormAttribution against per-step NormDecomposition calls and the model's own outputs."""

from __future__ import annotations

import pytest
import torch
from captum.attr import LLMAttributionResult, TextTemplateInput, TextTokenInput

import captum_ffb
from captum_ffb import NormDecomposition
from captum_ffb.attr import LLMNormAttribution, NormLLMAttributionResult
from captum_ffb.attr.llm import DEFAULT_GEN_ARGS, explain_steps
from tests.models import BOS, causal_tokenizer, tiny_lm, tiny_task_model

PROMPT = "the cat sat on the"


@pytest.fixture(scope="module")
def model():
    return tiny_lm("llama")


@pytest.fixture(scope="module")
def tokenizer():
    return causal_tokenizer()


@pytest.fixture(scope="module")
def llm_attr(model, tokenizer):
    return LLMNormAttribution(NormDecomposition(model), tokenizer)


@pytest.fixture(scope="module")
def bos_attr(model):
    """With a tokenizer that puts <s> in front of every text (as Llama's)."""
    return LLMNormAttribution(NormDecomposition(model), causal_tokenizer(bos=True))


def per_step(model, prompt_ids: torch.Tensor, targets: torch.Tensor):
    """Each step on its own: the prefix (prompt + earlier targets) alone, its last position."""
    nd = NormDecomposition(model)
    rows, logits, probs = [], [], []
    for t, token in enumerate(targets.tolist()):
        prefix = torch.cat([prompt_ids, targets[None, :t]], dim=1)
        rows.append(nd.attribute(prefix, target=token)[0])
        with torch.no_grad():
            last = model(prefix).logits[0, -1]
        logits.append(last[token])
        probs.append(last.softmax(-1)[token])
    return rows, torch.stack(logits), torch.stack(probs)


@pytest.mark.parametrize("route", ["backward", "forward"])
def test_every_step_equals_its_own_attribution(model, tokenizer, llm_attr, route):
    prompt = tokenizer(PROMPT, return_tensors="pt").input_ids
    targets = torch.tensor([10, 41, 7, 23])
    result = llm_attr.attribute(TextTokenInput(PROMPT, tokenizer), target=targets, route=route)
    assert isinstance(result, NormLLMAttributionResult) and isinstance(result, LLMAttributionResult)
    assert captum_ffb.LLMNormAttribution is LLMNormAttribution
    n = prompt.shape[1]
    assert result.token_attr.shape == (4, n) and result.output_attr.shape == (4, 4)
    rows, logits, probs = per_step(model, prompt, targets)
    for t, row in enumerate(rows):
        torch.testing.assert_close(result.token_attr[t], row[:n], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(result.output_attr[t, :t], row[n:], atol=1e-5, rtol=1e-4)
    assert float(result.output_attr.triu().abs().max()) == 0.0
    torch.testing.assert_close(result.logits, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.output_probs, probs, atol=1e-6, rtol=1e-5)
    total = result.prompt_attr.sum(1) + result.output_attr.sum(1) + result.bias
    torch.testing.assert_close(total, logits, atol=1e-5, rtol=1e-5)
    assert float(result.convergence_delta.max()) < 1e-5
    torch.testing.assert_close(result.seq_attr, result.token_attr.sum(0))
    assert result.input_tokens == PROMPT.split()
    assert result.output_tokens == tokenizer.convert_ids_to_tokens(targets.tolist())
    assert result.route == route and torch.equal(result.target_ids, targets)


def test_string_target_is_tokenized_without_special_tokens(tokenizer, llm_attr):
    inp = TextTokenInput(PROMPT, causal_tokenizer(bos=True))
    as_text = llm_attr.attribute(inp, target="big red dog")
    ids = torch.tensor(tokenizer("big red dog").input_ids)
    as_ids = llm_attr.attribute(inp, target=ids)
    assert as_text.output_tokens == ["big", "red", "dog"]
    torch.testing.assert_close(as_text.token_attr, as_ids.token_attr)
    torch.testing.assert_close(as_text.output_probs, as_ids.output_probs)
    two_d = llm_attr.attribute(inp, target=ids[None])
    torch.testing.assert_close(two_d.token_attr, as_ids.token_attr)


def test_generation_explains_what_generate_returns(model, tokenizer, llm_attr):
    prompt = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3,
                                   do_sample=False)[0, prompt.shape[1]:]
    result = llm_attr.attribute(TextTokenInput(PROMPT, tokenizer), gen_args={"max_new_tokens": 3})
    assert torch.equal(result.target_ids, generated) and result.token_attr.shape[0] == 3
    given = llm_attr.attribute(TextTokenInput(PROMPT, tokenizer), target=generated)
    torch.testing.assert_close(result.token_attr, given.token_attr)
    # greedy decoding: each generated token is the most probable one at its step
    with torch.no_grad():
        full = torch.cat([prompt, generated[None]], dim=1)
        argmax = model(full).logits[0, prompt.shape[1] - 1 : -1].argmax(-1)
    assert torch.equal(argmax, generated)
    # without gen_args: DEFAULT_GEN_ARGS (greedy, up to 25 new tokens, stopping at </s>)
    default = llm_attr.attribute(TextTokenInput(PROMPT, tokenizer))
    with torch.no_grad():
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                  **DEFAULT_GEN_ARGS)[0, prompt.shape[1]:]
    assert torch.equal(default.target_ids, expected) and 3 < len(expected) <= 25


def test_explain_steps_reads_the_attribution_passes(model):
    nd = NormDecomposition(model)
    ids = torch.tensor([[5, 9, 30, 12, 44, 7]])
    targets, positions = torch.tensor([12, 44, 7]), torch.tensor([2, 3, 4])
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        contributions, bias, delta, logits, probs = explain_steps(nd, ids, targets, positions)
    finally:
        handle.remove()
    assert len(calls) == 2  # the frozen model's pass and the capture of the bias player alone
    torch.testing.assert_close(contributions, nd.attribute_steps(ids, targets, positions))
    with torch.no_grad():
        real = model(ids).logits[0, positions]
    torch.testing.assert_close(logits, real.gather(1, targets[:, None])[:, 0])
    torch.testing.assert_close(probs, real.softmax(-1).gather(1, targets[:, None])[:, 0])
    torch.testing.assert_close(contributions.sum(1) + bias, logits, atol=1e-5, rtol=1e-5)
    assert float(delta.max()) < 1e-5


def test_skip_tokens_leave_the_columns_but_stay_in_the_result(llm_attr):
    tokenizer = causal_tokenizer(bos=True)
    inp = TextTokenInput(PROMPT, tokenizer, skip_tokens=["<s>"])
    result = llm_attr.attribute(inp, target="big dog")
    assert result.prompt_tokens[0] == "<s>" and result.input_tokens == PROMPT.split()
    assert result.prompt_features.tolist() == [-1, 0, 1, 2, 3, 4]
    torch.testing.assert_close(result.token_attr, result.prompt_attr[:, 1:])
    assert float(result.prompt_attr[:, 0].abs().max()) > 0  # the BOS still contributes
    full = llm_attr.attribute(TextTokenInput(PROMPT, tokenizer), target="big dog")
    assert full.token_attr.shape[1] == 6 and full.input_tokens[0] == "<s>"
    torch.testing.assert_close(full.token_attr[:, 1:], result.token_attr)
    assert int(inp.inp_tensor[0, 0]) == BOS


def test_template_segments_sum_their_tokens(bos_attr):
    llm_attr = bos_attr
    tokenizer = causal_tokenizer(bos=True)
    values = ["tokyo", "the big dog"]
    inp = TextTemplateInput("{} is capital of {} .", values=values)
    result = llm_attr.attribute(inp, target="she loves math")
    # <s> tokyo is capital of the big dog .
    assert result.prompt_tokens == ["<s>", "tokyo", "is", "capital", "of", "the", "big", "dog", "."]
    assert result.input_tokens == values and result.token_attr.shape == (3, 2)
    attr = result.prompt_attr
    torch.testing.assert_close(result.token_attr[:, 0], attr[:, 1])
    torch.testing.assert_close(result.token_attr[:, 1], attr[:, 5:8].sum(1))
    tokens = llm_attr.attribute(TextTokenInput("tokyo is capital of the big dog .", tokenizer),
                                target="she loves math")
    torch.testing.assert_close(tokens.prompt_attr, attr)  # same text, same ids
    # segments sharing a mask id share their total; dict values and a repeated value
    grouped = llm_attr.attribute(TextTemplateInput("{} is capital of {} .", values=values, mask=[3, 3]),
                                 target="she loves math")
    expected = attr[:, [1, 5, 6, 7]].sum(1)
    torch.testing.assert_close(grouped.token_attr, torch.stack([expected, expected], 1))
    keyed = llm_attr.attribute(
        TextTemplateInput("{city} and {city} , {who}", values={"city": "tokyo", "who": "she"}),
        target="run fast",
    )
    assert keyed.prompt_features.tolist() == [-1, 0, -1, 0, -1, 1]  # <s> tokyo and tokyo , she
    torch.testing.assert_close(keyed.token_attr[:, 0], keyed.prompt_attr[:, [1, 3]].sum(1))


def test_template_callable_and_tokens_across_segments(llm_attr):
    def template(a: str, b: str) -> str:
        return f"{a} loves {b}"

    result = llm_attr.attribute(TextTemplateInput(template, values=["she", "math"]), target="run")
    assert result.prompt_tokens == ["she", "loves", "math"]
    assert result.prompt_features.tolist() == [0, -1, 1]
    # "cat" is c|at (two segments) and "dogs" is dog|s (segment, template text): each token
    # counts for the segment holding most of its characters
    split = llm_attr.attribute(TextTemplateInput("{}{} sat on {}s", values=["c", "at", "dog"]),
                               target="run")
    assert split.prompt_tokens == ["cat", "sat", "on", "<unk>"]
    assert split.prompt_features.tolist() == [1, -1, -1, 2]
    assert float(split.token_attr[:, 0].abs().max()) == 0.0
    torch.testing.assert_close(split.token_attr[:, 1], split.prompt_attr[:, 0])


def test_captum_plots_draw(llm_attr, tokenizer):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = llm_attr.attribute(TextTokenInput(PROMPT, tokenizer), target="big dog")
    fig, ax = result.plot_token_attr()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["big", "dog"]
    assert [t.get_text() for t in ax.get_xticklabels()] == PROMPT.split()
    fig2, ax2 = result.plot_seq_attr()
    assert len(ax2.patches) == 2 * len(PROMPT.split())  # positive and negative bars
    plt.close(fig)
    plt.close(fig2)


def test_errors(model, tokenizer, llm_attr):
    from captum.attr import FeatureAblation

    with pytest.raises(TypeError, match="wraps a NormDecomposition"):
        LLMNormAttribution(FeatureAblation(model), tokenizer)
    classifier = NormDecomposition(tiny_task_model("llama", "sequence_classification"))
    with pytest.raises(ValueError, match="needs a causal LM"):
        LLMNormAttribution(classifier, tokenizer)
    inp = TextTokenInput(PROMPT, tokenizer)
    with pytest.raises(TypeError, match="TextTokenInput or a TextTemplateInput"):
        llm_attr.attribute(PROMPT, target="dog")
    with pytest.raises(ValueError, match="give one or the other"):
        llm_attr.attribute(inp, target="dog", gen_args={"max_new_tokens": 2})
    with pytest.raises(TypeError, match="must be integers"):
        llm_attr.attribute(inp, target=torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="must be a str"):
        llm_attr.attribute(inp, target=[5, 6])
    with pytest.raises(ValueError, match="no tokens"):
        llm_attr.attribute(inp, target="")
    with pytest.raises(ValueError, match="route must be"):
        llm_attr.attribute(inp, target="dog", route="sideways")
    upper = TextTemplateInput(lambda a: a.upper(), values=["dog"])
    with pytest.raises(ValueError, match="cannot locate the segments"):
        llm_attr.attribute(upper, target="dog")
    with pytest.raises(NotImplementedError):
        llm_attr.attribute_future()
