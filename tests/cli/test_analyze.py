"""``captum-ffb analyze`` end to end on a tiny saved model, and its errors."""

from __future__ import annotations

import json

import pytest

from captum_ffb.cli import main
from tests.models import CORPUS_LINES, TINY_MODELS, corpus_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-bert")
    TINY_MODELS["bert"].build().save_pretrained(folder)
    corpus_tokenizer(folder)
    return folder


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS_LINES) + "\n", encoding="utf-8")
    return path


def test_analyze_writes_the_report_and_resumes(model_dir, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["analyze", "--model", str(model_dir), "--data", str(corpus), "--out", str(out),
            "--batch-size", "3", "--max-tokens", "20", "--seed", "5", "--no-figures"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "8 sequences" in printed and "skipped line 3: empty" in printed
    first = json.loads((out / "results.json").read_text())
    assert first["sequences"] == 8 and first["settings"]["mask_rate_applied"] == 0.12
    assert (out / "report.html").exists() and (out / "per_sequence.csv").exists()
    assert main(argv + ["--quiet"]) == 0  # everything already on disk: same numbers
    assert json.loads((out / "results.json").read_text()) == first
    assert main(argv[:-1] + ["--seed", "6", "--quiet"]) == 2  # other settings, same folder
    assert "other settings" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--data", "no/such/file.txt"], "no data file"),
    (["--n", "0"], "--n must be at least 1, got 0"),
    (["--mask-rate", "1.5"], "mask rate"),
    (["--batch-size", "0"], "batch size"),
    (["--device", "bogus"], "cannot use device"),
])
def test_bad_input_is_one_line(model_dir, corpus, tmp_path, capsys, extra, message):
    argv = ["analyze", "--model", str(model_dir), "--data", str(corpus), "--out",
            str(tmp_path / "o"), "--quiet"] + extra
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_interrupted_run_says_how_to_resume(model_dir, corpus, tmp_path, capsys, monkeypatch):
    import captum_ffb.analysis as analysis

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(analysis, "analyze_corpus", interrupted)
    argv = ["analyze", "--model", str(model_dir), "--data", str(corpus), "--out",
            str(tmp_path / "o"), "--quiet"]
    assert main(argv) == 130
    assert "run the same command again to resume" in capsys.readouterr().err
