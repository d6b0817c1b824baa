"""One forward pass with hooks: the real tensors that the decomposition is checked against.

Attention probabilities come from the model's own attention function: while capturing, the
model runs with a recording attention implementation registered in transformers'
``AttentionInterface``. It calls the eager attention function of the module's own modeling
file (so rotary embeddings, GQA, sliding windows and soft-capping are the model's) and keeps
the probabilities it returns.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

RECORDING_IMPLEMENTATION = "captum_ffb_recording"

_recording: contextvars.ContextVar[dict[int, list[Tensor]] | None] = contextvars.ContextVar(
    "captum_ffb_recording", default=None
)


def _generic_eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Plain eager attention with grouped-query support, for modules without their own."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


def _recording_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, **kwargs):
    """Attention through the module's own eager function, keeping the probabilities."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    output, weights = (eager or _generic_eager_attention)(
        module, query, key, value, attention_mask, **kwargs
    )
    store = _recording.get()
    if store is not None and id(module) in store:
        store[id(module)].append(weights.detach())
    return output, weights


_registered = False


def _register_recording_implementation() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(RECORDING_IMPLEMENTATION, _recording_attention)
    AttentionMaskInterface.register(RECORDING_IMPLEMENTATION, eager_mask)
    _registered = True


def _configs_of(modules: Sequence[nn.Module]) -> list[Any]:
    """The distinct transformers configs reachable from ``modules`` (model and sub-modules)."""
    seen: dict[int, Any] = {}
    for root in modules:
        for module in root.modules():
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation_internal"):
                seen.setdefault(id(config), config)
    return list(seen.values())


