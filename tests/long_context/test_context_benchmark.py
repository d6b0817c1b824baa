"""The measures of the ContextCite comparison (``results/context/metrics.py``, issue 58 item 4)
on cases whose answer is known: ablations, random masks, the top-k drop and the linear
datamodeling score of a linear value, and the answer's log-probability with a reused cache
against one pass of the whole sequence (a tiny random Llama; no SmolLM2, no context-cite)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from captum_ffb.long_context.attribution import split_context
from tests.models import tiny_lm

FOLDER = Path(__file__).resolve().parents[2] / "results" / "context"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"context_benchmark_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    path, known = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(FOLDER))  # run.py imports metrics by name
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - known - {spec.name}:
            if name == "metrics":
                del sys.modules[name]
    return module


metrics = _load("metrics")

CONTEXT = "Ann lives in Oslo.  Bob likes tea!\n\nCid is tall. Dee is short."
SPANS = split_context(CONTEXT, "sentence")


def test_ablate_keeps_the_kept_sources_with_their_own_separators():
    assert [CONTEXT[s:e] for s, e in SPANS] == ["Ann lives in Oslo.", "Bob likes tea!", "Cid is tall.", "Dee is short."]
    assert metrics.ablate(CONTEXT, SPANS, [True] * 4) == CONTEXT
    assert metrics.ablate(CONTEXT, SPANS, [True, False, True, False]) == "Ann lives in Oslo.\n\nCid is tall."
    assert metrics.ablate(CONTEXT, SPANS, [False, True, False, True]) == "Bob likes tea! Dee is short."
    assert metrics.ablate(CONTEXT, SPANS, [False] * 4) == ""
    with pytest.raises(ValueError, match="keep flags"):
        metrics.ablate(CONTEXT, SPANS, [True])


def test_random_masks_are_seeded_and_keep_about_half():
    masks = metrics.random_masks(40, 50, seed=3)
    assert masks.shape == (50, 40) and masks.dtype == bool
    assert np.array_equal(masks, metrics.random_masks(40, 50, seed=3))
    assert not np.array_equal(masks, metrics.random_masks(40, 50, seed=4))
    assert 0.4 < masks.mean() < 0.6


def test_top_k_drop_of_a_linear_value_is_the_k_largest_weights():
    weights = np.array([0.5, 3.0, -1.0, 3.0, 2.0])
    assert metrics.top_k_keep(weights, 1).tolist() == [True, False, True, True, True]  # ties: the earlier first
    assert metrics.top_k_keep(weights, 2).tolist() == [True, False, True, False, True]
    value = lambda keep: float(np.asarray(keep, float) @ weights)  # noqa: E731
    full = value(np.ones(5, bool))
    for k, expected in ((1, 3.0), (3, 8.0), (5, 7.5)):
        assert full - value(metrics.top_k_keep(weights, k)) == pytest.approx(expected)
    # a method that ranks the weights backwards removes the sources that hold the value up
    assert full - value(metrics.top_k_keep(-weights, 1)) == pytest.approx(-1.0)


def test_lds_of_a_linear_value():
    masks = metrics.random_masks(6, 32, seed=0)
    weights = np.array([2.0, -1.0, 0.5, 0.0, 4.0, -3.0])
    values = masks @ weights + 7.0
    assert metrics.lds(weights, masks, values) == pytest.approx(1.0)
    assert metrics.lds(-weights, masks, values) == pytest.approx(-1.0)
    assert metrics.lds(3 * weights, masks, values) == pytest.approx(1.0)  # a rank measure: the scale is free
    # the logit of the probability is monotone in the log-probability: the same ranks
    log_probs = values - 20.0
    logits = [metrics.logit_of_log_prob(v) for v in log_probs]
    assert metrics.lds(weights, masks, logits) == pytest.approx(1.0)
    assert math.isnan(metrics.lds(np.zeros(6), masks, values))  # a constant prediction ranks nothing


def test_logit_of_log_prob_and_mean_se():
    assert metrics.logit_of_log_prob(math.log(0.5)) == pytest.approx(0.0)
    assert metrics.logit_of_log_prob(math.log(0.9)) == pytest.approx(math.log(9))
    assert metrics.logit_of_log_prob(-30.0) == pytest.approx(-30.0)
    assert metrics.logit_of_log_prob(0.0) == math.inf
    mean, se, n = metrics.mean_se([1.0, 2.0, 3.0, float("nan")])
    assert (mean, n) == (2.0, 3) and se == pytest.approx(1 / math.sqrt(3))
    assert metrics.mean_se([])[2] == 0


def _direct(model, prompt, answer):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + answer[:-1]])).logits[0, len(prompt) - 1:].double()
    return float(torch.log_softmax(logits, -1)[torch.arange(len(answer)), torch.tensor(answer)].sum())


def test_answer_scorer_reuses_a_prefix_and_gives_the_same_log_probability():
    model = tiny_lm("llama")
    scorer = metrics.AnswerScorer(model)
    prompt, answer = [5, 9, 11, 4, 7, 8, 12, 3], [6, 10, 2]
    full = scorer.log_prob(prompt, answer, remember=True)
    assert full == pytest.approx(_direct(model, prompt, answer), abs=1e-5)
    assert (scorer.passes, scorer.tokens) == (1, 10)
    ablated = [5, 9, 11, 4, 13, 3]  # shares 4 tokens with the remembered prompt
    assert scorer.log_prob(ablated, answer) == pytest.approx(_direct(model, ablated, answer), abs=1e-5)
    assert (scorer.passes, scorer.tokens) == (2, 10 + 4)  # only the tokens after the shared prefix ran
    one = scorer.log_prob(prompt, [6])  # a one-token answer: the last prompt token runs again
    assert one == pytest.approx(_direct(model, prompt, [6]), abs=1e-5)
    assert scorer.tokens == 10 + 4 + 1
    scorer.remember([1, 2, 3])
    assert scorer.passes == 4


def test_a_pinned_prefix_outlives_the_recent_ones():
    model = tiny_lm("llama")
    scorer = metrics.AnswerScorer(model, keep=1)
    prompt, answer = [5, 9, 11, 4, 7, 8, 12, 3], [6, 10]
    scorer.log_prob(prompt, answer, pin=True)
    for other in ([1, 2, 3, 4], [2, 3, 4, 5]):  # each pushes the last recent prefix out
        scorer.log_prob(other, answer, remember=True)
    before = scorer.tokens
    ablated = [5, 9, 11, 4, 7, 8, 13]
    assert scorer.log_prob(ablated, answer) == pytest.approx(_direct(model, ablated, answer), abs=1e-5)
    assert scorer.tokens - before == 2  # the pinned prompt's first 6 tokens were not run again
    scorer.unpin()
    scorer.log_prob(ablated, answer)
    assert scorer.tokens - before == 2 + 8


def test_the_question_selection_takes_each_document_in_turn():
    run = _load("run")
    rows = [dict(id=f"{doc}/{k}", doc=doc, kind=kind, kept=kept)
            for doc in ("a", "b") for k, (kind, kept) in enumerate([("one-token", True), ("one-token", True),
                                                                    ("one-token", False), ("several-token", True)])]
    chosen = [q["id"] for q in run.select(rows, per_kind=3)]
    assert chosen == ["a/0", "b/0", "a/1", "a/3", "b/3"]
    assert len(run.select(rows, per_kind=0)) == 6


def test_the_report_compares_each_of_our_methods_with_contextcite():
    """``SUMMARY.md`` has a row, a question-by-question comparison and a cost line for both of
    our methods, from a finished run's records (numbers made up here)."""
    run = _load("run")
    method = dict(top_k_drop={"1": 1.0, "3": 2.0, "5": 3.0}, lds=0.5, evidence_top1=True, seconds=2.0,
                  cpu_seconds=3.0, forwards=4)
    records = []
    for i, kind in enumerate(("one-token", "several-token")):
        methods = {name: dict(method, lds=0.5 + 0.1 * j) for j, name in
                   enumerate(("ours", "ours-presence", "contextcite-64", "contextcite-32", "recency", "leave-one-out"))}
        methods["contextcite-64"].update(seconds=40.0, cpu_seconds=60.0)
        records.append(dict(id=f"d/{i}", doc="d", kind=kind, prompt_tokens=100, sources=10, package_difference=1e-6,
                            methods=methods))
    text = run.report(dict(settings=dict(ablations=64, masks=32, threads=2, versions={"context-cite": "0.0.4"}),
                           questions=records, seconds=60))
    assert text.count("| ours-presence | 1.00") == 3 and text.count("| ours | 1.00") == 3
    assert text.count("| LDS | -0.10") == 3 and text.count("| LDS | -0.20") == 3  # ours 0.5 and 0.6 against 0.7
    assert text.count("ours-presence costs 0.050 of contextcite-64's wall time") == 3


