"""The tested version ranges: declared once (captum_ffb/versions.py) and in setup.cfg alike, and
a family whose modules changed in an installed version ends in one line, not a hook's error."""

from __future__ import annotations

import configparser
import importlib
from pathlib import Path

import pytest
import torch

from captum_ffb import LayerNormDecomposition, NormDecomposition, _private
from captum_ffb.cli import main
from captum_ffb.core import versions
from captum_ffb.core.versions import UnsupportedVersionError
from captum_ffb.engine import block as block_module
from tests.models import TINY_MODELS, save_tiny, tiny_task_model, token_ids

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.smoke


def _install_requires() -> dict[str, str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = [line.strip() for line in config["options"]["install_requires"].splitlines()]
    found = {}
    for line in lines:
        if line and not line.startswith("#"):
            name = line.split(">")[0].split("<")[0].split("=")[0].strip()
            found[name] = line
    return found


def test_setup_cfg_declares_the_tested_ranges():
    declared = _install_requires()
    for distribution in versions.TESTED:
        assert declared[distribution] == versions.requirement(distribution)


def test_ranges_and_requirements_read_as_written():
    low, high = versions.TESTED["transformers"]
    major, minor = (int(part) for part in high.split(".")[:2])
    assert versions.requirement("transformers") == f"transformers>={low},<{major}.{minor + 1}"
    assert versions.in_tested_range("torch", "2.13.0+cpu") and versions.in_tested_range("torch", "2.6.0")
    assert not versions.in_tested_range("torch", "2.5.1")
    assert versions.in_tested_range("transformers", "5.24.3")
    assert not versions.in_tested_range("transformers", "5.25.0.dev0")
    assert not versions.in_tested_range("transformers", "4.57.1")
    assert versions.installed_version("surely-not-an-installed-package") is None
    # what this suite runs on must be tested
    for distribution in versions.TESTED:
        assert versions.in_tested_range(distribution), (distribution, versions.installed_version(distribution))


def test_the_error_names_family_version_and_range(monkeypatch):
    monkeypatch.setattr(versions, "installed_version", lambda name: "5.99.0")
    message = str(UnsupportedVersionError("gptj", "GPTJAttention lost its method '_attn'"))
    assert "\n" not in message
    assert message.startswith("gptj: GPTJAttention lost its method '_attn' in transformers 5.99.0 (outside")
    assert versions.tested_range("transformers") in message
    assert versions.requirement("transformers") in message and "captum-ffb env" in message


def _without_any_attention_route(monkeypatch):
    """As if the installed transformers moved GPT-J's attention away from both routes we know:
    its modeling file offers no attention interface and the module lacks ``_attn``."""
    for module in (block_module, _private):
        monkeypatch.setattr(module, "model_eager_attention", lambda module: None)
    monkeypatch.setattr(versions, "installed_version", lambda name: "5.99.0")
    model = tiny_task_model("gptj")
    for layer in model.transformer.h:
        if hasattr(type(layer.attn), "_attn"):
            monkeypatch.delattr(type(layer.attn), "_attn")
    return model


def test_a_family_whose_attention_moved_is_refused_in_one_line(monkeypatch):
    model = _without_any_attention_route(monkeypatch)
    ids = token_ids()
    with pytest.raises(UnsupportedVersionError, match=r"^gptj: GPTJAttention neither calls .* "
                       r"transformers 5\.99\.0 \(outside the tested range"):
        LayerNormDecomposition(model, model.transformer.h[0]).attribute(ids)
    with pytest.raises(UnsupportedVersionError, match="^gptj: "):
        NormDecomposition(model).attribute(ids, target=3)


def test_the_cli_prints_that_line(monkeypatch, tmp_path, capsys):
    folder = save_tiny("gptj", tmp_path / "model")
    for module in (block_module, _private):
        monkeypatch.setattr(module, "model_eager_attention", lambda module: None)
    monkeypatch.setattr(versions, "installed_version", lambda name: "5.99.0")
    from transformers.models.gptj import modeling_gptj

    if hasattr(modeling_gptj.GPTJAttention, "_attn"):
        monkeypatch.delattr(modeling_gptj.GPTJAttention, "_attn")
    capsys.readouterr()
    code = main(["maps", "the cat sat on the mat .", "--model", str(folder), "--out",
                 str(tmp_path / "out"), "--format", "json", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("captum-ffb: error: gptj: GPTJAttention neither calls")
    assert "5.99.0" in err[0] and "Traceback" not in err[0]


def test_attention_that_records_nothing_is_refused_in_one_line(monkeypatch):
    """A family whose attention stopped calling the interface (and names no method)."""
    capture = importlib.import_module("captum_ffb.engine.capture")  # the package exports a function of that name
    monkeypatch.setattr(capture._Recorder, "finish", _finish_without_probabilities(capture._Recorder.finish))
    model = TINY_MODELS["llama"].build()
    with pytest.raises(UnsupportedVersionError, match=r"^llama: LlamaAttention recorded no attention"):
        LayerNormDecomposition(model, model.layers[0]).attribute(token_ids())


def _finish_without_probabilities(finish):
    def wrapped(self, record, ids):
        finish(self, record, ids)
        record.probs = []

    return wrapped


def test_gptj_takes_the_public_interface_where_its_modeling_file_has_one():
    """transformers 5.24 moved GPT-J to the attention interface; before, ``_attn`` records."""
    model = TINY_MODELS["gptj"].build()
    attention = model.h[0].attn
    from captum_ffb.architectures import get_architecture

    chosen = block_module.attention_method(attention, get_architecture("gptj"))
    if block_module.model_eager_attention(attention) is not None:
        assert chosen is None
    else:
        assert chosen == "_attn"
    dec = LayerNormDecomposition(model, model.h[0]).decompose(token_ids())
    with torch.no_grad():
        assert dec.terms.abs().sum() > 0
