"""One Transformer block, captured from one forward pass and replayable on new input vectors.

The baselines need two views of a layer: the tensors of the real forward pass (attention
probabilities, the value input, the real norms' statistics) and the layer *as a function of
its n input vectors* ``X ↦ Y`` for gradients and Shapley values. Both come from one forward
pass of the model: the core's capture records the tensors, and a pre-hook keeps the extra
arguments the model handed to the block (attention mask, position embeddings, …), so the block
can later be called on its own with other hidden states. Attention runs through the model's
own eager attention function, so gradients (reverse and forward mode) flow through it.
Everything is recorded by the engine's single capture (:func:`captum_ffb.engine.capture`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.attr import LayerNormDecomposition
from captum_ffb.core.decomposition import ScratchArena
from captum_ffb.engine import (
    Block,
    Outputs,
    capture_layers,
    row_chunks,
    run_block,
)
from captum_ffb.engine.passes import ModelPass

#: Names under which blocks receive a key/value cache; replays pass ``None`` instead.
_CACHE_NAMES = ("past_key_value", "past_key_values", "layer_past", "cache")


def _is_cache(value: Any) -> bool:
    return type(value).__name__.endswith("Cache")


def _for_example(value: Any, example: int, batch: int, count: int) -> Any:
    """Slice batch-first tensors (rank ≥ 2) to one example and expand them to ``count`` rows."""
    if isinstance(value, Tensor):
        if value.dim() < 2:
            return value
        if value.shape[0] == batch and batch > 1:
            value = value[example : example + 1]
        if value.shape[0] == 1 and count != 1:
            value = value.expand(count, *value.shape[1:])
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_for_example(v, example, batch, count) for v in value)
    if _is_cache(value):
        return None
    return value


def _first_tensor(value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    raise TypeError(f"the block returned {type(value).__name__}, not hidden states")


@dataclass
class LayerFunction:
    r"""A Transformer block as a function of its input vectors, for one example of a batch.

    ``fn(X)`` maps hidden states ``X`` ``(N, n, d)`` to the block's output ``(N, n, d)``,
    with everything else (attention mask, positions) as in the captured forward pass. It is
    differentiable (reverse and forward mode).

    Attributes:
        module (nn.Module): the block.
        example (int): which example of the captured batch the other arguments come from.
    """

    module: nn.Module
    example: int
    _args: tuple[Any, ...]
    _kwargs: dict[str, Any]
    _hidden_keyword: bool
    _batch: int
    _owners: list[nn.Module]
    _dtype: torch.dtype

    def __call__(self, hidden: Tensor) -> Tensor:
        if hidden.dim() != 3:
            raise ValueError(f"hidden states must be (N, n, d), got {tuple(hidden.shape)}")
        count = hidden.shape[0]
        args = [_for_example(a, self.example, self._batch, count) for a in self._args]
        kwargs = {
            k: None if k in _CACHE_NAMES else _for_example(v, self.example, self._batch, count)
            for k, v in self._kwargs.items()
        }
        hidden = hidden.to(self._dtype)
        # in eval mode (dropout would make the function random), with the attention the
        # decomposition read (the model's own eager function), differentiable
        with ModelPass(self._owners[0] if self._owners else self.module, owners=[self.module], grad=True,
                       inputs_only=False) as run:
            run.attention("eager")
            if self._hidden_keyword:
                out = run.call(self.module, *args, hidden_states=hidden, **kwargs)
            else:
                out = run.call(self.module, hidden, *args, **kwargs)
        return _first_tensor(out).float()


@dataclass
class CapturedLayer:
    r"""What the baselines need of one block for one batch of inputs.

    Build it with :func:`capture_layer`.

    Attributes:
        block (Block): the core's view of the block (real tensors, probabilities, weights).
        chain_name (str): the block's chain (``"post_ln"``, ``"pre_ln"``, …).
        scopes (tuple[str, ...]): the decomposition's scopes for this block.
        ff_pair (tuple[str, str]): the scopes just before and after the FF.
        token_mask (Tensor, optional): ``(B, n)`` bool, ``False`` on padding.
        causal (bool): whether token ``i`` only sees tokens ``j ≤ i`` (from the family's
                    spec).
        decomposer (LayerNormDecomposition): the decomposition of this block (its rules,
                    chain and scopes).
    """

    block: Block
    chain_name: str
    scopes: tuple[str, ...]
    ff_pair: tuple[str, str]
    token_mask: Tensor | None
    causal: bool
    decomposer: LayerNormDecomposition
    _call_args: tuple[Any, ...] = ()
    _call_kwargs: dict[str, Any] = field(default_factory=dict)
    _hidden_keyword: bool = False
    _owners: list[nn.Module] = field(default_factory=list)

    @property
    def inputs(self) -> Tensor:
        """The block's real input vectors ``(B, n, d)`` (float32)."""
        return self.block.inputs

    @property
    def output(self) -> Tensor:
        """The block's real output vectors ``(B, n, d)`` (float32)."""
        return self.block.output

    @property
    def batch_size(self) -> int:
        return self.block.capture.inputs.shape[0]

    @property
    def n_tokens(self) -> int:
        return self.block.capture.inputs.shape[1]

    def real_tokens(self, example: int) -> Tensor:
        """Indices of the real (non-padding) tokens of one example."""
        if self.token_mask is None:
            return torch.arange(self.n_tokens)
        return torch.nonzero(self.token_mask[example].cpu(), as_tuple=False).flatten()

    def layer_function(self, example: int = 0) -> LayerFunction:
        """The block as a function ``(N, n, d) → (N, n, d)`` with the arguments of ``example``."""
        if not 0 <= example < self.batch_size:
            raise ValueError(f"example {example} is not in a batch of {self.batch_size}")
        return LayerFunction(
            self.block.module, example, self._call_args, self._call_kwargs,
            self._hidden_keyword, self.batch_size, self._owners,
            self.block.capture.inputs.dtype,
        )

    def value_input(self) -> Tensor:
        """The real input of the attention's value projection ``(B, n, d)`` (float32)."""
        return self.block.real("value", "input")

    def decomposition_maps(self, scopes: Sequence[str] | None = None) -> dict[str, Tensor]:
        r"""The decomposition's maps ``(B, n, n)`` of this block at ``scopes`` (default: the
        chain's scopes), from the tensors already captured: no new forward pass. They are
        the maps ``LayerNormDecomposition.attribute()`` gives for the same inputs.

        Returns:
            dict scope → maps, in the order asked.
        """
        decomposer = self.decomposer
        names = list(self.scopes if scopes is None else scopes)
        decomposer.chain.check_scopes(names)
        extra = [name for name in names if name in decomposer.chain.extra_scopes]
        if extra and self.block.next_norm is None:
            raise ValueError(
                f"scope {extra[0]!r} needs the norm that reads the layer's output; capture the "
                "layer with with_next_norms=True from the model itself (the family may have "
                "no such norm)"
            )
        rows = row_chunks(self.block, None, decomposer.memory_budget)
        with torch.no_grad():
            result = run_block(self.block, decomposer.chain, decomposer.rules, names, rows,
                               Outputs(maps=True), arena=ScratchArena())
        return {name: result.maps[name] for name in names}


