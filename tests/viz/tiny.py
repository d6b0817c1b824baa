"""Tiny random models with a real (word-level) tokenizer, for the viz and CLI tests."""

from __future__ import annotations

from pathlib import Path

import torch

from captum_ffb.models import LoadedModel
from captum_ffb.text import TextMaps, text_maps
from tests.models import TINY_MODELS, VOCAB

WORDS = (
    "the cat sat on mat because it was tired . tokyo is capital of she loves math rather "
    "than engaging in a dog , hello world and big small red blue green run fast slow"
).split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tokenizer():
    """A BERT WordPiece tokenizer whose vocabulary fits the tiny models (< VOCAB ids)."""
    from transformers import BertTokenizer

    vocab = SPECIAL + sorted(set(WORDS))
    assert len(vocab) <= VOCAB
    return BertTokenizer(vocab={word: k for k, word in enumerate(vocab)}, do_lower_case=True)


def tiny_loaded(name: str) -> LoadedModel:
    """The tiny model ``name`` of ``tests.models`` with the word-level tokenizer."""
    torch.manual_seed(0)
    return LoadedModel(TINY_MODELS[name].build(), tokenizer(), f"tiny-{name}")


def tiny_text_maps(name: str, text: str = "the cat sat on the mat .") -> TextMaps:
    """All layers and scopes of ``text`` on the tiny model ``name``."""
    return text_maps(text, tiny_loaded(name))


def save_tiny(name: str, folder: Path) -> Path:
    """Save the tiny model and its tokenizer as a model folder that ``load_model`` reads."""
    loaded = tiny_loaded(name)
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder
