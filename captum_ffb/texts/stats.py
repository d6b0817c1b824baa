"""The paper's statistics as small pure functions on maps, tensors and arrays.

Conventions shared by every function here:

* A map is ``(n, n)`` with ``map[i, j] = ‖F_i(x_j)‖`` (row ``i`` receives, column ``j`` gives).
* ``token_mask`` ``(n,)`` marks real tokens (1) against padding (0). Padded rows and columns
  are *dropped* (not counted as zeros): a statistic of a padded map equals the statistic of
  the unpadded one.
* ``causal=True`` keeps only the lower triangle including the diagonal (``j ≤ i``): in a
  causal model the upper triangle is zero by construction, and counting those structural
  zeros would inflate every rank correlation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from captum_ffb.texts.text import ff_amplification

__all__ = [
    "PairTable",
    "contextualization_change",
    "correlations",
    "entry_mask",
    "ff_amp_pairs",
    "maps_without_dims",
    "mean_sem",
    "pair_pmi",
    "pearson",
    "smallest_dims",
    "spearman",
]


def entry_mask(n: int, token_mask: Tensor | None = None, causal: bool = False,
               diagonal: bool = True) -> Tensor:
    r"""The ``(n, n)`` boolean mask of map entries a statistic uses.

    Args:
        n (int): the map size.
        token_mask (Tensor, optional): ``(n,)``, non-zero for real tokens; padded rows and
                    columns are left out.
        causal (bool): keep only ``j ≤ i``.
        diagonal (bool): keep the diagonal ``i = j`` (same-position pairs).
    """
    keep = torch.ones(n, n, dtype=torch.bool)
    if token_mask is not None:
        real = torch.as_tensor(token_mask).reshape(-1)[:n].to("cpu") != 0
        keep &= real[:, None] & real[None, :]
    if causal:
        keep &= torch.ones(n, n, dtype=torch.bool).tril()
    if not diagonal:
        keep &= ~torch.eye(n, dtype=torch.bool)
    return keep


def pearson(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Pearson's r of two equally long vectors; NaN when either is constant or too short."""
    a = np.asarray(x, dtype=np.float64).ravel()
    b = np.asarray(y, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"vectors of different lengths: {a.size} and {b.size}")
    if a.size < 2:
        return math.nan
    a = a - a.mean()
    b = b - b.mean()
    denominator = math.sqrt(float(a @ a) * float(b @ b))
    if denominator == 0.0:
        return math.nan
    return float(np.clip((a @ b) / denominator, -1.0, 1.0))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, tied values sharing their average rank."""
    unique, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    del unique
    return (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman's ρ (Pearson's r of the ranks, ties get their average rank); NaN when
    either vector is constant or has fewer than two entries."""
    a = np.asarray(x, dtype=np.float64).ravel()
    b = np.asarray(y, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"vectors of different lengths: {a.size} and {b.size}")
    if a.size < 2:
        return math.nan
    return pearson(_ranks(a), _ranks(b))


def correlations(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> dict[str, float]:
    """``{"pearson": r, "spearman": ρ}`` of two vectors."""
    return {"pearson": pearson(x, y), "spearman": spearman(x, y)}


def mean_sem(values: Sequence[float] | np.ndarray, *, finite_only: bool = False) -> tuple[float, float]:
    r"""The mean of ``values`` and its standard error, ``s / √n`` (``s`` the sample standard
    deviation, ``ddof = 1``), over examples: how the evaluations report a score.

    Args:
        values (list[float] or numpy.ndarray): the numbers (flattened); a float array keeps its
                    precision.
        finite_only (bool): leave NaN and ±inf out first: the mean and the error of the values
                    where the score is defined (a score undefined on some examples, e.g. Kendall's
                    τ of a constant attribution). Without it a non-finite value makes the mean
                    and the error NaN or ±inf, as numpy computes them.

    Returns:
        ``(mean, sem)`` as floats. With no value (none finite, with ``finite_only``):
        ``(NaN, NaN)``; with one value: ``(value, NaN)``, the error of one value being
        undefined.
    """
    array = np.asarray(values)
    if not np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float64)
    array = array.ravel()
    if finite_only:
        array = array[np.isfinite(array)]
    if array.size == 0:
        return math.nan, math.nan
    sem = float(array.std(ddof=1) / np.sqrt(array.size)) if array.size > 1 else math.nan
    return float(array.mean()), sem


