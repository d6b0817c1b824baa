"""Positions in a padded batch: position ids, each row's first and last real token, and
padding a list of token id sequences into a batch.

Padding side: causal LMs are padded on the left (every row's last real token is the last
position, where the next token is read) with positions counted from the attention mask; the
others on the right (position ids start at 0 on the first token, as their models expect).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

PADDING_SIDES = ("left", "right")


def position_ids(attention_mask: Tensor) -> Tensor:
    """Position ids ``(B, n)`` counted from the attention mask: 0 on each row's first real
    token, so that left padding does not shift positions (padded positions get 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def real_positions(token_mask: Tensor, where: str) -> Tensor:
    """Each row's ``"first"`` or ``"last"`` real position ``(B,)`` (left or right padding).

    Raises:
        ValueError: when a row has no real token.
    """
    if where not in ("first", "last"):
        raise ValueError(f"where must be 'first' or 'last', got {where!r}")
    n = token_mask.shape[1]
    real = token_mask.bool()
    if not bool(real.any(dim=1).all()):
        raise ValueError("a row of the batch has no real token")
    index = torch.arange(n, device=token_mask.device)
    if where == "last":
        return torch.where(real, index, -1).amax(dim=1)
    return torch.where(real, index, n).amin(dim=1)


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int, side: str = "right"
                  ) -> tuple[Tensor, Tensor]:
    r"""Token id sequences as one batch.

    Args:
        sequences (list of lists of int): the rows (at least one).
        pad_id (int): the id put on padded positions.
        side (str): ``"left"`` (each row ends at the last position: causal LMs) or
                    ``"right"`` (each row starts at position 0).

    Returns:
        ``(input_ids, attention_mask)``, both ``(len(sequences), longest)`` long tensors.
    """
    if side not in PADDING_SIDES:
        raise ValueError(f"side must be one of {PADDING_SIDES}, got {side!r}")
    if not sequences:
        raise ValueError("no sequences to pad")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        n = len(sequence)
        where = slice(width - n, width) if side == "left" else slice(0, n)
        ids[row, where] = torch.as_tensor(list(sequence), dtype=torch.long)
        mask[row, where] = 1
    return ids, mask
