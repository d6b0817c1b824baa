"""Every use of a private name of transformers or Captum, in one place.

Each access is one small function, with the library version it was checked against
(transformers 5.0.0 to 5.24.0, captum 0.8.0 to 0.9.0; see :mod:`captum_ffb.core.versions`). When one of them breaks after an upgrade, this module
is the only one to change.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch import nn


# --------------------------------------------------------------------------- transformers
def has_attention_implementation(config: Any) -> bool:
    """Whether ``config`` is a transformers config that selects an attention implementation."""
    # transformers 5.24.0: PretrainedConfig keeps the choice in ``_attn_implementation_internal``.
    return hasattr(config, "_attn_implementation_internal")


def get_attention_implementation(config: Any) -> str | None:
    """The attention implementation ``config`` selects (``None``: the default)."""
    # transformers 5.24.0: the ``_attn_implementation`` property returns this field.
    return config._attn_implementation_internal


def effective_attention_implementation(config: Any) -> str | None:
    """The attention implementation a model with ``config`` runs (the default resolved)."""
    # transformers 5.24.0: the ``_attn_implementation`` property of PretrainedConfig.
    return getattr(config, "_attn_implementation", None)


def set_attention_implementation(config: Any, name: str | None) -> None:
    """Select the attention implementation ``name`` on ``config`` alone.

    The public ``model.set_attn_implementation`` validates against the model and recurses into
    sub-configs; the decompositions switch one config at a time and restore it afterwards.
    """
    # transformers 5.24.0: the field behind ``PretrainedConfig._attn_implementation``.
    config._attn_implementation_internal = name


def model_eager_attention(module: nn.Module) -> Callable | None:
    """The eager attention function of the modeling file that defines ``module``'s class
    (its rotary embeddings, grouped-query heads and soft-capping), or ``None``."""
    # transformers 5.24.0: each modeling file defines a module-level ``eager_attention_forward``.
    return getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)


def private_attention_method(module: nn.Module, name: str | None) -> str | None:
    """``name`` where ``module`` computes its attention probabilities in that method of its own
    (``(query, key, value, attention_mask) → (output, probabilities)``) because its modeling
    file offers no public ``AttentionInterface``; ``None`` where it does (always preferred) or
    the method is missing."""
    # transformers 5.0.0 to 5.23.0: GPT-J's ``GPTJAttention._attn``; 5.24.0 moved GPT-J to the
    # attention interface and removed ``_attn``.
    if name is None or model_eager_attention(module) is not None:
        return None
    return name if callable(getattr(module, name, None)) else None


@contextlib.contextmanager
def hidden_gguf_progress_bar() -> Iterator[None]:
    """Hide the progress bar transformers shows while de-quantising a GGUF file.

    It is a plain ``tqdm`` that ``transformers.utils.logging.disable_progress_bar`` does not
    reach; it is replaced by a disabled one inside the block.
    """
    # transformers 5.24.0: ``modeling_gguf_pytorch_utils`` calls its module-level ``tqdm``.
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


# --------------------------------------------------------------------------- torch
def add_alpha(node: Any) -> Any:
    """The ``alpha`` of an autograd node of an addition (``AddBackward0``: ``a + alpha * b``),
    1 for a node that saves none."""
    # torch 2.14.1: AddBackward0 keeps its alpha as ``_saved_alpha``.
    return getattr(node, "_saved_alpha", 1)


def version_counter(tensor: Any) -> int:
    """How many times ``tensor`` was changed in place (autograd's version counter)."""
    # torch 2.6 to 2.15: ``Tensor._version``, bumped by every in-place operation (not through ``.data``).
    return int(tensor._version)


# --------------------------------------------------------------------------- Captum
def llm_attribution_base() -> type:
    """Captum's base of ``LLMAttribution`` and ``LLMGradientAttribution`` (not exported)."""
    # captum 0.9.0: ``captum.attr._core.llm_attr.BaseLLMAttribution``.
    from captum.attr._core.llm_attr import BaseLLMAttribution

    return BaseLLMAttribution


def pretty_tokens(ids: Sequence[int] | Any, tokenizer: Any) -> list[str]:
    """Tokens as Captum's LLM attributions show them (readable byte-level tokens)."""
    # captum 0.9.0: ``captum.attr._core.llm_attr._convert_ids_to_pretty_tokens``.
    from captum.attr._core.llm_attr import _convert_ids_to_pretty_tokens

    return _convert_ids_to_pretty_tokens(ids, tokenizer)
