"""Checking and tokenising a text: invalid UTF-8, over-long inputs, the tokenizer's warning."""

from __future__ import annotations

import logging

import pytest

from captum_ffb.texts.text import check_text, encode_text, text_maps
from tests.models import tiny_loaded

LONG_WARNING = "Token indices sequence length is longer than the specified maximum"


@pytest.mark.parametrize("text, message", [
    ("caf\udce9", "byte 0xe9 at position 3"),  # b"caf\xe9" as Python decodes a command line
    ("\u00e9t\u00e9 \udcff", "byte 0xff at position 6"),  # positions count bytes
    ("\udcc3\udca9", "lone surrogate U+DCC3 at character 0"),  # escapes of valid UTF-8 bytes
    ("a\ud83d", "lone surrogate U+D83D at character 1"),  # half of a surrogate pair
])
def test_text_that_is_not_utf8_is_one_clear_error(text, message):
    with pytest.raises(ValueError) as error:
        check_text(text)
    assert str(error.value) == f"the text is not valid UTF-8 ({message})"
    with pytest.raises(ValueError, match="not valid UTF-8"):
        text_maps(text, tiny_loaded("bert"))


def test_valid_text_passes():
    assert check_text("caf\u00e9 \U0001f600") == "caf\u00e9 \U0001f600"
    with pytest.raises(ValueError, match="the text is empty"):
        check_text(" \n")


@pytest.fixture()
def transformers_records(caplog):
    """Records of transformers' loggers (which do not propagate to the root logger), at
    transformers' default verbosity (importing transformer_lens earlier in the same process
    silences them process-wide)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    root = logging.getLogger("transformers")
    root.addHandler(caplog.handler)
    yield caplog
    root.removeHandler(caplog.handler)
    hf_logging.set_verbosity(verbosity)


def test_the_tokenizer_warning_about_long_inputs_is_not_shown(transformers_records):
    from transformers.utils import logging as hf_logging

    loaded = tiny_loaded("bert")
    loaded.tokenizer.model_max_length = 4  # the model itself takes 64 positions
    verbosity = hf_logging.get_verbosity()
    text = "the cat sat on the mat because it was tired"
    assert encode_text(text, loaded)["input_ids"].shape[1] == 12
    with pytest.raises(ValueError, match="the text has 72 tokens; the model takes at most 64"):
        encode_text(" ".join([text] * 7), loaded)
    assert not [r for r in transformers_records.records if LONG_WARNING in r.getMessage()]
    assert hf_logging.get_verbosity() == verbosity  # logging is left as it was
    loaded.tokenizer(text)  # the same call without our care does warn
    assert [r for r in transformers_records.records if LONG_WARNING in r.getMessage()]