def contextualization_change(
    before: Tensor, after: Tensor, token_mask: Tensor | None = None, causal: bool = False
) -> float:
    r"""``1 − ρ``: Spearman's rank correlation of two flattened ``(n, n)`` maps, subtracted
    from one (0: same ranking of token pairs, 2: reversed).

    Args:
        before (Tensor): the map at the earlier scope ``(n, n)``.
        after (Tensor): the map at the later scope ``(n, n)``.
        token_mask (Tensor, optional): ``(n,)``; padded rows and columns are dropped.
        causal (bool): use only the lower triangle including the diagonal.

    Returns:
        float, NaN when fewer than two entries remain or a map is constant there.
    """
    if before.shape != after.shape or before.dim() != 2 or before.shape[0] != before.shape[1]:
        raise ValueError(
            f"maps must be two (n, n) tensors of one shape; got {tuple(before.shape)} and "
            f"{tuple(after.shape)}"
        )
    keep = entry_mask(before.shape[0], token_mask, causal)
    a = before.detach().to("cpu", torch.float64)[keep].numpy()
    b = after.detach().to("cpu", torch.float64)[keep].numpy()
    return 1.0 - spearman(a, b)


def ff_amp_pairs(
    before: Tensor,
    after: Tensor,
    token_ids: Sequence[int] | Tensor,
    token_mask: Tensor | None = None,
    causal: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""FF-amp scores of one sequence as ``(receiver ids, giver ids, scores)``.

    The FF-amp map is the column-normalised map after FF minus the one before
    (:func:`captum_ffb.texts.text.ff_amplification`); entry ``[i, j]`` is listed with the token
    types ``(w_i, w_j)``. Same-position entries ``i = j``, padding and (for causal models)
    the upper triangle are left out.

    Args:
        before (Tensor): the map before FF ``(n, n)``.
        after (Tensor): the map after FF ``(n, n)``.
        token_ids (list[int] or Tensor): the ``n`` input token ids.
        token_mask (Tensor, optional): ``(n,)``, non-zero for real tokens.
        causal (bool): use only ``j < i``.
    """
    n = before.shape[-1]
    ids = torch.as_tensor(token_ids).reshape(-1).to("cpu", torch.int64)
    if ids.numel() != n:
        raise ValueError(f"{ids.numel()} token ids for a {n} × {n} map")
    if token_mask is not None:
        # normalise columns over real rows only (padded rows are zero in real maps anyway)
        real = (torch.as_tensor(token_mask).reshape(-1).to(before.device) != 0).to(before.dtype)
        before = before * real[:, None] * real[None, :]
        after = after * real[:, None] * real[None, :]
    amp = ff_amplification(before.detach(), after.detach()).to("cpu", torch.float64)
    keep = entry_mask(n, token_mask, causal, diagonal=False)
    rows, cols = keep.nonzero(as_tuple=True)
    return ids[rows].numpy(), ids[cols].numpy(), amp[rows, cols].numpy()


_SHIFT = np.int64(1) << np.int64(31)


@dataclass
class PairTable:
    """Sum and count of a score per ordered token-type pair, mergeable and serialisable.

    Attributes:
        keys (np.ndarray): ``first · 2³¹ + second`` per pair, sorted, unique (int64).
        sums (np.ndarray): summed scores (float64).
        counts (np.ndarray): occurrences (int64).
    """

    keys: np.ndarray
    sums: np.ndarray
    counts: np.ndarray

    @classmethod
    def empty(cls) -> PairTable:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.int64))

    @classmethod
    def from_pairs(cls, first: np.ndarray, second: np.ndarray, scores: np.ndarray) -> PairTable:
        """Group ``scores`` by the pair ``(first[k], second[k])``."""
        first = np.asarray(first, np.int64)
        second = np.asarray(second, np.int64)
        if first.size and (first.min() < 0 or second.min() < 0 or max(first.max(), second.max()) >= _SHIFT):
            raise ValueError("token ids must lie in [0, 2**31)")
        keys = first * _SHIFT + second
        return cls._group(keys, np.asarray(scores, np.float64), np.ones(keys.size, np.int64))

    @classmethod
    def _group(cls, keys: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> PairTable:
        unique, inverse = np.unique(keys, return_inverse=True)
        return cls(
            unique,
            np.bincount(inverse, weights=sums, minlength=unique.size).astype(np.float64),
            np.bincount(inverse, weights=counts, minlength=unique.size).astype(np.int64),
        )

    @classmethod
    def merge(cls, tables: Iterable[PairTable]) -> PairTable:
        """One table holding the sums and counts of all ``tables``."""
        tables = list(tables)
        if not tables:
            return cls.empty()
        return cls._group(
            np.concatenate([t.keys for t in tables]),
            np.concatenate([t.sums for t in tables]),
            np.concatenate([t.counts for t in tables]),
        )

    def __len__(self) -> int:
        return int(self.keys.size)

    @property
    def first(self) -> np.ndarray:
        return self.keys // _SHIFT

    @property
    def second(self) -> np.ndarray:
        return self.keys % _SHIFT

    def means(self, min_count: int = 2, exclude: Iterable[int] = ()) -> PairTable:
        """The pairs seen at least ``min_count`` times and holding no id of ``exclude``,
        with ``sums`` replaced by the mean score."""
        keep = self.counts >= min_count
        banned = np.asarray(sorted(set(exclude)), np.int64)
        if banned.size:
            keep &= ~np.isin(self.first, banned) & ~np.isin(self.second, banned)
        counts = self.counts[keep]
        return PairTable(self.keys[keep], self.sums[keep] / np.maximum(counts, 1), counts)

    def top(self, k: int) -> list[tuple[int, int, float, int]]:
        """The ``k`` largest entries as ``(first, second, value, count)``, largest first
        (ties broken by the pair's ids, so the order is deterministic)."""
        order = np.lexsort((self.keys, -self.sums))[:k]
        return [
            (int(self.first[i]), int(self.second[i]), float(self.sums[i]), int(self.counts[i]))
            for i in order
        ]


def smallest_dims(gamma: Tensor, fraction: float = 0.01) -> Tensor:
    r"""Indices of the ``⌊fraction · d⌋`` dimensions with the smallest norm weight γ
    (at least one; ties go to the lower index), sorted.

    Args:
        gamma (Tensor): ``(d,)`` the norm's weight.
        fraction (float): share of dimensions, in ``(0, 1)``.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie in (0, 1); got {fraction}")
    gamma = torch.as_tensor(gamma).detach().reshape(-1).to("cpu", torch.float64)
    count = max(1, int(math.floor(fraction * gamma.numel() + 1e-9)))
    order = torch.argsort(gamma, stable=True)
    return order[:count].sort().values


def maps_without_dims(terms: Tensor, dims: Tensor | Sequence[int],
                      token_mask: Tensor | None = None) -> Tensor:
    r"""Maps ``‖F_i(x_j)‖`` with the norm taken over every dimension except ``dims``.

    Args:
        terms (Tensor): ``(..., n, n, d)`` decomposition terms.
        dims (Tensor or list[int]): dimensions to ignore.
        token_mask (Tensor, optional): ``(..., n)``; padded rows and columns are zeroed.
    """
    keep = torch.ones(terms.shape[-1], dtype=torch.bool, device=terms.device)
    keep[torch.as_tensor(dims, dtype=torch.long, device=terms.device)] = False
    maps = torch.linalg.vector_norm(terms[..., keep], dim=-1)
    if token_mask is not None:
        mask = (torch.as_tensor(token_mask, device=maps.device) != 0).to(maps.dtype)
        maps = maps * mask[..., :, None] * mask[..., None, :]
    return maps


def pair_pmi(
    documents: Iterable[Iterable[int]],
    first: np.ndarray,
    second: np.ndarray,
) -> np.ndarray:
    r"""Document-level PMI of token-type pairs:
    ``log(N · c(a, b) / (c(a) · c(b)))``, with ``c`` the number of the ``N`` documents
    (sentences) holding the type(s). Pairs never seen together get NaN.

    Args:
        documents (iterable of iterables of int): token ids per document.
        first (np.ndarray): first ids of the pairs.
        second (np.ndarray): second ids of the pairs.
    """
    holders: dict[int, set[int]] = {}
    n_docs = 0
    for doc, ids in enumerate(documents):
        n_docs += 1
        for token in set(int(t) for t in ids):
            holders.setdefault(token, set()).add(doc)
    out = np.full(len(first), np.nan)
    for k, (a, b) in enumerate(zip(np.asarray(first).tolist(), np.asarray(second).tolist())):
        sa, sb = holders.get(a), holders.get(b)
        if not sa or not sb:
            continue
        both = len(sa & sb) if len(sa) <= len(sb) else len(sb & sa)
        if both:
            out[k] = math.log(n_docs * both / (len(sa) * len(sb)))
    return out
