"""The corpus runner on tiny models: agreement with direct computation, Pre-LN extras,
resuming, determinism and skipped lines."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from captum_ffb import LayerNormDecomposition
from captum_ffb.analysis import AnalysisConfig, analyze_corpus, measures_for
from captum_ffb.analysis.report import paper_checks, write_report
from captum_ffb.analysis.stats import contextualization_change
from tests.models import CORPUS_LINES

CONFIG = dict(batch_size=3, mask_rate=0.0, max_tokens=20, ablation_fraction=0.1, min_count=1)


def _run(loaded, out, **changes):
    return analyze_corpus(loaded, CORPUS_LINES, out, AnalysisConfig(**{**CONFIG, **changes}),
                          show_progress=False)


def _index(summary, kind, label):
    return next(k for k, m in enumerate(summary["measures"])
                if m["kind"] == kind and m["label"] == label)


def test_measures_follow_the_paper():
    post = measures_for("post_ln", ("Atb", "AtbFf", "AtbFfRes", "AtbFfResLn"), ("Atb", "AtbFf"))
    assert [(m.kind, m.label, m.source, m.target) for m in post[:6]] == [
        ("consecutive", "+FF", "Atb", "AtbFf"),
        ("consecutive", "+RES", "AtbFf", "AtbFfRes"),
        ("consecutive", "+LN", "AtbFfRes", "AtbFfResLn"),
        ("relative", "+FF", "Atb", "AtbFf"),
        ("relative", "FF+RES", "Atb", "AtbFfRes"),
        ("relative", "FF+RES+LN", "Atb", "AtbFfResLn"),
    ]
    pre = measures_for("pre_ln", ("Atb", "AtbLn", "AtbLnFf", "AtbLnFfRes"), ("AtbLn", "AtbLnFf"))
    assert [m.label for m in pre if m.kind == "consecutive"] == [
        "+LN", "+FF", "+RES", "+LN (next LN1)"]
    assert [(m.label, m.source, m.target) for m in pre if m.kind == "relative"] == [
        ("+FF", "AtbLn", "AtbLnFf"), ("FF+RES", "AtbLn", "AtbLnFfRes"),
        ("FF+RES+LN", "AtbLn", "AtbLnFfResLn")]


def test_batches_are_sorted_by_length_and_fit_the_memory_budget():
    from captum_ffb.analysis.corpus import PreparedSequence
    from captum_ffb.analysis.runner import plan_batches

    sequences = [PreparedSequence(k, [0] * n, [False] * n) for k, n in enumerate([3, 10, 3, 5])]
    assert plan_batches(sequences, 2) == [[0, 2], [3, 1]]
    # 3 · 5² = 75 fits 80 bytes, 4 · 10² does not; 10 alone runs even over the budget
    assert plan_batches(sequences, 4, bytes_per_cell=1, budget=80) == [[0, 2, 3], [1]]
    assert plan_batches(sequences, 4, bytes_per_cell=1, budget=20) == [[0, 2], [3], [1]]


def _direct_maps(loaded, line, layer):
    ids = torch.tensor([loaded.tokenizer(line)["input_ids"]])
    lnd = LayerNormDecomposition(loaded.model, loaded.blocks[layer])
    return lnd.attribute(ids, scope=list(lnd.scopes))


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_runner_agrees_with_one_sequence_at_a_time(tiny, tmp_path, name):
    loaded = tiny(name)
    summary = _run(loaded, tmp_path)
    causal = name == "gpt2"
    assert summary["causal"] is causal and summary["sequences"] == 8
    per = summary["per_sequence"]
    for measure in ("+FF", "+RES"):
        k = _index(summary, "consecutive", measure)
        m = summary["measures"][k]
        for s in (0, 5):  # a short and a long (padded in its batch) sequence
            line = CORPUS_LINES[per["line"][s] - 1]
            for layer in range(2):
                maps = _direct_maps(loaded, line, layer)
                expected = contextualization_change(maps[m["source"]][0], maps[m["target"]][0],
                                                    causal=causal)
                assert per["changes"][s][layer][k] == pytest.approx(expected, abs=1e-5)


def test_res2_norms_match_the_real_tensors(tiny, tmp_path):
    loaded = tiny("bert")
    summary = _run(loaded, tmp_path)
    block = loaded.blocks[1]
    found = {}
    hooks = [
        block.attention.output.LayerNorm.register_forward_hook(
            lambda m, a, o: found.setdefault("bypass", o)),
        block.output.dense.register_forward_hook(lambda m, a, o: found.setdefault("ff", o)),
    ]
    ff_sum = bypass_sum = tokens = 0.0
    try:
        for line in CORPUS_LINES:
            if not line.strip() or len(loaded.tokenizer(line)["input_ids"]) > 20:
                continue
            found.clear()
            with torch.no_grad():
                loaded.model(torch.tensor([loaded.tokenizer(line)["input_ids"]]))
            ff_sum += float(found["ff"][0].norm(dim=-1).sum())
            bypass_sum += float(found["bypass"][0].norm(dim=-1).sum())
            tokens += found["ff"].shape[1]
    finally:
        for hook in hooks:
            hook.remove()
    norms = summary["layers"][1]["norms"]
    assert norms["ff_output"] == pytest.approx(ff_sum / tokens, rel=1e-4)
    assert norms["bypassed"] == pytest.approx(bypass_sum / tokens, rel=1e-4)
    assert summary["tokens"] == tokens


def test_pre_ln_next_norm_scope_is_complete(tiny, tmp_path):
    summary = _run(tiny("gpt2"), tmp_path)
    assert summary["scopes"][-1] == "AtbLnFfResLn"
    # the completeness residual includes the next LN1 (or ln_f) decomposition
    assert all(layer["completeness_residual_max"] < 1e-4 for layer in summary["layers"])
    assert [layer["outliers"]["norm"] for layer in summary["layers"]] == [
        "next layer's norm1", "final norm"]
    k = _index(summary, "relative", "FF+RES+LN")
    assert all(math.isfinite(layer["changes"][k]["mean"]) for layer in summary["layers"])


def test_ablation_without_dims_changes_only_the_norm(tiny, tmp_path):
    loaded = tiny("bert")
    summary = _run(loaded, tmp_path)
    layer = summary["layers"][0]
    gamma = torch.tensor(layer["outliers"]["gamma"])
    assert layer["outliers"]["ignored_dims"] == torch.argsort(gamma)[:3].sort().values.tolist()
    assert len(layer["outliers"]["random_dims"]) == 3  # 10 % of 32, as many random ones
    assert layer["outliers"]["gamma_vs_ff_out"]["pearson"] == pytest.approx(
        np.corrcoef(layer["outliers"]["gamma"], layer["ff_out_mean_abs"])[0, 1])


def test_resume_loses_and_repeats_nothing(tiny, tmp_path):
    loaded = tiny("bert")
    whole = _run(loaded, tmp_path / "whole", mask_rate=0.2)
    with pytest.raises(KeyboardInterrupt):
        analyze_corpus(loaded, CORPUS_LINES, tmp_path / "cut",
                       AnalysisConfig(**{**CONFIG, "mask_rate": 0.2}), show_progress=False,
                       stop_after=1)
    shards = sorted((tmp_path / "cut" / "shards").glob("*.npz"))
    assert len(shards) == 1
    (tmp_path / "cut" / "shards" / "batch-00001.npz.tmp").write_bytes(b"half-written")
    resumed = _run(loaded, tmp_path / "cut", mask_rate=0.2)
    assert resumed["sequences"] == whole["sequences"] == 8
    assert resumed["per_sequence"] == whole["per_sequence"]
    assert resumed["layers"] == whole["layers"]
    # a damaged shard is recomputed, not trusted
    shards[0].write_bytes(b"garbage")
    again = _run(loaded, tmp_path / "cut", mask_rate=0.2)
    assert again["per_sequence"] == whole["per_sequence"]


def test_other_settings_in_the_same_folder_are_refused(tiny, tmp_path):
    loaded = tiny("bert")
    _run(loaded, tmp_path, seed=1, mask_rate=0.2)
    with pytest.raises(ValueError, match="other settings"):
        _run(loaded, tmp_path, seed=2, mask_rate=0.2)
    changed = analyze_corpus(loaded, CORPUS_LINES, tmp_path, AnalysisConfig(**{**CONFIG, "seed": 2,
                             "mask_rate": 0.2}), show_progress=False, overwrite=True)
    assert changed["settings"]["seed"] == 2


def test_runs_are_deterministic_for_a_seed(tiny, tmp_path):
    loaded = tiny("bert")
    one = _run(loaded, tmp_path / "a", seed=3, mask_rate=0.3)
    two = _run(loaded, tmp_path / "b", seed=3, mask_rate=0.3)
    other = _run(loaded, tmp_path / "c", seed=4, mask_rate=0.3)
    assert one["masked_tokens"] > 0
    assert one["per_sequence"] == two["per_sequence"] and one["layers"] == two["layers"]
    assert one["per_sequence"]["changes"] != other["per_sequence"]["changes"]
    write_report(one, tmp_path / "a", figures=False)
    write_report(two, tmp_path / "b", figures=False)
    for name in ("results.json", "contextualization_change.csv", "ff_amp_top_pairs.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_causal_models_are_not_masked(tiny, tmp_path):
    summary = _run(tiny("gpt2"), tmp_path, mask_rate=0.5)
    assert summary["settings"]["mask_rate_applied"] == 0.0 and summary["masked_tokens"] == 0


def test_skipped_lines_and_max_seqs(tiny, tmp_path):
    summary = _run(tiny("bert"), tmp_path, max_seqs=4)
    assert summary["sequences"] == 4
    assert [(s["line"], s["reason"]) for s in summary["skipped"]] == [(3, "empty")]
    full = _run(tiny("bert"), tmp_path / "full")
    assert ("too long" in {s["reason"] for s in full["skipped"]})
    with pytest.raises(ValueError, match="no usable line"):
        analyze_corpus(tiny("bert"), ["", "  "], tmp_path / "none", show_progress=False)


def test_report_files(tiny, tmp_path):
    summary = _run(tiny("bert"), tmp_path, pmi=True, top_k=5)
    written = write_report(summary, tmp_path)
    for key in ("json", "changes", "pairs", "norms", "outliers", "dims", "pmi", "sequences",
                "skipped", "html", "steps", "relative", "norms", "outliers", "ablation"):
        assert written[key].exists() and written[key].stat().st_size > 0
    data = json.loads((tmp_path / "results.json").read_text(),
                      parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert len(data["layers"]) == 2 and "paper_checks" in data
    assert all(len(layer["ff_amp_top"]) <= 5 for layer in data["layers"])
    assert all("pmi" in layer for layer in data["layers"])
    rows = (tmp_path / "contextualization_change.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + (2 + 1) * len(summary["measures"])
    html = (tmp_path / "report.html").read_text()
    assert "tiny-bert" in html and "data:image/png;base64," in html
    checks = paper_checks(summary)
    assert {c["finding"][:20] for c in checks} >= {"FF's contextualizati", "RES2 bypasses a vect"}


def test_paper_checks_by_hand():
    def layer(ff, ff_res_ln, ratio, r, ablated, random):
        return {
            "changes": [
                {"kind": "consecutive", "label": "+FF", "mean": ff},
                {"kind": "relative", "label": "+FF", "mean": ff},
                {"kind": "relative", "label": "FF+RES", "mean": ff},
                {"kind": "relative", "label": "FF+RES+LN", "mean": ff_res_ln},
                {"kind": "ablation", "label": "x", "mean": ablated},
                {"kind": "ablation_random", "label": "y", "mean": random},
            ],
            "norms": {"bypassed_over_ff": ratio},
            "outliers": {"gamma_vs_ff_out": {"pearson": r}},
        }

    summary = {"layers": [layer(0.2, 0.1, 3.0, -0.5, 0.05, 0.2),
                          layer(0.1, 0.2, 1.5, -0.1, 0.1, 0.1),
                          layer(0.3, 0.1, 2.5, 0.2, 0.3, 0.3)]}
    found = {c["finding"].split(" (")[0]: c for c in paper_checks(summary)}
    cancel = found["FF's contextualization is cancelled by RES and LN"]
    assert (cancel["layers_holding"], cancel["layers"], cancel["holds"]) == (2, 3, True)
    res = found["RES2 bypasses a vector more than twice as large as FF's output"]
    assert (res["layers_holding"], res["holds"]) == (2, True)
    gamma = found["LN's γ shrinks FF's outlier dimensions"]
    assert (gamma["layers_holding"], gamma["holds"]) == (2, True)
    ablation = found["FF's contextualization lives in the smallest-γ dimensions"]
    # one layer of three, but the layer average 0.15 ≤ 0.8 × 0.2
    assert (ablation["layers_holding"], ablation["holds"]) == (1, True)
    assert not any(c["finding"].startswith("FF-amp is not explained") for c in found.values())


@pytest.mark.parametrize("count", [1, 4])
def test_outlier_figure_legend_hides_no_data(count):
    pytest.importorskip("matplotlib")
    from captum_ffb.analysis.report import _outliers_figure

    rng = np.random.default_rng(0)
    layers = [{"layer": k, "ff_in_mean_abs": rng.random(64).tolist(), "ff_out_mean_abs": rng.random(64).tolist(),
               "outliers": {"gamma": rng.random(64).tolist(), "norm": "LN2",
                            "gamma_vs_ff_out": {"pearson": 0.1}}} for k in range(count)]
    fig = _outliers_figure(layers)
    fig.suptitle("a title", fontsize=9)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["|FF input|", "|FF output|", "γ (right axis)"]
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:  # the panels, their γ axes and the empty panels of the grid
        if ax.axison:
            assert not box.overlaps(ax.get_tightbbox(renderer)), ax.get_title()
