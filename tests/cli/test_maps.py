import json

import pytest
import torch

from captum_ffb import supported_architectures
from captum_ffb.cli import main
from captum_ffb.cli._options import parse_formats, parse_layers, parse_scopes
from captum_ffb.explained.models import load_model
from captum_ffb.texts.text import text_maps
from tests.models import WORDS, save_tiny

TEXT = "she loves math rather than engaging in"


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return save_tiny("bert", tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return save_tiny("gpt2", tmp_path_factory.mktemp("models") / "tiny-gpt2")


def _error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("captum-ffb: error: ")
    return err[-1]


def test_writes_png_html_and_json(bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["maps", TEXT, "--model", str(bert_dir), "--out", str(out), "--dpi", "40"]) == 0
    printed = capsys.readouterr().out.splitlines()
    names = sorted(p.name for p in out.iterdir())
    assert names == ["maps.html", "maps.json", "maps_layer00.png", "maps_layer01.png"]
    assert sorted(printed[1:]) == sorted(str(out / name) for name in names)
    assert "largest completeness residual" in printed[0]
    for png in out.glob("*.png"):
        assert png.read_bytes()[:4] == b"\x89PNG"
    assert "ffbView" in (out / "maps.html").read_text(encoding="utf-8")

    data = json.loads((out / "maps.json").read_text())
    expected = text_maps(TEXT, load_model(bert_dir))
    assert data["tokens"] == expected.tokens == ["[CLS]", *TEXT.split(), "[SEP]"]
    assert data["scopes"] == list(expected.scopes) and data["ff_amp_pair"] == ["Atb", "AtbFf"]
    for layer in expected.layers:
        entry = data["layers"][str(layer)]
        for scope in expected.scopes:
            torch.testing.assert_close(torch.tensor(entry["maps"][scope]), expected.maps[layer][scope])
            assert 0 <= entry["completeness_residual"][scope] < 1e-3
        torch.testing.assert_close(torch.tensor(entry["ff_amp"]), expected.ff_amp(layer))


def test_layer_scopes_and_format_options(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["maps", TEXT, "--model", str(gpt2_dir), "--out", str(out), "--layer", "-1",
            "--scopes", "AtbLn,AtbLnFf", "AtbLnFfRes", "--format", "json", "--quiet"]
    assert main(argv) == 0
    assert capsys.readouterr() == ("", "")  # --quiet: no file list, no progress bars
    data = json.loads((out / "maps.json").read_text())
    assert list(data["layers"]) == ["1"] and data["chain"] == "pre_ln"
    assert main([*argv[:-3], "--format", "png,html", "--dpi", "30", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["maps.html", "maps.json", "maps_layer01.png"]
    assert '"layers": [1]' in (out / "maps.html").read_text(encoding="utf-8")
    assert data["scopes"] == ["AtbLn", "AtbLnFf", "AtbLnFfRes"]
    amp = torch.tensor(data["layers"]["1"]["ff_amp"])
    assert torch.all(amp.triu(1) == 0)  # causal: nothing from later tokens
    # without both FF scopes there is no FF-amp
    main(["maps", TEXT, "--model", str(gpt2_dir), "--out", str(out), "--scopes", "Atb", "--format", "json", "--quiet"])
    assert json.loads((out / "maps.json").read_text())["layers"]["0"]["ff_amp"] is None


def test_normalize_chooses_the_figures_colours(bert_dir, tmp_path, monkeypatch, capsys):
    import captum_ffb.viz.figures as figures

    seen = []
    original = figures.plot_maps
    monkeypatch.setattr(figures, "plot_maps", lambda *a, **k: seen.append(k["normalize"]) or original(*a, **k))
    for extra, expected in (([], "exclude-special"), (["--normalize", "row"], "row")):
        assert main(["maps", "the cat sat", "--model", str(bert_dir), "--layer", "0", "--format", "png",
                     "--out", str(tmp_path / expected), "--quiet", *extra]) == 0
        assert seen[-1] == expected and (tmp_path / expected / "maps_layer00.png").exists()
    assert main(["maps", "the cat sat", "--model", str(bert_dir), "--normalize", "max", "--quiet",
                 "--out", str(tmp_path / "x")]) == 2
    capsys.readouterr()


def test_parsers():
    assert parse_formats("PNG, .json") == ["png", "json"]
    assert parse_layers("all") == "all" and parse_layers("0,-1") == [0, -1]
    assert parse_scopes(["Atb,AtbFf", "AtbFfRes"]) == ["Atb", "AtbFf", "AtbFfRes"]
    assert parse_scopes(None) is None


def test_one_line_errors(bert_dir, tmp_path, capsys):
    base = ["--out", str(tmp_path / "x"), "--quiet"]
    assert _error(capsys, ["maps", "   ", *base]).endswith("the text is empty")
    assert "unknown format 'pdf'" in _error(capsys, ["maps", "hi", "--format", "png,pdf", *base])
    assert "--layer takes an integer" in _error(capsys, ["maps", "hi", "--layer", "first", *base])
    assert "no model folder at ./missing" in _error(capsys, ["maps", "hi", "--model", "./missing", *base])
    message = _error(capsys, ["maps", "hi", "--model", str(bert_dir), "--layer", "5", *base])
    assert "layer 5 does not exist: the model has 2 layers" in message
    message = _error(capsys, ["maps", "hi", "--model", str(bert_dir), "--scopes", "AtbLn", *base])
    assert "unknown scope 'AtbLn'" in message
    too_long = " ".join(WORDS * 3)
    message = _error(capsys, ["maps", too_long, "--model", str(bert_dir), *base])
    assert "the model takes at most 64" in message
    (tmp_path / "file").write_text("")
    message = _error(capsys, ["maps", "hi", "--model", str(bert_dir), "--out", str(tmp_path / "file")])
    assert "is not a folder" in message
    assert not (tmp_path / "x").exists()  # nothing written on errors


def test_unsupported_architecture_lists_the_supported_ones(tmp_path, capsys):
    from transformers import BertTokenizer, FunnelConfig, FunnelModel

    if "funnel" in supported_architectures():
        pytest.skip("funnel is supported now: pick another unsupported family")
    folder = tmp_path / "funnel"
    FunnelModel(FunnelConfig(vocab_size=60, d_model=16, n_head=2, d_head=8, d_inner=32,
                             block_sizes=[1, 1], num_decoder_layers=1)).save_pretrained(folder)
    from tests.models import wordpiece_tokenizer

    assert isinstance(wordpiece_tokenizer(), BertTokenizer)
    wordpiece_tokenizer().save_pretrained(folder)
    message = _error(capsys, ["maps", "hi", "--model", str(folder), "--quiet"])
    assert "'funnel' is not supported" in message
    assert all(name in message for name in supported_architectures())


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as done:
        main(["maps", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for needle in ("examples:", 'captum-ffb maps "The cat sat on the mat."', "--model", "--layer",
                   "--scopes", "--out", "--format", "maps.html"):
        assert needle in text


@pytest.mark.real_weights
def test_main_job_command_needs_no_flags(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["maps", "Tokyo is the capital of [MASK]."]) == 0
    out = tmp_path / "captum_ffb_maps"
    names = sorted(p.name for p in out.iterdir())
    assert names == ["maps.html", "maps.json"] + [f"maps_layer{i:02d}.png" for i in range(6)]
    data = json.loads((out / "maps.json").read_text())
    assert data["model"] == "all-MiniLM-L6-v2" and "[MASK]" in data["tokens"]
    worst = max(max(layer["completeness_residual"].values()) for layer in data["layers"].values())
    assert worst < 1e-3
