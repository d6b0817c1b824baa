r"""Encoder–decoder models end to end: a target token's logit written exactly over the source
tokens and the target prefix.

The players are the encoder's first-block input vectors (the source) and the decoder's
(the target prefix). The encoder's decomposition over the source players enters every
decoder block's cross-attention as the decomposition of its values (METHOD.md,
"Encoder–decoder models"), so one target logit is ``Σ_source c_s + Σ_target c_t + c_bias``.

Two routes compute it, as for decoder-only models: ``"backward"`` runs the model once with
its coefficients frozen (:func:`~captum_ffb.engine.linearise.linearise`, both stacks) and
takes one gradient per explained token; ``"forward"`` carries the decompositions through the
encoder's chains, then the decoder's cross-attention chains, then the head's rules. They
are independent computations of the same numbers; the forward route also gives the bias
player on its own (the convergence delta's check).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.architectures.spec import ArchitectureSpec
from captum_ffb.decomposition import Decomposition
from captum_ffb.engine.block import Block, block_watch, config_of, norm_parameters
from captum_ffb.engine.capture import capture, token_mask_of
from captum_ffb.engine.chains import Chain
from captum_ffb.engine.layers import chain_for
from captum_ffb.engine.linearise import linearise
from captum_ffb.engine.model import final_norm_of, find_blocks
from captum_ffb.engine.whole import (
    ResolvedHead,
    is_centered,
    player_start,
    propagate,
    reference_inputs,
    resolve_head,
    resolve_in,
    token_contributions,
    visible_positions,
)
from captum_ffb.rules import check_rules

#: The keyword arguments that carry the target side of an encoder–decoder's forward.
TARGET_KEYS = ("decoder_input_ids", "decoder_inputs_embeds")


@dataclass
class Seq2SeqAnswer:
    """One explained target token per row.

    Attributes:
        source (Tensor): ``(B, n_source)`` contributions of the source players.
        target (Tensor): ``(B, n_target)`` contributions of the target-prefix players.
        bias (Tensor, optional): ``(B,)`` the bias player's (``None`` when not computed).
        value (Tensor): ``(B,)`` the explained logit as the route computed it.
        real (Tensor): ``(B,)`` the logit the model computed.
    """

    source: Tensor
    target: Tensor
    bias: Tensor | None
    value: Tensor
    real: Tensor


@dataclass
class EncoderDecoder:
    """An encoder–decoder model bound to its family's specs: both stacks, their final norms
    and the language-model head.

    Attributes:
        model (nn.Module): the task model (``*ForConditionalGeneration``, ``MarianMTModel``).
        spec (ArchitectureSpec): the family's spec (the encoder's; ``spec.decoder`` the
                    decoder's).
        encoder_blocks (list[nn.Module]): the encoder's blocks.
        decoder_blocks (list[nn.Module]): the decoder's blocks.
        encoder_norm (nn.Module, optional): the norm after the encoder's last block.
        head (ResolvedHead): the decoder's final norm and the output layer.
        logits_bias (Tensor, optional): ``(vocabulary,)`` added to the logits.
    """

    model: nn.Module
    spec: ArchitectureSpec
    encoder_blocks: list[nn.Module]
    decoder_blocks: list[nn.Module]
    encoder_norm: nn.Module | None
    head: ResolvedHead
    logits_bias: Tensor | None

    @classmethod
    def of(cls, model: nn.Module, spec: ArchitectureSpec) -> EncoderDecoder:
        """Bind ``model`` (of a family whose spec has a ``decoder``)."""
        if spec.decoder is None:
            raise ValueError(f"{type(model).__name__} is not an encoder–decoder")
        head = resolve_head(model, spec.decoder)
        if head.task != "seq2seq_lm":
            raise ValueError(
                f"{type(model).__name__} has no language-model head: load the model with its head "
                "(AutoModelForSeq2SeqLM, *ForConditionalGeneration, MarianMTModel)"
            )
        bias = resolve_in(model, head.spec.logits_bias) if head.spec.logits_bias else None
        return cls(model, spec, list(find_blocks(model, spec)), list(find_blocks(model, spec.decoder)),
                   final_norm_of(model, spec), head, bias if isinstance(bias, Tensor) else None)

    @property
    def config(self) -> Any:
        return config_of(self.model)

    def spec_of(self, block: nn.Module) -> ArchitectureSpec:
        return self.spec.for_block(block)

    def chain_of(self, block: nn.Module) -> Chain:
        return self.chain_of_spec(self.spec_of(block))

    def layouts(self) -> list[ArchitectureSpec]:
        """The distinct specs of the model's blocks (encoder, decoder, alternative layouts)."""
        found: dict[int, ArchitectureSpec] = {}
        for block in [*self.encoder_blocks, *self.decoder_blocks]:
            spec = self.spec_of(block)
            found.setdefault(id(spec), spec)
        return list(found.values())

    def rules(self, rules: Mapping[str, Callable] | None, defaults: Callable[[str], dict[str, Any]],
              where: str) -> dict[str, Callable]:
        """``defaults`` for every role some block's chain calls, with the user's replacements."""
        roles: set[str] = set()
        for spec in self.layouts():
            roles |= self.chain_of_spec(spec).roles(spec)
        chosen = {role: rule for role, rule in defaults(self.spec.norm).items() if role in roles}
        chosen.update(check_rules(rules, frozenset(roles), where))
        return chosen

    def chain_of_spec(self, spec: ArchitectureSpec) -> Chain:
        return chain_for(spec, self.config)


