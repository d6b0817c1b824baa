r"""Agreement between token-to-token maps: 1 − Spearman ρ, Pearson r and top-k overlap.

Only entries that can carry information are compared: rows and columns of padded tokens are
left out, and for causal models so is the upper triangle (``j > i``), which every method
sets to zero. For each example,

* ``1 − ρ``: one minus Spearman's rank correlation of the two flattened maps (average ranks
  for ties), the paper's "contextualization change" when the two maps are two scopes;
* ``pearson``: Pearson's correlation of the flattened maps;
* ``top-k``: for each row ``i`` with more than ``k`` comparable columns, the share of the
  ``k`` largest entries of ``a[i]`` that are among the ``k`` largest of ``b[i]``, averaged
  over those rows (rows with ``k`` or fewer columns would agree trivially and are skipped).

Correlations of a constant map are undefined and reported as NaN; tables average examples
with NaNs left out.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from captum_ffb.io.files import write_text
from captum_ffb.texts import stats


def _as_batch(maps: Tensor, name: str) -> Tensor:
    if not isinstance(maps, Tensor):
        raise TypeError(f"{name} must be a tensor of maps (n, n) or (batch, n, n)")
    if maps.dim() == 2:
        maps = maps[None]
    if maps.dim() != 3 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(f"{name} must be (n, n) or (batch, n, n) maps, got {tuple(maps.shape)}")
    return maps.detach().double().cpu()


def comparable_entries(
    batch: int, n: int, token_mask: Tensor | None = None, causal: bool = False
) -> Tensor:
    """Boolean ``(B, n, n)``: the entries that are compared (real rows and columns; ``j ≤ i``
    when ``causal``)."""
    keep = torch.ones(batch, n, n, dtype=torch.bool, device="cpu")
    if token_mask is not None:
        mask = token_mask.detach().cpu().bool()
        if mask.dim() == 1:
            mask = mask[None]
        if mask.shape != (batch, n) and mask.shape != (1, n):
            raise ValueError(f"token_mask must be (batch, n) = {(batch, n)}, got {tuple(mask.shape)}")
        keep = keep & mask[:, :, None] & mask[:, None, :]
    if causal:
        keep = keep & torch.ones(n, n, dtype=torch.bool, device="cpu").tril()
    return keep


def _pearson(a: Tensor, b: Tensor) -> float:
    return stats.pearson(a.double().flatten().numpy(), b.double().flatten().numpy())


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's ρ of two tensors, flattened (NaN when either is constant); see
    :func:`captum_ffb.texts.stats.spearman`."""
    return stats.spearman(a.double().flatten().numpy(), b.double().flatten().numpy())


def _topk_overlap(a: Tensor, b: Tensor, keep: Tensor, k: int) -> float:
    shares = []
    for i in range(a.shape[0]):
        cols = torch.nonzero(keep[i], as_tuple=False).flatten()
        if cols.numel() <= k:
            continue
        top_a = set(cols[a[i, cols].topk(k).indices].tolist())
        top_b = set(cols[b[i, cols].topk(k).indices].tolist())
        shares.append(len(top_a & top_b) / k)
    return sum(shares) / len(shares) if shares else math.nan


def compare(
    maps_a: Tensor,
    maps_b: Tensor,
    token_mask: Tensor | None = None,
    causal: bool = False,
    k: int = 3,
) -> dict[str, Tensor]:
    r"""Per-example agreement of two sets of maps.

    Args:
        maps_a (Tensor): ``(n, n)`` or ``(batch, n, n)``.
        maps_b (Tensor): same shape.
        token_mask (Tensor, optional): ``(batch, n)``, nonzero for real tokens.
        causal (bool): leave out the upper triangle ``j > i``.
        k (int): size of the top-k sets.

    Returns:
        ``{"1-spearman": (B,), "pearson": (B,), "top-k": (B,)}`` float64 tensors (NaN where
        undefined).
    """
    a = _as_batch(maps_a, "maps_a")
    b = _as_batch(maps_b, "maps_b")
    if a.shape != b.shape:
        raise ValueError(f"the maps differ in shape: {tuple(a.shape)} and {tuple(b.shape)}")
    if k < 1:
        raise ValueError("k must be positive")
    keep = comparable_entries(a.shape[0], a.shape[1], token_mask, causal)
    keep = keep.expand(a.shape[0], -1, -1)
    out: dict[str, list[float]] = {"1-spearman": [], "pearson": [], "top-k": []}
    for example in range(a.shape[0]):
        sel = keep[example]
        x, y = a[example][sel], b[example][sel]
        rho = spearman(x, y)
        out["1-spearman"].append(1.0 - rho)
        out["pearson"].append(_pearson(x, y))
        out["top-k"].append(_topk_overlap(a[example], b[example], sel, k))
    return {key: torch.tensor(values, dtype=torch.float64, device="cpu") for key, values in out.items()}


