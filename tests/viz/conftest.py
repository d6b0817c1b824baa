import pytest

from tests.viz.tiny import tiny_text_maps


@pytest.fixture(scope="session")
def bert_maps():
    """All layers and scopes of a short text on the tiny random BERT (Post-LN)."""
    return tiny_text_maps("bert")


@pytest.fixture(scope="session")
def gpt2_maps():
    """All layers and scopes of a short text on the tiny random GPT-2 (Pre-LN, causal)."""
    return tiny_text_maps("gpt2")