def split_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor | None, Tensor | None]:
    """``(source mask, target mask)`` from the forward's keyword arguments (``None``: all real)."""
    source = kwargs.get("attention_mask")
    target = kwargs.get("decoder_attention_mask")
    return (source if isinstance(source, Tensor) else None, target if isinstance(target, Tensor) else None)


def check_target_given(kwargs: dict[str, Any]) -> None:
    """A clear error when the forward would not run the decoder on a given target."""
    if not any(kwargs.get(key) is not None for key in TARGET_KEYS):
        raise ValueError(
            "an encoder–decoder explains a target: give forward_kwargs={'decoder_input_ids': ...} "
            "(the target prefix, starting with the decoder's start token), or use attribute_steps "
            "/ generate to produce one"
        )


# --------------------------------------------------------------------------- backward route
def _contributions(gradient: Tensor, inputs: Tensor, mask: Tensor | None, reference: Any,
                   visible: Tensor | None) -> Tensor:
    """``⟨g_j, x_j − r_j⟩`` per player (one stack), the centred reference as in the
    decoder-only models (:func:`~captum_ffb.engine.whole.token_contributions`)."""
    real = torch.ones(inputs.shape[:2], device=inputs.device) if mask is None else mask.to(inputs.dtype)
    if is_centered(reference):
        out = token_contributions(gradient, inputs, None, visible)
    else:
        r = reference_inputs(reference, inputs, real)
        out = token_contributions(gradient, inputs, r, None)
    return out * real.to(out.dtype)


