r"""A model bound to its family: its stacks of blocks, its head, its stream points, and the
request of one call.

:class:`BoundModel` is what every feature of the engine reads of a model — the whole-model
routes (:class:`~captum_ffb.engine.whole.WholeModel`, which extends it), the graphs
(:mod:`~captum_ffb.engine.tape`), the score splits and patching — bound once: the family's
spec, the blocks of each stack (an encoder–decoder's encoder, then its decoder), the head,
the writers and reads of the residual stream (:mod:`~captum_ffb.engine.points`), and what
every call needs of them (the request, the players' masks and references, the explained
value through the frozen model).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.architectures import get_architecture
from captum_ffb.architectures.spec import ArchitectureSpec
from captum_ffb.engine.block import config_of
from captum_ffb.engine.head import (
    HeadTarget,
    linearised_target_value,
    resolve_head,
    target_value,
)
from captum_ffb.engine.layers import chain_for
from captum_ffb.engine.model import final_norm_of, find_blocks, model_type_of
from captum_ffb.engine.passes import ModelPass, first_block_input
from captum_ffb.engine.players import is_centered, reference_inputs, visible_positions
from captum_ffb.engine.points import stream_points
from captum_ffb.engine.requests import text_token_ids
from captum_ffb.rules import check_rules, whole_model_rules

#: The keyword arguments that carry an encoder–decoder's target.
TARGET_KEYS = ("decoder_input_ids", "decoder_inputs_embeds")


@dataclass
class Stack:
    """One stack of blocks.

    Attributes:
        spec (ArchitectureSpec): its blocks' layout (the family's, or its decoder's).
        blocks (list[nn.Module]): the blocks, in order.
        final_norm (nn.Module, optional): a norm after the stack that is not the head's (an
                    encoder's final norm).
    """

    spec: ArchitectureSpec
    blocks: list[nn.Module]
    final_norm: nn.Module | None = None


@dataclass
class Request:
    """One checked call of the model, built once at the library's door.

    Attributes:
        args (tuple): the forward's positional arguments (the inputs first).
        kwargs (dict): its keyword arguments (an encoder–decoder's target among them).
        read_mask (Tensor): ``(B, n)`` the real positions of the stack whose output is read
                    (the decoder's for an encoder–decoder).
        reference (Any): what the players are measured from (checked at the door).
        target (HeadTarget, optional): the explained output, resolved (the model's
                    prediction made concrete where none was named).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    read_mask: Tensor
    reference: Any = None
    target: HeadTarget | None = None

    @property
    def batch_size(self) -> int:
        return int(self.read_mask.shape[0])


class BoundModel:
    r"""A model bound to its family: its stacks, its head and its stream points.

    Args:
        model (nn.Module): a Hugging Face model of a supported family (a task model, or a base
                    model read through a direction).
        model_type (str, optional): the family when the config does not say it.
    """

    def __init__(self, model: nn.Module, model_type: str | None = None) -> None:
        self.model = model
        self.model_type = model_type or model_type_of(model)
        self.family = get_architecture(self.model_type)
        self.config = config_of(model)
        if self.config is not None:
            self.family.check_config(self.config)  # once, where the model is bound
        self.source: Stack | None = None
        if self.family.decoder is not None:
            self.head = resolve_head(model, self.family.decoder)
            if self.head.task != "seq2seq_lm":
                raise ValueError(
                    f"{type(model).__name__} has no language-model head: load the model with its head "
                    "(AutoModelForSeq2SeqLM, *ForConditionalGeneration, MarianMTModel)")
            encoder = list(find_blocks(model, self.family))
            self.source = Stack(self.family.for_block(encoder[0]), encoder, final_norm_of(model, self.family))
            blocks = list(find_blocks(model, self.family.decoder))
        else:
            blocks = list(find_blocks(model, self.family))
        self.stack = Stack(self.family.for_block(blocks[0]), blocks)
        if self.source is None:
            self.head = resolve_head(model, self.stack.spec)
        self.chain = chain_for(self.stack.spec, self.config)
        #: every writer and read of the residual stream, named once (:mod:`~captum_ffb.engine.points`)
        self.points = stream_points([(stack.blocks, lambda spec: chain_for(spec, self.config))
                                     for stack in (self.source, self.stack) if stack is not None],
                                    self.family, self.config)

    # ------------------------------------------------------------------ what the model is
    @property
    def task(self) -> str:
        """``"causal_lm"``, ``"sequence_classification"``, ``"seq2seq_lm"`` or ``"base"``."""
        return self.head.task

    @property
    def segments(self) -> tuple[str, ...]:
        """The player layout: ``("source", "target")`` or ``("tokens",)``."""
        return ("tokens",) if self.source is None else ("source", "target")

    @property
    def spec(self) -> ArchitectureSpec:
        """The layout of the read stack's blocks (the decoder's for an encoder–decoder)."""
        return self.stack.spec

    @property
    def blocks(self) -> list[nn.Module]:
        """The read stack's blocks."""
        return self.stack.blocks

    def layouts(self) -> list[ArchitectureSpec]:
        """The distinct layouts of every block (both stacks, alternative layouts)."""
        found: dict[int, ArchitectureSpec] = {}
        for stack in (self.source, self.stack):
            for block in ([] if stack is None else stack.blocks):
                spec = self.family.for_block(block)
                found.setdefault(id(spec), spec)
        return list(found.values())

    def rules(self, overrides: Mapping[str, Callable] | None = None) -> dict[str, Callable]:
        """The whole-model default rules for every role some block's chain calls, with
        ``overrides`` (role → rule) checked against those roles."""
        roles: set[str] = set()
        for spec in self.layouts():
            roles |= chain_for(spec, self.config).roles(spec)
        chosen = {role: rule for role, rule in whole_model_rules(self.family.norm).items() if role in roles}
        chosen.update(check_rules(overrides, frozenset(roles), f"a {self.model_type} model"))
        return chosen

    def request(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Request:
        """The request of one call (its arguments checked at the library's door): the read
        stack's real positions."""
        if self.source is not None:
            if not any(kwargs.get(key) is not None for key in TARGET_KEYS):
                raise ValueError(
                    "an encoder–decoder explains a target: give forward_kwargs={'decoder_input_ids': ...} "
                    "(the target prefix, starting with the decoder's start token)")
            ids = kwargs.get("decoder_input_ids")
            if ids is None:
                ids = kwargs["decoder_inputs_embeds"][..., 0]
            mask = kwargs.get("decoder_attention_mask")
        else:
            ids, mask = args[0], kwargs.get("attention_mask")
        real = (mask != 0).to(ids.device) if isinstance(mask, Tensor) and mask.shape == ids.shape[:2] \
            else torch.ones(ids.shape[:2], dtype=torch.bool, device=ids.device)
        return Request(args, dict(kwargs), real)

    def token_ids(self, tokenizer: Any, text: str, one: bool = False) -> list[int]:
        """The token ids of a target given as text (an encoder–decoder's target side), without
        special tokens (:func:`~captum_ffb.engine.requests.text_token_ids`: unknown text
        refused; with ``one``, a one-line error unless it is one token)."""
        if tokenizer is None:
            raise TypeError(f"target {text!r} is text: give NormDecomposition(model, tokenizer=...) to read "
                            "it, or its token id")
        return text_token_ids(tokenizer, text, one=one, decoder=self.source is not None)

    def refuse_two_stacks(self, what: str) -> None:
        """A one-line error for what encoder–decoders do not have yet."""
        if self.source is not None:
            raise ValueError(f"{what} is not available for encoder–decoder models yet")

    def predict(self, request: Request) -> Any:
        """The model's own output on the request (one real pass, without gradients)."""
        with ModelPass(self.model) as run:
            return run.run(*request.args, **request.kwargs)

    # ------------------------------------------------------------------ players and values
    def keep_needed_logits(self, kwargs: dict[str, Any], targets: list[HeadTarget]
                            ) -> tuple[dict[str, Any], list[HeadTarget]]:
        """Ask a causal LM for the logits of the target positions only (``logits_to_keep``):
        the ``n × vocabulary`` logits are most of the memory of a long sequence otherwise."""
        if "logits_to_keep" in kwargs:
            if not (isinstance(kwargs["logits_to_keep"], int) and kwargs["logits_to_keep"] == 0):
                raise ValueError("leave logits_to_keep out (or 0): the target positions say which "
                                 "logits are read")
            return kwargs, targets
        if self.head.task != "causal_lm":
            return kwargs, targets
        if "logits_to_keep" not in inspect.signature(self.model.forward).parameters:
            return kwargs, targets
        # One 1-D tensor of positions, kept for every row: every transformers 5 release reads
        # it the same way (a per-row 2-D tensor is understood from 5.21 on only).
        columns = [t.positions.reshape(t.positions.shape[0], -1) for t in targets]  # (B,) or (B, K) each
        keep, index = torch.unique(torch.cat(columns, dim=1), return_inverse=True)
        starts = [0]
        for column in columns:
            starts.append(starts[-1] + column.shape[1])
        moved = [replace(t, positions=index[:, a:b].reshape(t.positions.shape))
                 for t, a, b in zip(targets, starts, starts[1:])]
        return {**kwargs, "logits_to_keep": keep}, moved

    def masks(self, request: Request, shapes: Sequence[torch.Size]) -> list[Tensor]:
        """Each segment's real positions ``(B, n_segment)``, for segments of these shapes."""
        if self.source is None:
            return [request.read_mask]
        source = request.kwargs.get("attention_mask")
        device = request.read_mask.device
        source_mask = (source != 0).to(device) if isinstance(source, Tensor) and source.shape == shapes[0] \
            else torch.ones(shapes[0], dtype=torch.bool, device=device)
        return [source_mask, request.read_mask]

    def reference_of(self, reference: Any, x: Tensor, token_mask: Tensor | None, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Tensor | None:
        """The reference inputs ``(B, n, d)`` (``None`` for zero)."""
        if self.source is not None and not (reference is None or isinstance(reference, str)):
            raise ValueError("an encoder–decoder's reference is 'zero', 'mean' or 'centered'")
        return reference_inputs(reference, x, token_mask, lambda token: self._token_inputs(token, args, kwargs))

    def shared_positions(self, reference: Any, token_mask: Tensor, target: HeadTarget) -> Tensor | None:
        """For the centred reference, the ``(B, n)`` positions of the read stack whose mean the
        players are measured from: those the explained output sees."""
        if not is_centered(reference):
            return None
        causal = self.source is not None or self.stack.spec.is_causal(self.config)
        positions = target.positions
        if positions is not None and positions.dim() == 2:  # terms at several positions: the last sees the others'
            positions = positions.amax(1)
        return visible_positions(token_mask, positions, causal)

    def _token_inputs(self, token: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        """The first block's input for the inputs with every token id replaced by ``token``
        (same positions, masks and other arguments); the model stops at the first block."""
        ids = torch.full_like(args[0], int(token))
        return first_block_input(self.model, self.stack.blocks[0], (ids, *args[1:]), kwargs)

    # ------------------------------------------------------------------ the value read
    def linearised_value(self, output: Any, frozen: Any, target: HeadTarget, rules: Mapping[str, Callable]) -> Tensor:
        """``(B,)`` the explained value with the frozen model's graph: read from the model's own
        output (every constant after the output layer included), or through the output layer
        where a final soft-capping must pass through the activation rule's frozen slope."""
        if self.head.task == "base" or self.head.softcap is None:
            return target_value(self.head, output, target)
        return linearised_target_value(self.head, frozen.outputs["output"], target, rules)
