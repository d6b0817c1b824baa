"""Tiny models with the corpus's word-level tokenizer (both built in ``tests.models``)."""

from __future__ import annotations

import pytest

from captum_ffb.explained.models import LoadedModel
from tests.models import corpus_tokenizer, tiny_loaded


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    return corpus_tokenizer(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="session")
def tiny(tokenizer):
    """``tiny(name)``: a tiny model of ``tests.models`` with the corpus tokenizer."""
    cache: dict[str, LoadedModel] = {}

    def get(name: str) -> LoadedModel:
        if name not in cache:
            cache[name] = tiny_loaded(name, tokenizer)
        return cache[name]

    return get
