"""Damaged weights, a missing AttnLRP environment and mistyped ``--option`` keys: one line
each, and the last two before the weights load."""

from __future__ import annotations

import json

import pytest
import torch

from captum_ffb.cli import main
from captum_ffb.evaluation.evaluate import evaluate
from captum_ffb.evaluation.methods import METHODS, check_option
from captum_ffb.evaluation.peers import SETUP_COMMAND
from tests.models import save_tiny, save_tiny_lm

TEXT = "the cat sat on the mat ."


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "llama")


def _damage(folder, how: str):
    """Cut ``model.safetensors`` in half, or replace it by a ``pytorch_model.bin`` that is cut
    in half or not a pickle at all; returns the damaged file."""
    weights = folder / "model.safetensors"
    if how == "safetensors-cut":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
        return weights
    from safetensors.torch import load_file

    state = load_file(weights)
    weights.unlink()
    path = folder / "pytorch_model.bin"
    torch.save(state, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "bin-cut" else b"not a pickle" * 8)
    return path


@pytest.mark.parametrize("how", ["safetensors-cut", "bin-cut", "bin-garbage"])
def test_damaged_weights_are_one_line_naming_the_file(how, tmp_path, capsys, one_line):
    folder = save_tiny("bert", tmp_path / "bert")
    damaged = _damage(folder, how)
    capsys.readouterr()  # saving's progress bar
    message = one_line(["maps", TEXT, "--model", str(folder), "--format", "json",
                                 "--quiet", "--out", str(tmp_path / "out")])
    assert message.startswith(f"cannot load model {str(folder)!r}: the weights file {damaged} is "
                              "damaged or incomplete (")
    assert message.endswith("); download or save it again")
    assert not (tmp_path / "out").exists()


def test_attnlrp_without_its_environment(lm_dir, tmp_path, one_line, monkeypatch, no_weights):
    venv = tmp_path / "no-venv"
    monkeypatch.setenv("CAPTUM_FFB_LXT_VENV", str(venv))
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\n")
    message = one_line(["evaluate", "--model", str(lm_dir), "--task", "next-token",
                                 "--data", str(texts), "--methods", "attnlrp,random", "--quiet",
                                 "--out", str(tmp_path / "out")])
    assert message == (f"attnlrp runs in an environment of its own (lxt 2.1, transformers 4), not "
                       f"found at {venv}: create it with `{SETUP_COMMAND}` (or set "
                       "CAPTUM_FFB_LXT_VENV to one)")


@pytest.mark.parametrize("option, message", [
    ("integrated_gradients.n_stepz=3",
     "integrated_gradients has no option 'n_stepz'; it takes internal_batch_size, memory_budget, n_steps"),
    ("kernel_shap.steps=3", "kernel_shap has no option 'steps'; it takes n_samples, per_eval"),
    ("saliency.abs=1", "saliency has no option 'abs'; it takes none"),
    ("shap.n_samples=3", "unknown method 'shap'; choose from " + ", ".join(METHODS)),
])
def test_option_keys_are_checked_before_the_weights_load(lm_dir, tmp_path, one_line, no_weights,
                                                         option, message):
    argv = ["evaluate", "--model", str(lm_dir), "--task", "next-token", "--option", option,
            "--quiet", "--out", str(tmp_path / "out")]
    assert one_line(argv) == f"--option {option!r}: {message}"


def test_every_default_option_is_accepted():
    for method, info in METHODS.items():
        for key in info.options:
            check_option(method, key)
    with pytest.raises(ValueError, match="has no option 'n_stepz'"):
        evaluate(None, "sentiment", options={"integrated_gradients": {"n_stepz": 3}})


