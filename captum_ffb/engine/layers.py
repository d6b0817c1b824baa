"""Running chains: one forward pass for every block asked for, then each block's scopes by
row chunks, with maps, convergence deltas and decompositions as requested.

This is the engine shared by :class:`~captum_ffb.attr.LayerNormDecomposition`, the model-level
attribution and the corpus runner.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.architectures.registry import get_chain
from captum_ffb.architectures.spec import ArchitectureSpec
from captum_ffb.core.decomposition import Decomposition, ScratchArena, stack_rows, using_arena
from captum_ffb.engine.block import Block, block_watch, config_of
from captum_ffb.engine.capture import (
    BlockWatch,
    ModelCapture,
    capture,
    forward_arguments,
    token_mask_of,
)
from captum_ffb.engine.chains import Chain, Rules
from captum_ffb.engine.model import next_norms
from captum_ffb.engine.passes import ModelPass
from captum_ffb.rules import check_rules, default_rules

#: Memory the row chunks (and the forward route's player groups) may take when no chunk size
#: is given (bytes).
DEFAULT_MEMORY_BUDGET = 1 << 30


@dataclass(frozen=True)
class Outputs:
    """What a run keeps: maps, convergence deltas (relative or not), decompositions."""

    maps: bool = False
    delta: bool = False
    relative: bool = False
    decompositions: bool = False


@dataclass
class LayerResult:
    """Everything computed for one layer: maps, deltas and (optionally) decompositions."""

    chain: Chain
    maps: dict[str, Tensor] = field(default_factory=dict)
    delta: dict[str, Tensor] = field(default_factory=dict)
    decompositions: dict[str, Decomposition] = field(default_factory=dict)


def chain_for(spec: ArchitectureSpec, config: Any) -> Chain:
    """The chain that applies to a model of this family and config (the config is checked
    once, where the model is bound: ``WholeModel``, ``LayerNormDecomposition``)."""
    return get_chain(spec.chain_name(config))


def resolve_rules(chain: Chain, spec: ArchitectureSpec, rules: Mapping[str, Callable] | None,
                  where: str, defaults: Callable[[str], dict[str, Any]] = default_rules,
                  ) -> dict[str, Callable]:
    """The ``defaults`` (the paper's rules unless given) for every role the chain calls, with
    the user's replacements."""
    roles = chain.roles(spec)
    chosen = {role: rule for role, rule in defaults(spec.norm).items() if role in roles}
    chosen.update(check_rules(rules, roles, where))
    return chosen


def warn_if_padded_without_mask(args: tuple[Any, ...], kwargs: dict[str, Any], config: Any) -> None:
    """Warn when a row of token ids starts or ends with the pad token and no attention mask is
    given: padded positions would then be attended to like real tokens. A pad token inside a
    row is text, not padding (chat templates whose end-of-turn token is the pad token)."""
    ids = args[0] if args else kwargs.get("input_ids")
    pad = getattr(config, "pad_token_id", None)
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point() or pad is None:
        return
    if kwargs.get("attention_mask") is None and ids.shape[1] and bool(
            (ids[:, 0] == pad).any() or (ids[:, -1] == pad).any()):
        warnings.warn(
            f"the inputs hold the pad token (id {pad}) but no attention_mask was given: padded "
            "positions are attended to like real tokens and the maps differ from those of the "
            "unpadded text; pass forward_kwargs={'attention_mask': mask}",
            stacklevel=3,
        )


def embeds_as_keyword(forward_func: Callable, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Floating ``(batch, n, d)`` inputs of a model that takes ``inputs_embeds`` are passed
    as ``inputs_embeds`` (``input_ids`` set to ``None``): a Hugging Face model reads its first
    positional argument as token ids, and fails on embeddings with a torch error."""
    first = args[0] if args else None
    if (not isinstance(forward_func, nn.Module) or not isinstance(first, Tensor)
            or not first.is_floating_point() or first.dim() != 3 or "inputs_embeds" in kwargs):
        return args, kwargs
    try:
        parameters = inspect.signature(forward_func.forward).parameters
    except (TypeError, ValueError):
        return args, kwargs
    if "inputs_embeds" not in parameters:
        return args, kwargs
    return (None, *args[1:]), {**kwargs, "inputs_embeds": first}


def capture_layers(
    forward_func: Callable,
    model: nn.Module | None,
    layers: Sequence[nn.Module],
    spec: ArchitectureSpec,
    inputs: Any,
    additional_forward_args: Any = None,
    forward_kwargs: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
    with_next_norms: bool = True,
    keep_calls: bool = False,
    extra: dict[str, nn.Module] | None = None,
    keep_output: bool = False,
    light: bool = False,
) -> tuple[list[Block], ModelCapture]:
    r"""One forward pass of ``forward_func`` on the inputs, recording ``layers``.

    Args:
        forward_func (Callable): runs the model.
        model (nn.Module, optional): the model (its config selects the attention function;
                    its block list gives each layer's following norm).
        layers (Sequence[nn.Module]): the blocks to record.
        spec (ArchitectureSpec): their family's spec.
        inputs, additional_forward_args, forward_kwargs: as in Captum's attributions; a
                    model's embeddings ``(batch, n, d)`` given as ``inputs`` are passed to it
                    as ``inputs_embeds``.
        dtype (torch.dtype): the precision the blocks hand tensors out in.
        with_next_norms (bool): also record the norm that reads each block's output.
        keep_calls (bool): keep each block's call arguments.
        extra (dict, optional): role → module outside the blocks to record.
        keep_output (bool): keep what the forward call returns.
        light (bool): record only each block's input, output and call arguments, not its
                    attention probabilities and inner tensors: ``replay_block()`` records
                    those later, one block at a time (memory of one block's probabilities).

    Returns:
        ``(blocks, capture)``.
    """
    args = forward_arguments(inputs, additional_forward_args)
    args, kwargs = embeds_as_keyword(forward_func, args, dict(forward_kwargs or {}))
    config = config_of(model, *layers)
    warn_if_padded_without_mask(args, kwargs, config)
    following = next_norms(model, spec, layers) if with_next_norms else [None] * len(layers)
    watches = [block_watch(layer, spec, norm) for layer, norm in zip(layers, following)]
    if light:
        watches = [BlockWatch(watch.module) for watch in watches]
        keep_calls = True
    recorded = capture(
        lambda run: run.run(*args, **kwargs), watches, model=model, extra=extra,
        keep_calls=keep_calls, keep_output=keep_output, run_forward=forward_func,
    )
    first = recorded.blocks[0]
    source_mask = None
    if spec.has_cross_attention:
        # a decoder block: its own tokens are the target's; the encoder's mask is the source's
        token_mask = token_mask_of(kwargs.get("decoder_attention_mask"), first.inputs)
        source = first.tensors.get(("cross_value", "input"))
        if source is not None:
            source_mask = token_mask_of(kwargs.get("attention_mask"), source)
    else:
        token_mask = token_mask_of(kwargs.get("attention_mask"), first.inputs)
    blocks = [
        Block(layer, spec, record, dtype=dtype, token_mask=token_mask, config=config, next_norm=norm,
              source_mask=source_mask)
        for layer, record, norm in zip(layers, recorded.blocks, following)
    ]
    return blocks, recorded


def _no_cache(value: Any) -> Any:
    return None if type(value).__name__.endswith("Cache") else value


def replay_block(block: Block, model: nn.Module | None = None, owners: Sequence[nn.Module] = ()) -> Block:
    """A block recorded by a light capture, run again on its recorded input and arguments
    with everything the chains need recorded (probabilities, inner tensors).

    The replay computes what the model computed (same input, same arguments, no cache), so
    the block it returns is what a full capture would have given.
    """
    record = block.capture
    if record.call_args is None:
        raise ValueError("replay_block needs a block captured with its call arguments")
    args = tuple(_no_cache(a) for a in record.call_args)
    kwargs = {k: _no_cache(v) for k, v in record.call_kwargs.items()}
    hidden = record.inputs

    def forward(run: ModelPass) -> Any:
        if record.hidden_keyword:
            return run.call(block.module, *args, hidden_states=hidden, **kwargs)
        return run.call(block.module, hidden, *args, **kwargs)

    watch = block_watch(block.module, block.spec, block.next_norm)
    (full,) = capture(forward, [watch], model=model, owners=owners).blocks
    return Block(block.module, block.spec, full, block.dtype, block.token_mask, block.config,
                 block.next_norm, block.source_mask, block.source)


def reference(block: Block, chain: Chain, scope: str) -> Tensor:
    """The real tensor a scope reproduces: the sum of the chain's sources for it."""
    total = None
    for role, which in chain.references[scope]:
        value = block.real(role, which)
        total = value if total is None else total + value
    return total


def ff_width(block: Block) -> int:
    """Width of the FF hidden layer (of one expert for mixtures of experts), times two for
    gated FFs."""
    if block.is_moe:
        return block.expert_weights(0)[0].shape[-1] * 2
    width = block.projection(block.spec.ff_in)[0].shape[-1]
    return width * (2 if block.spec.ff_gate is not None else 1)


def row_chunks(block: Block, rows_per_chunk: int | None, budget: int, n_players: int | None = None) -> list[slice]:
    """Output-row chunks of a block: ``rows_per_chunk`` rows each, or as many as keep a
    chunk's dense terms within ``budget`` bytes."""
    batch, n, width = block.capture.inputs.shape
    players = n if n_players is None else n_players
    if block.spec.has_cross_attention and block.source is None:
        players += block.encoder_output.shape[1]  # the source players come before the target's
    if rows_per_chunk is None:
        item = torch.finfo(block.dtype).bits // 8
        per_row = batch * players * (2 * ff_width(block) + 8 * width) * item
        rows_per_chunk = max(1, min(n, budget // max(per_row, 1)))
    count = math.ceil(n / rows_per_chunk)
    return [slice(i * rows_per_chunk, min(n, (i + 1) * rows_per_chunk)) for i in range(count)]


def _row_scale(real: Tensor, token_mask: Tensor | None, offset: int) -> Tensor:
    """Largest ``|value|`` of the real tensor per batch element, over real rows."""
    size = real.abs().amax(dim=-1)
    if token_mask is not None:
        size = size * token_mask[:, offset : offset + size.shape[1]].to(size.dtype)
    return size.amax(dim=1)


def iter_scopes(
    block: Block,
    chain: Chain,
    rules: Rules,
    scopes: Sequence[str],
    chunks: Sequence[slice],
    start: Decomposition | None = None,
    arena: ScratchArena | None = None,
) -> Iterator[tuple[slice, str, Decomposition]]:
    """``(rows, scope, decomposition)`` for every chunk of rows and every scope asked for,
    in chain order; stops each chunk after the last scope asked for."""
    wanted = set(scopes)
    order = chain.all_scopes
    last = max(order.index(name) for name in scopes)
    state = chain.mix(block, rules, start)
    for rows in chunks:
        if arena is not None:
            arena.reset()
        with using_arena(arena):
            for position, (name, decomposition) in enumerate(chain.local(block, state, rows, rules)):
                if name in wanted:
                    yield rows, name, decomposition
                if position >= last:
                    break


def run_block(
    block: Block,
    chain: Chain,
    rules: Rules,
    scopes: Sequence[str],
    chunks: Sequence[slice],
    outputs: Outputs,
    start: Decomposition | None = None,
    arena: ScratchArena | None = None,
    progress: Any = None,
) -> LayerResult:
    """Maps, deltas and decompositions of one block at ``scopes``, chunk by chunk."""
    maps: dict[str, list[Tensor]] = {name: [] for name in scopes}
    deltas: dict[str, list[Tensor]] = {name: [] for name in scopes}
    scales: dict[str, list[Tensor]] = {name: [] for name in scopes}
    parts: dict[str, list[Decomposition]] = {name: [] for name in scopes}
    if block.next_norm is None:
        scopes = [name for name in scopes if name not in chain.extra_scopes]
    references = {name: reference(block, chain, name) for name in scopes} if outputs.delta else {}
    # A chunk's dense tensors die with it unless decompositions are kept: reuse buffers.
    arena = None if outputs.decompositions else arena
    done = None
    for rows, name, decomposition in iter_scopes(block, chain, rules, scopes, chunks, start, arena):
        offset = rows.start
        if outputs.maps:
            maps[name].append(decomposition.maps(row_offset=offset))
        if outputs.delta:
            real = references[name][:, rows]
            deltas[name].append(decomposition.completeness_residual(real, row_offset=offset))
            if outputs.relative:
                scales[name].append(_row_scale(real, block.token_mask, offset))
        if outputs.decompositions:
            parts[name].append(decomposition.dense())
        if progress is not None and rows != done:
            progress.update(1)
            done = rows

    result = LayerResult(chain)
    for name in scopes:
        if not (maps[name] or deltas[name] or parts[name]):
            continue  # a scope this block cannot give (no norm reads its output)
        if outputs.maps:
            result.maps[name] = torch.cat(maps[name], dim=1)
        if outputs.delta:
            delta = torch.stack(deltas[name]).amax(dim=0)
            if outputs.relative:
                scale = torch.stack(scales[name]).amax(dim=0)
                delta = delta / scale.clamp_min(torch.finfo(scale.dtype).tiny)
            result.delta[name] = delta
        if outputs.decompositions:
            result.decompositions[name] = stack_rows(parts[name])
    return result
