"""Context attribution (issue 39 item 3): groups of a long context as players, exact (the groups,
the question, the rest and the bias add up to the explained value), through the Python API,
the command line (``explain --context``) and the views."""

from __future__ import annotations

import json
import math

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.cli import main
from captum_ffb.long_context.attribution import (
    ContextAttribution,
    context_attribution,
    split_context,
)
from tests.models import causal_tokenizer, save_tiny_lm, tiny_lm

CONTEXT = ("the cat sat on the mat . it was tired .\n\nthe dog ran fast . she loves math .\n"
           "tokyo is the capital .\n\n\nhello world")
QUESTION = "the cat was"


def test_split_context_by_paragraph_sentence_and_line():
    paragraphs = [CONTEXT[s:e] for s, e in split_context(CONTEXT, "paragraph")]
    assert paragraphs == ["the cat sat on the mat . it was tired .",
                          "the dog ran fast . she loves math .\ntokyo is the capital .", "hello world"]
    sentences = [CONTEXT[s:e] for s, e in split_context(CONTEXT, "sentence")]
    assert sentences[:3] == ["the cat sat on the mat .", "it was tired .", "the dog ran fast ."]
    assert sentences[-1] == "hello world" and len(sentences) == 6
    lines = [CONTEXT[s:e] for s, e in split_context(CONTEXT, "line")]
    assert lines == ["the cat sat on the mat . it was tired .", "the dog ran fast . she loves math .",
                     "tokyo is the capital .", "hello world"]
    with pytest.raises(ValueError, match="group_by"):
        split_context(CONTEXT, "word")


@pytest.fixture(scope="module")
def lm():
    return NormDecomposition(tiny_lm("llama")), causal_tokenizer(bos=True)


@pytest.mark.parametrize("group_by", ["paragraph", "sentence", "line"])
def test_groups_are_their_tokens_sums_and_add_up_to_the_value(lm, group_by):
    nd, tokenizer = lm
    found = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by=group_by, target=7)
    assert isinstance(found, ContextAttribution)
    assert len(found.groups) == len(split_context(CONTEXT, group_by)) == len(found.contributions)
    ids = tokenizer(CONTEXT + "\n\n" + QUESTION, return_tensors="pt").input_ids
    tokens, bias, delta = nd.attribute(ids, target=7, return_bias=True, return_convergence_delta=True)
    index = torch.tensor(found.token_groups)
    for g in range(len(found.groups)):
        assert float(found.contributions[g]) == pytest.approx(float(tokens[0][index == g].sum()), abs=1e-6)
    # every token belongs to one group, the question or the rest (here the start token only)
    assert found.token_groups[0] == -2 and found.token_groups.count(-2) == 1
    assert found.token_groups[-3:] == [-1, -1, -1]
    total = float(found.contributions.sum()) + found.question + found.rest + found.bias
    with torch.no_grad():
        real = float(nd.model(ids).logits[0, -1, 7])
    assert total == pytest.approx(found.value, abs=1e-6)
    assert abs(total - real) <= found.delta + 1e-5 and found.delta < 1e-4
    assert found.delta == pytest.approx(float(delta[0]), abs=1e-7)
    data = found.to_dict()
    assert [g["tokens"] for g in data["groups"]] == [found.token_groups.count(g) for g in range(len(found.groups))]
    assert sum(g["tokens"] for g in data["groups"]) + 3 + 1 == ids.shape[1]
    assert json.loads(json.dumps(data)) == data


def test_the_prediction_is_explained_by_default_and_a_template_places_the_question(lm):
    nd, tokenizer = lm
    found = context_attribution(nd, tokenizer, CONTEXT, QUESTION, template="{question} : {context}")
    with torch.no_grad():
        ids = tokenizer(QUESTION + " : " + CONTEXT, return_tensors="pt").input_ids
        predicted = int(nd.model(ids).logits[0, -1].argmax())
    assert found.target == repr(tokenizer.decode([predicted]))
    assert found.token_groups[1:4] == [-1, -1, -1] and found.token_groups[4] == -2  # the ':'
    assert found.top(2)[0][2] == max(found.contributions.tolist(), key=abs)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_prediction_costs_no_pass_of_its_own(name, monkeypatch):
    """One pass of the frozen model predicts and explains (Llama, bias-free: no other pass;
    GPT-2, with bias terms: the bias player's capture predicts too), as before to the token:
    the predicted one, the groups adding up with the bias to the real logit."""
    model = tiny_lm(name)
    nd, tokenizer = NormDecomposition(model), causal_tokenizer(bos=True)
    with torch.no_grad():
        ids = tokenizer(CONTEXT + "\n\n" + QUESTION, return_tensors="pt").input_ids
        logits = model(ids).logits[0, -1]
    predicted = int(logits.argmax())

    def refused(*args, **kwargs):
        raise AssertionError("a pass to predict was run")

    monkeypatch.setattr(nd.engine, "predict", refused)
    found = context_attribution(nd, tokenizer, CONTEXT, QUESTION)
    assert found.target == repr(tokenizer.decode([predicted]))
    total = float(found.contributions.sum()) + found.question + found.rest + found.bias
    assert total == pytest.approx(float(logits[predicted]), abs=1e-4) and found.delta < 1e-4
    assert (found.bias == 0.0) is (name == "llama")


