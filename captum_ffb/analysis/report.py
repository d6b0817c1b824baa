"""Writing an analysis summary: JSON, CSV tables, PNG figures in the paper's style and a
one-page HTML report."""

from __future__ import annotations

import base64
import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from captum_ffb.analysis.corpus import write_skipped
from captum_ffb.io.files import atomic_open, save_figure, write_json, write_text
from captum_ffb.io.pages import escape, page

__all__ = ["paper_checks", "write_report"]

FILES = {
    "json": "results.json",
    "changes": "contextualization_change.csv",
    "pairs": "ff_amp_top_pairs.csv",
    "norms": "res2_norms.csv",
    "outliers": "ln_outliers.csv",
    "dims": "dimensions.csv",
    "pmi": "pmi.csv",
    "sequences": "per_sequence.csv",
    "skipped": "skipped.csv",
    "html": "report.html",
}
FIGURES = {
    "steps": "fig_contextualization_steps.png",
    "relative": "fig_contextualization_relative.png",
    "norms": "fig_res2_norms.png",
    "outliers": "fig_ln_outliers.png",
    "ablation": "fig_ablation.png",
}


def _cell(value: Any) -> Any:
    """CSV cell: floats with 8 significant digits (results.json keeps full precision)."""
    if isinstance(value, float):
        return format(value, ".8g") if math.isfinite(value) else ""
    return value


