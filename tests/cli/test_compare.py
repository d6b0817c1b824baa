"""``captum-ffb compare`` end to end, on a saved tiny model folder."""

from __future__ import annotations

import csv

import pytest

from captum_ffb.baselines import BASELINES
from captum_ffb.cli import main
from tests.models import TINY_MODELS, wordpiece_tokenizer

WORDS = "the cat sat on mat because it was tired . a dog ran fast".split()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_bert")
    wordpiece_tokenizer(sorted(set(WORDS)), folder)
    TINY_MODELS["bert"].build().save_pretrained(folder)
    return folder


def test_compare_writes_tables_and_figures(model_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(["compare", "the cat sat on the mat .", "--model", str(model_dir), "--layer", "1",
                 "--baselines", "attention,norm,ig,shap", "--n-steps", "4", "--out", str(out),
                 "--quiet"])
    assert code == 0
    rows = list(csv.DictReader((out / "compare.csv").open()))
    baselines = ["attention_mean", "attention_sum", "norm", "ig", "shap_exact"]
    scopes = ["Atb", "AtbFf", "AtbFfRes", "AtbFfResLn"]
    assert [(r["method"], r["reference"]) for r in rows] == [(b, s) for s in scopes for b in baselines]
    assert all(r["layer"] == "1" for r in rows)
    # the sum over heads is H times the mean: the same ranks and the same correlation
    for scope in scopes:
        by = {r["method"]: r for r in rows if r["reference"] == scope}
        for column in ("1-spearman", "pearson"):
            assert float(by["attention_sum"][column]) == pytest.approx(float(by["attention_mean"][column]))
    assert (out / "compare.md").read_text().startswith("| layer | method | reference |")
    assert (out / "compare_layer01.png").stat().st_size > 0
    assert capsys.readouterr() == ("", "")  # --quiet: no tables, files or progress bars


def test_compare_app_e_writes_timing_and_agreement(model_dir, tmp_path):
    out = tmp_path / "app_e"
    code = main(["compare", "the cat sat on the mat .", "--model", str(model_dir), "--app-e",
                 "--lengths", "3,4", "--methods", "ig,shap_exact,shap_kernel", "--out", str(out),
                 "--quiet"])
    assert code == 0
    timing = list(csv.DictReader((out / "app_e_timing.csv").open()))
    assert [(r["n"], r["method"]) for r in timing] == [
        (n, m) for n in ("3", "4") for m in ("ig", "shap_exact", "shap_kernel")
    ]
    agreement = list(csv.DictReader((out / "app_e_agreement.csv").open()))
    assert {r["scope"] for r in agreement} == {"AtbFf", "AtbFfRes", "AtbFfResLn"}
    # Kernel SHAP enumerates all coalitions of these short inputs: it agrees with Exact.
    for n in ("3", "4"):
        kernel = [r for r in agreement if r["n"] == n and r["method"] == "shap_kernel"]
        exact = [r for r in agreement if r["n"] == n and r["method"] == "shap_exact"]
        for a, b in zip(kernel, exact):
            assert float(a["1-spearman"]) == pytest.approx(float(b["1-spearman"]), abs=1e-6)
    assert (out / "app_e_change.md").exists() and (out / "app_e_timing.png").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--baselines", "ig,lime"], "unknown baseline 'lime'"),
        (["--layer", "7"], "layer 7 does not exist"),
        (["--app-e", "--lengths", "50"], "--lengths 50 is not possible"),
        (["--app-e", "--methods", "ig,lime"], "unknown activation method 'lime'"),
        (["--top-k", "0"], "--top-k must be positive"),
    ],
)
def test_compare_errors_are_one_line(model_dir, tmp_path, capsys, extra, message):
    code = main(["compare", "the cat sat", "--model", str(model_dir), "--out", str(tmp_path / "x"),
                 "--no-figures", "--quiet", *extra])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after any loading progress
    assert code == 2
    assert last.startswith("captum-ffb: error:") and message in last


@pytest.mark.real_weights
def test_compare_runs_on_minilm(tmp_path):
    out = tmp_path / "minilm"
    code = main(["compare", "The cat sat on the mat.", "--layer", "0,5", "--baselines",
                 "attention,norm,ig", "--n-steps", "8", "--out", str(out), "--no-figures", "--quiet"])
    assert code == 0
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert {r["layer"] for r in rows} == {"0", "5"}
    # IG of the whole layer ranks its token pairs more like the whole-layer decomposition
    # than raw attention weights do (Kobayashi et al.'s motivation).
    whole = [r for r in rows if r["reference"] == "AtbFfResLn"]
    ig = {r["layer"]: float(r["1-spearman"]) for r in whole if r["method"] == "ig"}
    attention = {r["layer"]: float(r["1-spearman"]) for r in whole if r["method"] == "attention_mean"}
    assert all(ig[layer] < attention[layer] for layer in ig)


def test_compare_all_runs_every_baseline(model_dir, tmp_path):
    out = tmp_path / "all"
    argv = ["compare", "the cat sat on the mat .", "--model", str(model_dir), "--layer", "0",
            "--scopes", "Atb", "--baselines", "all", "--n-steps", "2", "--n-samples", "30",
            "--no-figures", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["method"] for r in rows] == list(BASELINES)
