"""A token of part of a character is shown as its bytes, not as the replacement character."""

from __future__ import annotations

import pytest

from captum_ffb.core.pieces import REPLACEMENT, piece_bytes, readable, token_text
from captum_ffb.graph.lens import decoded_lens
from captum_ffb.texts.text import display_token

# "—" is the bytes e2 80 94, written by byte-level BPE as "â", "Ģ", "Ķ"
DASH_START, DASH_END, DASH = "âĢ", "Ķ", "âĢĶ"


def dash_tokenizer():
    """A byte-level tokenizer whose vocabulary splits "—" into a piece of two bytes and one of one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = ["<unk>", DASH_START, DASH_END, DASH, "Ġword", "ĠâĢ"]
    core = Tokenizer(models.WordLevel(vocab={w: k for k, w in enumerate(vocab)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")


def test_byte_level_and_byte_fallback_pieces_give_their_bytes():
    assert piece_bytes(DASH) == "—".encode()
    assert piece_bytes(DASH_START) == b"\xe2\x80"
    assert piece_bytes("Ġ") == b" " and piece_bytes("Ċ") == b"\n"
    assert piece_bytes("<0xE2>") == b"\xe2" and piece_bytes("<0x0a>") == b"\n"
    assert piece_bytes("▁word") is None  # SentencePiece's space marker is no byte-level character
    assert piece_bytes("") is None


def test_readable_shows_bytes_only_where_the_decoder_wrote_the_replacement_character():
    assert readable(REPLACEMENT, DASH_START) == "\\xe2\\x80"
    assert readable(" " + REPLACEMENT, "ĠâĢ") == " \\xe2\\x80"
    assert readable("—", DASH) == "—"  # a whole character stays as it reads
    assert readable(REPLACEMENT, "▁word") == REPLACEMENT  # no bytes known: the decoder's text
    assert readable("word", "<0xE2>") == "word"


def test_a_tokenizer_s_partial_character_is_shown_as_bytes():
    tokenizer = dash_tokenizer()
    start, end, whole = tokenizer.convert_tokens_to_ids([DASH_START, DASH_END, DASH])
    assert tokenizer.decode([start]) == REPLACEMENT  # what the labels showed before
    assert token_text(tokenizer, start) == "\\xe2\\x80"
    assert token_text(tokenizer, end) == "\\x94"
    assert token_text(tokenizer, whole) == "—"
    assert display_token(DASH_START, tokenizer) == "\\xe2\\x80"
    assert display_token("ĠâĢ", tokenizer) == "\\xe2\\x80"
    assert display_token("ĠâĢ", tokenizer, strip=False) == " \\xe2\\x80"
    assert display_token(DASH, tokenizer) == "—"


def test_the_lens_labels_show_a_partial_character_as_bytes():
    tokenizer = dash_tokenizer()
    start, whole = tokenizer.convert_tokens_to_ids([DASH_START, DASH])
    assert decoded_lens({3: ((start, whole), (whole,))}, tokenizer) == {3: (("\\xe2\\x80", "—"), ("—",))}


@pytest.mark.parametrize("piece", ["##ing", "[CLS]", "hello"])
def test_pieces_of_whole_characters_read_as_before(piece):
    assert readable(piece, piece) == piece