def backward_route(bound: EncoderDecoder, rules: Mapping[str, Callable], args: tuple[Any, ...],
                   kwargs: dict[str, Any], tokens: Tensor, positions: Tensor, reference: Any,
                   dtype: torch.dtype = torch.float32) -> list[Seq2SeqAnswer]:
    """One forward pass of the frozen model; one gradient per explained column.

    Args:
        tokens (Tensor): ``(B, T)`` the token whose logit is explained, ``T`` per row.
        positions (Tensor): ``(B, T)`` the decoder position whose logits are read.
    """
    model = bound.model
    source_mask, target_mask = split_inputs(args, kwargs)
    kwargs = {**kwargs, "use_cache": False}
    decoder = bound.spec.decoder
    training = model.training
    model.eval()
    answers = []
    try:
        with linearise(model, decoder, bound.decoder_blocks, rules, bound.head.final_norm, (),
                       source=(bound.spec, bound.encoder_blocks, bound.encoder_norm)) as frozen:
            output = model(*args, **kwargs)
            logits = output.logits
            rows = torch.arange(logits.shape[0], device=logits.device)
            target_inputs = frozen.inputs.detach()
            source_inputs = frozen.source_inputs.detach()
            t_mask = target_mask if target_mask is not None else torch.ones(target_inputs.shape[:2])
            for k in range(tokens.shape[1]):
                value = logits[rows, positions[:, k], tokens[:, k]]
                g_target, g_source = torch.autograd.grad(
                    value.sum(), [frozen.inputs, frozen.source_inputs], retain_graph=k + 1 < tokens.shape[1])
                visible = visible_positions(t_mask.to(target_inputs.device), positions[:, k], True)
                target = _contributions(g_target, target_inputs, target_mask, reference, visible)
                s_mask = source_mask if source_mask is not None else torch.ones(source_inputs.shape[:2])
                source = _contributions(g_source, source_inputs, source_mask, reference, s_mask.to(source_inputs.device))
                value = value.detach().to(dtype)
                answers.append(Seq2SeqAnswer(source.to(dtype), target.to(dtype), None, value, value.clone()))
    finally:
        model.train(training)
    return answers


# --------------------------------------------------------------------------- forward route
def _capture(bound: EncoderDecoder, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype
             ) -> tuple[list[Block], list[Block], dict, Any]:
    """One pass recording both stacks, the final norms and the output layer."""
    model = bound.model
    blocks = [*bound.encoder_blocks, *bound.decoder_blocks]
    specs = [bound.spec_of(block) for block in blocks]
    watches = [block_watch(block, spec) for block, spec in zip(blocks, specs)]
    extra = {"output": bound.head.output}
    if bound.head.final_norm is not None:
        extra["decoder_norm"] = bound.head.final_norm
    if bound.encoder_norm is not None:
        extra["encoder_norm"] = bound.encoder_norm
    training = model.training
    model.eval()
    try:
        recorded = capture(lambda: model(*args, **{**kwargs, "use_cache": False}), watches, owners=[model],
                           extra=extra, keep_output=True)
    finally:
        model.train(training)
    config = bound.config
    source_mask, target_mask = split_inputs(args, kwargs)
    n_encoder = len(bound.encoder_blocks)
    first_source = recorded.blocks[0].inputs
    source_mask = token_mask_of(source_mask, first_source)
    target_mask = token_mask_of(target_mask, recorded.blocks[n_encoder].inputs)
    encoder = [Block(b, s, r, dtype=dtype, token_mask=source_mask, config=config)
               for b, s, r in zip(blocks[:n_encoder], specs[:n_encoder], recorded.blocks[:n_encoder])]
    decoder = [Block(b, s, r, dtype=dtype, token_mask=target_mask, config=config, source_mask=source_mask)
               for b, s, r in zip(blocks[n_encoder:], specs[n_encoder:], recorded.blocks[n_encoder:])]
    return encoder, decoder, recorded.tensors, recorded.output


def _norm(rules: Mapping[str, Callable], module: nn.Module, spec: ArchitectureSpec, config: Any,
          decomposition: Decomposition, real: Tensor) -> Decomposition:
    weight, bias, eps = norm_parameters(module, spec, config)
    weight, bias = (None if t is None else t.detach().to(real.dtype) for t in (weight, bias))
    return rules["norm"](decomposition, real, weight, bias, eps)


