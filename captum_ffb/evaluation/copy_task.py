"""A synthetic task with a known answer: copying a repeated random sequence.

A sequence of distinct random tokens ``a_0 … a_{L−1}`` is followed by its first ``m``
tokens again; the model should predict ``a_m`` at the last position (induction: the current
token ``a_{m−1}`` occurred before at position ``m − 1``, and the token after it, at position
``m``, is the answer). A faithful attribution of the next-token logit should rank those
positions (the answer's earlier occurrence, and the current token's) high.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class CopyTask:
    r"""Repeated random sequences with their known answers.

    Attributes:
        input_ids (Tensor): ``(N, L + m)`` token ids: ``prefix, a_0 … a_{L−1}, a_0 … a_{m−1}``.
        targets (Tensor): ``(N,)`` the token to predict next, ``a_m``.
        answer_positions (Tensor): ``(N,)`` where ``a_m`` occurred before (the token after
                    the earlier occurrence of the current token).
        previous_positions (Tensor): ``(N,)`` the earlier occurrence of the current token
                    ``a_{m−1}`` (``answer_positions − 1``).
    """

    input_ids: Tensor
    targets: Tensor
    answer_positions: Tensor
    previous_positions: Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def copy_task(
    vocabulary: int | Any,
    n_sequences: int = 32,
    length: int = 8,
    repeated: int | None = None,
    seed: int = 0,
    prefix: list[int] | tuple[int, ...] = (),
    exclude: list[int] | tuple[int, ...] | None = None,
) -> CopyTask:
    r"""Repeated random token sequences with the position of the known answer.

    Args:
        vocabulary (int or tokenizer): the number of token ids, or a tokenizer (its
                    ``len()``; its special ids are left out).
        n_sequences (int): how many sequences.
        length (int): ``L``, the random sequence's length (distinct tokens).
        repeated (int, optional): ``m``, how many of its tokens are repeated (``1 ≤ m < L``);
                    ``L // 2`` by default.
        seed (int): the random seed.
        prefix (list[int]): ids put before every sequence (e.g. a BOS token).
        exclude (list[int], optional): ids never drawn (special tokens); a tokenizer's
                    ``all_special_ids`` by default.

    Returns:
        CopyTask

    Examples::

        >>> task = copy_task(tokenizer, n_sequences=16, length=10, prefix=[tokenizer.bos_token_id])
        >>> nd.attribute(task.input_ids, target=task.targets)   # rank task.answer_positions?
    """
    if isinstance(vocabulary, int):
        size, special = vocabulary, []
    else:
        size, special = len(vocabulary), list(getattr(vocabulary, "all_special_ids", []) or [])
    banned = set(special if exclude is None else exclude)
    allowed = torch.tensor([t for t in range(size) if t not in banned])
    if len(allowed) < length:
        raise ValueError(f"a sequence of {length} distinct tokens needs at least {length} allowed ids")
    m = length // 2 if repeated is None else int(repeated)
    if not 1 <= m < length:
        raise ValueError(f"repeated must be between 1 and {length - 1}, got {m}")
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_sequences):
        tokens = allowed[torch.randperm(len(allowed), generator=generator)[:length]]
        rows.append(torch.cat([torch.tensor(list(prefix), dtype=torch.long), tokens, tokens[:m]]))
    ids = torch.stack(rows)
    start = len(prefix)
    answer = torch.full((n_sequences,), start + m, dtype=torch.long)
    return CopyTask(ids, ids[:, start + m].clone(), answer, answer - 1)