def capture_layer(
    forward_func: Callable | nn.Module,
    layer: nn.Module | Sequence[nn.Module],
    inputs: Tensor | tuple[Tensor, ...],
    additional_forward_args: Any = None,
    forward_kwargs: dict[str, Any] | None = None,
    model_type: str | None = None,
    with_next_norms: bool = False,
) -> CapturedLayer | list[CapturedLayer]:
    r"""Run the model once and keep what the baselines need of ``layer``.

    Args:
        forward_func (nn.Module or Callable): the model (or a function that runs it).
        layer (nn.Module or list[nn.Module]): one Transformer block of a supported model, or
                    a list of blocks (then a list of contexts comes back, all from the same
                    forward pass).
        inputs (Tensor or tuple[Tensor, ...]): the model's positional inputs (token ids).
        additional_forward_args (Any, optional): further positional arguments.
        forward_kwargs (dict, optional): keyword arguments of the forward, e.g.
                    ``{"attention_mask": mask}``; a 2-D mask marks padding.
        model_type (str, optional): the architecture when it cannot be read from the model.
        with_next_norms (bool): also record the norm that reads each block's output, for the
                    scope :data:`~captum_ffb.engine.chains.NEXT_NORM_SCOPE` of
                    :meth:`CapturedLayer.decomposition_maps`.

    Returns:
        CapturedLayer, or a list of them for a list of layers.
    """
    many = isinstance(layer, (list, tuple, nn.ModuleList))
    layers = list(layer) if many else [layer]
    if not layers or not all(isinstance(m, nn.Module) and not isinstance(m, nn.ModuleList)
                             for m in layers):
        raise TypeError("layer must be one Transformer block module or a list of them")
    decomposers = [LayerNormDecomposition(forward_func, m, model_type=model_type) for m in layers]
    kwargs = dict(forward_kwargs or {})
    model = forward_func if isinstance(forward_func, nn.Module) else None
    blocks, _ = capture_layers(
        forward_func, model, layers, decomposers[0].spec, inputs, additional_forward_args, kwargs,
        with_next_norms=with_next_norms, keep_calls=True,
    )
    contexts = [_context(block, decomposer, model) for block, decomposer in zip(blocks, decomposers)]
    return contexts if many else contexts[0]


def _context(block: Block, decomposer: LayerNormDecomposition, model: nn.Module | None) -> CapturedLayer:
    """The context of one captured block."""
    record = block.capture
    chain = decomposer.chain
    return CapturedLayer(
        block=block,
        chain_name=chain.name,
        scopes=chain.scopes,
        ff_pair=chain.ff_pair,
        token_mask=block.token_mask,
        causal=decomposer.spec.is_causal(block.config),
        decomposer=decomposer,
        _call_args=tuple(record.call_args),
        _call_kwargs=dict(record.call_kwargs),
        _hidden_keyword=record.hidden_keyword,
        _owners=[model] if model is not None else [],
    )


def mask_maps(maps: Tensor, token_mask: Tensor | None) -> Tensor:
    """Zero the rows and columns of padded tokens in ``(B, n, n)`` maps."""
    if token_mask is None:
        return maps
    mask = token_mask.to(maps.dtype)
    return maps * mask[:, :, None] * mask[:, None, :]
