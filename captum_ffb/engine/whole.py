r"""The whole model, one engine for every registered shape: capture → propagate (the backward or
the forward route) → head.

A model is bound once (:class:`WholeModel`): its stacks (one for decoder-only and
encoder-only models; the encoder's, then the decoder's for an encoder–decoder), its head and
its rules. The players are laid out ``[source | target]`` — the encoder's first-block
inputs, then the decoder's — or, for a model of one stack, its tokens alone
(:mod:`captum_ffb.engine.players`); every answer, component row and start follows that
order. Two routes compute the same numbers:

* **backward** (:meth:`WholeModel.backward`): one forward pass of the model with every
  coefficient frozen (:func:`~captum_ffb.engine.linearise.linearise`, both stacks), then one
  gradient per explained output at the players' inputs; each player's contribution is
  ``⟨g_j, x_j − r_j⟩`` (:func:`~captum_ffb.engine.players.token_contributions`).
* **forward** (:meth:`WholeModel.forward`): one recorded pass, the players' decompositions
  carried through every block (the encoder's decomposition entering every cross-attention),
  then the head's rules (:func:`~captum_ffb.engine.head.head_forward`). It also gives the
  bias player on its own (no other player), the backward route's independent check, and the
  whole-model token-to-token maps.

The component tables (direct effects of every writer of the residual stream) take either
route too (:meth:`WholeModel.components`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb._deprecation import moved_names
from captum_ffb.core.decomposition import Decomposition, stack_rows
from captum_ffb.engine.block import Block, block_watch, norm_parameters
from captum_ffb.engine.bound import TARGET_KEYS, BoundModel, Request, Stack  # noqa: F401  (importable from here, as before)
from captum_ffb.engine.capture import capture, token_mask_of
from captum_ffb.engine.chains import Chain
from captum_ffb.engine.head import (  # noqa: F401  (importable from here, as before)
    HeadTarget,
    ResolvedHead,
    element_wise_rule,
    head_forward,
    linearised_target_value,
    resolve_head,
    resolve_in,
    target_value,
)
from captum_ffb.engine.layers import (
    DEFAULT_MEMORY_BUDGET,
    capture_layers,
    chain_for,
    iter_scopes,
    replay_block,
    row_chunks,
    warn_if_padded_without_mask,
)
from captum_ffb.engine.linearise import linearise
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.players import (  # noqa: F401  (importable from here, as before)
    REFERENCES,
    is_centered,
    joint,
    player_start,
    reference_inputs,
    shared_mean,
    token_contributions,
    visible_positions,
)
from captum_ffb.rules import is_linear_in_players

#: The routes of the whole-model attribution.
ROUTES = ("backward", "forward")
#: At most this many read-outs carried by one backward sweep of the component tables.
SWEEP_LIMIT = 256
#: On a CPU, a sweep carries at most as many read-outs as keep one batched FF activation within
#: this many bytes: under glibc's largest threshold for serving an allocation with fresh pages
#: (32 MiB), so the sweep's temporaries reuse freed memory instead of faulting new pages in
#: (SmolLM2, 2 threads: the table 6 % faster at n = 128, 16 % at n = 256).
CPU_SWEEP_BYTES = 24 * 2**20
def propagate(
    blocks: Sequence[Block],
    chain: Chain,
    rules: Mapping[str, Callable],
    start: Decomposition,
    budget: int,
    progress: Any = None,
    prepare: Callable[[Block], Block] | None = None,
) -> Iterator[Decomposition]:
    """The decomposition of every block's output, block after block, from ``start`` (the
    first block's input over the players); rows are chunked to ``budget`` bytes.
    ``prepare`` turns each block into one the chains can run (e.g.
    :func:`~captum_ffb.engine.layers.replay_block` after a light capture), one at a time."""
    current = start
    for block in blocks:
        if prepare is not None:
            block = prepare(block)
        chunks = row_chunks(block, None, budget, current.n_in)
        parts = [dec.dense() for _, _, dec in
                 iter_scopes(block, chain, rules, [chain.output_scope], chunks, current)]
        current = stack_rows(parts)
        if progress is not None:
            progress.update(1)
        yield current


# --------------------------------------------------------------------------- what the engine takes and gives
@dataclass
class Answer:
    """One explained output per row.

    Attributes:
        contributions (Tensor): ``(B, P)`` per player, in the layout's order.
        bias (Tensor, optional): ``(B,)`` the bias player's (``None`` when not computed).
        value (Tensor): ``(B,)`` the value as the route computed it.
        real (Tensor): ``(B,)`` the value the model computed.
        units (Tensor, optional): ``(B,)`` the predicted units, where the pass itself read
                    the prediction (``predict``).
    """

    contributions: Tensor
    bias: Tensor | None
    value: Tensor
    real: Tensor
    units: Tensor | None = None


@dataclass
class Captured:
    """One recorded pass: the blocks of each stack (bound to their tensors), the head's
    tensors and the model's output.

    Attributes:
        source (list[Block], optional): the encoder's blocks (encoder–decoders).
        blocks (list[Block]): the read stack's blocks.
        tensors (dict): the head's (and an encoder's final norm's) real tensors.
        output (Any): the model's output.
        light (bool): the blocks hold their inputs and call arguments only (replayed one at
                    a time when needed).
    """

    source: list[Block] | None
    blocks: list[Block]
    tensors: dict
    output: Any
    light: bool = False


# --------------------------------------------------------------------------- the engine

def available_bytes(device: torch.device) -> int:
    """The memory available on ``device`` now: a GPU's free memory, the system's available
    memory on Linux (``/proc/meminfo``), else :data:`DEFAULT_MEMORY_BUDGET`."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return DEFAULT_MEMORY_BUDGET

