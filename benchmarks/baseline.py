"""The denominator of every cost ratio in ``benchmarks/``: the input-gradient pass.

The gradient of the explained logit with respect to the input embeddings, and nothing else:
the parameters are frozen for the pass, so no parameter gradient is formed and no activation
is kept for one (what Captum's ``Saliency`` or ``InputXGradient`` costs a user). An
encoder–decoder's pass takes the gradient with respect to both embedded sequences (the source
and the target prefix), the tokens its attribution explains.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

NAME = "input-gradient pass"


@contextmanager
def frozen_parameters(model: torch.nn.Module) -> Iterator[None]:
    """Turn every parameter's gradient off, and back to what it was afterwards."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    for parameter in parameters:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in parameters:
            parameter.requires_grad_(True)


def input_gradient_pass(model: torch.nn.Module, ids: Tensor, target: int,
                        forward_kwargs: dict[str, Any] | None = None) -> tuple[Tensor, ...]:
    """The gradient of the last position's ``target`` logit with respect to the input embeddings.

    Args:
        model: A Hugging Face causal or encoder–decoder language model.
        ids: Input ids, shape ``(1, n)``.
        target: The vocabulary id whose logit is explained.
        forward_kwargs: ``decoder_input_ids`` for an encoder–decoder.

    Returns:
        The gradients, one per embedded sequence.
    """
    kwargs = dict(forward_kwargs or {})
    with frozen_parameters(model):
        if model.config.is_encoder_decoder:
            source = model.get_encoder().get_input_embeddings()(ids).detach().requires_grad_(True)
            prefix = model.get_decoder().get_input_embeddings()(kwargs.pop("decoder_input_ids"))
            prefix = prefix.detach().requires_grad_(True)
            out = model(inputs_embeds=source, decoder_inputs_embeds=prefix, use_cache=False, **kwargs)
            return torch.autograd.grad(out.logits[0, -1, target], (source, prefix))
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        out = model(inputs_embeds=embeds, use_cache=False, logits_to_keep=1, **kwargs)
        return torch.autograd.grad(out.logits[0, -1, target], (embeds,))