def _nanmean(values: Tensor) -> float:
    finite = values[~torch.isnan(values)]
    return float(finite.mean()) if finite.numel() else math.nan


@dataclass
class ComparisonTable:
    r"""Rows of agreement numbers, one per compared pair of methods (and extra keys).

    Attributes:
        rows (list[dict]): each row has the keys of ``columns``.
        columns (list[str]): column names in order.
        k (int): the top-k size used.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    k: int = 3

    def __len__(self) -> int:
        return len(self.rows)

    def extend(self, other: ComparisonTable) -> ComparisonTable:
        """Append another table's rows (columns are merged in order)."""
        for column in other.columns:
            if column not in self.columns:
                self.columns.append(column)
        self.rows.extend(other.rows)
        return self

    def lookup(self, **where: Any) -> dict[str, Any]:
        """The single row whose values match ``where``."""
        found = [r for r in self.rows if all(r.get(key) == value for key, value in where.items())]
        if len(found) != 1:
            raise KeyError(f"{len(found)} rows match {where}")
        return found[0]

    @staticmethod
    def _format(value: Any) -> str:
        if isinstance(value, float):
            if math.isnan(value):
                return "nan"
            text = f"{value:.3f}"
            return "0.000" if text == "-0.000" else text
        return str(value)

    def to_markdown(self) -> str:
        """The table as GitHub Markdown."""
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        for row in self.rows:
            lines.append("| " + " | ".join(self._format(row.get(c, "")) for c in self.columns) + " |")
        return "\n".join(lines) + "\n"

    def to_csv(self, path: str | Path | None = None) -> str:
        """The table as CSV text; also written to ``path`` when given."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            writer.writerow({c: row.get(c, "") for c in self.columns})
        text = buffer.getvalue()
        if path is not None:
            write_text(path, text)
        return text

    def to_pandas(self) -> Any:
        """The table as a ``pandas.DataFrame`` (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=self.columns)

    def __str__(self) -> str:
        return self.to_markdown()


def compare_methods(
    maps: Mapping[str, Tensor],
    reference: str | Sequence[str] | None = None,
    token_mask: Tensor | None = None,
    causal: bool = False,
    k: int = 3,
    extra: Mapping[str, Any] | None = None,
) -> ComparisonTable:
    r"""Agreement of several methods' maps, as a table (averages over the batch).

    Args:
        maps (Mapping[str, Tensor]): method name → maps ``(n, n)`` or ``(batch, n, n)``.
        reference (str or list[str], optional): compare every other method with these;
                    by default every pair of methods once.
        token_mask (Tensor, optional): ``(batch, n)``, nonzero for real tokens.
        causal (bool): leave out the upper triangle.
        k (int): size of the top-k sets.
        extra (Mapping, optional): constant columns put first in every row (e.g. the layer).

    Returns:
        ComparisonTable with columns ``[*extra, "method", "reference", "1-spearman",
        "pearson", "top-k"]`` (the last named ``top{k}``).
    """
    names = list(maps)
    if reference is None:
        pairs = [(names[a], names[b]) for a in range(len(names)) for b in range(a + 1, len(names))]
    else:
        refs = [reference] if isinstance(reference, str) else list(reference)
        missing = [r for r in refs if r not in maps]
        if missing:
            raise ValueError(f"reference {missing[0]!r} is not among the methods {names}")
        pairs = [(name, ref) for ref in refs for name in names if name != ref]
    extra = dict(extra or {})
    topk = f"top{k}"
    table = ComparisonTable(
        columns=[*extra, "method", "reference", "1-spearman", "pearson", topk], k=k
    )
    for name, ref in pairs:
        scores = compare(maps[name], maps[ref], token_mask, causal, k)
        table.rows.append({
            **extra,
            "method": name,
            "reference": ref,
            "1-spearman": _nanmean(scores["1-spearman"]),
            "pearson": _nanmean(scores["pearson"]),
            topk: _nanmean(scores["top-k"]),
        })
    return table