#: At most this many positions named in the message of :func:`check_finite_inputs`.
_NAMED_POSITIONS = 8


def check_finite_inputs(x: Tensor, ids: Any = None, embedding: nn.Module | None = None,
                        what: str = "the input embeddings", first: bool = True) -> None:
    r"""A one-line ValueError when a block's input ``x`` ``(B, n, d)`` holds NaN or inf.

    Every player would then be NaN (and a graph's influence would never settle), so the
    positions are named with what made them: non-finite inputs given as embeddings, the
    model's embedding rows for those tokens, or (``first``: the first block's input) what
    the model adds to finite rows; otherwise a block before this one. One ``isfinite`` of
    ``x`` when it is finite.

    Args:
        x (Tensor): the block's input hidden states ``(B, n, d)``.
        ids (Tensor, optional): the inputs it came from: token ids ``(B, n)``, or embeddings.
        embedding (nn.Module, optional): the model's token embedding (its ``weight`` rows).
        what (str): the name of ``x`` in the message.
        first (bool): whether ``x`` is the first block's input (the embeddings).
    """
    if bool(torch.isfinite(x).all()):
        return
    bad = ~torch.isfinite(x).all(-1)  # (B, n)
    row = int(bad.any(-1).nonzero()[0, 0])
    positions = bad[row].nonzero()[:, 0].tolist()
    named = ", ".join(str(p) for p in positions[:_NAMED_POSITIONS])
    named += ", …" if len(positions) > _NAMED_POSITIONS else ""
    where = (f"row {row}, " if x.shape[0] > 1 else "") + ("position " if len(positions) == 1 else "positions ")
    picked = ids[row, positions].detach() if isinstance(ids, Tensor) and ids.shape[:2] == bad.shape else None
    verb = "hold" if what.endswith("s") else "holds"
    raise ValueError(f"{what} {verb} NaN or inf (at {where}{named}): {_non_finite_cause(picked, embedding, first)}")


def _non_finite_cause(picked: Tensor | None, embedding: nn.Module | None, first: bool) -> str:
    """What made the non-finite inputs at the positions whose inputs are ``picked`` (token ids,
    or embedding vectors given): see :func:`check_finite_inputs`."""
    unknown = "the model's embeddings are not finite there" if first else "a block before this one computes them"
    weight = getattr(embedding, "weight", None)
    if picked is None:
        return unknown
    if picked.is_floating_point():
        return "the embeddings given are not finite there" if not bool(torch.isfinite(picked).all()) else unknown
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.device.type == "meta":
        return unknown
    tokens = picked.to(weight.device)
    if not bool(((tokens >= 0) & (tokens < weight.shape[0])).all()):
        return unknown
    rows = ~torch.isfinite(weight[tokens].detach()).all(-1)
    if not bool(rows.any()):
        return ("the model's embedding rows for these tokens are finite: what it adds to them (position or "
                "type embeddings, a norm) is not") if first else unknown
    found = list(dict.fromkeys(tokens[rows].tolist()))
    listed = ", ".join(str(t) for t in found)
    if first:
        these = f"these tokens (ids {listed})" if len(found) > 1 else f"this token (id {listed})"
    else:
        these = f"the tokens {listed}" if len(found) > 1 else f"the token {listed}"
    return f"the model's embedding rows for {these} are not finite"


