"""``captum-ffb maps`` and ``captum-ffb explain`` on saved tiny encoder–decoders (T5, Marian)."""

from __future__ import annotations

import json

import pytest
import torch

from captum_ffb import LayerNormDecomposition, NormDecomposition
from captum_ffb.cli import main
from captum_ffb.texts.text import text_maps
from tests.models import load_saved, save_tiny_seq2seq

SOURCE = "the cat sat on the mat"
TARGET = "the dog run fast"


@pytest.fixture(scope="module", params=["marian", "t5-gated"])
def folder(request, tmp_path_factory):
    return save_tiny_seq2seq(tmp_path_factory.mktemp(request.param), request.param)


def test_maps_of_a_source_and_a_target(folder, tmp_path, capsys):
    out = tmp_path / "maps"
    assert main(["maps", f"{SOURCE} ||| {TARGET}", "--model", str(folder), "--out", str(out), "--dpi", "40"]) == 0
    assert "largest completeness residual" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["maps.html", "maps.json", "maps_layer00.png", "maps_layer01.png"]
    data = json.loads((out / "maps.json").read_text())
    n_target, n_source = data["n_target"], data["n_source"]  # the players: [source | target]
    source_tokens = SOURCE.split() + ["</s>"]
    assert data["tokens"][:n_source] == source_tokens
    assert data["tokens"][n_source:] == ["<pad>", *TARGET.split(), "</s>"] and n_target == len(data["tokens"]) - n_source
    assert "Cross" in data["scopes"]
    # the maps equal the layer attribution's, rows of the source empty
    loaded = load_saved(folder)
    enc = loaded.tokenizer(SOURCE, return_tensors="pt")
    decoder_ids = torch.tensor([[0, *loaded.tokenizer(TARGET, add_special_tokens=False).input_ids, 3]])
    blocks = loaded.model.get_decoder().layers if hasattr(loaded.model.get_decoder(), "layers") \
        else loaded.model.get_decoder().block
    lnd = LayerNormDecomposition(loaded.model, blocks[1])
    expected = lnd.attribute(enc.input_ids, scope="Cross", forward_kwargs={
        "attention_mask": enc.attention_mask, "decoder_input_ids": decoder_ids})
    got = torch.tensor(data["layers"]["1"]["maps"]["Cross"])
    torch.testing.assert_close(got[n_source:], expected[0])
    assert got[:n_source].abs().max() == 0
    for residuals in (entry["completeness_residual"] for entry in data["layers"].values()):
        assert max(residuals.values()) < 1e-4


def test_explain_a_forced_target_and_a_generation(folder, tmp_path, capsys):
    out = tmp_path / "explain"
    assert main(["explain", f"{SOURCE} ||| {TARGET}", "--model", str(folder), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "source share" in printed
    assert sorted(p.name for p in out.iterdir()) == ["explanation.html", "explanation.json", "explanation.png"]
    data = json.loads((out / "explanation.json").read_text())
    assert data["explained_tokens"] == [*TARGET.split(), "</s>"]
    assert max(data["delta"]) < 1e-4
    for step, value in enumerate(data["value"]):
        total = sum(data["source"][step]) + sum(data["target"][step]) + data["bias"][step]
        assert abs(total - value) < 1e-4
        assert data["source_share"][step] == pytest.approx(sum(data["source"][step]) / value, rel=1e-4)
    out2 = tmp_path / "generate"
    assert main(["explain", SOURCE, "--model", str(folder), "--generate", "3", "--out", str(out2),
                 "--format", "json", "--route", "forward"]) == 0
    generated = json.loads((out2 / "explanation.json").read_text())
    assert 1 <= len(generated["explained_tokens"]) <= 3 and max(generated["delta"]) < 1e-4


def test_explain_refuses_what_does_not_apply(folder, tmp_path, capsys):
    for argv in (["--class", "1"], ["--components"], ["--generate", "2"]):
        code = main(["explain", f"{SOURCE} ||| {TARGET}", "--model", str(folder), "--out", str(tmp_path / "x"), *argv])
        assert code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("captum-ffb: error: ")


def test_text_maps_needs_a_target_for_an_encoder_decoder(folder):
    loaded = load_saved(folder)
    with pytest.raises(ValueError, match=r"\|\|\|"):
        text_maps(SOURCE, loaded)
    assert NormDecomposition(loaded).engine.segments == ("source", "target")
