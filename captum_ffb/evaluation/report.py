"""Write an evaluation summary as CSV, Markdown, JSON, PNG curves and one offline HTML page."""

from __future__ import annotations

import base64
import csv
import io
import math
from pathlib import Path
from typing import Any

from captum_ffb.io.files import atomic_open, save_figure, write_json, write_text
from captum_ffb.io.pages import escape, page

#: The table columns: (key, heading, "higher" or "lower" is better, or None).
COLUMNS = (
    ("decompx_aopc", "DecompX AOPC", "higher"),
    ("decompx_accuracy", "accuracy after masking", "lower"),
    ("comprehensiveness", "comprehensiveness", "higher"),
    ("sufficiency", "sufficiency", "lower"),
    ("abpc", "ABPC", "higher"),
    *((f"{score}_{scheme}", f"{heading} ({scheme})", better)
      for scheme in ("delete", "zero", "unk")
      for score, heading, better in (("comprehensiveness", "comprehensiveness", "higher"),
                                     ("sufficiency", "sufficiency", "lower"))),
    ("seconds_per_example", "s / example", None),
    ("cost_vs_ig", "cost / IG", None),
    ("peak_mb", "peak extra MB", None),
)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) >= 10 ** -digits or value == 0 else f"{value:.1e}"
    return str(value)


def _table(summary: dict[str, Any]) -> tuple[list[str], list[tuple[str, list[tuple[str, bool]]]]]:
    """The table's headings and, per method, its cells as ``(text, best)``: plain text, which
    :func:`markdown_table` and the HTML page each mark up in their own way."""
    columns = [c for c in COLUMNS if any(c[0] in r for r in summary["rows"])]
    best = {}
    for key, _, better in columns:
        values = [r[key] for r in summary["rows"] if r["method"] != "random"
                  and isinstance(r.get(key), float) and not math.isnan(r[key])]
        if better and values:
            best[key] = max(values) if better == "higher" else min(values)
    headings = ["method"] + [h + (" ↑" if b == "higher" else " ↓" if b == "lower" else "")
                             for _, h, b in columns]
    rows = []
    for row in summary["rows"]:
        cells = []
        for key, _, _ in columns:
            text = _fmt(row.get(key))
            if f"{key}_sem" in row and not math.isnan(row[f"{key}_sem"]):
                text += f" ± {_fmt(row[f'{key}_sem'])}"
            cells.append((text, key in best and row.get(key) == best[key]))
        rows.append((str(row["method"]), cells))
    return headings, rows


def markdown_table(summary: dict[str, Any]) -> str:
    """One row per method; the best value of every score column in bold."""
    headings, rows = _table(summary)
    lines = ["| " + " | ".join(headings) + " |", "|---|" + "---:|" * (len(headings) - 1)]
    for method, cells in rows:
        lines.append(f"| `{method}` | " + " | ".join(f"**{t}**" if best else t for t, best in cells) + " |")
    return "\n".join(lines)


def _html_table(summary: dict[str, Any]) -> tuple[str, str]:
    """The header row's cells and the body rows of the HTML table (methods in ``<code>``, the
    best values in ``<b>``: no Markdown marks)."""
    headings, rows = _table(summary)
    header = "".join(f"<th>{escape(h)}</th>" for h in headings)
    body = "".join(
        f"<tr><td><code>{escape(method)}</code></td>"
        + "".join(f"<td><b>{escape(t)}</b></td>" if best else f"<td>{escape(t)}</td>"
                  for t, best in cells) + "</tr>"
        for method, cells in rows)
    return header, body


def scheme_text(summary: dict[str, Any]) -> str:
    """Kendall's τ between the methods' rankings under each pair of removal schemes (empty
    without the ``schemes`` protocol)."""
    tau = summary.get("scheme_tau")
    if not tau:
        return ""
    lines = ["", f"{SCHEME_CAPTION}:", "", "| scores | schemes | τ |", "|---|---|---:|"]
    lines += [f"| {score} | {pair} | {_fmt(value)} |" for score, pair, value in _scheme_rows(tau)]
    return "\n".join(lines) + "\n"


#: What the schemes' table shows.
SCHEME_CAPTION = ("Kendall's τ between the methods' rankings under two ways of taking tokens out "
                  "(1: the same order; 0: unrelated)")


