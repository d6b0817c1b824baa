r"""The request check at the library's door: token ids, masks and indices checked once, before
any pass of the model, with errors that name the parameter.

A model given bad input fails deep inside (an ``IndexError`` from an embedding, a
``RuntimeError`` from a position table) or, worse, computes something else (a mask of the
wrong shape taken as all ones, a row of padding giving ``NaN``). Every public entry point
passes its inputs through these functions first; each raises ``TypeError`` (wrong kind) or
``ValueError`` (wrong value) in one line naming the parameter as the caller wrote it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

#: Keyword arguments of a forward that hold a mask over a token-id input, by that input.
MASK_OF = {"inputs": "attention_mask", "decoder_input_ids": "decoder_attention_mask"}


def vocabulary_size(model: nn.Module) -> int | None:
    """How many token ids the model's input embedding takes (``None`` when it has none)."""
    getter = getattr(model, "get_input_embeddings", None)
    try:
        embedding = getter() if callable(getter) else None
    except (NotImplementedError, AttributeError):
        embedding = None
    size = getattr(embedding, "num_embeddings", None)
    return int(size) if isinstance(size, int) else None


def position_limit(model: nn.Module, decoder: bool = False) -> int | None:
    r"""The longest input a model with a learned position table takes (``None`` for rotary,
    relative or ALiBi positions, which have no table to run past).

    Args:
        model (nn.Module): the model.
        decoder (bool): an encoder–decoder's decoder table rather than its encoder's.
    """
    limits = []
    two_stacks = bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if not isinstance(module, nn.Embedding) or not ("position" in leaf or leaf == "wpe"):
            continue
        if two_stacks and ("decoder" in name) != decoder:
            continue
        padding = module.padding_idx
        offset = int(getattr(module, "offset", 0) or 0) + (0 if padding is None else padding + 1)
        limits.append(module.num_embeddings - offset)
    return min(limits) if limits else None


def generation_limit(config: Any, decoder: bool = False) -> int | None:
    """The most positions a model generates into: its configuration's position count (a
    rotary model's too; an encoder–decoder's decoder count where it has one)."""
    keys = ("max_target_positions", "max_position_embeddings", "n_positions") if decoder \
        else ("max_position_embeddings", "n_positions", "n_ctx")
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_token_ids(ids: Any, model: nn.Module, name: str = "inputs", decoder: bool = False) -> Tensor:
    r"""``ids`` checked as a batch of token ids of ``model``: a 2-D integer tensor with at
    least one row and one position, every id in the vocabulary, no longer than a learned
    position table.

    Args:
        ids (Tensor): the token ids ``(batch, n)``.
        model (nn.Module): the model that reads them.
        name (str): the parameter's name in messages.
        decoder (bool): the ids are an encoder–decoder's target (its decoder's table).

    Returns:
        Tensor: ``ids``. Raises ``TypeError`` or ``ValueError`` naming ``name``.
    """
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a tensor of token ids, got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got {str(ids.dtype).replace('torch.', '')}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, n), got {tuple(ids.shape)}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name} is empty ({tuple(ids.shape)}): at least one row of one token is needed")
    size = vocabulary_size(model)
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (size is not None and high >= size):
        bad = low if low < 0 else high
        upper = f"0 … {size - 1}" if size is not None else "non-negative"
        raise ValueError(f"{name} holds the token id {bad}, outside the model's vocabulary ({upper})")
    limit = position_limit(model, decoder)
    if limit is not None and ids.shape[1] > limit:
        raise ValueError(f"{name} has {ids.shape[1]} positions; the model takes at most {limit}")
    return ids


def check_mask(mask: Any, ids: Tensor, name: str = "attention_mask") -> Tensor | None:
    r"""A mask over ``ids``: ``None``, or a tensor of ``ids``' shape holding 0 and 1 with at
    least one real token per row.

    Args:
        mask (Tensor, optional): the mask.
        ids (Tensor): ``(batch, n)`` what it masks (token ids, or any tensor with those two
                    leading dimensions).
        name (str): the parameter's name in messages.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(mask).__name__}")
    shape = tuple(ids.shape[:2])
    if tuple(mask.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}; the ids it masks have {shape}")
    if mask.is_floating_point():
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"{name} holds values other than 0 and 1")
    elif mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} holds values other than 0 and 1")
    empty = (~(mask != 0).any(dim=1)).nonzero()
    if len(empty):
        raise ValueError(f"{name}: row {int(empty[0])} has no real token (all padding)")
    return mask


def check_forward_kwargs(kwargs: Mapping[str, Any] | None, name: str = "forward_kwargs") -> dict[str, Any]:
    """``forward_kwargs`` as a new dict (``None``: empty); a clear error for anything else."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"{name} must be a dict of the forward's keyword arguments, got {type(kwargs).__name__}")
    return dict(kwargs)