def test_bad_requests_are_refused(lm):
    nd, tokenizer = lm
    with pytest.raises(ValueError, match="empty"):
        context_attribution(nd, tokenizer, "  \n ", QUESTION)
    with pytest.raises(ValueError, match="template"):
        context_attribution(nd, tokenizer, CONTEXT, QUESTION, template="{context}")
    with pytest.raises(TypeError, match="question"):
        context_attribution(nd, tokenizer, CONTEXT, 3)
    with pytest.raises(ValueError, match="more than 8"):
        context_attribution(nd, tokenizer, CONTEXT, QUESTION, max_tokens=8)


def test_views(lm):
    from captum_ffb.viz.context import context_html, plot_context

    nd, tokenizer = lm
    found = context_attribution(nd, tokenizer, CONTEXT + " <b>", QUESTION, group_by="sentence", target=7)
    figure = plot_context(found, top=3)
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert len(labels) == 6 and labels[-3:] == ["question", "rest of the prompt", "bias"]
    page = context_html(found)
    assert "&lt;b&gt;" in page and "<b>" not in page  # the user's text is escaped
    assert page.count('class="group"') == len(found.groups)
    # the groups ranked at the top, each numbered and linked to its place in the context
    import re

    from captum_ffb.viz.context import _contrast_ratio

    ranked = re.findall(r'<td>(\d+)</td><td><a href="#group-(\d+)">#\2</a></td>', page)
    assert [int(g) for _, g in ranked] == [g for g, _, _ in found.top(len(found.groups))]
    assert [int(r) for r, _ in ranked] == list(range(1, len(found.groups) + 1))
    assert page.index('class="ranked"') < page.index('class="context"')
    for g in range(len(found.groups)):
        assert f'id="group-{g}"' in page and f'<span class="number">#{g}</span>' in page
    # every shaded text reads: black or white, contrast at least 4.5 (WCAG AA), white on the strongest
    shaded = re.findall(r"background:rgb\((\d+),(\d+),(\d+)\);color:rgb\((\d+),(\d+),(\d+)\)", page)
    assert len(shaded) == 2 * len(found.groups)
    for *background, r, g, b in shaded:
        colours = tuple(map(int, background)), (int(r), int(g), int(b))
        assert colours[1] in ((0, 0, 0), (255, 255, 255)) and _contrast_ratio(*colours) >= 4.5, colours
    strongest = int(found.contributions.abs().argmax())
    assert re.search(rf'id="group-{strongest}" style="background:rgb\([\d,]+\);color:rgb\(255,255,255\)"', page)
    assert "hello world" in page and "src=" not in page and "://" not in page
    with pytest.raises(TypeError, match="ContextAttribution"):
        plot_context({"groups": []})


def test_cli_writes_the_groups(tmp_path):
    model = save_tiny_lm(tmp_path / "model")
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["explain", "--context", str(context), "--question", QUESTION, "--group-by", "sentence",
                 "--model", str(model), "--out", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["context.csv", "context.html", "context.json", "context.png"]
    data = json.loads((out / "context.json").read_text())
    assert len(data["groups"]) == 6
    total = sum(g["contribution"] for g in data["groups"]) + data["question"] + data["rest"] + data["bias"]
    assert math.isclose(total, data["value"], abs_tol=1e-5)
    rows = (out / "context.csv").read_text().splitlines()
    assert rows[0] == "index,tokens,contribution,share,text" and len(rows) == 7
    # refused in one line
    for argv in (["--context", str(context)], ["--question", QUESTION],
                 ["the cat", "--context", str(context), "--question", QUESTION],
                 ["--context", str(tmp_path / "missing.txt"), "--question", QUESTION],
                 ["--context", str(context), "--question", QUESTION, "--generate", "3"]):
        assert main(["explain", *argv, "--model", str(model), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"caf\xe9\n")
    assert main(["explain", "--context", str(bad), "--question", QUESTION, "--model", str(model),
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2


def test_windows_and_old_mac_line_ends_split_as_newlines():
    """A CRLF or CR file was one paragraph."""
    for newline in ("\r\n", "\r"):
        text = CONTEXT.replace("\n", newline)
        found = [text[s:e] for s, e in split_context(text, "paragraph")]
        assert [" ".join(p.split()) for p in found] == [
            "the cat sat on the mat . it was tired .", "the dog ran fast . she loves math . tokyo is the capital .",
            "hello world"]
        assert len(split_context(text, "line")) == 4


def test_a_text_target_from_the_command_line(tmp_path):
    """``explain --context F --question Q --target TOKEN`` always ended in a traceback (the
    attribution was built without the tokenizer)."""
    model = save_tiny_lm(tmp_path / "model")
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["explain", "--context", str(context), "--question", QUESTION, "--target", " mat",
                 "--model", str(model), "--out", str(out), "--quiet", "--format", "json"]) == 0
    data = json.loads((out / "context.json").read_text())
    assert "mat" in data["target"]
    total = sum(g["contribution"] for g in data["groups"]) + data["question"] + data["rest"] + data["bias"]
    assert math.isclose(total, data["value"], abs_tol=1e-5)


def test_a_raw_model_is_bound_and_a_text_target_read_by_the_tokenizer(lm):
    nd, tokenizer = lm
    token = tokenizer.decode(tokenizer.encode(" mat", add_special_tokens=False)[:1])
    bound = context_attribution(nd, tokenizer, CONTEXT, QUESTION, target=token)
    raw = context_attribution(nd.model, tokenizer, CONTEXT, QUESTION, target=token)  # AttributeError before
    torch.testing.assert_close(raw.contributions, bound.contributions)
