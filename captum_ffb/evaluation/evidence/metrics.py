r"""The evidence scores: per example the reciprocal rank, top-1 and share of the evidence
(:func:`reciprocal_ranks`), and their summary per method, subset and distance
(:func:`summarise_evidence`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from captum_ffb.evaluation.evidence.data import EvidenceExample
from captum_ffb.texts.stats import mean_sem

#: Distance buckets of the tables (tokens between the evidence and the prediction).
DISTANCE_BUCKETS = ((0, 0), (1, 1), (2, 3), (4, 7), (8, None))


def reciprocal_ranks(attributions: Tensor, mask: Tensor, evidence: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""Reciprocal rank, top-1 and share of the evidence per row.

    Args:
        attributions (Tensor): ``(B, n)``, larger = more relevant.
        mask (Tensor): ``(B, n)`` 1 for the tokens ranked (the prefix's real tokens).
        evidence (Tensor): ``(B, n)`` bool, the evidence positions.

    Returns:
        ``(rr, top1, share)``, each ``(B,)``: a tie counts at its mean rank.
    """
    real = mask.bool()
    a = attributions.float().masked_fill(~real, float("-inf"))
    rr, top1 = [], []
    for row in range(a.shape[0]):
        values = a[row, real[row]]
        best = None
        for position in torch.nonzero(evidence[row] & real[row]).flatten().tolist():
            v = a[row, position]
            above = int((values > v).sum())
            ties = int((values == v).sum()) - 1
            rank = 1 + above + ties / 2
            best = rank if best is None else min(best, rank)
        rr.append(1.0 / best)
        top1.append(1.0 if best == 1 else 0.0)
    magnitude = attributions.float().abs() * real
    share = (magnitude * evidence).sum(1) / magnitude.sum(1).clamp_min(1e-30)
    return torch.tensor(rr), torch.tensor(top1), share.cpu()


def _bucket(distance: int) -> str:
    """The name of the :data:`DISTANCE_BUCKETS` bucket ``distance`` falls in (``"2-3"``)."""
    for low, high in DISTANCE_BUCKETS:
        if distance >= low and (high is None or distance <= high):
            return str(low) if low == high else (f"{low}+" if high is None else f"{low}-{high}")
    return "?"


def summarise_evidence(shards: list[dict[str, np.ndarray]], examples: Sequence[EvidenceExample],
                       methods: Sequence[str]) -> dict[str, Any]:
    r"""Per method: MRR (± standard error), top-1 and share overall, per subset and per
    distance bucket; the token share ``Σ_j a_j / value`` (median, min, max) and seconds per
    example."""
    index = np.concatenate([s["index"] for s in shards]).astype(int)
    subsets = np.array([examples[k].subset for k in index])
    buckets = np.array([_bucket(examples[k].distance) for k in index])
    groups = {"all": np.ones(len(index), dtype=bool)}
    groups.update({name: subsets == name for name in sorted(set(subsets))})
    by_distance = {name: buckets == name for name in dict.fromkeys(_bucket(low) for low, _ in DISTANCE_BUCKETS)}
    summary: dict[str, Any] = {"n": int(len(index)), "subsets": {k: int(v.sum()) for k, v in groups.items()},
                               "distances": {k: int(v.sum()) for k, v in by_distance.items()}, "methods": {}}
    for method in methods:
        values = {key: np.concatenate([s[f"{method}.{key}"] for s in shards])
                  for key in ("rr", "top1", "share", "token_share")}
        row: dict[str, Any] = {}
        for name, chosen in {**groups, **{f"distance {k}": v for k, v in by_distance.items()}}.items():
            if not chosen.any():
                continue
            mrr, sem = mean_sem(values["rr"][chosen])
            row[name] = {"mrr": mrr, "mrr_sem": sem, "top1": float(values["top1"][chosen].mean()),
                         "share": float(values["share"][chosen].mean()), "n": int(chosen.sum())}
        ts = values["token_share"]
        row["token_share"] = {"median": float(np.median(ts)), "min": float(ts.min()), "max": float(ts.max())}
        seconds = sum(float(s[f"{method}.seconds"].sum()) for s in shards)
        row["seconds_per_example"] = seconds / max(len(index), 1)
        summary["methods"][method] = row
    return summary