def check_call(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], name: str = "inputs"
               ) -> dict[str, Any]:
    r"""A forward call's arguments checked as one request: the first positional argument is
    token ids (:func:`check_token_ids`; a speech model's floating features, or embeddings,
    pass), the masks fit what they mask (:func:`check_mask`), and an encoder–decoder's target
    (``decoder_input_ids``) is token ids with as many rows as the source.

    Args:
        model (nn.Module): the model called.
        args (tuple): its positional arguments (the inputs first).
        kwargs (dict): its keyword arguments.
        name (str): the first argument's name in messages.

    Returns:
        dict: ``kwargs``.
    """
    first = args[0] if args else None
    if isinstance(first, Tensor) and first.is_floating_point() and first.dim() == 3:
        if not bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False)):
            check_mask(kwargs.get("attention_mask"), first)
    elif first is not None:
        check_token_ids(first, model, name)
        check_mask(kwargs.get("attention_mask"), first)
    target = kwargs.get("decoder_input_ids")
    if target is not None:
        check_token_ids(target, model, "decoder_input_ids", decoder=True)
        if isinstance(first, Tensor) and target.shape[0] != first.shape[0]:
            raise ValueError(f"decoder_input_ids has {target.shape[0]} rows; the source ({name}) "
                             f"has {first.shape[0]}")
        check_mask(kwargs.get("decoder_attention_mask"), target, "decoder_attention_mask")
    return kwargs


