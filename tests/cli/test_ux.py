"""What a new user trips on: bad bytes, missing tokenizers, long texts, ``--quiet``, options
checked before the weights load, and which errors are one line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from captum_ffb.cli import UsageError, main
from tests.models import WORDS, save_tiny

TEXT = "she loves math rather than engaging in"
LATIN1 = "caf\udce9"  # what Python makes of the bytes b"caf\xe9" on a command line


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return save_tiny("bert", tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return save_tiny("gpt2", tmp_path_factory.mktemp("models") / "tiny-gpt2")


def test_text_that_is_not_utf8(bert_dir, tmp_path, one_line, no_weights):
    for command in ("maps", "compare"):
        argv = [command, LATIN1, "--model", str(bert_dir), "--out", str(tmp_path / "o")]
        assert one_line(argv) == "the text is not valid UTF-8 (byte 0xe9 at position 3)"


def test_bytes_on_a_real_command_line(bert_dir):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable.encode(), b"-m", b"captum_ffb.cli", b"maps", b"caf\xe9", b"--model",
         bytes(bert_dir), b"--quiet"],
        cwd=root, env=env, capture_output=True, timeout=300,
    )
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode() == (
        "captum-ffb: error: the text is not valid UTF-8 (byte 0xe9 at position 3)\n"
    )


def test_corpus_that_is_not_utf8_names_the_line(bert_dir, tmp_path, one_line):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"the cat sat\nthe caf\xe9 was red\n")
    argv = ["analyze", "--model", str(bert_dir), "--data", str(corpus), "--out", str(tmp_path / "o")]
    message = one_line(argv)
    assert message == f"{corpus} is not valid UTF-8: line 2 (byte 0xe9 at position 7); save it as UTF-8"


def test_model_folder_without_tokenizer(bert_dir, tmp_path, one_line):
    folder = tmp_path / "weights-only"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((bert_dir / name).read_bytes())
    for command in ("maps", "compare"):
        message = one_line([command, TEXT, "--model", str(folder), "--quiet"])
        assert message.startswith(f"the model folder {folder} has no tokenizer: none of tokenizer.json")
    argv = ["analyze", "--model", str(folder), "--out", str(tmp_path / "o"), "--quiet"]
    assert "has no tokenizer" in one_line(argv)


def test_long_text_gives_only_our_line(tmp_path, capsys, one_line):
    folder = save_tiny("bert", tmp_path / "tiny-bert")
    settings = folder / "tokenizer_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "model_max_length": 16}))
    capsys.readouterr()  # saving shows a bar
    transformers_logger = logging.getLogger("transformers")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    transformers_logger.addHandler(handler)
    try:
        too_long = " ".join(WORDS * 3)
        for command in ("maps", "compare"):
            argv = [command, too_long, "--model", str(folder), "--out", str(tmp_path / "o"),
                    "--quiet"]
            assert one_line(argv) == "the text has 107 tokens; the model takes at most 64"
        # longer than the tokenizer's 16 but fine for the model: no warning either
        argv = ["maps", " ".join(WORDS[:20]), "--model", str(folder), "--out",
                str(tmp_path / "o"), "--format", "json", "--quiet"]
        assert main(argv) == 0
        assert capsys.readouterr() == ("", "")
    finally:
        transformers_logger.removeHandler(handler)
    assert not [r for r in records if "Token indices sequence length" in r.getMessage()]


def test_quiet_prints_nothing(bert_dir, tmp_path, capsys):
    from transformers.utils import logging as hf_logging

    argv = ["maps", TEXT, "--model", str(bert_dir), "--out", str(tmp_path / "o"), "--dpi", "20"]
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")
    assert len(list((tmp_path / "o").iterdir())) == 4  # json, html and two figures
    assert hf_logging.is_progress_bar_enabled()  # the bars come back for the next caller
    assert main(argv) == 0  # without --quiet: progress, summary and files as before
    captured = capsys.readouterr()
    assert "Loading weights" in captured.err and "decomposing" in captured.err
    assert captured.out.splitlines()[1:] == [str(tmp_path / "o" / n) for n in (
        "maps.json", "maps.html", "maps_layer00.png", "maps_layer01.png")]
    argv = ["compare", TEXT, "--model", str(bert_dir), "--out", str(tmp_path / "c"), "--layer",
            "0", "--baselines", "norm", "--no-figures", "--quiet"]
    assert main(argv) == 0
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("options, message", [
    (["--layer", "2"], "layer 2 does not exist: the model has 2 layers"),
    (["--layer", "0,-3"], "layer -3 does not exist: the model has 2 layers"),
    (["--scopes", "Atb", "AtbFf"], "unknown scope 'AtbFf' for a pre_ln model; choose from "
     "Atb, AtbLn, AtbLnFf, AtbLnFfRes, AtbLnFfResLn"),
    (["--dpi", "0"], "--dpi must lie between 10 and 1200, got 0"),
    (["--format", "svg"], "unknown format 'svg'; choose from png, html, json"),
])
def test_maps_options_fail_before_the_weights_load(gpt2_dir, tmp_path, one_line, no_weights,
                                                   options, message):
    argv = ["maps", TEXT, "--model", str(gpt2_dir), "--out", str(tmp_path / "o"), *options]
    assert one_line(argv) == message
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("options, message", [
    (["--layer", "-7"], "layer -7 does not exist: the model has 6 layers"),
    (["--scopes", "AtbLn"], "unknown scope 'AtbLn' for a post_ln model"),
])
def test_the_bundled_model_is_checked_from_its_config(tmp_path, one_line, no_weights, options,
                                                      message):
    assert message in one_line(["maps", TEXT, "--out", str(tmp_path / "o"), *options])


@pytest.mark.parametrize("options, message", [
    (["--layer", "5"], "layer 5 does not exist: the model has 2 layers"),
    (["--scopes", "Atb,AtbLn"], "unknown scope 'AtbLn' for a post_ln model"),
    (["--app-e", "--layer", "3"], "layer 3 does not exist"),
    (["--baselines", "lime"], "unknown baseline 'lime'"),
])
def test_compare_options_fail_before_the_weights_load(bert_dir, tmp_path, one_line, no_weights,
                                                      options, message):
    argv = ["compare", TEXT, "--model", str(bert_dir), "--out", str(tmp_path / "o"), *options]
    assert message in one_line(argv)


def test_internal_errors_keep_their_traceback(bert_dir, tmp_path, one_line, monkeypatch):
    import captum_ffb.texts.text

    def broken(*args, **kwargs):
        raise TypeError("an internal bug")

    monkeypatch.setattr(captum_ffb.texts.text, "text_maps", broken)
    with pytest.raises(TypeError, match="an internal bug"):
        main(["maps", TEXT, "--model", str(bert_dir), "--out", str(tmp_path / "o"), "--quiet"])

    def mistake(*args, **kwargs):
        raise UsageError("a user mistake")

    monkeypatch.setattr(captum_ffb.texts.text, "text_maps", mistake)
    argv = ["maps", TEXT, "--model", str(bert_dir), "--out", str(tmp_path / "o"), "--quiet"]
    assert one_line(argv) == "a user mistake"
    assert issubclass(UsageError, ValueError)


def test_default_output_folders_are_ignored_by_git():
    from captum_ffb.cli import compare, maps

    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    for folder in (maps.DEFAULT_OUT, compare.DEFAULT_OUT):
        assert f"{folder}/" in ignored
