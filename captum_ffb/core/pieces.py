r"""A token's text, read alone: where a token holds only part of a character.

Byte-level tokenizers (GPT-2's BPE, Llama 3's, SmolLM2's) and SentencePiece's byte fallback
split a character of several UTF-8 bytes (``é``, ``—``, an emoji) over several tokens. Such a
token decoded alone is the replacement character ``"\ufffd"`` (``�``), which says nothing of
which character it is part of. :func:`token_text` shows its bytes instead, the ones that do
not form a character as ``\x`` escapes (``"\xe2\x80"``), as Python writes bytes. This module
imports nothing heavy.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

__all__ = ["REPLACEMENT", "piece_bytes", "readable", "token_text"]

#: What a decoder writes for bytes that are not a whole character.
REPLACEMENT = "\ufffd"
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's alphabet, character → byte: the printable bytes stand for themselves,
    every other byte for the character ``256 + i`` (``i`` counting those bytes in order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in printable]
    alphabet.update({chr(256 + i): b for i, b in enumerate(others)})
    return alphabet


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a token's piece (``convert_ids_to_tokens``) stands for: a byte fallback's
    (``"<0xE2>"``) or a byte-level BPE piece's (``"âĢ"``); ``None`` for a piece written in
    neither."""
    found = _BYTE_FALLBACK.fullmatch(piece)
    if found:
        return bytes([int(found.group(1), 16)])
    alphabet = _byte_alphabet()
    if piece and all(ch in alphabet for ch in piece):
        return bytes(alphabet[ch] for ch in piece)
    return None


def readable(text: str, piece: str) -> str:
    r"""``text``, a token decoded alone; where it holds ``"\ufffd"`` and ``piece`` is a
    byte-level or byte-fallback piece, its bytes instead, those that are no character as
    ``\x`` escapes."""
    if REPLACEMENT not in text:
        return text
    raw = piece_bytes(piece)
    return text if raw is None else raw.decode("utf-8", errors="backslashreplace")


def token_text(tokenizer: Any, token_id: int) -> str:
    r"""One token decoded alone by ``tokenizer``, a part of a character shown as its bytes
    (:func:`readable`)."""
    text = tokenizer.decode([int(token_id)])
    if REPLACEMENT not in text or not hasattr(tokenizer, "convert_ids_to_tokens"):
        return text
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    return readable(text, piece) if isinstance(piece, str) else text
