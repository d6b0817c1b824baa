r"""Greedy generation, the one place every explanation of generated text generates from: a
causal LM continues its prompt, an encoder–decoder writes a target for its source.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.requests import check_new_tokens

#: How many tokens are generated when nobody says (every entry point: the API, the LLM
#: wrapper, the command line, the app).
DEFAULT_NEW_TOKENS = 20


def generate_greedily(model: nn.Module, inputs: Tensor, max_new_tokens: int = DEFAULT_NEW_TOKENS,
                      forward_kwargs: dict[str, Any] | None = None, name: str = "max_new_tokens") -> Tensor:
    r"""The tokens ``model`` generates greedily after ``inputs`` (one row): ``(T,)`` token ids,
    ``T ≤ max_new_tokens`` (fewer where it ends its text).

    Args:
        model (nn.Module): a causal LM, or an encoder–decoder with its LM head.
        inputs (Tensor): ``(1, n)`` a causal LM's prompt, or an encoder–decoder's source
                    (token ids, or a speech model's features ``(1, channels, frames)``).
        max_new_tokens (int): at most this many, within the model's positions (checked).
        forward_kwargs (dict, optional): more arguments of ``generate`` (an
                    ``attention_mask``; they replace the greedy settings where they name one).
        name (str): the count's name in messages.

    Returns:
        Tensor: the generated tokens; for an encoder–decoder, its target without the
        decoder's start token.
    """
    config = model.config
    two_stacks = bool(getattr(config, "is_encoder_decoder", False))
    prefix = 1 if two_stacks else int(inputs.shape[-1])
    check_new_tokens(max_new_tokens, prefix, config, decoder=two_stacks, name=name)
    kwargs = dict(forward_kwargs or {})
    settings: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": False, "num_beams": 1}
    pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    if pad is None:
        pad = getattr(config, "pad_token_id", None) or getattr(config, "eos_token_id", None)
    if isinstance(pad, list):
        pad = pad[0]
    if pad is not None:
        settings["pad_token_id"] = pad
    with ModelPass(model) as run:
        if two_stacks:
            key = "input_features" if inputs.is_floating_point() else "input_ids"
            output = run.generate(**{key: inputs}, **{**settings, **kwargs})
        else:
            kwargs.setdefault("attention_mask", torch.ones_like(inputs))
            output = run.generate(inputs, **{**settings, **kwargs})
    sequence = (output if isinstance(output, Tensor) else output.sequences)[0]
    if not two_stacks:
        return sequence[inputs.shape[1]:]
    start = getattr(config, "decoder_start_token_id", None)
    return sequence[1:] if start is not None and sequence.numel() and int(sequence[0]) == int(start) else sequence
