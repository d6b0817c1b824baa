"""A linear scorer over (zeroable) token embeddings, whose exact attribution is known."""

from __future__ import annotations

import torch
from torch import Tensor

PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIAL = (CLS, SEP)


class LinearScorer:
    """``f(x) = bias + Σ_j <w, e(x_j)>`` over the real, non-zeroed positions.

    The exact attribution of position ``j`` is ``c_j = <w, e(x_j)>``; every call is recorded
    in ``calls`` as ``(input_ids, attention_mask, zeroed)``.
    """

    def __init__(self, vocab: int = 60, dim: int = 5, seed: int = 0, bias: float = 0.25):
        generator = torch.Generator().manual_seed(seed)
        self.embedding = torch.randn(vocab, dim, generator=generator, dtype=torch.float64)
        self.w = torch.randn(dim, generator=generator, dtype=torch.float64)
        self.bias = bias
        self.calls: list[tuple[Tensor, Tensor, Tensor | None]] = []

    def contributions(self, input_ids: Tensor) -> Tensor:
        return self.embedding[input_ids] @ self.w

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, zeroed: Tensor | None = None) -> Tensor:
        self.calls.append((input_ids.clone(), attention_mask.clone(),
                           None if zeroed is None else zeroed.clone()))
        embeds = self.embedding[input_ids]
        if zeroed is not None:
            embeds = embeds.masked_fill(zeroed.unsqueeze(-1), 0.0)
        return self.bias + ((embeds @ self.w) * attention_mask).sum(dim=1)


def batch(rows: list[list[int]], side: str = "right") -> tuple[Tensor, Tensor]:
    """Pad id lists to one width on ``side``; returns ``input_ids`` and ``attention_mask``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        ids[i, span] = torch.tensor(row)
        mask[i, span] = 1
    return ids, mask


def sentence(n_free: int, seed: int) -> list[int]:
    """``[CLS] w_1 … w_n [SEP]`` with distinct random word ids (≥ 4)."""
    generator = torch.Generator().manual_seed(seed)
    words = (torch.randperm(56, generator=generator)[:n_free] + 4).tolist()
    return [CLS, *words, SEP]
