r"""Whole-model attribution of encoder–decoders: each target token's logit over the source
tokens and the target prefix (what :class:`~captum_ffb.attr.NormDecomposition` does for a model
whose family has a decoder spec).

The result of one explained token is a pair ``(source (B, n_source), target (B, n_target))``
with ``Σ source + Σ target + bias = logit`` exactly; its **source share**
``Σ source / logit`` is ALTI+'s headline quantity (Ferrando et al., 2022), here with the
feed-forward blocks and exact. With the default centred reference each stack's tokens are
measured from their own mean and that mean's output is shared back to them, so the share
is the same as from zero (centring moves credit within a stack, never between them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captum_ffb.attr.components import ComponentAttribution
from captum_ffb.engine.capture import forward_arguments
from captum_ffb.engine.requests import check_forward_kwargs, check_index, check_new_tokens
from captum_ffb.engine.seq2seq import (
    EncoderDecoder,
    Seq2SeqAnswer,
    backward_route,
    check_target_given,
    components_route,
    forward_route,
)
from captum_ffb.rules import whole_model_rules


@dataclass
class Seq2SeqExplanation:
    r"""Every generated (or forced) target token explained over the source and the prefix.

    Attributes:
        source_ids (Tensor): ``(n_source,)`` the source token ids (empty for audio sources).
        target_ids (Tensor): ``(n_target,)`` the decoder's input: its start token, then the
                    target tokens but the last.
        tokens (Tensor): ``(T,)`` the explained target tokens (``tokens[t]`` is read at
                    decoder position ``t``).
        source (Tensor): ``(T, n_source)`` contributions of the source players.
        target (Tensor): ``(T, n_target)`` contributions of the target-prefix players (zero
                    from position ``t + 1`` on: the decoder is causal).
        bias (Tensor): ``(T,)`` the bias player's.
        value (Tensor): ``(T,)`` the logits explained.
        delta (Tensor): ``(T,)`` ``|Σ source + Σ target + bias − logit|``.
    """

    source_ids: Tensor
    target_ids: Tensor
    tokens: Tensor
    source: Tensor
    target: Tensor
    bias: Tensor
    value: Tensor
    delta: Tensor

    @property
    def source_share(self) -> Tensor:
        """``(T,)``: ``Σ source / logit`` for each explained token."""
        return self.source.sum(-1) / self.value

    @property
    def source_magnitude_share(self) -> Tensor:
        """``(T,)``: ``Σ |source| / (Σ |source| + Σ |target prefix|)``, the source's part of the
        tokens' contributions by magnitude (ALTI+'s kind of proportion, in ``[0, 1]``). Unlike
        :attr:`source_share` it stays readable where large parts cancel (a model whose own
        bias terms are as large as the parts: Whisper-base, docs/encoder_decoder.md)."""
        source = self.source.abs().sum(-1)
        return source / (source + self.target.abs().sum(-1)).clamp_min(torch.finfo(source.dtype).tiny)

    def table(self, tokenizer: Any = None) -> str:
        """A Markdown table: one row per explained token, its logit, source, target prefix
        and bias parts, the source shares and the delta."""
        lines = ["| step | token | logit | Σ source | Σ target prefix | bias | source share | "
                 "source share by magnitude | delta |",
                 "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for step, token in enumerate(self.tokens.tolist()):
            shown = tokenizer.convert_ids_to_tokens(int(token)) if tokenizer is not None else str(token)
            lines.append(
                f"| {step} | {shown} | {self.value[step]:.4f} | {self.source[step].sum():.4f} | "
                f"{self.target[step].sum():.4f} | {self.bias[step]:.4f} | {self.source_share[step]:.3f} | "
                f"{self.source_magnitude_share[step]:.3f} | {self.delta[step]:.1e} |")
        return "\n".join(lines)


def _refuse(name: str, given: Any) -> None:
    if given is not None:
        raise ValueError(f"{name}= is not available for encoder–decoder models yet")


def _tokens_per_row(target: Any, batch: int, units: int) -> Tensor:
    if isinstance(target, bool) or not isinstance(target, (int, Tensor)):
        raise TypeError(
            "an encoder–decoder's target is a token id (or one per row as a (batch,) tensor) whose "
            f"logit is explained; got {type(target).__name__}"
        )
    check_index(target, "target", units)
    tokens = torch.as_tensor(target).reshape(-1)
    if tokens.numel() == 1:
        tokens = tokens.expand(batch)
    if tokens.numel() != batch:
        raise ValueError(f"give one target token per row ({batch}), got {tokens.numel()}")
    return tokens.long()


def _positions(kwargs: dict[str, Any], batch: int, position: Any) -> Tensor:
    """The decoder position read per row: ``position`` (negative from the end), or each
    row's last real target position."""
    ids = kwargs.get("decoder_input_ids")
    if ids is None:
        ids = kwargs["decoder_inputs_embeds"][..., 0]
    n = ids.shape[1]
    if position is None:
        mask = kwargs.get("decoder_attention_mask")
        if isinstance(mask, Tensor):
            last = torch.arange(n)[None].expand(batch, n).masked_fill(mask == 0, -1).amax(1)
            return last.long()
        return torch.full((batch,), n - 1, dtype=torch.long)
    where = torch.as_tensor(position).reshape(-1).long()
    where = torch.where(where < 0, where + n, where)
    if where.numel() == 1:
        where = where.expand(batch)
    if bool(((where < 0) | (where >= n)).any()):
        raise ValueError(f"target_position must be within the {n} decoder positions")
    return where


