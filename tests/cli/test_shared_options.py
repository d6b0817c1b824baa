"""The options the sub-commands share (issue 37 item 3, issue 40): declared once, with one help
text and one check; ``--device`` and ``--dtype`` for one text too; ``--scopes`` read alike;
the renamed flags' old spellings still work and warn in one line."""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

import pytest
import torch

import captum_ffb.explained.models
from captum_ffb.cli import build_parser, main
from captum_ffb.cli._options import SHARED, deprecation_warnings, parse_scopes
from tests.models import CORPUS_LINES, corpus_tokenizer, save_tiny, save_tiny_lm

TEXT = "the cat sat on the mat ."

#: The shared options each command takes.
TAKES = {
    "maps": {"model", "scopes", "out", "format", "device", "dtype", "quiet"},
    "explain": {"model", "out", "format", "device", "dtype", "quiet"},
    "compare": {"model", "scopes", "out", "device", "dtype", "quiet"},
    "analyze": {"model", "out", "device", "dtype", "quiet"},
    "evaluate": {"model", "out", "device", "quiet"},
    "app": {"model", "device", "quiet"},
    "lit": {"model", "device", "quiet"},
    "env": set(),
    "graph": {"model", "out", "device", "dtype", "quiet"},
}

#: Shared flag names a command declares itself because they choose other things there
#: (``graph --format`` picks among json, html and neuronpedia files).
OWN = {"graph": {"format"}}


