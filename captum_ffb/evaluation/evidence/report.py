r"""The evidence run's result files: ``results.json``, ``results.md`` (:func:`evidence_table`,
:func:`distance_table`), ``results.csv`` and ``examples.csv``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captum_ffb.evaluation.evidence.data import EvidenceExample
from captum_ffb.io.files import write_text


def _completes(method: str) -> bool:
    """Whether a method's ``Σ_j a_j`` is meant to be the explained value (the others: "–")."""
    return method.startswith("decomposition") or method == "attnlrp"


#: Short names of the bundled subsets for table headings.
SHORT = {"blimp_anaphor_gender_agreement": "anaphor gender", "blimp_anaphor_number_agreement": "anaphor number",
         "blimp_determiner_noun_agreement_1": "det.–noun", "blimp_distractor_agreement_relational_noun": "distractor",
         "blimp_npi_present_1": "NPI", "blimp_regular_plural_subject_verb_agreement_1": "plural subj.–verb"}


def _number(value: Any, digits: int = 3) -> str:
    return "–" if value is None or value != value else f"{value:.{digits}f}"


def evidence_table(summary: dict[str, Any]) -> str:
    """The Markdown table: per method the overall MRR ± s.e., top-1, evidence share, token
    share (``Σ tokens / value``: median [min, max], for the methods meant to add up to the
    value), the MRR of each subset and the seconds per example."""
    subsets = [k for k in summary["subsets"] if k != "all"]
    head = ["method", "MRR", "top-1", "evidence share", "Σ tokens / value",
            *[f"{SHORT.get(s, s)} ({summary['subsets'][s]})" for s in subsets], "s / example"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for method, row in summary["methods"].items():
        overall, share = row["all"], row["token_share"]
        token = (f"{_number(share['median'])} [{_number(share['min'])}, {_number(share['max'])}]"
                 if _completes(method) else "–")
        cells = [f"`{method}`", f"{_number(overall['mrr'])} ± {_number(overall['mrr_sem'])}",
                 _number(overall["top1"]), _number(overall["share"]), token,
                 *[_number(row[s]["mrr"]) if s in row else "–" for s in subsets],
                 _number(row["seconds_per_example"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def distance_table(summary: dict[str, Any]) -> str:
    """MRR per distance bucket (tokens between the evidence and the prediction)."""
    buckets = [k for k, v in summary["distances"].items() if v]
    head = ["method", *[f"{k} ({summary['distances'][k]})" for k in buckets]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * len(buckets)]
    for method, row in summary["methods"].items():
        lines.append("| " + " | ".join([f"`{method}`", *[_number(row.get(f"distance {k}", {}).get("mrr"))
                                                            for k in buckets]]) + " |")
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (JSON's ``null``)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def write_evidence_report(summary: dict[str, Any], shards: list[dict[str, np.ndarray]],
                          examples: Sequence[EvidenceExample], folder: Path) -> None:
    """``results.json``, ``results.md``, ``results.csv`` (method × group) and ``examples.csv``
    (one row per example and method) into ``folder``."""
    write_text(folder / "results.json", json.dumps(_finite(summary), indent=2, allow_nan=False, default=str))
    counts = ", ".join(f"{k} {v}" for k, v in summary["subsets"].items() if k != "all")
    skipped = "; ".join(f"{why}: {count}" for why, count in summary.get("skipped", {}).items()) or "none"
    text = (f"# Evidence of next-token predictions\n\nModel `{summary.get('model')}`, split "
            f"`{summary.get('split')}`: {summary['n']} pairs scored ({counts}) of {summary.get('read')} read; "
            f"left out: {skipped}.\n\nMRR of the evidence token (± standard error), top-1, the share of "
            f"|attribution| on it, and `Σ tokens / value` (median [min, max]) for the methods meant to "
            f"add up to the explained contrast; then the MRR per subset.\n\n{evidence_table(summary)}\n\n"
            f"## By distance from the evidence to the prediction (tokens; examples)\n\n{distance_table(summary)}\n")
    write_text(folder / "results.md", text)
    lines = ["method,group,n,mrr,mrr_sem,top1,share"]
    for method, row in summary["methods"].items():
        for group, scores in row.items():
            if isinstance(scores, dict) and "mrr" in scores:
                lines.append(f"{method},{group},{scores['n']},{scores['mrr']:.6f},{scores['mrr_sem']:.6f},"
                             f"{scores['top1']:.6f},{scores['share']:.6f}")
    write_text(folder / "results.csv", "\n".join(lines) + "\n")
    methods = list(summary["methods"])
    rows = ["subset,row,distance,value," + ",".join(f"{m}.rr" for m in methods)]
    for shard in shards:
        for k, position in enumerate(shard["index"].astype(int)):
            e = examples[position]
            rows.append(f"{e.subset},{e.row},{e.distance},{shard['value'][k]:.6f}," +
                        ",".join(f"{shard[f'{m}.rr'][k]:.4f}" for m in methods))
    write_text(folder / "examples.csv", "\n".join(rows) + "\n")
