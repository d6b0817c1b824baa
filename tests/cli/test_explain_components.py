"""``captum-ffb explain --components`` and ``explain_text(components=...)``: the explained output
split over tokens × components, written as PNG, an HTML tab and JSON; and its refusals."""

from __future__ import annotations

import json

import pytest
import torch

from captum_ffb.cli import main
from captum_ffb.explain import explain_text
from captum_ffb.explained.readouts import BinaryDirection
from tests.models import load_saved

TEXT = "the cat sat on the mat because"


def _adds_up(table: dict) -> None:
    """Σ over tokens and components plus Σ bias is the table's value, which is the output's."""
    total = sum(map(sum, table["contributions"])) + sum(table["bias"])
    assert total == pytest.approx(table["value"], abs=1e-4)


def test_components_files_json_and_page(lm_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["explain", TEXT, "--model", str(lm_dir), "--out", str(out), "--components"]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [
        "components.png", "explanation.html", "explanation.json", "explanation.png"]
    assert (out / "components.png").stat().st_size > 1000
    data = json.loads((out / "explanation.json").read_text(encoding="utf-8"))
    table = data["components"]
    assert table["granularity"] == "sublayer"  # --components alone
    assert table["components"] == ["embeddings", "block.0.attention", "block.0.ff", "block.1.attention",
                                   "block.1.ff", "output_head"]
    assert table["tokens"] == data["labels"] and len(table["contributions"]) == len(data["labels"])
    _adds_up(table)
    assert table["value"] == pytest.approx(data["outputs"][0]["value"], abs=1e-5)
    # summed over components, the table gives the output's own contributions
    by_token = torch.tensor(table["contributions"]).sum(1)
    torch.testing.assert_close(by_token, torch.tensor(data["outputs"][0]["contributions"]), atol=1e-5, rtol=0)
    # the page's components tab: every component, the largest entries
    page = (out / "explanation.html").read_text(encoding="utf-8")
    assert '<button id="tab-k">Components</button>' in page and 'id="cmp-map"' in page
    assert all(name in page for name in table["components"])
    assert "http" not in page.split('<script id="data"')[0]
    # the five largest entries, printed after the usual lines
    values = torch.tensor(table["contributions"])
    order = values.abs().flatten().topk(5).indices
    lines = printed.splitlines()
    start = lines.index("  largest direct effects (sublayer), token × component:")
    assert lines[start - 1].startswith("  checked against the forward route")
    for line, flat in zip(lines[start + 1: start + 6], order.tolist()):
        j, c = divmod(flat, values.shape[1])
        assert line == f"    {table['tokens'][j]} × {table['components'][c]}: {float(values[j, c]):+.4f}"


def test_head_granularity_into_json_only(lm_dir, tmp_path):
    out = tmp_path / "out"
    assert main(["explain", TEXT, "--model", str(lm_dir), "--out", str(out), "--components", "head",
                 "--format", "json", "--quiet"]) == 0
    assert [p.name for p in out.iterdir()] == ["explanation.json"]
    table = json.loads((out / "explanation.json").read_text(encoding="utf-8"))["components"]
    assert table["granularity"] == "head" and "block.1.attention.head.3" in table["components"]
    _adds_up(table)


def test_no_components_unless_asked(lm_dir, tmp_path):
    out = tmp_path / "out"
    assert main(["explain", TEXT, "--model", str(lm_dir), "--out", str(out), "--format", "json,html",
                 "--quiet"]) == 0
    assert "components" not in json.loads((out / "explanation.json").read_text(encoding="utf-8"))
    page = (out / "explanation.html").read_text(encoding="utf-8")
    assert 'id="tab-k"' not in page and 'id="cmp-map"' not in page


def test_a_classifier_and_a_base_model_with_a_read_out(classifier_dir, base_dir):
    explanation = explain_text(TEXT, load_saved(classifier_dir), class_index=2, maps=False, components="block")
    table = explanation.components
    assert table.components[0] == "embeddings" and table.components[-1] == "output_head"
    assert float(table.value[0]) == pytest.approx(float(explanation.values[0]), abs=1e-5)
    _adds_up(explanation.to_dict()["components"])
    # a base model reads through its read-out (Post-LN: the norms' β are components too)
    readout = BinaryDirection(torch.randn(32, generator=torch.Generator().manual_seed(0)), "mean", 0.25)
    explanation = explain_text(TEXT, load_saved(base_dir), readout=readout, maps=False, components="sublayer")
    table = explanation.components
    assert "block.0.norm1" in table.components and table.tokens == [explanation.labels]
    assert float(table.value[0]) == pytest.approx(float(explanation.values[0]), abs=1e-5)
    _adds_up(explanation.to_dict()["components"])


def test_library_refusals(lm_dir, base_dir):
    with pytest.raises(ValueError, match="^components explains one output; leave out generate$"):  # its words
        explain_text(TEXT, load_saved(lm_dir), generate=2, components="sublayer")
    with pytest.raises(ValueError, match="needs an output to explain: this base model has none"):
        explain_text(TEXT, load_saved(base_dir), components="sublayer")
    with pytest.raises(ValueError, match="needs an output to explain"):  # checked before loading
        explain_text(TEXT, str(base_dir), components="sublayer")
    with pytest.raises(ValueError, match="granularity must be one of block, sublayer, head"):
        explain_text(TEXT, load_saved(lm_dir), components="rows")


def test_command_line_refusals_come_before_the_weights(lm_dir, base_dir, tmp_path, one_line, no_weights):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat\n")
    assert one_line(["explain", TEXT, "--model", str(lm_dir), "--components", "--generate", "2"]) == (
        "--components explains one output; leave out --generate")
    assert "--components needs an output to explain" in one_line(
        ["explain", TEXT, "--model", str(base_dir), "--components", "block"])
    assert one_line(["explain", "--data", str(corpus), "--model", str(lm_dir), "--components"]) == (
        "--components is for one TEXT; the corpus mode explains each text's prediction")


def test_granularities_match_the_engine():
    from captum_ffb.cli.explain import GRANULARITIES
    from captum_ffb.core.vocabulary import FEATURE_GRANULARITIES

    assert GRANULARITIES == FEATURE_GRANULARITIES["components"]