def test_the_report_pools_two_runs_over_the_methods_both_ran():
    """With a second run's results, ``SUMMARY.md`` ends with both runs' questions together: the
    methods both ran, compared question by question over all of them (numbers made up here)."""
    run = _load("run")

    def records(doc: str, ours_lds: float, names: tuple[str, ...]) -> list[dict]:
        method = dict(top_k_drop={"1": 1.0, "3": 2.0, "5": 3.0}, lds=0.7, evidence_top1=True, seconds=2.0,
                      cpu_seconds=3.0, forwards=4)
        methods = {name: dict(method) for name in names}
        methods["ours"]["lds"] = ours_lds
        return [dict(id=f"{doc}/0", doc=doc, kind="one-token", prompt_tokens=100, sources=10, methods=methods)]

    settings = dict(ablations=64, masks=32, threads=2, versions={"context-cite": "0.0.4"})
    first = dict(settings=dict(settings, questions_file="questions.json"),
                 questions=records("a", 0.5, ("ours", "ours-presence", "contextcite-64", "contextcite-32")))
    second = dict(settings=dict(settings, questions_file="questions-second.json"),
                  questions=records("b", 0.9, ("ours", "contextcite-64", "contextcite-32")))
    text = run.report(second, first)
    assert "`questions-second.json`" in text.splitlines()[2]
    pooled = text.split("## Both evaluation sets together")[1]
    assert pooled.startswith(" (2 questions: these 1 and the 1 of `questions.json`")
    assert "| ours | 1.00" in pooled and "ours-presence" not in pooled
    assert "| LDS | 0.00 ± 0.20 | 1 / 0 / 1 |" in pooled  # ours −0.2 on one, +0.2 on the other
    assert "## Both evaluation sets together" not in run.report(second)
