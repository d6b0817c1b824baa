r"""The evidence data: the annotated pairs (the bundled subsets or a CSV of the same columns),
their held-out and selection splits, and each pair tokenised into an :class:`EvidenceExample`
(the evidence word's token positions, the two next tokens contrasted); the copy task's
sequences as examples of the same kind."""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captum_ffb.texts.corpus import read_csv_records

#: The bundled data (see its README for sources and license).
EVIDENCE_DIR = Path(__file__).resolve().parents[1] / "data" / "evidence"
#: The columns an evidence CSV needs.
COLUMNS = ("one_prefix_prefix", "one_prefix_word_good", "one_prefix_word_bad", "target")
#: The splits: rows at positions that are multiples of 5 were used to choose defaults.
SPLITS = ("heldout", "selection", "all")
#: Copy-task subset: lengths of the random sequence (evidence-to-prediction distance L − 2).
COPY_LENGTHS = (4, 8, 16, 32)


def bundled_subsets() -> list[str]:
    """The bundled subsets' names (``"ioi"``, ``"blimp_npi_present_1"``, …), sorted."""
    return sorted(path.stem for path in EVIDENCE_DIR.glob("*.csv"))


@dataclass(frozen=True)
class EvidenceRow:
    """One annotated pair, as read: ``subset``, ``row`` (its position in the file), the
    ``prefix``, the ``good`` and ``bad`` next words and the ``evidence`` word."""

    subset: str
    row: int
    prefix: str
    good: str
    bad: str
    evidence: str