def check_index(value: Any, name: str, size: int | None = None) -> Any:
    r"""An index argument (a token id, a class): an integer (not a ``bool``), or an integer
    tensor, within ``0 … size − 1`` when ``size`` is known; other values pass through
    unchanged (a read-out, a text)."""
    if isinstance(value, bool) or (isinstance(value, Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer index, got a bool")
    if isinstance(value, float) or (isinstance(value, Tensor) and value.is_floating_point()):
        raise TypeError(f"{name} must be an integer index, got a float")
    if size is not None and isinstance(value, (int, Tensor)):
        tensor = value if isinstance(value, Tensor) else torch.as_tensor(value, device="cpu")
        if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= size):
            bad = int(tensor.min()) if int(tensor.min()) < 0 else int(tensor.max())
            raise ValueError(f"{name} {bad} is out of range (0 … {size - 1})")
    return value


def check_count(value: Any, name: str, lowest: int = 1) -> int:
    """A count argument (``batch_size``, ``max_new_tokens``, ...): an integer ``≥ lowest``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < lowest:
        raise ValueError(f"{name} must be at least {lowest}, got {value}")
    return value


def check_new_tokens(max_new_tokens: Any, prefix: int, config: Any, decoder: bool = False,
                     name: str = "max_new_tokens") -> int:
    r"""``max_new_tokens`` checked: at least 1, and the prefix plus the new tokens within the
    model's positions (:func:`generation_limit`), one line above it.

    Args:
        max_new_tokens (int): how many tokens to generate.
        prefix (int): the positions already there (the prompt, or the decoder's start).
        config: the model's configuration.
        decoder (bool): an encoder–decoder's decoder.
        name (str): the parameter's name in messages (``--generate`` for the CLI).
    """
    check_count(max_new_tokens, name)
    limit = generation_limit(config, decoder)
    if limit is not None and prefix + max_new_tokens > limit:
        room = max(limit - prefix, 0)
        raise ValueError(f"{name} {max_new_tokens} runs past the model's {limit} positions: at most "
                         f"{room} new tokens fit after {prefix} position{'s' if prefix != 1 else ''}")
    return max_new_tokens


def text_token_ids(tokenizer: Any, text: str, name: str = "target", one: bool = False,
                   decoder: bool = False) -> list[int]:
    r"""The token ids of a target given as text, without special tokens: a one-line error for
    text of no token, for text the tokenizer reads as its unknown token (``<unk>``: the text is
    not in its vocabulary), and with ``one``, unless it is one token.

    Args:
        tokenizer: the model's tokenizer.
        text (str): the text.
        name (str): how the text is named in messages.
        one (bool): it must be one token.
        decoder (bool): an encoder–decoder's target side (``text_target=``).
    """
    ids = list(tokenizer(text_target=text, add_special_tokens=False)["input_ids"]) if decoder \
        else list(tokenizer.encode(text, add_special_tokens=False))
    if not ids:
        raise ValueError(f"{name} {text!r} holds no token for this tokenizer: give the text of at least one token")
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is not None and unknown in ids and text.strip() != getattr(tokenizer, "unk_token", None):
        raise ValueError(f"{name} {text!r} is not in the tokenizer's vocabulary: it reads as "
                         f"{tokenizer.unk_token!r}, which would be explained instead")
    if one and len(ids) != 1:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        raise ValueError(f"{name} {text!r} is {len(ids)} tokens for this tokenizer ({pieces}); give one "
                         "token (mind the leading space, e.g. ' Paris')")
    return ids


def leading_space_hint(tokenizer: Any, text: str, predicted: Any, name: str = "target") -> str | None:
    """A hint for a target text without its leading space (``"Paris"``) whose spaced form
    (``" Paris"``) is another single token, the one predicted (``predicted``: the predicted
    ids); ``None`` otherwise."""
    if not text or text[:1].isspace():
        return None
    own = tokenizer.encode(text, add_special_tokens=False)
    spaced = tokenizer.encode(" " + text, add_special_tokens=False)
    if len(own) != 1 or len(spaced) != 1 or own == spaced:
        return None
    found = predicted.reshape(-1).tolist() if isinstance(predicted, Tensor) else [int(predicted)]
    if spaced[0] not in found:
        return None
    return (f"{name} {text!r} is the token {tokenizer.convert_ids_to_tokens(own)[0]!r}, not the model's "
            f"prediction {tokenizer.convert_ids_to_tokens(spaced)[0]!r} (the word with its leading space): give "
            f"{' ' + text!r} to explain the prediction")


def text_input_ids(tokenizer: Any, inputs: Any, name: str, model: Any,
                   give: str = "NormDecomposition(model, tokenizer=...)") -> Any:
    """Inputs given as text, as ``(1, n)`` token ids on ``model``'s device (read by
    ``tokenizer``, special tokens included); other inputs as they are. ``give``: what to
    write to pass a tokenizer, for the message when there is none."""
    if not isinstance(inputs, str):
        return inputs
    check_text(inputs, name=name)
    if tokenizer is None:
        raise TypeError(f"{name} is text: give {give} to read it, or token ids")
    return tokenizer(inputs, return_tensors="pt").input_ids.to(next(model.parameters()).device)


#: Unicode categories that draw nothing: format characters (zero-width space, joiners, the
#: byte-order mark), controls, separators.
INVISIBLE = frozenset({"Cf", "Cc", "Zs", "Zl", "Zp"})


def check_text(text: str, name: str = "the text") -> str:
    r"""``text`` if it can be tokenised, else a one-line ValueError: it is empty, or it is not
    valid UTF-8 (bytes that are not UTF-8 on a command line reach Python as lone surrogates,
    which tokenizers refuse); ``name`` says which text in the message."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a string, got {type(text).__name__}")
    if not text or not text.strip():
        raise ValueError(f"{name} is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        first = error.start
    else:
        if all(unicodedata.category(c) in INVISIBLE or c.isspace() for c in text):
            raise ValueError(f"{name} has no visible characters (only spaces, zero-width or control "
                             "characters)")
        return text
    try:
        raw = text.encode("utf-8", "surrogateescape")  # the bytes the command line had
        raw.decode("utf-8")
    except UnicodeEncodeError:  # a surrogate that stands for no byte
        pass
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{name} is not valid UTF-8 (byte 0x{raw[error.start]:02x} at position "
            f"{error.start})"
        ) from None
    raise ValueError(
        f"{name} is not valid UTF-8 (lone surrogate U+{ord(text[first]):04X} at character "
        f"{first})"
    )