class Seq2SeqRoutes:
    """The encoder–decoder side of :class:`~captum_ffb.attr.NormDecomposition` (one per instance)."""

    def __init__(self, owner: Any, bound: EncoderDecoder) -> None:
        """``owner``: the :class:`~captum_ffb.attr.NormDecomposition` (its rules, reference,
        budget and precision)."""
        self.owner = owner
        self.bound = bound
        #: the output layer's units (the target vocabulary)
        self.units = int(bound.head.output.weight.shape[0])

    def rules(self, rules: Mapping[str, Callable] | None) -> dict[str, Callable]:
        """The whole-model defaults for every role of both stacks, then the replacements."""
        owner = self.owner
        return self.bound.rules({**owner._user_rules, **(rules or {})}, whole_model_rules,
                                f"a {owner.model_type} model")

    def answers(self, args: tuple[Any, ...], kwargs: dict[str, Any], tokens: Tensor, positions: Tensor,
                route: str, rules: Mapping[str, Callable] | None, reference: Any, with_bias: bool
                ) -> list[Seq2SeqAnswer]:
        """Each explained column's answer by ``route``; on the backward route with
        ``with_bias`` the bias player comes from the forward route on its own."""
        owner = self.owner
        chosen = self.rules(rules)
        reference = owner.reference if reference is None else reference
        if not (reference is None or isinstance(reference, str)):
            raise ValueError("an encoder–decoder's reference is 'zero', 'mean' or 'centered'")
        if route == "forward":
            return forward_route(self.bound, chosen, args, kwargs, tokens, positions, reference,
                                 owner.memory_budget, owner.dtype)
        answers = backward_route(self.bound, chosen, args, kwargs, tokens, positions, reference, owner.dtype)
        if with_bias:
            alone = forward_route(self.bound, chosen, args, kwargs, tokens, positions, reference,
                                  owner.memory_budget, owner.dtype, players=False)
            for answer, bias in zip(answers, alone):
                answer.bias = bias.bias.to(answer.value.dtype)
        return answers

    def attribute(self, inputs: Any, target: Any, additional_forward_args: Any, forward_kwargs: dict | None,
                  feature_mask: Any, target_position: Any, return_convergence_delta: bool, route: str,
                  rules: Mapping[str, Callable] | None, return_bias: bool, players: Any, reference: Any) -> Any:
        """See ``NormDecomposition.attribute()`` (the encoder–decoder case)."""
        _refuse("feature_mask", feature_mask)
        _refuse("players", players)
        args = forward_arguments(inputs, additional_forward_args)
        kwargs = dict(forward_kwargs or {})
        check_target_given(kwargs)
        batch = args[0].shape[0]
        tokens = _tokens_per_row(target, batch, self.units)[:, None]
        positions = _positions(kwargs, batch, target_position)[:, None]
        (answer,) = self.answers(args, kwargs, tokens, positions, route, rules, reference,
                                 return_bias or return_convergence_delta)
        out: list[Any] = [(answer.source, answer.target)]
        if return_bias:
            out.append(answer.bias)
        if return_convergence_delta:
            out.append((answer.source.sum(-1) + answer.target.sum(-1) + answer.bias - answer.real).abs())
        return out[0] if len(out) == 1 else tuple(out)

    def attribute_components(self, inputs: Any, target: Any, additional_forward_args: Any,
                             forward_kwargs: dict | None, feature_mask: Any, target_position: Any,
                             granularity: str, rules: Mapping[str, Callable] | None, reference: Any,
                             route: str) -> ComponentAttribution:
        """See ``NormDecomposition.attribute_components()`` (the encoder–decoder case)."""
        _refuse("feature_mask", feature_mask)
        if route == "backward":
            raise ValueError("encoder–decoders' component tables take the forward route (route='auto' "
                             "or 'forward')")
        if route not in ("auto", "forward"):
            raise ValueError(f"route must be one of auto, forward, backward; got {route!r}")
        owner = self.owner
        args = forward_arguments(inputs, additional_forward_args)
        kwargs = dict(forward_kwargs or {})
        check_target_given(kwargs)
        batch = args[0].shape[0]
        if target is None:
            raise ValueError("an encoder–decoder's component table explains a token id: give target=")
        token = _tokens_per_row(target, batch, self.units)
        position = _positions(kwargs, batch, target_position)
        reference = owner.reference if reference is None else reference
        names, contributions, bias, real = components_route(
            self.bound, self.rules(rules), args, kwargs, token, position, reference, granularity,
            owner.memory_budget, owner.dtype)
        delta = (contributions.sum(dim=(1, 2)) + bias.sum(1) - real).abs()
        return ComponentAttribution(contributions, bias, names, real, delta, granularity)

    def explain_target(self, inputs: Tensor, decoder_input_ids: Tensor, tokens: Sequence[int] | Tensor,
                       forward_kwargs: dict | None = None, route: str = "backward",
                       rules: Mapping[str, Callable] | None = None, reference: Any = None) -> Seq2SeqExplanation:
        """One source and a forced target: ``tokens[t]`` explained at decoder position ``t``
        from one forward pass (one backward pass per token on the backward route)."""
        source = torch.as_tensor(inputs)
        source = source[None] if source.dim() == 1 or (source.is_floating_point() and source.dim() == 2) \
            else source
        prefix = torch.as_tensor(decoder_input_ids)
        prefix = prefix[None] if prefix.dim() == 1 else prefix
        kwargs = {**check_forward_kwargs(forward_kwargs), "decoder_input_ids": prefix}
        (source,), kwargs = self.owner._request(source, None, kwargs)
        if source.shape[0] != 1 or prefix.shape[0] != 1:
            raise ValueError("explain one source and one target at a time (batch of 1)")
        explained = check_index(torch.as_tensor(tokens), "tokens", self.units).reshape(-1).long()
        if explained.numel() == 0 or explained.numel() > prefix.shape[1]:
            raise ValueError(f"give between 1 and {prefix.shape[1]} target tokens (one per decoder position)")
        steps = explained.numel()
        positions = torch.arange(steps)[None]
        answers = self.answers((source,), kwargs, explained[None], positions, route, rules, reference, True)
        source_part, target_part, bias, real = (torch.cat([getattr(a, name) for a in answers])
                                                for name in ("source", "target", "bias", "real"))
        delta = (source_part.sum(-1) + target_part.sum(-1) + bias - real).abs()
        source_ids = source[0] if not source.is_floating_point() else torch.empty(0, dtype=torch.long)
        return Seq2SeqExplanation(source_ids, prefix[0], explained, source_part, target_part, bias, real, delta)

    def generate(self, inputs: Tensor, max_new_tokens: int = 20, forward_kwargs: dict | None = None,
                 route: str = "backward", rules: Mapping[str, Callable] | None = None,
                 reference: Any = None, **generate_kwargs: Any) -> Seq2SeqExplanation:
        """Generate greedily from one source, then explain every generated token (the
        generation's logits equal the forced decoding's: it is the same computation)."""
        model = self.bound.model
        source = torch.as_tensor(inputs)
        source = source[None] if source.dim() == 1 or (source.is_floating_point() and source.dim() == 2) \
            else source
        (source,), kwargs = self.owner._request(source, None, forward_kwargs)
        check_new_tokens(max_new_tokens, 1, model.config, decoder=True)
        key = "input_features" if source.is_floating_point() else "input_ids"
        with torch.no_grad():
            generated = model.generate(**{key: source}, **kwargs, max_new_tokens=max_new_tokens,
                                       do_sample=False, num_beams=1, **generate_kwargs)
        sequence = generated[0]
        start = getattr(model.config, "decoder_start_token_id", None)
        if start is not None and int(sequence[0]) != int(start):
            # Whisper's generate returns the generated tokens without the decoder's start
            sequence = torch.cat([sequence.new_tensor([int(start)]), sequence])
        if sequence.numel() < 2:
            raise ValueError("the model generated nothing to explain")
        return self.explain_target(source, sequence[:-1], sequence[1:], kwargs, route, rules, reference)
