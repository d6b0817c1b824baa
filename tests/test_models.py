"""Loading models offline."""

from __future__ import annotations

import pytest

from captum_ffb.models import ModelNotFoundError, find_blocks, load_model
from tests.models import TINY_MODELS


def test_unknown_name_fails_at_once_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="not a model folder"):
        load_model("no-such-model-name")
    with pytest.raises(ModelNotFoundError, match="no model folder"):
        load_model("./no/such/folder")


def test_a_saved_folder_loads(tmp_path):
    from transformers import BertTokenizerFast

    spec = TINY_MODELS["bert"]
    spec.build().save_pretrained(tmp_path)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]))
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.model_type == "bert" and len(loaded.blocks) == 2
    assert find_blocks(loaded.model) is loaded.model.encoder.layer
