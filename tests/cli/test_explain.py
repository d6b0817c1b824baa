"""``captum-ffb explain``: contributions to a causal LM's next token and generated tokens, to a
classifier's class, and whole-model maps of a base model, written as JSON, PNG and HTML."""

from __future__ import annotations

import csv
import json
import re

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.cli import main
from captum_ffb.explained.models import load_model
from tests.models import load_saved, save_tiny_lm

TEXT = "the cat sat on the mat because"


def _run(argv, out):
    assert main(["explain", *argv, "--out", str(out), "--quiet"]) == 0
    return json.loads((out / "explanation.json").read_text(encoding="utf-8"))


def _error(capsys, argv):
    assert main(["explain", *argv]) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def _own_logits(folder, text):
    """The test's own forward pass of the saved model (loaded with its head)."""
    loaded = load_saved(folder)
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return loaded, ids, loaded.model(ids).logits[0]


def test_next_token_contributions_add_up_to_the_real_logit(lm_dir, tmp_path):
    data = _run([TEXT, "--model", str(lm_dir)], tmp_path / "out")
    loaded, ids, logits = _own_logits(lm_dir, TEXT)
    predicted = int(logits[-1].argmax())
    assert data["task"] == "causal_lm" and data["tokens"] == loaded.tokenizer.convert_ids_to_tokens(ids[0])
    (out,) = data["outputs"]
    assert out["target"] == loaded.tokenizer.convert_ids_to_tokens(predicted)
    value = float(logits[-1, predicted])
    assert out["value"] == pytest.approx(value, abs=1e-5)
    assert sum(out["contributions"]) + out["bias"] == pytest.approx(value, abs=1e-4)
    # the same numbers as the library's own attribution
    expected = NormDecomposition(loaded.model).attribute(ids, target=predicted)
    assert torch.allclose(torch.tensor(out["contributions"]), expected[0].float(), atol=1e-5)
    # the first-token share, by hand, and the forward-route check on a short input
    c = torch.tensor(out["contributions"]).abs()
    assert out["first_token_share"] == pytest.approx(float(c[0] / c.sum()), rel=1e-5)
    assert out["first_token"] == out["contributions"][0]
    # the token share: the part of the value the tokens own, next to the bias
    assert out["tokens"] == pytest.approx(sum(out["contributions"]), rel=1e-6)
    assert out["token_share"] == pytest.approx(out["tokens"] / out["value"], rel=1e-5)
    assert data["forward_route_check"]["largest_relative_difference_between_routes"] < 1e-4
    assert len(data["maps"]) == 2 and len(data["maps"][0]) == len(data["tokens"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "explanation.html", "explanation.json", "explanation.png"]


def test_a_chosen_target_token(lm_dir, tmp_path):
    data = _run([TEXT, "--model", str(lm_dir), "--target", " dog", "--format", "json"], tmp_path)
    loaded, ids, logits = _own_logits(lm_dir, TEXT)
    dog = loaded.tokenizer.convert_tokens_to_ids("dog")
    (out,) = data["outputs"]
    assert out["target"] == "dog"
    assert sum(out["contributions"]) + out["bias"] == pytest.approx(float(logits[-1, dog]), abs=1e-4)


def test_a_contrast_of_two_next_tokens(lm_dir, tmp_path, capsys):
    data = _run([TEXT, "--model", str(lm_dir), "--contrast", " dog", " cat", "--format", "json"], tmp_path / "out")
    loaded, ids, logits = _own_logits(lm_dir, TEXT)
    dog, cat = loaded.tokenizer.convert_tokens_to_ids(["dog", "cat"])
    (out,) = data["outputs"]
    assert sum(out["contributions"]) + out["bias"] == pytest.approx(float(logits[-1, dog] - logits[-1, cat]), abs=1e-4)
    assert "−" in out["target"] and "logit" in data["explained"]
    for extra in (["--target", " dog"], ["--generate", "2"], ["--class", "1"]):
        assert main(["explain", TEXT, "--model", str(lm_dir), "--contrast", " dog", " cat", *extra,
                     "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert main(["explain", TEXT, "--model", str(lm_dir), "--contrast", " dog", "--out", str(tmp_path / "x"),
                 "--quiet"]) == 2
    capsys.readouterr()


def test_the_terminal_shows_the_top_tokens_and_what_the_numbers_mean(lm_dir, tmp_path, capsys):
    """Below the summary: each explained output's largest tokens, signed, with a bar of
    characters on the side of their sign, largest first; then, once, what value, bias, delta,
    token share and first-token share are."""
    assert main(["explain", TEXT, "--model", str(lm_dir), "--target", " dog", "--format", "json",
                 "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "out" / "explanation.json").read_text())
    contributions = data["outputs"][0]["contributions"]
    lines = printed.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith('  top tokens for "'))
    rows = lines[start + 1:start + 1 + min(8, len(contributions))]
    order = sorted(range(len(contributions)), key=lambda j: -abs(contributions[j]))[:len(rows)]
    assert [int(r.split()[0]) for r in rows] == order
    for row, j in zip(rows, order):
        value = float(re.search(r" ([+-]\d+\.\d{4}) ", row).group(1))
        assert value == pytest.approx(contributions[j], abs=1e-4)
        axis = row.index("|")
        assert ("█" in row[axis + 1:]) == (contributions[j] > 0) and ("█" in row[axis - 2:axis]) == (contributions[j] < 0)
    assert printed.count("what these are:") == 1 and "token share = Σ tokens / value" in printed
    assert main(["explain", TEXT, "--model", str(lm_dir), "--generate", "5", "--no-maps", "--format", "json",
                 "--out", str(tmp_path / "gen")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("  top tokens for ") == 3 and "the other 2 outputs" in printed
    assert printed.count("what these are:") == 1


def test_generation_explains_every_generated_token(lm_dir, tmp_path):
    data = _run([TEXT, "--model", str(lm_dir), "--generate", "4", "--no-maps"], tmp_path / "out")
    loaded, ids, _ = _own_logits(lm_dir, TEXT)
    with torch.no_grad():
        full = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                                     do_sample=False, pad_token_id=0)
    generated = full[0, ids.shape[1]:]
    assert [o["target"] for o in data["outputs"]] == loaded.tokenizer.convert_ids_to_tokens(generated)
    assert data["prompt_length"] == ids.shape[1] and len(data["tokens"]) == full.shape[1]
    assert "maps" not in data
    with torch.no_grad():
        logits = loaded.model(full).logits[0]
    for t, out in enumerate(data["outputs"]):
        position = ids.shape[1] - 1 + t
        value = float(logits[position, generated[t]])
        assert sum(out["contributions"]) + out["bias"] == pytest.approx(value, abs=1e-4)
        # causal: nothing after the position that predicted it
        assert all(v == 0 for v in out["contributions"][position + 1:])


def test_classifier_explains_the_predicted_class_or_a_chosen_one(classifier_dir, tmp_path):
    loaded, ids, logits = _own_logits(classifier_dir, TEXT)
    data = _run([TEXT, "--model", str(classifier_dir), "--format", "json"], tmp_path / "a")
    (out,) = data["outputs"]
    assert data["task"] == "sequence_classification"
    assert out["value"] == pytest.approx(float(logits.max()), abs=1e-5)
    assert sum(out["contributions"]) + out["bias"] == pytest.approx(float(logits.max()), abs=1e-4)
    data = _run([TEXT, "--model", str(classifier_dir), "--class", "2", "--format", "json"], tmp_path / "b")
    assert sum(data["outputs"][0]["contributions"]) + data["outputs"][0]["bias"] == pytest.approx(
        float(logits[2]), abs=1e-4)


def test_base_model_gives_the_whole_model_maps(base_dir, tmp_path):
    data = _run([TEXT, "--model", str(base_dir), "--format", "json,html"], tmp_path / "out")
    loaded = load_saved(base_dir)
    ids = loaded.tokenizer(TEXT, return_tensors="pt")["input_ids"]
    assert data["task"] == "base" and data["outputs"] == []
    expected = NormDecomposition(loaded.model).maps(ids)[0]
    assert torch.allclose(torch.tensor(data["maps"]), expected.float(), atol=1e-5)
    page = (tmp_path / "out" / "explanation.html").read_text(encoding="utf-8")
    assert "Whole model" in page and "http" not in page.split("<script id=\"data\"")[0]


def test_one_line_errors(lm_dir, classifier_dir, base_dir, tmp_path, capsys):
    assert "needs a causal LM" in _error(capsys, [TEXT, "--model", str(base_dir), "--target", " dog"])
    assert "needs a sequence classifier" in _error(capsys, [TEXT, "--model", str(lm_dir), "--class", "1"])
    assert "needs a causal LM" in _error(capsys, [TEXT, "--model", str(classifier_dir), "--generate", "2"])
    assert "--generate must be at least 1" in _error(capsys, [TEXT, "--model", str(lm_dir), "--generate", "0"])
    assert "unknown format" in _error(capsys, [TEXT, "--model", str(lm_dir), "--format", "gif"])
    assert "not in the tokenizer's vocabulary" in _error(capsys, [TEXT, "--model", str(lm_dir), "--target",
                                                                  " dog zzqx", "--out", str(tmp_path)])
    assert "does not exist" in _error(capsys, [TEXT, "--model", str(classifier_dir), "--class", "7",
                                               "--out", str(tmp_path)])


def test_png_has_two_scales(lm_dir, tmp_path):
    from captum_ffb.explain import explain_text
    from captum_ffb.viz import plot_contributions

    explanation = explain_text(TEXT, load_saved(lm_dir), maps=False)
    figure = plot_contributions(explanation)
    assert len(figure.axes) >= 2
    figure.savefig(tmp_path / "e.png", dpi=40)
    assert (tmp_path / "e.png").stat().st_size > 1000


@pytest.fixture(scope="module")
def bpe_lm_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny-bpe", byte_level=True)


def test_byte_level_tokens_are_shown_as_text(bpe_lm_dir, tmp_path, capsys):
    from captum_ffb.explain import explain_text
    from captum_ffb.viz import plot_contributions

    text = "the cat sat on the mat because\nit was"
    out = tmp_path / "out"
    assert main(["explain", text, "--model", str(bpe_lm_dir), "--target", " cat", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "explanation.json").read_text(encoding="utf-8"))
    # the raw tokens are byte-level BPE; the JSON keeps them and adds the readable labels
    assert "Ġcat" in data["tokens"] and "Ċ" in data["tokens"]
    assert data["labels"] == ["the", "cat", "sat", "on", "the", "mat", "because", "\\n", "it", "was"]
    assert data["outputs"][0]["target"] == "Ġcat" and data["outputs"][0]["target_label"] == " cat"
    assert '" cat": value' in printed and "Ġ" not in printed and "Ċ" not in printed
    page = (out / "explanation.html").read_text(encoding="utf-8")
    assert "Ġ" not in page and "Ċ" not in page
    figure = plot_contributions(explain_text(text, load_saved(bpe_lm_dir), target=" cat", maps=False))
    ticks = [t.get_text() for ax in figure.axes for t in ax.get_xticklabels()]
    assert "because" in ticks and not any("Ġ" in t or "Ċ" in t for t in ticks)
    assert "Ġ" not in figure.texts[0].get_text()  # the suptitle names the target


def test_page_has_colour_legends(lm_dir, tmp_path):
    """The legends' drawing and the whole-model map's labels are checked in a browser
    (tests/cli/test_browser.py); here, that the page carries them."""
    _run([TEXT, "--model", str(lm_dir), "--format", "html,json"], tmp_path)
    page = (tmp_path / "explanation.html").read_text(encoding="utf-8")
    assert 'id="legend-note"' in page and "Red tokens raise" in page and "blue tokens lower" in page
    assert 'id="map-legend"' in page and 'id="map-hi"' in page and "this block's scale" in page


@pytest.mark.real_weights
def test_bundled_minilm_sentiment_head(tmp_path):
    from captum_ffb.evaluation.minilm_head import load_minilm_sentiment_head

    text = "a charming and often affecting journey."
    data = _run([text, "--format", "json"], tmp_path / "out")
    loaded = load_model(show_progress=False)
    batch = loaded.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        hidden = loaded.model(**batch).last_hidden_state
        value = float(load_minilm_sentiment_head()(hidden, batch["attention_mask"]))
    (out,) = data["outputs"]
    assert out["target"] == "positive sentiment" and value > 0
    assert sum(out["contributions"]) + out["bias"] == pytest.approx(value, abs=1e-4)
    assert len(data["maps"]) == 6


def test_corpus_mode_writes_one_line_per_text_and_resumes(lm_dir, tmp_path):
    texts = ["the cat sat on the mat", "a dog was tired", "she loves math", "big red cat run"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n")
    out = tmp_path / "out"
    argv = ["explain", "--data", str(corpus), "--model", str(lm_dir), "--batch-size", "3",
            "--out", str(out), "--quiet"]
    assert main(argv) == 0
    lines = [json.loads(line) for line in (out / "explanations.jsonl").read_text().splitlines()]
    assert [line["text"] for line in lines] == texts
    loaded = load_saved(lm_dir)
    for line in lines:
        ids = loaded.tokenizer(line["text"], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = loaded.model(ids).logits[0, -1]
        assert line["target"] == int(logits.argmax())
        assert sum(line["contributions"]) + line["bias"] == pytest.approx(float(logits.max()), abs=1e-4)
        assert line["tokens"] == loaded.tokenizer.convert_ids_to_tokens(ids[0])
    before = (out / "explanations.jsonl").read_text()
    assert main(argv) == 0  # the shards are there: nothing is recomputed, same file
    assert (out / "explanations.jsonl").read_text() == before


def test_corpus_mode_skips_blank_and_too_long_lines_and_keeps_line_indices(lm_dir, tmp_path, capsys):
    """Blank lines and a line longer than the model's 64 positions are listed in skipped.csv;
    each explanation keeps its line's index; a truncated shard is recomputed on resume."""
    long = " ".join(["the cat sat on the mat"] * 12)
    lines = ["the cat sat on the mat", "", "   ", long, "a dog was tired", "she loves math"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = ["explain", "--data", str(corpus), "--model", str(lm_dir), "--batch-size", "2", "--out", str(out)]
    assert main(argv) == 0
    assert f"3 texts explained; 3 skipped, listed in {out / 'skipped.csv'}" in capsys.readouterr().out
    explained = [json.loads(x) for x in (out / "explanations.jsonl").read_text().splitlines()]
    assert [(x["index"], x["text"]) for x in explained] == [(k, lines[k]) for k in (0, 4, 5)]
    n_long = len(load_saved(lm_dir).tokenizer(long)["input_ids"])
    assert n_long > 64
    with (out / "skipped.csv").open(newline="") as f:
        assert list(csv.reader(f)) == [["line", "reason", "detail"], ["2", "empty", ""], ["3", "empty", ""],
                                       ["4", "too long", f"{n_long} tokens > 64 (the model's maximum)"]]
    before = (out / "explanations.jsonl").read_text()
    shard = out / "run" / "shards" / "batch-00000.npz"
    raw = shard.read_bytes()
    shard.write_bytes(raw[: len(raw) // 2])  # an interrupted copy: a truncated zip
    assert main([*argv, "--quiet"]) == 0
    assert (out / "explanations.jsonl").read_text() == before
    assert shard.stat().st_size == len(raw)  # computed again


def test_corpus_mode_errors(lm_dir, base_dir, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat\n")
    assert "either a TEXT or --data" in _error(capsys, ["--model", str(lm_dir)])
    assert "--target is for one TEXT" in _error(capsys, ["--data", str(corpus), "--model", str(lm_dir),
                                                         "--target", " dog"])
    assert "corpus mode" in _error(capsys, [TEXT, "--model", str(lm_dir), "--backend", "ray"])
    assert "base model has no output" in _error(capsys, ["--data", str(corpus), "--model", str(base_dir),
                                                         "--out", str(tmp_path / "o")])


def test_the_device_is_checked_before_the_model_loads(lm_dir, tmp_path, capsys, monkeypatch):
    import captum_ffb.explained.models

    def never(*args, **kwargs):
        raise AssertionError("the model loaded before the device was checked")

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat\na dog\n")
    argv = ["--data", str(corpus), "--model", str(lm_dir), "--out", str(tmp_path / "o"), "--quiet"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(captum_ffb.explained.models, "load_model", never)
    assert _error(capsys, [*argv, "--device", "cuda"]) == (
        "captum-ffb: error: cannot use device 'cuda': no cuda device is available")
    assert _error(capsys, [TEXT, "--model", str(lm_dir), "--device", "cuda:0"]) == (
        "captum-ffb: error: cannot use device 'cuda:0': no cuda device is available")
    monkeypatch.undo()
    assert main(["explain", *argv, "--device", "cpu"]) == 0
    assert len((tmp_path / "o" / "explanations.jsonl").read_text().splitlines()) == 2


def test_first_token_share_of_rows():
    from captum_ffb.explain import Explanation, first_token_share

    c = torch.tensor([[1.0, -2.0, 1.0], [0.0, 0.0, 0.0], [-3.0, 1.0, 0.0]])
    assert first_token_share(c).tolist() == [0.25, 0.0, 0.75]
    explanation = Explanation(text="a b c", model_name="m", model_type="llama", task="next-token",
                              tokens=["a", "b", "c"], prompt_length=3, explained="next token",
                              targets=["x", "y", "z"], contributions=c)
    assert torch.equal(explanation.first_token_share(), first_token_share(c))