def _write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with atomic_open(path, newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in rows:
            writer.writerow([_cell(v) for v in row])


def _change(layer: dict[str, Any], kind: str, label: str | None = None) -> list[dict[str, Any]]:
    return [c for c in layer["changes"] if c["kind"] == kind and (label is None or c["label"] == label)]


def _ff_change(layer: dict[str, Any], kind: str) -> float:
    found = _change(layer, kind)
    if kind in ("consecutive", "relative"):
        found = [c for c in found if c["label"] == "+FF"]
    return found[0]["mean"] if found else math.nan


def _mean(values: Iterable[float]) -> float:
    finite = [v for v in values if isinstance(v, float) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def paper_checks(summary: dict[str, Any]) -> list[dict[str, Any]]:
    r"""The paper's qualitative findings, each tested on this run with a stated criterion.

    Returns:
        a list of ``{"finding", "criterion", "layers_holding", "layers", "holds", "detail",
        "paper"}``.
    """
    layers = summary["layers"]
    checks = [_cancellation_check(layers), _bypass_check(layers), _outlier_check(layers),
              _ablation_check(layers)]
    if all("pmi" in layer for layer in layers):
        checks.append(_pmi_check(layers))
    return checks


def _finite(*values: float) -> bool:
    return all(isinstance(v, float) and math.isfinite(v) for v in values)


def _check(finding: str, criterion: str, flags: list[bool | None], detail: str, paper: str,
           holds: bool | None = None) -> dict[str, Any]:
    """One finding's entry; ``holds``: in most layers, unless the finding is about the layer
    average."""
    known = [f for f in flags if f is not None]
    holding = sum(bool(f) for f in known)
    return {
        "finding": finding, "criterion": criterion, "layers_holding": holding,
        "layers": len(known),
        "holds": (bool(known) and holding * 2 > len(known)) if holds is None else holds,
        "detail": detail, "paper": paper,
    }


def _cancellation_check(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """FF's contextualization cancelled by RES and LN (Fig. 6)."""
    relative = [{c["label"]: c["mean"] for c in _change(layer, "relative")} for layer in layers]
    flags = []
    for r in relative:
        ff, last = r.get("+FF", math.nan), r.get("FF+RES+LN", math.nan)
        flags.append(last < ff if _finite(ff, last) else None)
    return _check(
        "FF's contextualization is cancelled by RES and LN (Fig. 6)",
        "change relative to before FF: FF+RES+LN < +FF",
        flags,
        "layer average +FF {:.3f}, FF+RES {:.3f}, FF+RES+LN {:.3f}".format(
            _mean(r.get("+FF", math.nan) for r in relative),
            _mean(r.get("FF+RES", math.nan) for r in relative),
            _mean(r.get("FF+RES+LN", math.nan) for r in relative),
        ),
        "BERT-base and GPT-2: the change rises through FF and falls back after LN",
    )


def _bypass_check(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """RES2's bypassed vector against FF's output (Fig. 7)."""
    ratios = [layer["norms"]["bypassed_over_ff"] for layer in layers]
    return _check(
        "RES2 bypasses a vector more than twice as large as FF's output (Fig. 7)",
        "mean ‖bypassed‖ / mean ‖FF(x)‖ > 2",
        [r > 2 if _finite(r) else None for r in ratios],
        "ratios " + ", ".join(f"{r:.2f}" for r in ratios),
        "BERT-base and GPT-2: more than 2× in most layers",
    )


def _outlier_check(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """LN's γ against FF's outlier dimensions (Fig. 8)."""
    pearsons = [
        layer["outliers"].get("gamma_vs_ff_out", {}).get("pearson", math.nan) for layer in layers
    ]
    return _check(
        "LN's γ shrinks FF's outlier dimensions (Fig. 8)",
        "Pearson r(γ, mean |FF output|) < 0",
        [p < 0 if _finite(p) else None for p in pearsons],
        "Pearson r " + ", ".join("n/a" if not _finite(p) else f"{p:.2f}" for p in pearsons),
        "high-impact layers: −0.45 to −0.78 (BERTs), −0.22 to −0.59 (GPT-2)",
    )


def _ablation_check(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """FF's change without the smallest-γ dimensions against random ones (§6.2)."""
    plain = [_ff_change(layer, "consecutive") for layer in layers]
    ablated = [_ff_change(layer, "ablation") for layer in layers]
    control = [_ff_change(layer, "ablation_random") for layer in layers]
    average_ablated, average_control = _mean(ablated), _mean(control)
    return _check(
        "FF's contextualization lives in the smallest-γ dimensions (§6.2)",
        "layer average of FF's change without the smallest-γ dimensions ≤ 0.8 × without as "
        "many random ones (layers: the same per layer)",
        [a <= 0.8 * c if _finite(a, c) else None for a, c in zip(ablated, control)],
        f"layer average +FF {_mean(plain):.3f} → {average_ablated:.3f} without the smallest-γ "
        f"dimensions ({average_control:.3f} without random ones)",
        "layer average 0.21 → 0.09 (BERT-base), 0.15 → 0.02 (GPT-2)",
        holds=_finite(average_ablated, average_control) and average_ablated <= 0.8 * average_control,
    )


def _pmi_check(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """FF-amp against co-occurrence (PMI) (§5.2)."""
    rho = [layer["pmi"]["spearman"] for layer in layers]
    return _check(
        "FF-amp is not explained by co-occurrence (PMI) (§5.2)",
        "|Spearman ρ(FF-amp, PMI)| < 0.2",
        [abs(r) < 0.2 if _finite(r) else None for r in rho],
        "ρ " + ", ".join("n/a" if not _finite(r) else f"{r:.2f}" for r in rho),
        "BERT-base: 0.06 to 0.14 (Wikipedia PMI)",
    )


# --------------------------------------------------------------------------- figures
def _bar_layers(ax: Any, layers: Sequence[int], series: dict[str, list[float]], colors: Sequence[str]) -> None:
    import numpy as np

    width = 0.8 / max(len(series), 1)
    x = np.arange(len(layers))
    for k, ((name, values), color) in enumerate(zip(series.items(), colors)):
        shown = [v if math.isfinite(v) else 0.0 for v in values]
        ax.bar(x + (k - (len(series) - 1) / 2) * width, shown, width, label=name, color=color)
    ax.set_xticks(x, [str(layer) for layer in layers])
    ax.set_xlabel("layer")
    ax.grid(axis="y", alpha=0.3)


def _outliers_figure(layers: Sequence[dict[str, Any]]) -> Any:
    """|FF input|, |FF output| and the norm's γ per dimension, one panel per layer; the legend
    below the panels, where it hides no data."""
    import matplotlib.pyplot as plt
    import numpy as np

    cols = min(3, len(layers))
    rows = math.ceil(len(layers) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.6 * rows + 0.4), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(layers):]:
        ax.axis("off")
    handles: list[Any] = []
    for ax, layer in zip(axes.flat, layers):
        dims = np.arange(len(layer["ff_out_mean_abs"]))
        ax.plot(dims, layer["ff_in_mean_abs"], color="tab:blue", lw=0.7, label="|FF input|")
        ax.plot(dims, layer["ff_out_mean_abs"], color="tab:green", lw=0.7, label="|FF output|")
        ax.set_xlabel("dimension")
        twin = ax.twinx()
        twin.plot(dims, layer["outliers"]["gamma"], color="tab:red", lw=0.7, label="γ (right axis)")
        twin.tick_params(axis="y", colors="tab:red")
        r = layer["outliers"]["gamma_vs_ff_out"]["pearson"]
        r_text = "n/a" if r is None or not math.isfinite(r) else f"{r:.2f}"
        ax.set_title(f"layer {layer['layer']}: γ of {layer['outliers']['norm']}, r = {r_text}", fontsize=8)
        if not handles:
            handles = ax.get_lines() + twin.get_lines()
    fig.legend(handles, [h.get_label() for h in handles], loc="outside lower center", ncol=3,
               fontsize=8, frameon=False)
    return fig


def _figures(summary: dict[str, Any], out: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = summary["layers"]
    numbers = [layer["layer"] for layer in layers]
    title = f"{summary['model']} on {summary['source']} ({summary['sequences']} sequences)"
    paths: dict[str, Path] = {}

    def save(fig: Any, key: str, dpi: int = 110) -> None:
        fig.suptitle(title, fontsize=9)
        if fig.get_layout_engine() is None:  # a constrained layout places its legends itself
            fig.tight_layout()
        path = out / FIGURES[key]
        save_figure(fig, path, dpi=dpi, metadata={"Software": None})
        plt.close(fig)
        paths[key] = path

    steps = [m for m in summary["measures"] if m["kind"] == "consecutive"]
    fig, axes = plt.subplots(1, len(steps), figsize=(3.2 * len(steps), 2.8), sharey=True, squeeze=False)
    for ax, step in zip(axes[0], steps):
        values = [_change(layer, "consecutive", step["label"])[0]["mean"] for layer in layers]
        _bar_layers(ax, numbers, {step["label"]: values}, ["tab:blue"])
        ax.set_title(f"{step['label']}\n({step['source']} ↔ {step['target']})", fontsize=9)
    axes[0][0].set_ylabel("1 − Spearman ρ")
    save(fig, "steps")

    relative = [m for m in summary["measures"] if m["kind"] == "relative"]
    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * len(layers), 3.2))
    series = {
        m["label"]: [_change(layer, "relative", m["label"])[0]["mean"] for layer in layers]
        for m in relative
    }
    _bar_layers(ax, numbers, series, ["tab:orange", "tab:purple", "tab:gray", "tab:olive"])
    ax.set_ylabel(f"1 − ρ relative to {summary['ff_pair'][0]}")
    ax.legend(fontsize=8)
    save(fig, "relative")

    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * len(layers), 3.2))
    _bar_layers(ax, numbers, {
        "‖FF(x)‖": [layer["norms"]["ff_output"] for layer in layers],
        "‖x‖ (bypassed by RES2)": [layer["norms"]["bypassed"] for layer in layers],
    }, ["tab:green", "tab:blue"])
    ax.set_ylabel("mean L2 norm")
    ax.legend(fontsize=8)
    save(fig, "norms")

    with_gamma = [layer for layer in layers if "gamma" in layer["outliers"]]
    if with_gamma:
        save(_outliers_figure(with_gamma), "outliers", dpi=80)

    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * len(layers), 3.2))
    _bar_layers(ax, numbers, {
        "+FF": [_ff_change(layer, "consecutive") for layer in layers],
        "without smallest-γ dims": [_ff_change(layer, "ablation") for layer in layers],
        "without random dims": [_ff_change(layer, "ablation_random") for layer in layers],
    }, ["tab:blue", "tab:red", "tab:gray"])
    ax.set_ylabel("1 − ρ of FF")
    ax.legend(fontsize=8)
    save(fig, "ablation")
    return paths


# --------------------------------------------------------------------------- tables
def _tables(summary: dict[str, Any], out: Path) -> None:
    layers = summary["layers"]
    rows = []
    for layer in layers:
        for c in layer["changes"]:
            rows.append([layer["layer"], c["kind"], c["label"], c["source"], c["target"],
                         c["mean"], c["std"], c["n"], c["undefined"]])
    for a in summary["averages"]:
        rows.append(["mean", a["kind"], a["label"], a["source"], a["target"],
                     a["mean_over_layers"], math.nan, len(layers), 0])
    _write_csv(out / FILES["changes"], ["layer", "kind", "label", "from", "to", "mean", "std",
                                        "sequences", "undefined"], rows)
    _write_csv(out / FILES["pairs"], ["layer", "rank", "receiver", "giver", "ff_amp", "count"], (
        [layer["layer"], p["rank"], p["receiver"], p["giver"], p["ff_amp"], p["count"]]
        for layer in layers for p in layer["ff_amp_top"]
    ))
    _write_csv(out / FILES["norms"], ["layer", "ff_output", "bypassed", "bypassed_over_ff"], (
        [layer["layer"], layer["norms"]["ff_output"], layer["norms"]["bypassed"],
         layer["norms"]["bypassed_over_ff"]] for layer in layers
    ))
    rows = []
    for layer in layers:
        o = layer["outliers"]
        corr = o.get("gamma_vs_ff_out", {})
        corr_in = o.get("gamma_vs_ff_in", {})
        rows.append([
            layer["layer"], o["norm"], corr.get("pearson", math.nan), corr.get("spearman", math.nan),
            corr_in.get("pearson", math.nan), corr_in.get("spearman", math.nan),
            " ".join(str(d) for d in o.get("ignored_dims", [])),
            _ff_change(layer, "consecutive"), _ff_change(layer, "ablation"),
            _ff_change(layer, "ablation_random"),
        ])
    _write_csv(out / FILES["outliers"], [
        "layer", "norm", "pearson_gamma_ff_out", "spearman_gamma_ff_out", "pearson_gamma_ff_in",
        "spearman_gamma_ff_in", "ignored_dims", "ff_change", "ff_change_without_smallest_gamma",
        "ff_change_without_random_dims",
    ], rows)
    _write_csv(out / FILES["dims"], ["layer", "dim", "gamma", "ff_out_mean_abs", "ff_in_mean_abs"], (
        [layer["layer"], d, layer["outliers"]["gamma"][d] if "gamma" in layer["outliers"] else math.nan,
         layer["ff_out_mean_abs"][d], layer["ff_in_mean_abs"][d]]
        for layer in layers for d in range(len(layer["ff_out_mean_abs"]))
    ))
    if not all("pmi" in layer for layer in layers):
        (out / FILES["pmi"]).unlink(missing_ok=True)  # from an earlier run with --pmi
    else:
        _write_csv(out / FILES["pmi"], ["layer", "spearman", "pairs", "documents"], (
            [layer["layer"], layer["pmi"]["spearman"], layer["pmi"]["pairs"], layer["pmi"]["documents"]]
            for layer in layers
        ))
    per = summary["per_sequence"]
    measures = summary["measures"]
    _write_csv(out / FILES["sequences"], ["line", "n_tokens", "layer", "kind", "label", "value"], (
        [line, n, index + 1, m["kind"], m["label"], per["changes"][s][index][k]]
        for s, (line, n) in enumerate(zip(per["line"], per["n_tokens"]))
        for index in range(len(summary["layers"]))
        for k, m in enumerate(measures)
    ))
    write_skipped(out / FILES["skipped"], summary["skipped"])


# --------------------------------------------------------------------------- HTML
def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return "–" if not math.isfinite(value) else escape(f"{value:.{digits}f}")
    return escape(value)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _image(figures: dict[str, Path], key: str, caption: str) -> str:
    """A figure embedded as a data URL (empty when it was not drawn)."""
    if key not in figures:
        return ""
    data = base64.b64encode(figures[key].read_bytes()).decode("ascii")
    return (f'<figure><img alt="{escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def _change_table(summary: dict[str, Any]) -> str:
    """Contextualization change per layer and measure, and the mean over layers."""
    measures = summary["measures"]
    rows = [[layer["layer"]] + [layer["changes"][k]["mean"] for k in range(len(measures))]
            for layer in summary["layers"]] + [["mean"] + [a["mean_over_layers"] for a in summary["averages"]]]
    header = ["layer"] + [f"{m['label']}" + (" (rel.)" if m["kind"] == "relative" else "") for m in measures]
    return _table(header, rows)


def _outlier_rows(layers: list[dict[str, Any]]) -> list[list[Any]]:
    """γ against |FF out| per layer, the dimensions ignored and FF's change without them."""
    rows = []
    for layer in layers:
        o = layer["outliers"]
        corr = o.get("gamma_vs_ff_out", {})
        rows.append([
            layer["layer"], o["norm"], corr.get("pearson", math.nan),
            corr.get("spearman", math.nan), " ".join(map(str, o.get("ignored_dims", []))) or "–",
            _ff_change(layer, "consecutive"), _ff_change(layer, "ablation"),
            _ff_change(layer, "ablation_random"),
        ])
    return rows


def _pmi_section(layers: list[dict[str, Any]]) -> str:
    """FF-amp against PMI, when every layer has it."""
    if not all("pmi" in layer for layer in layers):
        return ""
    return "<h2>FF-amp against PMI</h2>" + _table(
        ["layer", "Spearman ρ", "pairs", "documents"],
        [[layer["layer"], layer["pmi"]["spearman"], layer["pmi"]["pairs"], layer["pmi"]["documents"]]
         for layer in layers],
    )


def _html(summary: dict[str, Any], figures: dict[str, Path], checks: list[dict[str, Any]]) -> str:
    layers = summary["layers"]
    settings = summary["settings"]
    skipped: dict[str, int] = {}
    for s in summary["skipped"]:
        skipped[s["reason"]] = skipped.get(s["reason"], 0) + 1

    def image(key: str, caption: str) -> str:
        return _image(figures, key, caption)

    norm_rows = [[layer["layer"], layer["norms"]["ff_output"], layer["norms"]["bypassed"],
                  layer["norms"]["bypassed_over_ff"]] for layer in layers]
    pair_rows = [
        [layer["layer"], "; ".join(
            f"({p['receiver']}, {p['giver']}) {p['ff_amp']:.3f}×{p['count']}"
            for p in layer["ff_amp_top"][:8]
        ) or "–"] for layer in layers
    ]
    check_rows = [[c["finding"], c["criterion"], f"{c['layers_holding']}/{c['layers']}",
                   "yes" if c["holds"] else "no", c["detail"], c["paper"]] for c in checks]
    masking = (f"{settings['mask_rate_applied']:.0%} of non-special tokens masked "
               f"({summary['masked_tokens']} tokens, seed {settings['seed']})"
               if settings["mask_rate_applied"] > 0 else "no masking")
    skipped_text = ", ".join(f"{v} {k}" for k, v in sorted(skipped.items())) or "none"
    body = f"""<p>{escape(summary['model_type'])} ({escape(summary['chain'])}, {"causal" if summary['causal'] else "bidirectional"}),
corpus <b>{escape(summary['source'])}</b>: {escape(summary['sequences'])} sequences, {escape(summary['tokens'])} tokens;
{escape(masking)}; skipped lines: {escape(skipped_text)}. Layers are numbered from 1.</p>
<p class="note">Contextualization change = 1 − Spearman ρ between the flattened maps of two scopes, averaged
over sequences. Padded rows and columns are dropped; for causal models only the lower triangle
(with the diagonal) is used. FF-amp = column-normalised map after FF minus before FF, averaged per
(receiver, giver) subword pair, without same-position pairs, pairs seen fewer than {escape(settings['min_count'])} times
{"" if settings['include_special'] else "and pairs with special tokens"}.
The γ compared with FF's outputs is that of the norm that next reads the FF output; the ablation drops the
⌊{escape(f"{settings['ablation_fraction']:.0%}")} · d⌋ dimensions with the smallest γ from both maps' norms.</p>
<h2>The paper's findings on this run</h2>
{_table(["finding", "criterion", "layers", "holds", "this run", "the paper"], check_rows)}
<h2>Contextualization change</h2>
{image("steps", "Change through each component (consecutive scopes, cf. Fig. 3)")}
{image("relative", "Change relative to the map before FF (cf. Fig. 6)")}
{_change_table(summary)}
<h2>RES2 against FF</h2>
{image("norms", "Mean norm of FF's output and of the vector RES2 bypasses (cf. Fig. 7)")}
{_table(["layer", "‖FF(x)‖", "‖bypassed‖", "ratio"], norm_rows)}
<h2>LN against FF outliers</h2>
{image("outliers", "Mean |FF input|, |FF output| per dimension and γ (cf. Fig. 8)")}
{image("ablation", "FF's change without the smallest-γ dimensions (cf. Fig. 32), and a random control")}
{_table(["layer", "norm", "Pearson r(γ, |FF out|)", "Spearman ρ", "ignored dims", "+FF", "without small-γ", "without random"], _outlier_rows(layers))}
<h2>Most FF-amplified pairs (receiver, giver)</h2>
{_table(["layer", "top pairs: score × count"], pair_rows)}
{_pmi_section(layers)}
<p class="note">Largest relative completeness residual of the decompositions per layer:
{escape(", ".join(f"{layer['completeness_residual_max']:.1e}" for layer in layers))}.
All numbers: results.json and the CSV files beside this page.</p>
"""
    return page(f"Feed-forward contextualization: {summary['model']}", body, style=_STYLE)


#: The report's own rule: one centred column.
_STYLE = """
body { max-width: 1100px; margin: 0 auto; }
"""


def write_report(summary: dict[str, Any], out_dir: str | Path, figures: bool = True) -> dict[str, Path]:
    r"""Write the summary of :func:`~captum_ffb.analysis.analyze_corpus` as files.

    Args:
        summary (dict): the summary.
        out_dir (str or Path): the folder.
        figures (bool): draw the PNG figures (needs matplotlib).

    Returns:
        name → path of every file written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checks = paper_checks(summary)
    full = {k: v for k, v in summary.items() if k != "per_sequence"}
    full["paper_checks"] = checks
    write_json(out / FILES["json"], full, indent=1, ensure_ascii=False)
    _tables(summary, out)
    drawn = _figures(summary, out) if figures else {}
    write_text(out / FILES["html"], _html(summary, drawn, checks))
    written = {key: out / name for key, name in FILES.items() if (out / name).exists()}
    written.update(drawn)
    return written