def _scheme_rows(tau: dict[str, float]) -> list[tuple[str, str, float]]:
    """``(scores, "delete vs zero", τ)`` for each entry of a summary's ``scheme_tau``."""
    rows = []
    for key, value in tau.items():
        score, pair = key.split(" ", 1)
        rows.append((score, pair.replace("~", " vs "), value))
    return rows


def _heading(summary: dict[str, Any]) -> str:
    accuracy = summary.get("accuracy")
    parts = [f"model {summary.get('model')} ({summary.get('model_type')})", f"task {summary.get('task')}",
             f"data {summary.get('data')}", f"{summary['n']} examples",
             f"{summary['players_mean']:.1f} perturbable tokens on average"]
    if accuracy is not None:
        parts.append(f"model accuracy {accuracy:.3f}")
    if summary.get("keep_first"):
        parts.append("first position kept")
    return "; ".join(parts)


def plot_curves(summary: dict[str, Any]) -> Any:
    """The mean curves of every protocol, one panel each, one line per method (``None``
    when no protocol run has curves: ``schemes`` alone)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    curves = summary["curves"]
    if any("decompx" in c for c in curves.values()):
        panels.append(("DecompX: p(ŷ) drop vs % masked", summary["decompx_ratios"], "decompx"))
    if any("comprehensiveness" in c for c in curves.values()):
        panels.append(("ERASER comprehensiveness per bin", summary["eraser_bins"], "comprehensiveness"))
        panels.append(("ERASER sufficiency per bin", summary["eraser_bins"], "sufficiency"))
    if any("abpc_morf" in c for c in curves.values()):
        panels.append(("ABPC: logit, MoRF (solid) / LeRF (dashed)", summary["abpc_fractions"], "abpc"))
    if not panels:
        return None
    figure, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    colours = plt.get_cmap("tab20")
    for ax, (title, x, key) in zip(axes[0], panels):
        for k, (method, c) in enumerate(curves.items()):
            colour = colours(k % 20)
            if key == "abpc":
                ax.plot(x, c["abpc_morf"], color=colour, label=method)
                ax.plot(x, c["abpc_lerf"], color=colour, linestyle="--")
            else:
                ax.plot(x, c[key], color=colour, marker="o", markersize=3, label=method)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("fraction of tokens")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    figure.suptitle(_heading(summary), fontsize=8)
    figure.tight_layout()
    return figure


def _scheme_html(summary: dict[str, Any]) -> str:
    """:func:`scheme_text` as an HTML table (empty without the ``schemes`` protocol)."""
    tau = summary.get("scheme_tau")
    if not tau:
        return ""
    cells = "".join(f"<tr><td>{escape(score)}</td><td>{escape(pair)}</td><td>{escape(_fmt(value))}</td></tr>"
                    for score, pair, value in _scheme_rows(tau))
    return (f"<p>{escape(SCHEME_CAPTION)}</p><table><tr><th>scores</th><th>schemes</th><th>τ</th></tr>"
            f"{cells}</table>")


def write_report(summary: dict[str, Any], out: str | Path) -> list[Path]:
    """``results.json``, ``results.csv``, ``results.md``, ``curves.png`` (with matplotlib)
    and ``report.html`` into ``out``; returns the paths."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    written.append(write_json(folder / "results.json", summary, indent=1, default=float))
    keys = ["method"] + sorted({k for r in summary["rows"] for k in r if k != "method"})
    path = folder / "results.csv"
    with atomic_open(path, newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(summary["rows"])
    written.append(path)
    table = markdown_table(summary)
    written.append(write_text(folder / "results.md", f"{_heading(summary)}\n\n{table}\n{scheme_text(summary)}"))
    image = ""
    try:
        figure = plot_curves(summary)
    except ImportError:
        figure = None
    if figure is not None:
        path = save_figure(figure, folder / "curves.png", dpi=110)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=80)
        image = f'<img alt="curves" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'
        written.append(path)
    header, rows = _html_table(summary)
    body = f"<table><tr>{header}</tr>{rows}</table>{_scheme_html(summary)}{image}"
    html_page = page("Faithfulness", body, header=f'<p class="meta">{escape(_heading(summary))}</p>\n')
    written.append(write_text(folder / "report.html", html_page))
    return written