class WholeModel(BoundModel):
    r"""A model bound to its family (:class:`~captum_ffb.engine.bound.BoundModel`: its stacks,
    its head, its stream points) with both routes, the component tables, the graphs, the
    score splits and the patching estimates.

    Args:
        model (nn.Module): a Hugging Face model of a supported family (a task model, or a base
                    model read through a direction).
        model_type (str, optional): the family when the config does not say it.
        memory_budget (int, optional): bytes the forward route's row chunks and player groups
                    may take (default :data:`~captum_ffb.engine.layers.DEFAULT_MEMORY_BUDGET`);
                    on the backward route, when the blocks' intermediate tensors would exceed
                    it (when not given: half the memory available on the inputs' device), each
                    block is run again during the backward pass instead.
        dtype (torch.dtype): the forward route's precision.
        show_progress (bool): progress bars over blocks and read-outs.
    """

    def __init__(self, model: nn.Module, model_type: str | None = None,
                 memory_budget: int | None = None, dtype: torch.dtype = torch.float32,
                 show_progress: bool = False) -> None:
        if memory_budget is not None and memory_budget <= 0:
            raise ValueError("memory_budget must be a positive number of bytes")
        super().__init__(model, model_type)
        self.memory_budget = memory_budget
        self.dtype = dtype
        self.show_progress = show_progress
        self._precision_warned = False

    def groups(self, feature_mask: Tensor | None, players: Any, request: Request) -> tuple[Tensor, int]:
        """The player of each position ``(B, n)`` and how many players: the positions, or the
        groups of Captum's ``feature_mask`` (non-negative integer group ids)."""
        ids = request.read_mask
        batch, n = ids.shape
        if feature_mask is not None or players is not None:
            self.refuse_two_stacks("feature_mask" if feature_mask is not None else "players")
        if feature_mask is None:
            return torch.arange(n, device=ids.device).expand(batch, n).contiguous(), n
        mask = torch.as_tensor(feature_mask, device=ids.device)
        if mask.dim() == 1:
            mask = mask.expand(batch, -1)
        if mask.shape != ids.shape:
            raise ValueError(f"feature_mask must be (batch, n) = {tuple(ids.shape)}, got {tuple(mask.shape)}")
        if mask.is_floating_point() or int(mask.min()) < 0:
            raise ValueError("feature_mask holds non-negative integer group ids")
        return mask.long().contiguous(), int(mask.max()) + 1

    def per_group(self, answer: Answer, request: Request, groups: Tensor, n_groups: int, route: str) -> Tensor:
        """An answer's contributions per player ``(B, P)``: the backward route's per position
        added up by group, the forward route's as they are (its groups were the players)."""
        if route == "forward" or self.source is not None:
            return answer.contributions
        contributions = answer.contributions * request.read_mask.to(answer.contributions.dtype)
        per_group = contributions.new_zeros(contributions.shape[0], n_groups)
        return per_group.scatter_add_(1, groups, contributions)

    def per_position(self, per_group: Tensor, request: Request, groups: Tensor) -> Any:
        """Captum's attribution tensors: each position's group's contribution ``(B, n)``, or an
        encoder–decoder's pair ``(source (B, n_source), target (B, n_target))``."""
        if self.source is not None:
            n_source = per_group.shape[1] - request.read_mask.shape[1]
            return per_group[:, :n_source], per_group[:, n_source:]
        return per_group.gather(1, groups) * request.read_mask.to(per_group.dtype)

    def forced(self, inputs: Tensor, tokens: Tensor, kwargs: dict[str, Any]
               ) -> tuple[Tensor, dict[str, Any], list[int]]:
        """A forced target fed to the model: ``(inputs, keyword arguments, the position that
        reads each token)``: a causal LM reads ``tokens[t]`` after its prompt and the tokens
        before it; an encoder–decoder's decoder reads it at position ``t`` of its input (its
        start token, then the target but its last token; given in ``kwargs`` or made here)."""
        if self.source is None:
            ids = torch.cat([inputs, tokens[None, :-1].to(inputs.device)], dim=1)
            if "attention_mask" in kwargs:
                kwargs = {**kwargs, "attention_mask": torch.cat(
                    [kwargs["attention_mask"], torch.ones_like(tokens[None, :-1])], dim=1)}
            return ids, kwargs, list(range(inputs.shape[1] - 1, inputs.shape[1] - 1 + tokens.numel()))
        prefix = kwargs.get("decoder_input_ids")
        if prefix is None:
            start = getattr(self.config, "decoder_start_token_id", None)
            if start is None:
                raise ValueError(f"{self.model_type}'s config has no decoder_start_token_id: give "
                                 "forward_kwargs['decoder_input_ids']")
            prefix = torch.cat([tokens.new_tensor([int(start)]), tokens[:-1]])[None]
        prefix = torch.as_tensor(prefix)
        prefix = prefix[None] if prefix.dim() == 1 else prefix
        if tokens.numel() > prefix.shape[1]:
            raise ValueError(f"target: give between 1 and {prefix.shape[1]} tokens (one per decoder position)")
        return inputs, {**kwargs, "decoder_input_ids": prefix}, list(range(tokens.numel()))

    # ------------------------------------------------------------------ routes
    def answers(self, request: Request, targets: list[HeadTarget], rules: Mapping[str, Callable],
                reference: Any, route: str, groups: Tensor | None = None, n_groups: int | None = None,
                players: Sequence[int] | None = None, with_bias: bool = False,
                captured: Captured | None = None, predict: Callable[[Tensor], HeadTarget] | None = None,
                no_bias: bool | None = None) -> list[Answer]:
        """Each target's answer by ``route``. On the backward route, with ``with_bias``, the
        bias player's contribution is computed on its own: the forward route with no other
        player (one capture, or ``captured``, and one propagation of ``n`` vectors per block),
        so that the convergence delta ``|Σ_j c_j + c_bias − real|`` checks the backward pass
        against an independent computation. A model without bias terms under the default
        rules, measured from zero or the centred reference, has a bias player of exactly 0
        (:meth:`holds_no_bias`): that pass is skipped, and the delta checks the backward pass's
        contributions against the real model's output. ``predict`` (backward route, one
        target): ``targets`` holds a stand-in at the read positions and the pass explains the
        unit it predicts there (:meth:`backward`). ``no_bias``: :meth:`holds_no_bias`, where the
        caller has decided it already (``None``: decided here)."""
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        if route == "forward":
            captured = captured if captured is not None else self.capture(request)
            return self.forward(captured, request, targets, rules, groups, n_groups, players, reference)[0]
        if players is not None:
            raise ValueError("players= splits the forward route; use route='forward'")
        answers = self.backward(request, targets, rules, reference, predict)
        if not with_bias:
            return answers
        if self.holds_no_bias(rules, reference) if no_bias is None else no_bias:
            return [replace(answer, bias=torch.zeros_like(answer.value) + target.offset)
                    for answer, target in zip(answers, targets)]
        captured = captured if captured is not None else self.capture(request)
        alone = self.forward(captured, request, targets, rules, None, None, [], reference)[0]
        return [replace(answer, bias=part.bias.to(answer.contributions.dtype))
                for answer, part in zip(answers, alone)]

    def holds_no_bias(self, rules: Mapping[str, Callable], reference: Any) -> bool:
        """Whether the bias player is 0 whatever the input: a decoder-only or encoder-only
        model with no nonzero bias term (no parameter named ``bias`` or ``*_bias`` holds
        anything but zeros), the default rules (the same types and settings), and players
        measured from zero or the centred reference (whose output goes back to the tokens)."""
        if self.source is not None or not (reference is None or is_centered(reference)
                                           or (isinstance(reference, str) and reference == "zero")):
            return False
        defaults = self.rules()
        if set(rules) != set(defaults) or not all(_same_rule(rules[r], defaults[r]) for r in defaults):
            return False
        return not any(bool(p.detach().any()) for name, p in self.model.named_parameters()
                       if name.rsplit(".", 1)[-1] == "bias" or name.endswith("_bias"))

    def explain(self, request: Request, targets_of: Callable[[Any], list[HeadTarget]],
                rules: Mapping[str, Callable], reference: Any, route: str, maps: bool = False, check: bool = False
                ) -> tuple[list[Answer], list[Answer] | None, Tensor | None, Any]:
        """Several targets of one batch in at most two passes: one recording the forward route
        (its outputs give ``targets_of`` what resolves a predicted unit; the bias player, the
        maps and the check ride along), then the backward pass. Returns ``(answers, the forward
        route's answers when checked or on the forward route, the maps, the outputs)``."""
        zero = reference is None or (isinstance(reference, str) and reference == "zero")
        captured = self.capture(request)
        targets = targets_of(captured.output)
        whole, found = None, None
        if maps or check or route == "forward":  # the maps ride along where the players are from zero
            whole, found = self.forward(captured, request, targets, rules, reference=reference, maps=maps and zero)
        if maps and not zero:
            _, found = self.forward(captured, request, targets, rules, maps=True)
        answers = whole if route == "forward" else self.answers(request, targets, rules, reference, route,
                                                                 with_bias=True, captured=captured)
        return answers, whole if (check or route == "forward") else None, found, captured.output

    def backward(self, request: Request, targets: list[HeadTarget], rules: Mapping[str, Callable],
                 reference: Any, predict: Callable[[Tensor], HeadTarget] | None = None) -> list[Answer]:
        """One forward pass through the frozen model; one backward pass per target. With
        ``predict`` (a causal LM's next token), ``targets`` is one stand-in for the positions
        read: the unit explained is the one the pass's own logits rank first there (the
        model's prediction, with no pass of its own), its head target ``predict(units)``."""
        if predict is not None and (len(targets) != 1 or self.head.task != "causal_lm"):
            raise ValueError("predict reads a causal LM's next token: give one stand-in target")
        head, model = self.head, self.model
        args, kwargs = request.args, dict(request.kwargs)
        warn_if_padded_without_mask(args, kwargs, self.config)
        self._warn_if_reduced_precision()
        shares = [self.shared_positions(reference, request.read_mask, t) for t in targets]  # before remapping
        kwargs, targets = self.keep_needed_logits(kwargs, targets)  # positions index the kept logits
        watch = {} if head.output is None else {"output": head.output}
        source = None if self.source is None else (self.source.spec, self.source.blocks, self.source.final_norm)
        answers = []
        with ModelPass(model, grad=True) as run, \
                linearise(run, self.stack.spec, self.stack.blocks, rules, head.final_norm, head.linearised_steps(),
                          watch, recompute=self._recompute(request), source=source) as frozen:
            output = run.run(*args, **kwargs)
            inputs = [leaf.detach() for leaf in frozen.leaves]
            self.check_players(request, inputs)
            masks = self.masks(request, [x.shape[:2] for x in inputs])
            references = [None if is_centered(reference) else
                          self.reference_of(reference, x.to(self.dtype), mask, args, kwargs)
                          for x, mask in zip(inputs, masks)]
            units = None
            if predict is not None:  # the prediction, from this pass's logits at the positions read
                units = self._predicted_units(output, targets[0])
                targets = [replace(predict(units), positions=targets[0].positions)]
            values = [self.linearised_value(output, frozen, target, rules) for target in targets]
            for k, (target, value, grads) in enumerate(zip(targets, values, frozen.gradients(values))):
                parts = []
                for segment, (g, x, mask, r) in enumerate(zip(grads, inputs, masks, references)):
                    seen = None
                    if is_centered(reference):  # the read stack sees what the target sees
                        seen = shares[k] if segment == len(inputs) - 1 else mask
                        seen = seen.to(x.device)
                    part = token_contributions(g, x, r, seen)
                    parts.append(part * mask.to(part.dtype))
                contributions = torch.cat(parts, dim=1).to(self.dtype)
                value = value.detach().to(self.dtype)
                real = target_value(head, output, target, self.dtype).detach()
                answers.append(Answer(contributions, value - contributions.sum(-1), value, real, units))
        return answers

    def _predicted_units(self, output: Any, target: HeadTarget) -> Tensor:
        """``(B,)`` the unit each row's logits rank first at ``target``'s positions."""
        logits = output.logits if hasattr(output, "logits") else output[0]
        rows = torch.arange(logits.shape[0], device=logits.device)
        return logits[rows, target.positions.to(logits.device)].detach().argmax(-1)

    def capture(self, request: Request) -> Captured:
        """One pass recording what the forward route needs: every block of each stack, the
        head's tensors (and an encoder's final norm's), the output; the read stack's blocks
        light (inputs and arguments only) when their probabilities would not fit
        ``memory_budget``."""
        model, args, kwargs = self.model, request.args, request.kwargs
        if self.source is None:
            light = self.is_light(args[0])
            blocks, recorded = capture_layers(
                model, model, self.stack.blocks, self.stack.spec, args, None, kwargs, dtype=self.dtype,
                with_next_norms=False, extra=self.head.modules(), keep_output=True, light=light)
            self.check_players(request, [blocks[0].inputs])
            return Captured(None, blocks, recorded.tensors, recorded.output, light)
        stacks = [*self.source.blocks, *self.stack.blocks]
        specs = [self.family.for_block(block) for block in stacks]
        extra = {**self.head.modules()}
        if self.source.final_norm is not None:
            extra["source_norm"] = self.source.final_norm
        recorded = capture(lambda run: run.run(*args, **kwargs),
                           [block_watch(block, spec) for block, spec in zip(stacks, specs)],
                           model=model, extra=extra, keep_output=True)
        n_source = len(self.source.blocks)
        self.check_players(request, [recorded.blocks[0].inputs, recorded.blocks[n_source].inputs])
        source_mask = token_mask_of(kwargs.get("attention_mask"), recorded.blocks[0].inputs)
        target_mask = token_mask_of(kwargs.get("decoder_attention_mask"), recorded.blocks[n_source].inputs)
        config = self.config
        source = [Block(b, s, r, dtype=self.dtype, token_mask=source_mask, config=config)
                  for b, s, r in zip(stacks[:n_source], specs[:n_source], recorded.blocks[:n_source])]
        blocks = [Block(b, s, r, dtype=self.dtype, token_mask=target_mask, config=config, source_mask=source_mask)
                  for b, s, r in zip(stacks[n_source:], specs[n_source:], recorded.blocks[n_source:])]
        return Captured(source, blocks, recorded.tensors, recorded.output)

    def forward(self, captured: Captured, request: Request, targets: list[HeadTarget],
                rules: Mapping[str, Callable], groups: Tensor | None = None, n_groups: int | None = None,
                players: Sequence[int] | None = None, reference: Any = None, maps: bool = False,
                ) -> tuple[list[Answer], Tensor | None]:
        """The forward route from a capture: the players through every block, then the head's
        rules for each target. ``players`` (with ``groups``) propagates only these players,
        ``[]`` the bias player alone. With ``maps``, every position is its own player, the
        players go in groups that fit ``memory_budget`` and the whole-model maps
        ``(batch, blocks, n, n)`` come back too (else ``None``)."""
        blocks = captured.blocks
        x = blocks[0].inputs
        batch, n, _ = x.shape
        if groups is None:
            groups, n_groups = torch.arange(n, device=x.device).expand(batch, n).contiguous(), n
        if self.source is not None and (n_groups != n or maps):
            raise ValueError("feature_mask and whole-model maps are not available for encoder–decoder models yet")
        chosen = list(range(n_groups)) if players is None else [int(p) for p in players]
        if any(not 0 <= p < n_groups for p in chosen):
            raise ValueError(f"players must be among the {n_groups} players (0 … {n_groups - 1})")
        parts = [chosen]
        found = None
        if maps:
            if not (reference is None or (isinstance(reference, str) and reference == "zero")) or players is not None:
                raise ValueError("the whole-model maps are of every position from zero")
            size = self.group_size(x, rules)
            parts = [chosen[first:first + size] for first in range(0, n, size)]
            found = torch.zeros(batch, len(blocks), n, n, dtype=self.dtype, device=x.device)
        # targets whose centred reference averages the same positions share one propagation
        shares = [self.shared_positions(reference, request.read_mask, t) for t in targets]
        order: list[list[int]] = []
        for k, share in enumerate(shares):
            same = next((g for g in order if share is None or torch.equal(shares[g[0]], share)), None)
            same.append(k) if same is not None else order.append([k])
        prepare = self.replay if captured.light else None
        progress = self.progress_bar(len(blocks) * len(parts) * len(order) + (0 if self.source is None else
                                                                              len(captured.source)))
        contributions: list[Tensor | None] = [None] * len(targets)
        biases: list[Tensor | None] = [None] * len(targets)
        try:
            with torch.no_grad():
                for part in parts:
                    encoded = self.encode(captured, rules, reference, bool(part), progress)
                    for group in order:
                        start = self.start_of(captured, request, groups, part, reference, shares[group[0]], encoded)
                        for index, last in enumerate(propagate(blocks, self.chain, rules, start, self.memory_budget,
                                                               progress, prepare)):
                            if found is not None:
                                found[:, index, :, part[0]:part[0] + len(part)] = last.maps()
                        columns = self.columns_of(part, n_groups, x.device)
                        for k in group:
                            share, biases[k] = head_forward(last, self.head, targets[k], rules, captured.tensors,
                                                            self.stack.spec, self.config, self.dtype)
                            if contributions[k] is None:
                                contributions[k] = share.new_zeros(share.shape[0], self.n_players(captured, n_groups))
                            contributions[k][:, columns] = share
        finally:
            if progress is not None:
                progress.close()
        answers = []
        for c, b, target in zip(contributions, biases, targets):
            real = target_value(self.head, captured.output, target, self.dtype)
            answers.append(Answer(c, b, c.sum(-1) + b, real))
        return answers, found

    def maps(self, request: Request, rules: Mapping[str, Callable], return_delta: bool = False) -> Any:
        """Whole-model token-to-token maps ``(batch, blocks, n, n)``: ``‖F_i(x_j)‖`` after every
        block over the input tokens, players propagated in groups that fit
        ``memory_budget``; with ``return_delta``, per block the largest completeness residual
        against the block's real output ``(batch, blocks)``."""
        self.refuse_two_stacks("maps")
        args, kwargs = request.args, request.kwargs
        light = self.is_light(args[0])
        blocks, _ = capture_layers(self.model, self.model, self.stack.blocks, self.stack.spec, args, None, kwargs,
                                   dtype=self.dtype, with_next_norms=False, light=light)
        prepare = self.replay if light else None
        x = blocks[0].inputs
        self.check_players(request, [x])
        batch, n, d = x.shape
        token_mask = blocks[0].token_mask
        positions = torch.arange(n, device=x.device).expand(batch, n)
        size = self.group_size(x, rules)
        found = torch.zeros(batch, len(blocks), n, n, dtype=self.dtype, device=x.device)
        totals = [torch.zeros(batch, n, d, dtype=self.dtype, device=x.device) for _ in blocks]
        bias_total: list[Tensor | None] = [None] * len(blocks)
        progress = self.progress_bar(len(blocks) * ((n + size - 1) // size))
        try:
            for first in range(0, n, size):
                players = list(range(first, min(n, first + size)))
                start = player_start(x, positions, players, token_mask)
                for index, dec in enumerate(propagate(blocks, self.chain, rules, start, self.memory_budget,
                                                      progress, prepare)):
                    found[:, index, :, first: first + len(players)] = dec.maps()
                    if return_delta:
                        totals[index] += dec.terms.sum(dim=2)
                        bias_total[index] = dec.bias
        finally:
            if progress is not None:
                progress.close()
        if not return_delta:
            return found
        delta = torch.stack([
            ((total + bias - block.output).abs().amax(-1) * (1 if token_mask is None else token_mask)).amax(-1)
            for total, bias, block in zip(totals, bias_total, blocks)
        ], dim=1)
        return found, delta

    # ------------------------------------------------------------------ players and starts
    def check_players(self, request: Request, inputs: Sequence[Tensor]) -> None:
        """A one-line ValueError when the first block's input of a stack (``inputs``: one per
        segment, in the layout's order) holds NaN or inf (:func:`check_finite_inputs`)."""
        ids = [request.args[0]] if self.source is None else [request.args[0], request.kwargs.get("decoder_input_ids")]
        for segment, x, given in zip(self.segments, inputs, ids):
            if bool(torch.isfinite(x).all()):
                continue
            try:
                embedding = self.model.get_input_embeddings()
            except (AttributeError, NotImplementedError):
                embedding = None
            what = "the input embeddings" if self.source is None else f"the {segment}'s input embeddings"
            check_finite_inputs(x, given, embedding, what)

    def players_mask(self, request: Request, captured: Captured | None) -> Tensor:
        """The real positions of every player ``(B, P)``, in the layout's order (``captured``:
        an encoder–decoder's, for its source's length)."""
        if self.source is None:
            return request.read_mask
        return torch.cat(self.masks(request, [captured.source[0].inputs.shape[:2],
                                               captured.blocks[0].inputs.shape[:2]]), dim=1)

    def n_players(self, captured: Captured, n_groups: int) -> int:
        return n_groups if self.source is None else captured.source[0].inputs.shape[1] + n_groups

    def columns_of(self, part: Sequence[int], n_groups: int, device: torch.device) -> Tensor | slice:
        """Where a part's players go in the answer: its columns (one stack), or every column of
        the layout ``[source | target]`` (two stacks: a part is all players or none)."""
        if self.source is not None and part:
            return slice(None)
        return torch.as_tensor(list(part), dtype=torch.long, device=device)

    def encode(self, captured: Captured, rules: Mapping[str, Callable], reference: Any, players: bool,
                progress: Any) -> Decomposition | None:
        """An encoder–decoder's encoder output over the source players (``players=False``: over
        none, the bias player alone), after its final norm; ``None`` for one stack."""
        if self.source is None:
            return None
        encoder = captured.source
        x = encoder[0].inputs
        mask = encoder[0].token_mask
        ids = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        real = mask if mask is not None else torch.ones_like(ids)
        centered = is_centered(reference)
        chosen = list(range(x.shape[1])) if players else []
        r = None if centered else reference_inputs(reference, x, real)
        start = player_start(x, ids, chosen, mask, r, real if centered else None)
        chain = chain_for(self.source.spec, self.config)
        *_, encoded = propagate(encoder, chain, rules, start, self.memory_budget, progress)
        if self.source.final_norm is not None:
            weight, bias, eps = norm_parameters(self.source.final_norm, self.source.spec, self.config)
            real_input = captured.tensors[("source_norm", "input")].to(self.dtype)
            weight, bias = (None if t is None else t.detach().to(real_input.dtype) for t in (weight, bias))
            encoded = rules["norm"](encoded, real_input, weight, bias, eps)
        return encoded

    def start_of(self, captured: Captured, request: Request, groups: Tensor, part: Sequence[int], reference: Any,
               shared: Tensor | None, encoded: Decomposition | None) -> Decomposition:
        """The read stack's first-block input over the players: the chosen part of the players
        (one stack), or the layout ``[source | target]`` with every decoder block's ``source``
        set to the encoder's decomposition over it (two stacks)."""
        x = captured.blocks[0].inputs
        token_mask = captured.blocks[0].token_mask
        r = None if shared is not None else self.reference_of(reference, x, token_mask, request.args, request.kwargs)
        own = player_start(x, groups, part, token_mask, r, shared)
        if encoded is None:
            return own
        own_mask = None if token_mask is None or not part else token_mask[:, list(part)]
        source = joint(encoded, 0, own.n_in, None, own_mask)
        for block in captured.blocks:
            block.source = source
        return joint(own, encoded.n_in, 0, encoded.player_mask, None)

    # ------------------------------------------------------------------ budgets
    def is_light(self, ids: Tensor) -> bool:
        """Whether the forward route should record one block at a time (replaying each from
        its recorded input) rather than every block's attention probabilities at once: when
        those would not fit ``memory_budget``."""
        heads = getattr(self.config, "num_attention_heads", 1) or 1
        n = ids.shape[-1]
        return ids.shape[0] * heads * n * n * 4 * len(self.stack.blocks) > self.memory_budget

    def replay(self, block: Block) -> Block:
        return replay_block(block, self.model)

    @property
    def memory_budget(self) -> int:
        """Bytes the forward route's row chunks and player groups may take."""
        return self._memory_budget

    @memory_budget.setter
    def memory_budget(self, value: int | None) -> None:
        self._memory_budget = DEFAULT_MEMORY_BUDGET if value is None else int(value)
        self._budget_given = value is not None

    def _recompute(self, request: Request) -> bool:
        """Whether the backward route should recompute blocks instead of keeping their
        intermediate tensors: when those would not fit ``memory_budget`` if one was given,
        else half the memory available on the inputs' device (keeping them costs about as
        much as a plain backward pass keeps, and recomputing costs a second forward pass)."""
        width, ff = self._widths()
        per_block = request.read_mask.numel() * (2 * ff + 6 * width) * 4
        budget = self.memory_budget if self._budget_given else available_bytes(request.read_mask.device) // 2
        return self.source is None and per_block * len(self.stack.blocks) > budget

    def group_size(self, x: Tensor, rules: Mapping[str, Callable]) -> int:
        """How many players the forward route propagates at once (all of them when they fit
        ``memory_budget``)."""
        batch, n, d = x.shape
        per_player = batch * n * d * (torch.finfo(self.dtype).bits // 8) * 12
        size = max(1, min(n, self.memory_budget // max(per_player, 1)))
        if size < n and not all(is_linear_in_players(r) for r in rules.values()):
            raise ValueError("a rule that is not linear in the players needs all players at once: "
                             "raise memory_budget")
        return size

    def _widths(self) -> tuple[int, int]:
        """The stream's width and the FF's (its configured size, else four times the stream's)."""
        width = getattr(self.config, "hidden_size", 0) or getattr(self.config, "d_model", 0) or 0
        return width, getattr(self.config, "intermediate_size", 0) or 4 * width

    def sweep_limit(self, inputs: Tensor) -> int:
        """How many read-outs one backward sweep carries: as many as keep their cotangents (and
        one block's batched activations, about 12 of a cotangent's size) within
        ``memory_budget``, at most ``SWEEP_LIMIT``; on a CPU also within
        ``CPU_SWEEP_BYTES`` per batched FF activation."""
        per_read_out = inputs.numel() * inputs.element_size() * 13
        limit = min(SWEEP_LIMIT, int(self.memory_budget // max(per_read_out, 1)))
        if inputs.device.type == "cpu":
            activation = inputs.shape[0] * inputs.shape[1] * self._widths()[1] * inputs.element_size()
            limit = min(limit, CPU_SWEEP_BYTES // max(activation, 1))
        return max(1, limit)

    def progress_bar(self, total: int) -> Any:
        if not self.show_progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="propagating", unit="block")

    def _warn_if_reduced_precision(self) -> None:
        """Once per engine: a bfloat16 / float16 model's backward-route delta is measured
        against its own low-precision output, so it does not show the precision lost."""
        if self._precision_warned:
            return
        dtype = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), None)
        if dtype in (torch.float16, torch.bfloat16):
            self._precision_warned = True
            name = str(dtype).replace("torch.", "")
            warnings.warn(
                f"the model computes in reduced precision ({name}): on the backward route the "
                f"convergence delta is measured against the model's own {name} output, so it "
                "does not show that the contributions may differ from the float32 model's by "
                "about 1 %; load the model in float32 for exact contributions",
                stacklevel=5,
            )


# --------------------------------------------------------------------------- helpers of the routes


#: Names that left with the features in 0.4, still importable from here for one release.
__getattr__ = moved_names(__name__, {
    "BACKWARD_PER_FORWARD_PLAYER": "captum_ffb.components.pipeline", "ComponentTable": "captum_ffb.components.pipeline",
    "component_route": "captum_ffb.components.pipeline", "EMBEDDINGS": "captum_ffb.components.sums",
    "HEAD": "captum_ffb.components.sums", "BuiltGraph": "captum_ffb.graph.pipeline",
    "EXACT_ABOVE": "captum_ffb.patching.patches",
})


def _same_rule(rule: Callable, default: Callable) -> bool:
    """Whether ``rule`` is ``default``'s type with the same settings (a rule whose settings
    cannot be compared is taken as another)."""
    if type(rule) is not type(default):
        return False
    try:
        return bool(vars(rule) == vars(default))
    except (TypeError, RuntimeError, ValueError):  # no __dict__, or tensors among the settings
        return False