def _joint(decomposition: Decomposition, before: int, after: int, before_mask: Tensor | None,
           after_mask: Tensor | None) -> Decomposition:
    """``decomposition`` over ``before`` more players, its own, then ``after`` more (the
    others own nothing of it), with the joint player mask."""
    dense = decomposition.dense()
    terms = dense.terms
    batch, n, own, width = terms.shape
    masks = (before_mask, dense.player_mask, after_mask)
    players = None
    if any(mask is not None for mask in masks):
        players = torch.cat([terms.new_ones(batch, size) if mask is None else mask.to(terms.dtype)
                             for mask, size in zip(masks, (before, own, after))], dim=1)
    terms = torch.cat([terms.new_zeros(batch, n, before, width), terms,
                       terms.new_zeros(batch, n, after, width)], dim=2)
    return Decomposition(terms, dense.bias, dense.token_mask, players)


@dataclass
class _Propagation:
    """One capture of both stacks and the encoder's decomposition over the source players,
    ready to start the decoder for any read position."""

    bound: EncoderDecoder
    decoder: list[Block]
    tensors: dict
    output: Any
    encoded: Decomposition
    target_inputs: Tensor
    target_mask: Tensor | None
    target_players: list[int]
    source_players: list[int]
    reference: Any

    @classmethod
    def of(cls, bound: EncoderDecoder, rules: Mapping[str, Callable], args: tuple[Any, ...],
           kwargs: dict[str, Any], reference: Any, budget: int, dtype: torch.dtype, players: bool
           ) -> _Propagation:
        encoder, decoder, tensors, output = _capture(bound, args, kwargs, dtype)
        x_source, x_target = encoder[0].inputs, decoder[0].inputs
        source_mask = encoder[0].token_mask
        source_ids = torch.arange(x_source.shape[1], device=x_source.device).expand(x_source.shape[0], -1)
        source_real = source_mask if source_mask is not None else torch.ones_like(source_ids)
        centered = is_centered(reference)
        chosen_source = list(range(x_source.shape[1])) if players else []
        r_source = None if centered else reference_inputs(reference, x_source, source_real)
        start = player_start(x_source, source_ids, chosen_source, source_mask, r_source,
                             source_real if centered else None)
        *_, encoded = propagate(encoder, bound.chain_of(encoder[0].module), rules, start, budget)
        if bound.encoder_norm is not None:
            encoded = _norm(rules, bound.encoder_norm, bound.spec, bound.config, encoded,
                            tensors[("encoder_norm", "input")].to(dtype))
        chosen_target = list(range(x_target.shape[1])) if players else []
        return cls(bound, decoder, tensors, output, encoded, x_target, decoder[0].token_mask,
                   chosen_target, chosen_source, reference)

    @property
    def chain(self) -> Chain:
        return self.bound.chain_of(self.decoder[0].module)

    def start(self, position: Tensor) -> Decomposition:
        """The decoder's first-block input over the players ``[target | source]`` for an output
        read at ``position`` (the centred reference averages the positions it sees), with
        every decoder block's ``source`` set to the encoder's decomposition over them."""
        x = self.target_inputs
        ids = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        real = self.target_mask if self.target_mask is not None else torch.ones_like(ids)
        centered = is_centered(self.reference)
        r_target = None if centered else reference_inputs(self.reference, x, real)
        visible = visible_positions(real, position, True) if centered else None
        target_start = player_start(x, ids, self.target_players, self.target_mask, r_target, visible)
        mask = None if self.target_mask is None else self.target_mask[:, self.target_players]
        source = _joint(self.encoded, len(self.target_players), 0, mask, None)
        for block in self.decoder:
            block.source = source
        return _joint(target_start, 0, len(self.source_players), None, self.encoded.player_mask)

    def real(self, position: Tensor, token: Tensor, dtype: torch.dtype) -> Tensor:
        logits = self.output.logits
        rows = torch.arange(logits.shape[0], device=logits.device)
        return logits[rows, position, token].detach().to(dtype)