def test_an_option_reaches_its_method(lm_dir, tmp_path, monkeypatch):
    seen = []
    original = METHODS["integrated_gradients"]
    monkeypatch.setitem(METHODS, "integrated_gradients", type(original)(
        lambda task, batch, target, options: seen.append(dict(options)) or torch.rand(batch.input_ids.shape),
        original.options))
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\n")
    out = tmp_path / "out"
    assert main(["evaluate", "--model", str(lm_dir), "--task", "next-token", "--data", str(texts),
                 "--methods", "integrated_gradients", "--protocol", "decompx", "--option",
                 "integrated_gradients.n_steps=3", "--quiet", "--out", str(out)]) == 0
    expected = {**original.options, "n_steps": 3}
    assert expected["n_steps"] != original.options["n_steps"]
    assert seen and all({k: o[k] for k in expected} == expected for o in seen)
    summary = json.loads((out / "results.json").read_text())
    assert summary["options"]["integrated_gradients"] == expected


def test_an_option_of_a_method_not_run_is_an_error(lm_dir, tmp_path, one_line, no_weights):
    argv = ["evaluate", "--model", str(lm_dir), "--task", "next-token", "--methods",
            "decomposition,random", "--option", "integrated_gradients.n_steps=3", "--quiet",
            "--out", str(tmp_path / "out")]
    assert one_line(argv) == ("--option 'integrated_gradients.n_steps=3': "
                                       "integrated_gradients is not among --methods "
                                       "(decomposition, random)")


def test_a_missing_data_file_fails_before_the_weights_load(lm_dir, tmp_path, one_line, no_weights):
    missing = tmp_path / "nowhere.txt"
    argv = ["evaluate", "--model", str(lm_dir), "--task", "next-token", "--data", str(missing),
            "--quiet", "--out", str(tmp_path / "out")]
    assert one_line(argv) == f"--data {missing}: no such file (or use rotten_tomatoes)"


def test_the_data_labels_do_not_replace_the_label_tokens(lm_dir, tmp_path, monkeypatch):
    """The gold labels of a labelled file are the examples' labels; the job's ``labels`` stay
    the prompt's label tokens (``None``: the default ones)."""
    from captum_ffb.evaluation import evaluate as evaluate_module

    jobs = []
    original = evaluate_module.EvaluationJob

    def spy(*args, **kwargs):
        job = original(*args, **kwargs)
        jobs.append(job)
        return job

    monkeypatch.setattr(evaluate_module, "EvaluationJob", spy)
    data = tmp_path / "texts.csv"
    data.write_text("text,label\nthe cat sat,1\na dog ran,0\n")
    evaluate(str(lm_dir), "next-token", data, "random", "eraser", tmp_path / "out")
    assert len(jobs) == 1 and jobs[0].labels is None
    assert [e.label for e in jobs[0].examples] == [1, 0]


@pytest.mark.parametrize("value", [20, 0.5, 1e-3, True, None, "mean", "20", "true", "", "a=b c",
                                   '"quoted"', [1, 2], {"k": 1}])
def test_option_text_reads_back(value):
    from captum_ffb.cli.evaluate import parse_options
    from captum_ffb.evaluation.methods import format_option, option_items, parse_option

    item = format_option("integrated_gradients", "n_steps", value)
    assert item.startswith("integrated_gradients.n_steps=")
    assert parse_option(item) == ("integrated_gradients", "n_steps", value)
    options = {"integrated_gradients": {"n_steps": value, "memory_budget": 7},
               "kernel_shap": {"n_samples": value}}
    assert option_items(options) == [item, "integrated_gradients.memory_budget=7",
                                     format_option("kernel_shap", "n_samples", value)]
    assert parse_options(option_items(options)) == options


def test_option_grammar():
    from captum_ffb.evaluation.methods import OPTION_SYNTAX, parse_option

    assert parse_option("decomposition_frozen.reference=mean") == ("decomposition_frozen",
                                                                   "reference", "mean")
    assert parse_option("lime.n_samples=100") == ("lime", "n_samples", 100)
    for bad in ("integrated_gradients", "integrated_gradients.n_steps", "integrated_gradients=3",
                ".n_steps=3", "integrated_gradients.=3", "integrated_gradients.n_steps="):
        with pytest.raises(ValueError, match=f"^write {OPTION_SYNTAX}$"):
            parse_option(bad)
