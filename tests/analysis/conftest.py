"""Tiny models with a word-level tokenizer, and a small corpus they can read."""

from __future__ import annotations

from pathlib import Path

import pytest

from captum_ffb.models import LoadedModel
from tests.models import TINY_MODELS, VOCAB

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    "the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "table", "red", "blue",
    "big", "small", "and", "or", "it", "was", "is", "very", "old", "new", "house", "tree",
    "river", "bank", "sun", "moon", "light", "dark", "walk", "##s", "##ed", "##ing", "to",
    "from", "of", "in", "by", "with", "happy", "sad", "quick", "slow", "bird", "fish",
    "green", "black", "white", "cold", "hot", "day", "night", ".", ",",
]
assert len(SPECIAL) + len(WORDS) <= VOCAB

LINES = [
    "the cat sat on the mat .",
    "a dog ran under the table",
    "",
    "the big red house was very old .",
    "a small bird sat in the tree , and it was happy",
    "   ",
    "the river bank was dark and cold at night",
    "the quick dog walked to the river",
    "sun and moon , light and dark , day and night , hot and cold , black and white , big and small , quick and slow , happy and sad , old and new , red and blue and green",
    "the fish was slow",
    "a happy cat",
]


def tokenizer_for(folder: Path):
    """A WordPiece tokenizer over ``SPECIAL + WORDS`` (saved in ``folder`` too)."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer(vocab={t: i for i, t in enumerate(SPECIAL + WORDS)})
    tokenizer.save_pretrained(folder)
    return tokenizer


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    return tokenizer_for(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="session")
def tiny(tokenizer):
    """``tiny(name)``: a tiny model of ``tests.models`` with the word-level tokenizer."""
    cache: dict[str, LoadedModel] = {}

    def get(name: str) -> LoadedModel:
        if name not in cache:
            cache[name] = LoadedModel(TINY_MODELS[name].build(), tokenizer, f"tiny-{name}")
        return cache[name]

    return get
