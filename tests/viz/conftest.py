import pytest

from captum_ffb.texts.text import TextMaps, text_maps
from tests.models import tiny_loaded


def tiny_text_maps(name: str, text: str = "the cat sat on the mat .") -> TextMaps:
    """All layers and scopes of ``text`` on the tiny model ``name``."""
    return text_maps(text, tiny_loaded(name))


@pytest.fixture(scope="session")
def bert_maps():
    """All layers and scopes of a short text on the tiny random BERT (Post-LN)."""
    return tiny_text_maps("bert")


@pytest.fixture(scope="session")
def gpt2_maps():
    """All layers and scopes of a short text on the tiny random GPT-2 (Pre-LN, causal)."""
    return tiny_text_maps("gpt2")