def in_split(row: int, split: str) -> bool:
    """Whether the ``row``-th row of a file belongs to ``split``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    return split == "all" or (row % 5 == 0) == (split == "selection")


def read_evidence(data: str | os.PathLike | Sequence[str] | None = None, split: str = "heldout",
                  n: int | None = None) -> list[EvidenceRow]:
    r"""Annotated pairs from the bundled subsets or a CSV of the same columns.

    Args:
        data: ``None`` (every bundled subset), subset names (:func:`bundled_subsets`, a list
                    or a comma string), or a CSV file with the columns :data:`COLUMNS`.
        split (str): ``"heldout"`` (rows not at multiples of 5, the default), ``"selection"``
                    or ``"all"``; a file of your own is read whole.
        n (int, optional): the first ``n`` rows of the split per subset.

    Returns:
        list[EvidenceRow]
    """
    if data is None or isinstance(data, (list, tuple)) or (
            isinstance(data, str) and not data.endswith(".csv") and not Path(data).exists()):
        names = bundled_subsets() if data is None else (
            [s.strip() for s in data.split(",") if s.strip()] if isinstance(data, str) else list(data))
        unknown = [name for name in names if name not in bundled_subsets() and name != "copy"]
        if unknown:
            raise ValueError(f"unknown evidence subset {unknown[0]!r}; bundled: "
                             f"{', '.join(bundled_subsets())} (and copy), or give a CSV file")
        files = [(EVIDENCE_DIR / f"{name}.csv", split) for name in names if name != "copy"]
    else:
        files = [(Path(data), "all")]
    rows: list[EvidenceRow] = []
    for path, part in files:
        rows += _read_file(path, part, n)
    return rows


def _read_file(path: Path, split: str, n: int | None) -> list[EvidenceRow]:
    if not path.is_file():
        raise FileNotFoundError(f"--data {path}: no such file")
    header, records = read_csv_records(path)
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{path}: missing column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)}; an evidence CSV needs {', '.join(COLUMNS)}")
    out = []
    for k, (line, record) in enumerate(records):
        if not in_split(k, split):
            continue
        if n is not None and len(out) >= n:
            break
        empty = [c for c in COLUMNS if record.get(c) is None]
        if empty:
            raise ValueError(f"{path}: line {line} has no {', '.join(empty)} (too few fields)")
        out.append(EvidenceRow(path.stem, k, record["one_prefix_prefix"], record["one_prefix_word_good"],
                               record["one_prefix_word_bad"], record["target"]))
    return out


@dataclass(frozen=True)
class EvidenceExample:
    """A tokenised pair: ``ids``, the ``good`` and ``bad`` next-token ids, the ``evidence``
    positions, its ``distance`` to the prediction, and where it came from."""

    subset: str
    row: int
    ids: tuple[int, ...]
    good: int
    bad: int
    evidence: tuple[int, ...]

    @property
    def distance(self) -> int:
        return len(self.ids) - 1 - max(self.evidence)


def evidence_example(tokenizer: Any, row: EvidenceRow) -> tuple[EvidenceExample | None, str | None]:
    r"""Tokenise one pair: ``(example, None)``, or ``(None, why it is left out)``.

    Left out: the two words start with the same token (nothing to contrast), the evidence
    word is not in the prefix, or every token of the prefix is evidence (nothing to rank).

    Raises:
        ValueError: the tokenizer merges the evidence word with a neighbour (a token that
                    starts before it, past a space, or runs past its end).
    """
    encoded = tokenizer(row.prefix, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    good = tokenizer(" " + row.good.strip(), add_special_tokens=False)["input_ids"]
    bad = tokenizer(" " + row.bad.strip(), add_special_tokens=False)["input_ids"]
    if not good or not bad or good[0] == bad[0]:
        return None, "the good and bad words start with the same token"
    spans = [m.span() for m in re.finditer(r"(?<!\w)" + re.escape(row.evidence.strip()) + r"(?!\w)", row.prefix)]
    if not spans:
        return None, "the evidence word is not in the prefix"
    ends = [end for _, end in spans]  # the matches do not overlap: starts and ends both ascend
    evidence = []
    for k, (a, b) in enumerate(offsets):
        m = bisect.bisect_right(ends, a)  # the first match that ends after the token starts
        while m < len(spans) and spans[m][0] < b:
            start, end = spans[m]
            if row.prefix[a:start].strip() or b > end:
                raise ValueError(
                    f"{row.subset} row {row.row}: the tokenizer merges the evidence word "
                    f"{row.evidence!r} with its neighbours (token {row.prefix[a:b]!r})")
            evidence.append(k)
            m += 1
    if len(set(evidence)) == len(ids):
        return None, "every token of the prefix is evidence"
    return EvidenceExample(row.subset, row.row, tuple(int(i) for i in ids), int(good[0]), int(bad[0]),
                           tuple(sorted(set(evidence)))), None


def copy_examples(tokenizer: Any, per_length: int = 20, lengths: Sequence[int] = COPY_LENGTHS,
                  seed: int = 0) -> list[EvidenceExample]:
    r"""The copy task as evidence examples: for each length ``L``, random sequences of ``L``
    distinct tokens followed by their first two again; the evidence is the answer's earlier
    occurrence (distance ``L − 2``), the contrast the answer against the token after it."""
    from captum_ffb.evaluation.copy_task import copy_task

    words = [t for t in range(len(tokenizer)) if re.fullmatch(r"Ġ?[a-z]{3,}", tokenizer.convert_ids_to_tokens(t) or "")]
    examples = []
    for length in lengths:
        task = copy_task(len(words), n_sequences=per_length, length=length, repeated=2, seed=seed + length)
        for k in range(len(task)):
            ids = [words[int(t)] for t in task.input_ids[k]]
            answer = int(task.answer_positions[k])
            examples.append(EvidenceExample("copy", length * 1000 + k, tuple(ids), ids[answer],
                                            ids[answer + 1], (answer,)))
    return examples


def select_evidence(tokenizer: Any, rows: Sequence[EvidenceRow], max_length: int | None = None
                    ) -> tuple[list[EvidenceExample], dict[str, int]]:
    """The usable examples of ``rows`` and how many were left out, by reason."""
    examples, skipped = [], {}
    for row in rows:
        example, why = evidence_example(tokenizer, row)
        if example is not None and max_length is not None and len(example.ids) > max_length:
            example, why = None, "longer than the model takes"
        if example is None:
            skipped[why] = skipped.get(why, 0) + 1
        else:
            examples.append(example)
    return examples, skipped