def forward_route(bound: EncoderDecoder, rules: Mapping[str, Callable], args: tuple[Any, ...],
                  kwargs: dict[str, Any], tokens: Tensor, positions: Tensor, reference: Any,
                  budget: int, dtype: torch.dtype = torch.float32, players: bool = True) -> list[Seq2SeqAnswer]:
    """The decompositions carried through both stacks and the head (see the module's text);
    with ``players=False`` only the bias player is carried (the backward route's check)."""
    prepared = _Propagation.of(bound, rules, args, kwargs, reference, budget, dtype, players)
    n_target = len(prepared.target_players)
    answers = []
    for k in range(tokens.shape[1]):
        position = positions[:, k]
        start = prepared.start(position)
        *_, last = propagate(prepared.decoder, prepared.chain, rules, start, budget)
        share, bias = _head(bound, rules, last, position, tokens[:, k], prepared.tensors, dtype)
        answers.append(Seq2SeqAnswer(share[:, n_target:], share[:, :n_target], bias, share.sum(-1) + bias,
                                     prepared.real(position, tokens[:, k], dtype)))
    return answers


def components_route(bound: EncoderDecoder, rules: Mapping[str, Callable], args: tuple[Any, ...],
                     kwargs: dict[str, Any], token: Tensor, position: Tensor, reference: Any,
                     granularity: str, budget: int, dtype: torch.dtype = torch.float32
                     ) -> tuple[list[str], Tensor, Tensor, Tensor]:
    """Direct effects on one target logit per row: ``(component names, contributions (B, P,
    C) over the players [target | source], bias (B, C), the real logit (B,))``. The
    decoder's writers are its self-attention, cross-attention and FF sublayers (and their
    heads); the source enters the stream through the cross-attentions, so the writers before
    the first one owe it nothing."""
    from captum_ffb.engine.components import (
        _probe,
        check_granularity,
        check_linear_rules,
        direct_paths,
        propagate_components,
        stacked,
    )

    check_granularity(granularity)
    check_linear_rules(rules)
    prepared = _Propagation.of(bound, rules, args, kwargs, reference, budget, dtype, True)
    like = prepared.decoder[-1].output
    with torch.enable_grad():  # the logit's covector at the last decoder block's output
        terms, probe = _probe(*like.shape, like)
        share, constant = _head(bound, rules, probe, position, token, prepared.tensors, dtype)
        (covector,) = torch.autograd.grad(share.sum(), terms)
    paths = direct_paths(prepared.decoder, prepared.chain, rules, covector[:, :, 0].detach(), constant.detach())
    start = prepared.start(position)
    sums, _ = propagate_components(prepared.decoder, prepared.chain, rules, start, paths, granularity, budget)
    names, contributions, bias = stacked(sums, start.n_in, like)
    return names, contributions, bias, prepared.real(position, token, dtype)


def _head(bound: EncoderDecoder, rules: Mapping[str, Callable], last: Decomposition, position: Tensor,
          token: Tensor, tensors: dict, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The explained logit's share per player ``(B, P)`` and its bias ``(B,)`` from the last
    decoder block's decomposition: final norm, the model's factor, the output row, biases."""
    batch = last.batch_size
    rows = torch.arange(batch, device=position.device)
    terms = last.terms[rows, position][:, None]  # (B, 1, P, d)
    bias = last.bias[rows, position][:, None]
    at = Decomposition(terms, bias)
    head = bound.head
    if head.final_norm is not None:
        real = tensors[("decoder_norm", "input")].to(dtype)[rows, position][:, None]
        at = _norm(rules, head.final_norm, bound.spec.decoder, bound.config, at, real)
    weight = head.output.weight.detach().to(dtype)[token]  # (B, d)
    share = torch.einsum("bpd,bd->bp", at.terms[:, 0], weight)
    constant = torch.einsum("bd,bd->b", at.bias[:, 0], weight)
    if head.scale is not None:
        share, constant = share * head.scale, constant * head.scale
    if head.output.bias is not None:
        constant = constant + head.output.bias.detach().to(dtype)[token]
    if bound.logits_bias is not None:
        constant = constant + bound.logits_bias.detach().to(dtype).reshape(-1)[token]
    return share, constant