@contextlib.contextmanager
def recording_attention(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Run the models owning ``modules`` with the recording attention implementation."""
    _register_recording_implementation()
    configs = _configs_of(modules)
    saved = [config._attn_implementation_internal for config in configs]
    for config in configs:
        config._attn_implementation_internal = RECORDING_IMPLEMENTATION
    try:
        yield
    finally:
        for config, value in zip(configs, saved):
            config._attn_implementation_internal = value


def _first_tensor(value: Any) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    return None


@dataclass
class BlockCapture:
    """What one forward pass showed of one Transformer block.

    Attributes:
        inputs (Tensor): the block's input hidden states ``(B, n, d)``.
        output (Tensor): the block's output hidden states ``(B, n, d)``.
        probs (list[Tensor]): attention probabilities ``(B, H, n, n)`` per recorded attention.
        tensors (dict): ``(role, "input" | "output") → (B, n, width)`` for each watched module.
        raw_outputs (dict): ``role → `` the watched module's output as returned (tuples kept),
                    for modules such as MoE routers that return several tensors.
    """

    inputs: Tensor | None = None
    output: Tensor | None = None
    probs: list[Tensor] = field(default_factory=list)
    tensors: dict[tuple[str, str], Tensor] = field(default_factory=dict)
    raw_outputs: dict[str, Any] = field(default_factory=dict)


def _as_sequence(tensor: Tensor, batch: int) -> Tensor:
    """Give ``(B·n, w)`` tensors (some models flatten before the FF) back their batch axis."""
    if tensor.dim() == 2 and tensor.shape[0] % batch == 0:
        return tensor.reshape(batch, -1, tensor.shape[-1])
    return tensor


def capture_blocks(
    forward: Callable[[], Any],
    blocks: Sequence[nn.Module],
    watched: Sequence[dict[str, nn.Module]],
    attention_modules: Sequence[Sequence[nn.Module]],
    owners: Sequence[nn.Module] = (),
) -> list[BlockCapture]:
    """Run ``forward()`` once under ``no_grad`` and record every block's real tensors.

    Args:
        forward (Callable): runs the model on the user's inputs.
        blocks (Sequence[nn.Module]): the Transformer blocks to watch.
        watched (Sequence[dict]): per block, ``role → module`` whose input and output to keep.
        attention_modules (Sequence): per block, the modules that call the attention function.
        owners (Sequence[nn.Module]): modules whose configs select the attention function
                    (the model, when known); the blocks are always included.
    """
    captures = [BlockCapture() for _ in blocks]
    handles = []
    store: dict[int, list[Tensor]] = {}
    fallback: dict[int, Tensor] = {}
    order: list[list[int]] = []

    def keep_block_input(capture: BlockCapture):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs.get("hidden_states")
            if capture.inputs is None and isinstance(hidden, Tensor):
                capture.inputs = hidden.detach()

        return hook

    def keep_block_output(capture: BlockCapture):
        def hook(module, args, kwargs, output):
            tensor = _first_tensor(output)
            if capture.output is None and tensor is not None:
                capture.output = tensor.detach()

        return hook

    def keep_role(capture: BlockCapture, role: str):
        def hook(module, args, kwargs, output):
            hidden = args[0] if args else next(iter(kwargs.values()), None)
            tensor = _first_tensor(output)
            if (role, "output") in capture.tensors:
                return  # a module used twice keeps its first call
            if isinstance(hidden, Tensor):
                capture.tensors[(role, "input")] = hidden.detach()
            if tensor is not None:
                capture.tensors[(role, "output")] = tensor.detach()
            capture.raw_outputs[role] = output

        return hook

    def keep_returned_probs(key: int):
        # Attention modules that do not call the AttentionInterface (GPT-J) return their
        # probabilities as the second output: kept as a fallback.
        def hook(module, args, kwargs, output):
            if (
                isinstance(output, tuple)
                and len(output) > 1
                and isinstance(output[1], Tensor)
                and output[1].dim() == 4
            ):
                fallback.setdefault(key, output[1].detach())

        return hook

    for block, capture, roles, attn in zip(blocks, captures, watched, attention_modules):
        handles.append(block.register_forward_pre_hook(keep_block_input(capture), with_kwargs=True))
        handles.append(block.register_forward_hook(keep_block_output(capture), with_kwargs=True))
        for role, module in roles.items():
            if isinstance(module, nn.Module):
                handles.append(module.register_forward_hook(keep_role(capture, role), with_kwargs=True))
        ids = []
        for module in attn:
            store[id(module)] = []
            ids.append(id(module))
            handles.append(module.register_forward_hook(keep_returned_probs(id(module)), with_kwargs=True))
        order.append(ids)

    token = _recording.set(store)
    try:
        with torch.no_grad(), recording_attention([*owners, *blocks]):
            forward()
    finally:
        _recording.reset(token)
        for handle in handles:
            handle.remove()

    for capture, ids in zip(captures, order):
        if capture.inputs is None or capture.output is None:
            raise RuntimeError(
                "the forward pass did not run one of the given layers; is the layer part of "
                "the model that forward_func calls?"
            )
        batch = capture.inputs.shape[0]
        capture.tensors = {k: _as_sequence(v, batch) for k, v in capture.tensors.items()}
        capture.probs = [store[i][0] if store[i] else fallback[i] for i in ids if store[i] or i in fallback]
    return captures


def forward_arguments(inputs: Any, additional_forward_args: Any) -> tuple[Any, ...]:
    """The positional arguments of the forward call, Captum style; rejects empty inputs."""
    if isinstance(inputs, Tensor):
        args: tuple[Any, ...] = (inputs,)
    elif isinstance(inputs, tuple) and inputs:
        args = inputs
    else:
        raise TypeError("inputs must be a tensor of token ids or a non-empty tuple of tensors")
    first = args[0]
    if isinstance(first, Tensor) and (first.numel() == 0 or (first.dim() >= 2 and first.shape[1] == 0)):
        raise ValueError("inputs are empty: at least one token is needed")
    if additional_forward_args is None:
        return args
    extra = additional_forward_args
    return args + (tuple(extra) if isinstance(extra, (tuple, list)) else (extra,))


def token_mask_of(attention_mask: Any, hidden: Tensor) -> Tensor | None:
    """``1`` for real tokens from a 2-D ``attention_mask`` matching ``hidden``, else ``None``."""
    if not isinstance(attention_mask, Tensor) or attention_mask.dim() != 2:
        return None
    if attention_mask.shape != hidden.shape[:2]:
        return None
    return (attention_mask != 0).to(hidden.device)
