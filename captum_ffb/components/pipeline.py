"""The component tables' one entry: :func:`build` computes the direct effect of every writer
of the residual stream (and of each head, expert) on one read-out, per player, by the forward
route (every player carried through every block) or the backward route (one read-out per
writer pulled back to the players), whichever is cheaper."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captum_ffb.architectures.moe import MoEAdapter
from captum_ffb.components.sums import (
    EMBEDDINGS,
    HEAD,
    ComponentSums,
    check_linear_rules,
    direct_paths,
    head_direct_path,
    head_read_outs,
    iter_groups,
    plain_direct_paths,
    propagate_components,
    settle_block,
    stacked,
)
from captum_ffb.core.vocabulary import check_granularity
from captum_ffb.engine.bound import Request
from captum_ffb.engine.capture import keep_module
from captum_ffb.engine.head import HeadTarget, target_value
from captum_ffb.engine.linearise import linearise
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.players import token_contributions
from captum_ffb.engine.sweep import swept_gradients
from captum_ffb.engine.whole import ROUTES, Captured, WholeModel

__all__ = ["ComponentTable", "build", "component_route"]

#: A backward pass of one writer through one block costs about this many forward-route
#: players through one block (SmolLM2, one thread: 1.7 at n = 32, 1.2 at n = 128).
BACKWARD_PER_FORWARD_PLAYER = 1.4



def component_route(n_players: int, n_blocks: int, granularity: str, n_heads: int, moe: bool) -> str:
    """The cheaper route for a component table: the forward route carries every player through
    every block (cost ∝ players × blocks), the backward route one read-out per writer through
    the blocks below it (cost ∝ Σ writers' depths); a mixture of experts split per expert
    takes the forward route."""
    if granularity == "head" and moe:
        return "forward"
    per_block = 2 + (n_heads if granularity == "head" else 0)
    depths = per_block * sum(index + 0.5 for index in range(n_blocks))  # in blocks
    backward = BACKWARD_PER_FORWARD_PLAYER * depths
    return "forward" if n_players * n_blocks < backward else "backward"



@dataclass
class ComponentTable:
    """Direct effects of every writer on one read-out per row.

    Attributes:
        names (list[str]): the components, in stream order.
        contributions (Tensor): ``(B, P, C)`` over the players, in the layout's order.
        bias (Tensor): ``(B, C)`` owed to no player.
        real (Tensor): ``(B,)`` the read-out's value in the model.
        delta (Tensor): ``(B,)`` ``|Σ contributions + Σ bias − real|``.
    """

    names: list[str]
    contributions: Tensor
    bias: Tensor
    real: Tensor
    delta: Tensor



def _sequence(tensor: Tensor, batch: int) -> Tensor:
    """``(B·n, d)`` outputs (some families flatten before the FF) back to ``(B, n, d)``."""
    return tensor.reshape(batch, -1, tensor.shape[-1]) if tensor.dim() == 2 else tensor


def build(engine: WholeModel, request: Request, target: HeadTarget, rules: Mapping[str, Callable], reference: Any,
          granularity: str, route: str | None, groups: Tensor, n_groups: int,
          captured: Captured | None = None) -> ComponentTable:
    r"""The direct effect of every writer of the residual stream on ``target``, per player:
    ``target = Σ_j Σ_c C[j, c] + Σ_c b[c]``, by ``route`` (``None``: the cheaper one,
    :func:`component_route`; a mixture of experts split per expert and an encoder–decoder
    take the forward route)."""
    check_granularity(granularity, "components")
    check_linear_rules(rules)
    if route not in (None, *ROUTES):
        raise ValueError(f"route must be one of {ROUTES} (or None: the cheaper), got {route!r}")
    if engine.source is not None and route == "backward":
        raise ValueError("encoder–decoders' component tables take the forward route (route='forward' or None)")
    if engine.source is not None and n_groups != groups.shape[1]:
        raise ValueError("feature_mask is not available for encoder–decoder models yet")
    moe = [MoEAdapter.of(block, engine.stack.spec) is not None for block in engine.stack.blocks]
    if route is None:
        route = "forward" if engine.source is not None else component_route(
            n_groups, len(moe), granularity, int(engine.config.num_attention_heads), any(moe))
    backward = route == "backward" and not (granularity == "head" and any(moe))
    paths, real = None, None
    if not (backward and captured is None and _reads_alone(engine, granularity)):  # else one pass of its own
        captured = captured if captured is not None else engine.capture(request)
        blocks = captured.blocks
        prepare = engine.replay if captured.light else None
        like = blocks[0].inputs.to(engine.dtype)
        with torch.no_grad():
            covector, constant = head_direct_path(engine.head, target, rules, captured.tensors,
                                                  engine.stack.spec, engine.config, like)
            paths = direct_paths(blocks, engine.chain, rules, covector, constant, prepare)
        real = target_value(engine.head, captured.output, target, engine.dtype)
    mask = engine.players_mask(request, captured)
    if backward:
        names, table, bias, own = _backward(engine, request, captured, paths, target, rules, reference,
                                                            granularity, groups.shape[1], moe)
        real = own if real is None else real
        table = table * mask[..., None].to(table.dtype)
        players = table.new_zeros(table.shape[0], n_groups, table.shape[-1])
        players.scatter_add_(1, groups[..., None].expand_as(table), table)  # the groups are the players
    else:
        names, players, bias = _forward(engine, request, captured, paths, target, rules, reference,
                                                        granularity, groups, n_groups, prepare)
    delta = (players.sum((1, 2)) + bias.sum(-1) - real).abs()
    if engine.source is None:  # every position gets its group's share
        players = players.gather(1, groups[..., None].expand(-1, -1, players.shape[-1]))
        players = players * mask[..., None].to(players.dtype)
    return ComponentTable(names, players, bias, real, delta)

def _forward(engine: WholeModel, request, captured, paths, target, rules, reference, granularity, groups, n_groups,
             prepare):
    """The forward route of :func:`build`: every player's share carried through every
    block, each writer read through its direct path as it passes."""
    blocks = captured.blocks
    x = blocks[0].inputs
    like = x.to(engine.dtype)
    size = n_groups if engine.source is not None else engine.group_size(x, rules)
    parts = list(iter_groups(range(n_groups), size))
    progress = engine.progress_bar(len(blocks) * (len(parts) + 1))
    table, bias, names = None, None, None
    share = engine.shared_positions(reference, request.read_mask, target)
    try:
        with torch.no_grad():
            if progress is not None:
                progress.update(len(blocks))
            for part in parts:
                encoded = engine.encode(captured, rules, reference, True, None)
                start = engine.start_of(captured, request, groups, part, reference, share, encoded)
                sums, _ = propagate_components(blocks, engine.chain, rules, start, paths, granularity,
                                               engine.memory_budget, progress, prepare)
                names, found, found_bias = stacked(sums, start.n_in, like)
                if table is None:
                    table = found.new_zeros(found.shape[0], engine.n_players(captured, n_groups), found.shape[-1])
                    bias = found_bias  # every part carries the whole bias player
                table[:, engine.columns_of(part, n_groups, x.device)] = found
    finally:
        if progress is not None:
            progress.close()
    return names, table, bias

def _reads_alone(engine: WholeModel, granularity: str) -> bool:
    """Whether the backward route's own pass gives the direct paths (no capture first): one
    stack whose stream passes no norm between a writer and the head, a head of a final norm
    and an output layer alone (no soft-capping), writers not split into heads."""
    head = engine.head
    return (engine.source is None and granularity != "head" and head.softcap is None and not head.steps
            and not any(step.kind == "norm" for step in engine.chain.stream))

def _backward(engine: WholeModel, request, captured, paths, target, rules, reference, granularity, n, moe):
    """The backward route of :func:`build`: one forward pass of the frozen model and,
    per writer, the gradient of its direct read-out ``⟨g_c, w_c⟩`` with respect to the
    players; the writer's bias is what its read-out keeps beyond the tokens'
    (``⟨g_c, w_c⟩ − Σ_j C[j, c]``). Returns ``(names, table, bias, value)``.

    Without ``captured`` (where :func:`_reads_alone`) the pass itself records the final
    norm's input, from which the head's covector and the direct paths are computed, and
    ``value`` is the model's value from the pass's own output (``None`` with ``captured``)."""
    n_blocks = len(moe)
    points = {(writer.layer, writer.kind): writer for writer in engine.points.writers}
    writers = {(index, kind): points[(index, kind)].module
               for index in range(n_blocks) for kind in ("attention", "ff")}
    seen = engine.shared_positions(reference, request.read_mask, target)
    parts = {f"{index}.parts": points[(index, "attention")].parts for index in range(n_blocks)} \
        if granularity == "head" else {}
    kwargs, kept = _pass_kwargs(engine, request, target, captured)
    head_tensors: dict = {}
    sums = ComponentSums()
    progress = None
    try:
        watch = {f"{index}.{name}": module for (index, name), module in writers.items()}
        with ModelPass(engine.model, grad=True) as run, \
                linearise(run, engine.stack.spec, engine.stack.blocks, rules, engine.head.final_norm, (), watch,
                          watch_inputs=parts, separate_blocks=True,
                          eager_attention=not engine.is_light(request.read_mask)) as frozen:
            if captured is None and engine.head.final_norm is not None:
                keep_module(run, engine.head.final_norm, head_tensors, "final_norm")
            output = run.run(*request.args, **kwargs)
            inputs = frozen.inputs
            engine.check_players(request, [inputs])
            players = inputs.detach().to(engine.dtype)
            like = players
            real = None
            if captured is None:
                with torch.no_grad():
                    covector, constant = head_direct_path(engine.head, target, rules, head_tensors,
                                                          engine.stack.spec, engine.config, like)
                    paths = plain_direct_paths(n_blocks, engine.chain, engine.stack.spec.residual_scale,
                                               engine.config, covector, constant)
                real = target_value(engine.head, output, kept, engine.dtype).detach()
            r = None if seen is not None else engine.reference_of(reference, like, request.read_mask,
                                                              request.args, request.kwargs)

            def split(value: Tensor, grads: Tensor) -> tuple[Tensor, Tensor]:
                """A read-out's tokens (from its gradient) and its bias."""
                c = token_contributions(grads.to(engine.dtype), players, r, seen)
                return c, value.detach().to(engine.dtype) - c.sum(1)

            gradient = paths.embeddings.to(inputs.dtype)
            sums.add(EMBEDDINGS, *split((gradient * inputs.detach()).sum((1, 2)), gradient))
            read_outs = _direct_read_outs(engine, frozen, paths, captured, rules, granularity, n_blocks)
            found = [ComponentSums() for _ in range(n_blocks)]
            progress = engine.progress_bar(len(read_outs))
            grads = swept_gradients(frozen.block_outputs, frozen.block_inputs,
                                    [(index, value) for index, _, value in read_outs], engine.sweep_limit(inputs),
                                    None if progress is None else progress.update,
                                    groups=[name.split(".")[0] for _, name, _ in read_outs])  # a writer's own
            for (index, name, value), grad in zip(read_outs, grads):
                found[index].add(name, *split(value, grad))
            for index in range(n_blocks):
                settle_block(sums, found[index], index, engine.chain, paths, granularity, moe[index])
            sums.add(HEAD, None, paths.constants[HEAD])
    finally:
        if progress is not None:
            progress.close()
    return (*stacked(sums, n, like), real)


def _pass_kwargs(engine: WholeModel, request: Request, target: HeadTarget, captured: Captured | None
                 ) -> tuple[dict[str, Any], HeadTarget | None]:
    """The backward route's forward arguments, and the target as the kept logits hold it
    (``None`` with ``captured``: the head is then read through its direct path only)."""
    if captured is None:  # the target's logits are the value
        kwargs, (kept,) = engine.keep_needed_logits(dict(request.kwargs), [target])
        return kwargs, kept
    kwargs = dict(request.kwargs)
    if engine.task == "causal_lm" and "logits_to_keep" in inspect.signature(engine.model.forward).parameters:
        kwargs.setdefault("logits_to_keep", 1)  # the head is read through its direct path
    return kwargs, None


def _direct_read_outs(engine: WholeModel, frozen: Any, paths: Any, captured: Captured | None,
                      rules: Mapping[str, Callable], granularity: str, n_blocks: int) -> list[tuple[int, str, Tensor]]:
    """Every writer's direct read-out ``⟨g_c, w_c⟩`` in the frozen pass, in stream order (a
    block's heads after it): ``(block, name, value)``."""
    read_outs: list[tuple[int, str, Tensor]] = []
    for index in range(n_blocks):
        for name in ("attention", "ff"):
            g = paths.writers[(index, name)]
            w = _sequence(frozen.outputs[f"{index}.{name}"], g.shape[0])
            read_outs.append((index, name, (w * g.to(w.dtype)).sum((1, 2))))
        if granularity == "head":
            values = head_read_outs(captured.blocks[index], frozen.outputs[f"{index}.parts"],
                                    paths.writers[(index, "attention")],
                                    rules, engine.stack.spec, int(engine.config.num_attention_heads))
            read_outs += [(index, f"attention.head.{h}", v) for h, v in enumerate(values)]
    return read_outs