#: The deprecated spellings, hidden from ``--help``.
HIDDEN = {"compare": ("--route", "--no-figure"), "analyze": ("--max-seqs",), "lit": ("--examples",)}


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "bert"
    save_tiny("bert", folder)
    corpus_tokenizer(folder)  # knows the corpus' words
    return folder


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "llama")


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS_LINES) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def loads(monkeypatch):
    """The models the command lines load (``load_model`` spied on)."""
    loaded = []
    original = captum_ffb.explained.models.load_model

    def spy(*args, **kwargs):
        loaded.append(original(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(captum_ffb.explained.models, "load_model", spy)
    return loaded


# --------------------------------------------------------------------------- one declaration
def test_every_command_takes_its_shared_options_from_one_place():
    commands = _commands()
    assert set(commands) == set(TAKES)
    for command, parser in commands.items():
        flags = {o: a for a in parser._actions for o in a.option_strings}
        for name, (names, keywords) in SHARED.items():
            if name in TAKES[command]:
                action = flags[names[0]]
                assert action.help == keywords["help"], (command, name)
                assert action.container.title == "shared options"
                if name == "out":
                    assert action.default == f"captum_ffb_{command}"
            elif name not in OWN.get(command, ()):
                assert names[0] not in flags, (command, name)


@pytest.mark.parametrize("command", [c for c in TAKES if TAKES[c]])
def test_help_lists_the_shared_options_with_one_text(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = _flat(capsys.readouterr().out)
    assert "shared options: the same in every captum-ffb command" in text
    for name in TAKES[command]:
        flag, keywords = SHARED[name][0][0], SHARED[name][1]
        assert re.search(re.escape(flag) + r"\b", text)
        assert _flat(keywords["help"]) in text, (command, flag)
    for hidden in HIDDEN.get(command, ()):  # the deprecated spellings are not listed
        assert not re.search(re.escape(hidden) + r"(?![\w-])", text), hidden


def test_dtype_choices_are_the_loaders():
    assert SHARED["dtype"][1]["choices"] == captum_ffb.explained.models.DTYPES


def test_every_default_output_folder_is_named_after_its_command_and_ignored_by_git():
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    for command, parser in _commands().items():
        if "out" in TAKES[command]:
            out = parser.parse_args(["x"] if command in ("maps", "compare", "graph") else
                                    ["--task", "sentiment"] if command == "evaluate" else []).out
            assert out == f"captum_ffb_{command}"
            assert f"{out}/" in ignored


def test_analyze_needs_no_out(tmp_path, monkeypatch, bert_dir, corpus):
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "--model", str(bert_dir), "--data", str(corpus), "--n", "2",
                 "--no-figures", "--quiet"]) == 0
    assert json.loads((tmp_path / "captum_ffb_analyze" / "results.json").read_text())["sequences"] == 2


# --------------------------------------------------------------------------- --scopes
def test_scopes_are_read_alike():
    assert parse_scopes(["Atb", "AtbFf"]) == parse_scopes(["Atb,AtbFf"]) == ["Atb", "AtbFf"]
    assert parse_scopes(["Atb,", "AtbFf,Atb"]) == ["Atb", "AtbFf"]
    for command in ("maps", "compare"):
        parser = _commands()[command]
        for spelling in (["Atb", "AtbFf"], ["Atb,AtbFf"], ["Atb,", "AtbFf"]):
            args = parser.parse_args([TEXT, "--scopes", *spelling])
            assert parse_scopes(args.scopes) == ["Atb", "AtbFf"]


def test_compare_takes_scopes_as_words_and_as_a_list(bert_dir, tmp_path):
    tables = []
    for k, spelling in enumerate((["Atb", "AtbFf"], ["Atb,AtbFf"])):
        out = tmp_path / f"c{k}"
        assert main(["compare", TEXT, "--model", str(bert_dir), "--layer", "0", "--baselines", "norm",
                     "--scopes", *spelling, "--no-figures", "--quiet", "--out", str(out)]) == 0
        tables.append((out / "compare.csv").read_text())
    assert tables[0] == tables[1]
    assert [r["reference"] for r in csv.DictReader(tables[0].splitlines())] == ["Atb", "AtbFf"]


# --------------------------------------------------------------------------- --device
@pytest.mark.parametrize("argv", [
    ["maps", TEXT], ["explain", TEXT], ["compare", TEXT], ["analyze"],
    ["evaluate", "--task", "next-token"], ["explain", "--data", "{corpus}"],
])
@pytest.mark.parametrize("device, message", [
    ("cuda", "cannot use device 'cuda': no cuda device is available"),
    ("cuda:1", "cannot use device 'cuda:1': no cuda device is available"),
    ("nonsense", "cannot use device 'nonsense': not a torch device name"),
])
def test_an_unavailable_device_is_one_line_before_the_weights_load(argv, device, message, lm_dir, corpus,
                                                                   tmp_path, one_line, no_weights,
                                                                   monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [part.format(corpus=corpus) for part in argv]
    assert one_line([*argv, "--model", str(lm_dir), "--device", device, "--out", str(tmp_path / "o")]) == message
    assert not (tmp_path / "o").exists()


def test_device_cpu_runs_one_text(lm_dir, tmp_path, loads):
    assert main(["explain", TEXT, "--model", str(lm_dir), "--device", "cpu", "--format", "json",
                 "--quiet", "--out", str(tmp_path / "o")]) == 0
    assert next(loads[0].model.parameters()).device == torch.device("cpu")


# --------------------------------------------------------------------------- --dtype
def _dtypes(loaded) -> set[torch.dtype]:
    return {p.dtype for p in loaded.model.parameters()}


def test_maps_in_float64(bert_dir, tmp_path, loads):
    assert main(["maps", TEXT, "--model", str(bert_dir), "--layer", "0", "--format", "json",
                 "--device", "cpu", "--dtype", "float64", "--quiet", "--out", str(tmp_path / "o")]) == 0
    assert _dtypes(loads[0]) == {torch.float64}
    data = json.loads((tmp_path / "o" / "maps.json").read_text())
    assert max(data["layers"]["0"]["completeness_residual"].values()) < 1e-4


def test_the_default_dtype_is_float32(bert_dir, tmp_path, loads):
    assert main(["maps", TEXT, "--model", str(bert_dir), "--layer", "0", "--format", "json",
                 "--quiet", "--out", str(tmp_path / "o")]) == 0
    assert _dtypes(loads[0]) == {torch.float32}


def test_explain_one_text_in_bfloat16(lm_dir, tmp_path, loads):
    out = tmp_path / "o"
    assert main(["explain", TEXT, "--model", str(lm_dir), "--dtype", "bfloat16", "--format", "json",
                 "--quiet", "--out", str(out)]) == 0
    assert _dtypes(loads[0]) == {torch.bfloat16}
    (output,) = json.loads((out / "explanation.json").read_text())["outputs"]
    # the decomposition computes in float32: the contributions add up to the bfloat16 model's
    # value up to its reduced precision
    total = sum(output["contributions"]) + output["bias"]
    assert total == pytest.approx(output["value"], abs=2e-2 * max(1.0, abs(output["value"])))


def test_compare_and_analyze_in_float64(bert_dir, corpus, tmp_path, loads):
    assert main(["compare", TEXT, "--model", str(bert_dir), "--layer", "0", "--baselines", "norm,ig",
                 "--n-steps", "2", "--dtype", "float64", "--no-figures", "--quiet",
                 "--out", str(tmp_path / "c")]) == 0
    assert main(["analyze", "--model", str(bert_dir), "--data", str(corpus), "--n", "3",
                 "--dtype", "float64", "--no-figures", "--quiet", "--out", str(tmp_path / "a")]) == 0
    assert [_dtypes(loaded) for loaded in loads] == [{torch.float64}] * 2
    assert json.loads((tmp_path / "a" / "results.json").read_text())["sequences"] == 3


@pytest.mark.parametrize("argv, message", [
    (["explain", "--data", "{corpus}", "--dtype", "bfloat16"],
     "--dtype bfloat16 is for one TEXT: the corpus mode's workers load the model in its saved dtype"),
    (["analyze", "--data", "{corpus}", "--backend", "ray", "--dtype", "float16"],
     "--dtype float16 needs --backend local: Ray's workers load the model in its saved dtype"),
    (["maps", TEXT, "--dtype", "int8"],
     "re:argument --dtype: invalid choice: 'int8' \\(choose from .*float64'?\\) \\(see captum-ffb maps --help\\)"),
])
def test_dtype_mistakes_are_one_line(argv, message, lm_dir, corpus, tmp_path, one_line, no_weights):
    if "ray" in argv:
        pytest.importorskip("ray")
    argv = [part.format(corpus=corpus) for part in argv]
    got = one_line([*argv, "--model", str(lm_dir), "--out", str(tmp_path / "o")])
    assert re.fullmatch(message[3:], got) if message.startswith("re:") else got == message


# --------------------------------------------------------------------------- old spellings
#: (command line, the deprecated spelling's warning, the option it sets, its value)
OLD_SPELLINGS = [
    (["compare", TEXT, "--route", "captum"],
     "--route is deprecated: use --differentiation forward-mode|captum (--route is explain's "
     "whole-model route)", "differentiation", "captum"),
    (["compare", TEXT, "--route", "forward"],
     "--route is deprecated: use --differentiation forward-mode|captum (--route is explain's "
     "whole-model route)", "differentiation", "forward-mode"),
    (["compare", TEXT, "--no-figure"], "--no-figure is deprecated: use --no-figures", "no_figures", True),
    (["analyze", "--max-seqs", "7"], "--max-seqs is deprecated: use --n", "n", 7),
    (["lit", "--examples", "9"], "--examples is deprecated: use --n", "n", 9),
]


@pytest.mark.parametrize("argv, warning, dest, value", OLD_SPELLINGS)
def test_old_spellings_set_the_new_option_and_leave_one_warning(argv, warning, dest, value):
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    assert deprecation_warnings(args) == [warning]
    without = argv[:2] if argv[0] == "compare" else argv[:1]
    assert deprecation_warnings(build_parser().parse_args(without)) == []


def test_new_spellings_parse():
    args = build_parser().parse_args(["compare", TEXT, "--differentiation", "captum", "--no-figures"])
    assert (args.differentiation, args.no_figures) == ("captum", True)
    assert build_parser().parse_args(["analyze", "--n", "5"]).n == 5
    assert build_parser().parse_args(["lit", "--n", "5"]).n == 5
    assert build_parser().parse_args(["lit"]).n == 200


def test_an_old_spelling_runs_and_warns_in_one_line(bert_dir, tmp_path, capsys, monkeypatch):
    import captum_ffb.baselines

    routes = []
    original = captum_ffb.baselines.compare_with_baselines

    def spy(*args, **kwargs):
        routes.append(kwargs["route"])
        return original(*args, **kwargs)

    monkeypatch.setattr(captum_ffb.baselines, "compare_with_baselines", spy)
    argv = ["compare", TEXT, "--model", str(bert_dir), "--layer", "0", "--baselines", "ig",
            "--n-steps", "2", "--out", str(tmp_path / "o")]
    assert main([*argv, "--route", "captum", "--no-figure"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("captum-ffb: warning")]
    assert warnings == [
        "captum-ffb: warning: --route is deprecated: use --differentiation forward-mode|captum "
        "(--route is explain's whole-model route)",
        "captum-ffb: warning: --no-figure is deprecated: use --no-figures"]
    assert not list((tmp_path / "o").glob("*.png"))
    assert main([*argv, "--differentiation", "forward-mode", "--no-figures", "--quiet"]) == 0
    assert main([*argv, "--route", "captum", "--no-figure", "--quiet"]) == 0  # --quiet: no warning
    assert capsys.readouterr() == ("", "")
    assert routes == ["captum", "forward", "captum"]


def test_analyze_max_seqs_still_limits_the_texts(bert_dir, corpus, tmp_path, capsys):
    assert main(["analyze", "--model", str(bert_dir), "--data", str(corpus), "--max-seqs", "2",
                 "--no-figures", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "captum-ffb: warning: --max-seqs is deprecated: use --n" in err.splitlines()
    assert json.loads((tmp_path / "o" / "results.json").read_text())["sequences"] == 2
