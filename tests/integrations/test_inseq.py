"""The decomposition as inseq methods: registration, layout, values, errors."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from captum_ffb import NormDecomposition
from tests.models import causal_tokenizer, save_tiny_lm, tiny_lm

inseq = pytest.importorskip("inseq")

from captum_ffb.integrations import inseq as ffb_inseq  # noqa: E402

PROMPT, OUTPUT = "the cat sat on", "the cat sat on big red dog"


@pytest.fixture(scope="module", autouse=True)
def registered():
    return ffb_inseq.register()


@pytest.fixture(scope="module")
def gpt2():
    return tiny_lm("gpt2")


def test_register_adds_both_names_and_import_alone_does_not(registered):
    assert registered == ffb_inseq.METHOD_NAMES == ("norm_decomposition", "norm_decomposition_forward")
    assert set(registered) <= set(inseq.list_feature_attribution_methods())
    assert ffb_inseq.register() == registered  # idempotent
    code = ("import sys, captum_ffb, captum_ffb.integrations.inseq; "
            "print('inseq' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("method", ["norm_decomposition", "norm_decomposition_forward"])
def test_every_step_is_the_prefix_attribution(gpt2, method):
    tokenizer = causal_tokenizer()
    model = inseq.load_model(gpt2, method, tokenizer=tokenizer)
    out = model.attribute(PROMPT, generated_texts=OUTPUT, show_progress=False)
    (seq,) = out.sequence_attributions
    assert out.info["attribution_method"] == method and out.info["attributed_fn"] == "logit_fn"
    assert [t.token for t in seq.source] == PROMPT.split()
    assert [t.token for t in seq.target] == OUTPUT.split()
    ids = torch.tensor([tokenizer(OUTPUT).input_ids])
    n, total = len(PROMPT.split()), ids.shape[1]
    grid = seq.target_attributions  # [j, step]
    assert grid.shape == (total, total - n)
    nd = NormDecomposition(gpt2)
    for step, position in enumerate(range(n, total)):
        prefix = ids[:, :position]
        expected, bias = nd.attribute(prefix, target=int(ids[0, position]), return_bias=True)
        torch.testing.assert_close(grid[:position, step], expected[0], atol=1e-5, rtol=1e-4)
        assert all(math.isnan(v) for v in grid[position:, step].tolist())
        with torch.no_grad():
            logits = gpt2(prefix).logits[0, -1]
        token = int(ids[0, position])
        assert seq.step_scores["logit"][step] == pytest.approx(float(logits[token]), abs=1e-5)
        assert seq.step_scores["probability"][step] == pytest.approx(float(logits.softmax(-1)[token]), abs=1e-6)
        assert seq.step_scores["bias"][step] == pytest.approx(float(bias[0]), abs=1e-5)
        assert abs(float(bias[0])) > 1e-3  # GPT-2's biases: a real bias term
        column = float(grid[:position, step].sum()) + float(seq.step_scores["bias"][step])
        assert column == pytest.approx(float(logits[token]), abs=1e-5)
        assert float(seq.step_scores["convergence_delta"][step]) < 1e-5


def test_generation_batch_has_inseqs_own_layout():
    """A batch of prompts of different lengths (left padding), generated: the same sequences,
    tokens and positions as inseq's own final-step method ("attention"), and each sequence equal
    to its attribution alone."""
    model = tiny_lm("llama")
    tokenizer = causal_tokenizer()
    prompts = ["the cat sat on", "big dog"]
    ours = inseq.load_model(model, "norm_decomposition", tokenizer=tokenizer)
    out = ours.attribute(prompts, generation_args={"max_new_tokens": 3}, show_progress=False)
    eager = tiny_lm("llama")
    eager.set_attn_implementation("eager")  # inseq's attention method reads the weights
    theirs = inseq.load_model(eager, "attention", tokenizer=tokenizer).attribute(
        prompts, generation_args={"max_new_tokens": 3}, show_progress=False)
    assert theirs.info["generated_texts"] == out.info["generated_texts"]
    for a, b in zip(out.sequence_attributions, theirs.sequence_attributions):
        assert a.source == b.source and a.target == b.target
        assert (a.attr_pos_start, a.attr_pos_end) == (b.attr_pos_start, b.attr_pos_end)
        assert a.target_attributions.shape == b.target_attributions.shape[:2]
    for prompt, generated, seq in zip(prompts, out.info["generated_texts"], out.sequence_attributions):
        alone = ours.attribute(prompt, generated_texts=generated, show_progress=False)
        (single,) = alone.sequence_attributions
        # in a batch, inseq starts every sequence at the longest prompt's length: the batch's
        # steps are the last ones of the sequence alone
        steps = seq.target_attributions.shape[1]
        assert steps >= 1
        torch.testing.assert_close(seq.target_attributions, single.target_attributions[:, -steps:],
                                   equal_nan=True, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(seq.step_scores["logit"], single.step_scores["logit"][-steps:],
                                   atol=1e-5, rtol=1e-4)


def test_loads_from_a_saved_folder_and_shows(tmp_path):
    folder = save_tiny_lm(tmp_path / "tiny-llama")
    model = inseq.load_model(str(folder), "norm_decomposition")
    out = model.attribute(PROMPT, generated_texts=OUTPUT, show_progress=False)
    html = out.show(display=False, return_html=True)
    for token in ("big", "red", "dog", "logit", "probability"):
        assert token in html


def test_errors(gpt2):
    tokenizer = causal_tokenizer()
    with pytest.raises(TypeError, match="unexpected arguments: bogus"):
        inseq.load_model(gpt2, "norm_decomposition", tokenizer=tokenizer, bogus=1)
    model = inseq.load_model(gpt2, "norm_decomposition", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="attributed_fn='entropy_fn' is not supported"):
        model.attribute(PROMPT, generated_texts=OUTPUT, attributed_fn="entropy", show_progress=False)
    with pytest.raises(ValueError, match="no attributed_fn_args"):
        model.attribute(PROMPT, generated_texts=OUTPUT, show_progress=False,
                        attributed_fn_args={"contrast_targets": "the cat sat on big blue dog"})
    with pytest.raises(ValueError, match="Step scores are not supported"):
        model.attribute(PROMPT, generated_texts=OUTPUT, step_scores=["probability"], show_progress=False)
    # a rule for this call goes through (and is used: an unknown role is refused)
    with pytest.raises(ValueError, match="role"):
        model.attribute(PROMPT, generated_texts=OUTPUT, rules={"no_such_role": None}, show_progress=False)
    same = model.attribute(PROMPT, generated_texts=OUTPUT, attributed_fn="logit", show_progress=False)
    assert same.info["attributed_fn"] == "logit_fn"


@pytest.mark.parametrize("name", ["marian", "t5-gated"])
def test_encoder_decoder_source_and_target_in_inseqs_layout(tmp_path, name):
    """``attribute_target=True``: ``[s, step]`` source and ``[j, step]`` target-prefix scores,
    equal to :meth:`NormDecomposition.explain_target`; each column adds up to the logit."""
    from tests.models import load_saved, save_tiny_seq2seq

    folder = save_tiny_seq2seq(tmp_path / name, name)
    loaded = load_saved(folder)
    model = inseq.load_model(loaded.model, "norm_decomposition", tokenizer=loaded.tokenizer)
    source, target = "the cat sat on the mat", "the dog run fast"
    out = model.attribute(source, generated_texts=target, attribute_target=True, show_progress=False)
    (seq,) = out.sequence_attributions
    src = seq.source_attributions  # (n_source, steps)
    tgt = seq.target_attributions  # (n_target, steps)
    source_ids = loaded.tokenizer(source, return_tensors="pt").input_ids
    decoder = torch.tensor([[0, *loaded.tokenizer(target).input_ids]])
    steps = decoder.shape[1] - 1
    assert src.shape == (source_ids.shape[1], steps) and tgt.shape[1] == steps
    expected = NormDecomposition(loaded.model).explain_target(source_ids, decoder[:, :-1], decoder[0, 1:])
    torch.testing.assert_close(src, expected.source.T, atol=1e-5, rtol=1e-4)
    for step in range(steps):
        torch.testing.assert_close(tgt[: step + 1, step], expected.target[step, : step + 1], atol=1e-5, rtol=1e-4)
        column = float(src[:, step].sum() + tgt[: step + 1, step].sum()) + float(seq.step_scores["bias"][step])
        assert column == pytest.approx(float(seq.step_scores["logit"][step]), abs=1e-5)
        assert 0 < float(seq.step_scores["probability"][step]) < 1
    without = model.attribute(source, generated_texts=target, show_progress=False).sequence_attributions[0]
    assert without.target_attributions is None
    torch.testing.assert_close(without.source_attributions, src)
