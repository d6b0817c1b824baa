"""``NormDecomposition``: exact contributions of the input tokens to a model's output, as a
Captum model-level attribution (as ``IntegratedGradients`` is to ``LayerIntegratedGradients``)."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from captum.attr import Attribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_ffb.architectures import get_architecture
from captum_ffb.attr.components import ComponentAttribution
from captum_ffb.attr.layer_norm_decomposition import DEFAULT_MEMORY_BUDGET
from captum_ffb.attr.seq2seq import Seq2SeqExplanation, Seq2SeqRoutes
from captum_ffb.engine import (
    capture_layers,
    chain_for,
    find_blocks,
    find_model,
    forward_arguments,
    model_type_of,
    resolve_rules,
)
from captum_ffb.engine.block import Block, config_of, watched_modules
from captum_ffb.engine.components import (
    EMBEDDINGS,
    HEAD,
    ComponentSums,
    check_granularity,
    check_linear_rules,
    direct_paths,
    head_direct_path,
    iter_groups,
    propagate_components,
    pull_back_norm,
    settle_block,
    stacked,
)
from captum_ffb.engine.layers import replay_block, warn_if_padded_without_mask
from captum_ffb.engine.linearise import linearise
from captum_ffb.engine.locking import serialized
from captum_ffb.engine.requests import (
    check_call,
    check_forward_kwargs,
    check_index,
    vocabulary_size,
)
from captum_ffb.engine.seq2seq import EncoderDecoder
from captum_ffb.engine.whole import (
    REFERENCES,
    HeadTarget,
    head_forward,
    is_centered,
    player_start,
    propagate,
    reference_inputs,
    resolve_head,
    shared_mean,
    token_contributions,
    visible_positions,
)
from captum_ffb.readouts import (
    ClassLogit,
    Direction,
    NextToken,
    ReadOut,
    as_readout,
    linearised_target_value,
    target_value,
)
from captum_ffb.rules import is_linear_in_players, whole_model_rules

ROUTES = ("backward", "forward")
#: at most this many read-outs of one block share a batched backward pass (a block's heads
#: together: 13 % faster than one pass each on SmolLM2; mixing blocks of different depths is not)
GRADIENT_CHUNK = 16
COMPONENT_ROUTES = ("auto", *ROUTES)
#: a backward pass of one writer through one block costs about this many forward-route
#: players through one block (SmolLM2, one thread: 1.7 at n = 32, 1.2 at n = 128)
BACKWARD_PER_FORWARD_PLAYER = 1.4


def component_route(n_players: int, n_blocks: int, granularity: str, n_heads: int, moe: bool) -> str:
    """The cheaper route for ``NormDecomposition.attribute_components()``: the forward
    route carries every player through every block (cost ∝ players × blocks), the backward
    route one read-out per writer through the blocks below it (cost ∝ Σ writers' depths);
    a mixture of experts split per expert takes the forward route."""
    if granularity == "head" and moe:
        return "forward"
    per_block = 2 + (n_heads if granularity == "head" else 0)
    depths = per_block * sum(index + 0.5 for index in range(n_blocks))  # in blocks
    backward = BACKWARD_PER_FORWARD_PLAYER * depths
    return "forward" if n_players * n_blocks < backward else "backward"


@dataclass
class ExplainedReadOuts:
    r"""What :meth:`NormDecomposition.explain` finds for the read-outs of one input.

    Attributes:
        readouts (list[ReadOut]): the read-outs explained, a predicted unit made concrete.
        contributions (Tensor): ``(T·batch, n)`` on the chosen route, read-out after read-out.
        bias (Tensor): ``(T·batch,)`` the bias player, propagated on its own.
        delta (Tensor): ``(T·batch,)`` the convergence delta ``|Σ_j c_j + bias − real|``.
        outputs (Any): the model's outputs (from the pass that recorded the forward route).
        maps (Tensor, optional): ``(batch, blocks, n, n)`` whole-model token-to-token maps.
        forward_contributions (Tensor, optional): ``(T·batch, n)`` the forward route's own
                    contributions (asked for with ``check``, or the forward route).
        forward_delta (Tensor, optional): ``(T·batch,)`` their convergence delta.
    """

    readouts: list[ReadOut]
    contributions: Tensor
    bias: Tensor
    delta: Tensor
    outputs: Any
    maps: Tensor | None = None
    forward_contributions: Tensor | None = None
    forward_delta: Tensor | None = field(default=None)


#: What the players are measured from by default (see ``NormDecomposition.attribute()``):
#: each token from the mean of the input's tokens, that mean's own output shared back to them.
DEFAULT_REFERENCE = "centered"


class NormDecomposition(Attribution):
    r"""Exact contributions of a model's input tokens to one of its outputs.

    The model's blocks are chained (each block's decomposition starts from the previous
    one's) and followed by the head's rules, so that a scalar output (a class logit, the
    logit of a token at a position, a contrast of two logits, a direction read from pooled
    hidden states) is written exactly as ``Σ_j c_j + c_bias``, one ``c_j`` per input
    position (the first block's input vectors are the players) and one for everything owed
    to no token. The rules (:func:`~captum_ffb.rules.whole_model_rules`) are the paper's
    (frozen attention probabilities); :class:`~captum_ffb.rules.AttnLRPAttention` and the other
    rules that also credit queries and keys are one argument away. By default each token is
    measured from the mean of the input's tokens and that mean's own output is shared back to
    the tokens it is made of (``reference="centered"``), so the tokens own the whole output
    but for the model's own bias terms (``c_bias``). With the coefficients of
    each rule taken from the real forward pass (norm scales, activation and softmax
    coefficients), the model is linear in the players, so ``c_j`` costs one backward pass (``route="backward"``), and equals the forward propagation of the
    decompositions through every block (``route="forward"``, which also gives whole-model
    token-to-token maps). The convergence delta is the completeness residual
    ``|Σ_j c_j + c_bias − real|`` against the model's real output. On the backward route
    the bias player's contribution is then computed on its own, by the forward route with
    no other player (one more capture and propagation of ``n`` vectors per block, only
    when the delta or the bias is asked for), so the delta checks the backward pass's
    contributions against an independent computation (it shows, e.g., the quadrature
    error of :class:`~captum_ffb.rules.IGAttention` on both routes).

    A model that computes in reduced precision (bfloat16, float16) is decomposed in its own
    precision on the backward route: its delta is then measured against the model's own
    low-precision output and stays small (it shows the rounding of the low-precision pass),
    while its contributions may differ from those of the same model in float32 by about
    1 % (up to 1.4 % measured on bfloat16). A
    warning says so once per instance; load the model in float32 for exact contributions.

    Args:
        forward_func (nn.Module): a Hugging Face model of a supported family: a
                    ``*ForCausalLM``, a ``*ForSequenceClassification`` or a base model.
        model_type (str, optional): the architecture when the config does not say it.
        rules (dict, optional): role → rule replacing the default rule of that role
                    (:func:`~captum_ffb.rules.whole_model_rules`; roles: see
                    :class:`~captum_ffb.attr.LayerNormDecomposition`).
        memory_budget (int): bytes the forward route's row chunks and player groups may take;
                    on the backward route, when the blocks' intermediate tensors would exceed
                    it, each block is run again during the backward pass instead of keeping
                    them (about one more forward pass, memory of one block).
        dtype (torch.dtype): the forward route's precision (float32 by default).
        show_progress (bool): a progress bar over blocks (forward route).
        reference (str, int or Tensor): what the players are measured from when a call does
                    not say (see :meth:`attribute`): ``"centered"`` by default, ``"zero"``
                    for the paper's.

    Examples::

        >>> from captum_ffb import NormDecomposition
        >>> nd = NormDecomposition(model)                     # e.g. SmolLM2 (LlamaForCausalLM)
        >>> ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
        >>> next_id = model(ids).logits[0, -1].argmax()
        >>> contributions, delta = nd.attribute(ids, target=int(next_id),
        ...                                     return_convergence_delta=True)
        >>> contributions.shape                               # (1, n): one per input token
    """

    def __init__(
        self,
        forward_func: nn.Module,
        model_type: str | None = None,
        rules: Mapping[str, Callable] | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        dtype: torch.dtype = torch.float32,
        show_progress: bool = False,
        reference: str | int | Tensor = DEFAULT_REFERENCE,
    ) -> None:
        model = find_model(forward_func)
        if model is None:
            raise TypeError("NormDecomposition needs the model itself (an nn.Module) as forward_func")
        super().__init__(model)
        self.model = model
        self.model_type = model_type or model_type_of(model)
        self.spec = get_architecture(self.model_type)
        self.config = config_of(model)
        self._user_rules = dict(rules or {})
        #: the encoder–decoder side (``None`` for encoders and decoders)
        self.seq2seq: Seq2SeqRoutes | None = None
        if self.spec.decoder is not None:
            bound = EncoderDecoder.of(model, self.spec)
            self.seq2seq = Seq2SeqRoutes(self, bound)
            self.chain = chain_for(self.spec.decoder, self.config)
            self.blocks = bound.decoder_blocks
            self.head = bound.head
            self.rules = self.seq2seq.rules(None)
        else:
            self.blocks = list(find_blocks(model, self.spec))
            self.spec = self.spec.for_block(self.blocks[0])  # the family's layout of these blocks
            self.chain = chain_for(self.spec, self.config)
            self.head = resolve_head(model, self.spec)
            self.rules = self._rules(None)
        if memory_budget <= 0:
            raise ValueError("memory_budget must be a positive number of bytes")
        self.memory_budget = int(memory_budget)
        self.dtype = dtype
        self.show_progress = show_progress
        if isinstance(reference, str) and reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, a token id or a tensor, got {reference!r}")
        #: what the players are measured from when a call does not say (see :meth:`attribute`)
        self.reference = reference
        self._precision_warned = False

    def has_convergence_delta(self) -> bool:
        return True

    @property
    def task(self) -> str:
        """``"causal_lm"``, ``"sequence_classification"`` or ``"base"``."""
        return self.head.task

    # ------------------------------------------------------------------ public API
    @log_usage()
    @serialized
    def attribute(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: int | Tensor | ReadOut | None = None,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
        feature_mask: Tensor | None = None,
        target_position: int | Tensor | None = None,
        return_convergence_delta: bool = False,
        route: str = "backward",
        rules: Mapping[str, Callable] | None = None,
        return_bias: bool = False,
        players: Sequence[int] | None = None,
        reference: str | int | Tensor | None = None,
    ) -> Any:
        r"""Signed contributions ``(batch, n)`` of the input positions to ``target``.

        Args:
            inputs (Tensor or tuple[Tensor, ...]): the model's positional inputs (token ids).
            target (int, Tensor or ReadOut, optional): a class index for a
                        sequence classifier; a token id for a causal LM (its logit at each
                        row's last real position, or at ``target_position``); one per row as
                        a ``(batch,)`` tensor; :class:`Contrast` for ``logit(a) − logit(b)``;
                        :class:`Direction` for a base model; or any other read-out of
                        :mod:`captum_ffb.readouts` that names its unit. ``None``: whole-model
                        token-to-token maps (see ``maps()``), forward route.
            additional_forward_args (Any, optional): further positional arguments.
            forward_kwargs (dict, optional): keyword arguments of the forward, e.g.
                        ``{"attention_mask": mask}`` (left or right padding).
            feature_mask (Tensor, optional): ``(batch, n)`` group ids in Captum's convention:
                        the groups are the players (words from subwords, sentences, prompt
                        segments); every position gets its group's contribution, and a
                        group's contribution is the sum of its tokens'.
            target_position (int or Tensor, optional): the position whose output is read
                        (causal LMs; a ``(batch,)`` tensor for one per row; negative counts
                        from the end).
            return_convergence_delta (bool): also return ``|Σ_j c_j + c_bias − real|``
                        ``(batch,)``, the completeness residual against the real output (on
                        the backward route with ``c_bias`` from the forward route restricted
                        to the bias player: a real check, at the cost of one more capture
                        and propagation of ``n`` vectors per block).
            route (str): ``"backward"`` (one backward pass through the frozen model) or
                        ``"forward"`` (the decompositions carried through every block).
            rules (dict, optional): role → rule for this call (e.g. an ablation).
            return_bias (bool): also return the bias player's contribution ``(batch,)``
                        (on the backward route computed on its own, as for the delta).
            players (list[int], optional): forward route only: propagate just these players
                        (positions, or group ids with a ``feature_mask``); the others get 0.
                        The propagation is linear in the players, so parts computed apart
                        (on other workers) add up to the whole; every part carries the whole
                        bias player (``[]``: the bias player alone).
            reference (str, int or Tensor, optional): what each player is measured from
                        (``None``: the instance's ``reference``, ``DEFAULT_REFERENCE``):
                        ``c_j = L_j(x_j − r_j)`` with ``L_j`` the frozen model's linear map
                        of position ``j``, and ``Σ_j L_j(r_j)`` added to the bias player
                        (completeness is kept). ``"zero"``: ``r = 0`` (the paper's);
                        ``"mean"``: each row's mean first-block input over its real tokens (a
                        token counts by how it differs from the average token, e.g. the
                        attention sink no longer gets credit for being a large vector);
                        ``"centered"`` (default): the mean of the positions the output sees,
                        with the mean's own output ``Σ_j L_j(x̄)`` shared back to the tokens
                        it averages (token ``k`` gets ``(1/|V|) Σ_j L_j(x_k)`` more), so the
                        bias player keeps only the model's own bias terms; a token id: the
                        first-block input of that token at each position; a tensor ``(d,)``,
                        ``(n, d)`` or ``(batch, n, d)``.

        Returns:
            contributions ``(batch, n)``; with ``return_bias``, ``(contributions, bias)``; with
            ``return_convergence_delta``, the delta last. Padded positions get exactly 0.

        Encoder–decoder models (T5, BART, Marian, ...): ``inputs`` is the source (token ids,
        or Whisper's ``input_features``), ``forward_kwargs`` holds the target prefix
        (``decoder_input_ids``, and ``decoder_attention_mask`` for padded targets), ``target``
        is a token id read at ``target_position`` of the decoder (default: each row's last
        real one), and the contributions are a pair ``(source (batch, n_source), target
        (batch, n_target))``: ``Σ source + Σ target + bias = logit``. ``feature_mask`` and
        ``players`` are not available there; see also :meth:`explain_target` and
        :meth:`explain_generation`.
        """
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        args, kwargs = self._request(inputs, additional_forward_args, forward_kwargs, reference)
        if self.seq2seq is not None:
            return self.seq2seq.attribute(args, target, None, kwargs, feature_mask,
                                          target_position, return_convergence_delta, route, rules,
                                          return_bias, players, reference)
        chosen = self._rules(rules)
        reference = self.reference if reference is None else reference
        if target is None:
            raise ValueError(
                "target is None: for whole-model token-to-token maps call maps(); attribute() "
                "explains one output (a class, a token id, a Contrast or a Direction)"
            )
        ids = args[0]
        token_mask = self._token_mask(kwargs, ids)
        groups, n_groups = self._groups(feature_mask, ids)
        head_target = self._target(target, target_position, token_mask)
        if players is not None and route != "forward":
            raise ValueError("players= splits the forward route; use route='forward'")
        ((contributions, bias, real),) = self._route(args, kwargs, [head_target], chosen, reference, route,
                                                     groups, n_groups, players,
                                                     with_bias=return_bias or return_convergence_delta)
        if route == "backward":  # per position: add up each group's
            contributions = contributions * token_mask.to(contributions.dtype)
            per_group = torch.zeros(ids.shape[0], n_groups, dtype=contributions.dtype,
                                    device=contributions.device)
            per_group.scatter_add_(1, groups, contributions)
        else:  # the groups were the players
            per_group = contributions
        expanded = per_group.gather(1, groups) * token_mask.to(per_group.dtype)
        out: list[Any] = [expanded]
        if return_bias:
            out.append(bias)
        if return_convergence_delta:
            out.append((per_group.sum(1) + bias - real).abs())
        return out[0] if len(out) == 1 else tuple(out)

    @log_usage()
    @serialized
    def explain_target(
        self,
        inputs: Tensor,
        decoder_input_ids: Tensor,
        tokens: Sequence[int] | Tensor,
        forward_kwargs: dict[str, Any] | None = None,
        route: str = "backward",
        rules: Mapping[str, Callable] | None = None,
        reference: str | None = None,
    ) -> Seq2SeqExplanation:
        r"""Encoder–decoders: every token of a forced target explained over the source and
        the target prefix, from one forward pass.

        Args:
            inputs (Tensor): the source ``(1, n_source)`` token ids (or ``input_features``).
            decoder_input_ids (Tensor): ``(1, n_target)`` the decoder's input (its start
                        token, then the target but its last token).
            tokens (list[int] or Tensor): the target tokens explained, ``tokens[t]`` at decoder
                        position ``t`` (usually ``decoder_input_ids[0, 1:]`` and the last one).
            forward_kwargs (dict, optional): further keyword arguments (``attention_mask``).
            route, rules, reference: see :meth:`attribute`.

        Returns:
            ``Seq2SeqExplanation`` (contributions, bias, delta
            and the source share of each token).

        Examples::

            >>> nd = NormDecomposition(marian)                   # a MarianMTModel
            >>> src = tokenizer("Hello world", return_tensors="pt").input_ids
            >>> out = nd.explain_generation(src, max_new_tokens=10)
            >>> out.source_share                                 # (T,): Σ source / logit
        """
        self._require_seq2seq("explain_target")
        return self.seq2seq.explain_target(inputs, decoder_input_ids, tokens, forward_kwargs, route, rules, reference)

    @log_usage()
    @serialized
    def explain_generation(
        self,
        inputs: Tensor,
        max_new_tokens: int = 20,
        forward_kwargs: dict[str, Any] | None = None,
        route: str = "backward",
        rules: Mapping[str, Callable] | None = None,
        reference: str | None = None,
    ) -> Seq2SeqExplanation:
        r"""Encoder–decoders: generate greedily from one source, then explain every generated
        token (see :meth:`explain_target`)."""
        self._require_seq2seq("explain_generation")
        return self.seq2seq.generate(inputs, max_new_tokens, forward_kwargs, route, rules, reference)

    def _require_seq2seq(self, name: str) -> None:
        if self.seq2seq is None:
            raise ValueError(f"{name} is for encoder–decoder models; {type(self.model).__name__} is not one")

    def _refuse_seq2seq(self, name: str) -> None:
        if self.seq2seq is not None:
            raise ValueError(
                f"{name} is not available for encoder–decoder models yet; use attribute, "
                "explain_target or explain_generation"
            )

    @log_usage()
    @serialized
    def attribute_components(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: int | Tensor | ReadOut | None = None,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
        feature_mask: Tensor | None = None,
        target_position: int | Tensor | None = None,
        granularity: str = "sublayer",
        rules: Mapping[str, Callable] | None = None,
        reference: str | int | Tensor | None = None,
        route: str = "auto",
    ) -> ComponentAttribution:
        r"""Which components, acting on which tokens, wrote the read-out: the exact table
        ``C[j, c]`` of direct effects with ``target = Σ_j Σ_c C[j, c] + Σ_c b[c]``.

        Each writer of the residual stream (the embeddings, each attention block or head,
        each FF block or expert) is read through the frozen later norms and the head (its
        *direct* effect, not its effect through later blocks), and that read-out is split
        over the tokens: by its gradient at the players (the backward route) or by carrying
        every token's share through the blocks (the forward route). Summed over components it gives :meth:`attribute`'s contributions (both
        routes agree); see :class:`~captum_ffb.attr.components.ComponentAttribution`.

        Args:
            inputs, target, additional_forward_args, forward_kwargs, feature_mask, target_position, rules, reference:
                        as in :meth:`attribute`; ``target=None`` explains the predicted class
                        or next token.
            granularity (str): ``"block"`` (one component per block), ``"sublayer"``
                        (attention and FF apart; Post-LN norms' β apart) or ``"head"`` (each
                        attention head, each expert of a mixture of experts).
            route (str): ``"auto"`` (default): the cheaper of the two for the number of
                        players, blocks and writers (``component_route()``);
                        ``"backward"``: one backward pass through the frozen model per writer,
                        seeded with its direct path at its output (per head: the heads of a
                        block in one batched pass); ``"forward"``: the forward route carrying
                        every token's share through every block (the independent check; a
                        mixture of experts split per expert always takes it). Both give the
                        same table.

        Returns:
            ComponentAttribution: ``contributions`` ``(batch, n, C)``, ``bias`` ``(batch, C)``,
            ``components``, ``value``, ``delta``.

        Encoder–decoders: ``target`` is a token id read at a decoder position (as in
        :meth:`attribute`), the rows of ``contributions`` are the players ``[target prefix |
        source]`` and the decoder's components include ``block.<l>.cross_attention`` (and its
        heads), through which the source enters the decoder's stream; forward route.
        """
        args, kwargs = self._request(inputs, additional_forward_args, forward_kwargs, reference)
        if self.seq2seq is not None:
            return self.seq2seq.attribute_components(args, target, None, kwargs,
                                                     feature_mask, target_position, granularity, rules,
                                                     reference, route)
        check_granularity(granularity)
        if route not in COMPONENT_ROUTES:
            raise ValueError(f"route must be one of {COMPONENT_ROUTES}, got {route!r}")
        chosen = self._rules(rules)
        check_linear_rules(chosen)
        reference = self.reference if reference is None else reference
        ids = args[0]
        token_mask = self._token_mask(kwargs, ids)
        groups, n_groups = self._groups(feature_mask, ids)
        blocks, recorded, light = self._capture(args, kwargs)
        if target is None:
            if self.task == "base":
                raise ValueError(f"{type(self.model).__name__} is a base model: give a Direction target")
            target = NextToken(None, target_position) if self.task == "causal_lm" else ClassLogit(None)
            target_position = None
        if isinstance(target, ReadOut):
            target = target.resolve(recorded.output, token_mask.long())
        head_target = self._target(target, target_position, token_mask)
        x = blocks[0].inputs
        reference_x = self._reference(reference, x, token_mask, args, kwargs)
        prepare = self._replay if light else None
        moe = any(b.is_moe for b in blocks)
        if route == "auto":
            route = component_route(n_groups, len(blocks), granularity, int(self.config.num_attention_heads), moe)
        if route == "backward" and not (granularity == "head" and moe):
            return self._components_backward(args, kwargs, blocks, recorded, head_target, chosen, reference,
                                             granularity, groups, n_groups, token_mask, prepare)
        size = self._group_size(x, chosen)
        parts = list(iter_groups(range(n_groups), size))
        progress = self._progress(len(blocks) * (len(parts) + 1))
        table, bias, names = None, None, None
        try:
            with torch.no_grad():
                like = x.to(self.dtype)
                covector, constant = head_direct_path(self.head, head_target, chosen, recorded.tensors,
                                                      self.spec, self.config, like)
                paths = direct_paths(blocks, self.chain, chosen, covector, constant, prepare)
                if progress is not None:
                    progress.update(len(blocks))
                for part in parts:
                    start = player_start(x, groups, part, token_mask, reference_x,
                                         self._shared(reference, token_mask, head_target))
                    sums, _ = propagate_components(blocks, self.chain, chosen, start, paths, granularity,
                                                   self.memory_budget, progress, prepare)
                    names, found, found_bias = stacked(sums, len(part), like)
                    if table is None:
                        table = found.new_zeros(found.shape[0], n_groups, found.shape[-1])
                        bias = found_bias  # every part carries the whole bias player
                    table[:, part] = found
        finally:
            if progress is not None:
                progress.close()
        real = target_value(self.head, recorded.output, head_target, self.dtype)
        delta = (table.sum((1, 2)) + bias.sum(-1) - real).abs()
        index = groups[..., None].expand(-1, -1, table.shape[-1])
        expanded = table.gather(1, index) * token_mask[..., None].to(table.dtype)
        return ComponentAttribution(expanded, bias, names, real, delta, granularity)

    def _components_backward(self, args, kwargs, blocks, recorded, head_target: HeadTarget, rules,
                             reference: Any, granularity: str, groups: Tensor, n_groups: int,
                             token_mask: Tensor, prepare: Callable | None) -> ComponentAttribution:
        """:meth:`attribute_components` on the backward route: the direct paths as for the
        forward route, then one forward pass of the frozen model and, per writer, the gradient
        of its direct read-out ``⟨g_c, w_c⟩`` with respect to the players; the writer's bias
        is what its read-out keeps beyond the tokens' (``⟨g_c, w_c⟩ − Σ_j C[j, c]``)."""
        x = blocks[0].inputs
        like = x.to(self.dtype)
        with torch.no_grad():
            covector, constant = head_direct_path(self.head, head_target, rules, recorded.tensors,
                                                  self.spec, self.config, like)
            paths = direct_paths(blocks, self.chain, rules, covector, constant, prepare)
        writers = {}
        for index, block in enumerate(blocks):
            roles = watched_modules(block.module, self.spec)
            writers[(index, "attention")] = roles.get("attention_post_norm", roles["attn_out"])
            writers[(index, "ff")] = roles["ff"]
        seen = self._shared(reference, token_mask, head_target)
        r = None if seen is not None else self._reference(reference, like, token_mask, args, kwargs)
        heads: dict[int, Tensor] = {}
        hooks = []
        if granularity == "head":
            for index, block in enumerate(blocks):
                out = watched_modules(block.module, self.spec)["attn_out"]
                hooks.append(out.register_forward_hook(_keep_input(heads, index)))
        kwargs = dict(kwargs)
        if self.task == "causal_lm" and "logits_to_keep" in inspect.signature(self.model.forward).parameters:
            kwargs.setdefault("logits_to_keep", 1)  # the head is read through its direct path
        sums = ComponentSums()
        training = self.model.training
        self.model.eval()
        progress = None
        try:
            watch = {f"{index}.{name}": module for (index, name), module in writers.items()}
            with linearise(self.model, self.spec, self.blocks, rules, self.head.final_norm, (), watch) as frozen:
                self.model(*args, **kwargs)
                inputs = frozen.inputs
                players = inputs.detach().to(self.dtype)

                def split(value: Tensor, grads: Tensor) -> tuple[Tensor, Tensor]:
                    """A read-out's tokens (from its gradient) and its bias."""
                    c = token_contributions(grads.to(self.dtype), players, r, seen)
                    return c, value.detach().to(self.dtype) - c.sum(1)

                gradient = paths.embeddings.to(inputs.dtype)
                sums.add(EMBEDDINGS, *split((gradient * inputs.detach()).sum((1, 2)), gradient))
                # every writer's direct read-out, in stream order (a block's heads after it)
                read_outs: list[tuple[int, str, Tensor]] = []
                for index in range(len(blocks)):
                    for name in ("attention", "ff"):
                        g = paths.writers[(index, name)]
                        w = _sequence(frozen.outputs[f"{index}.{name}"], g.shape[0])
                        read_outs.append((index, name, (w * g.to(w.dtype)).sum((1, 2))))
                    if granularity == "head":
                        values = self._head_read_outs(blocks[index], heads[index], paths.writers[(index, "attention")],
                                                      rules)
                        read_outs += [(index, f"attention.head.{h}", v) for h, v in enumerate(values)]
                found = [ComponentSums() for _ in blocks]
                progress = self._progress(len(read_outs))
                for chunk in _chunks(read_outs, self._gradient_chunk(inputs)):  # one block's at a time
                    grads = _batched_gradients([value for _, _, value in chunk], inputs)
                    for (index, name, value), grad in zip(chunk, grads):
                        found[index].add(name, *split(value, grad))
                    if progress is not None:
                        progress.update(len(chunk))
                for index, block in enumerate(blocks):
                    settle_block(sums, found[index], index, self.chain, paths, granularity, block.is_moe)
                sums.add(HEAD, None, paths.constants[HEAD])
        finally:
            for hook in hooks:
                hook.remove()
            if progress is not None:
                progress.close()
            self.model.train(training)
        names, table, bias = stacked(sums, groups.shape[1], like)
        table = table * token_mask[..., None].to(table.dtype)
        per_group = table.new_zeros(table.shape[0], n_groups, table.shape[-1])
        per_group.scatter_add_(1, groups[..., None].expand_as(table), table)  # the groups are the players
        table = per_group.gather(1, groups[..., None].expand_as(table)) * token_mask[..., None].to(table.dtype)
        real = target_value(self.head, recorded.output, head_target, self.dtype)
        delta = (per_group.sum((1, 2)) + bias.sum(-1) - real).abs()
        return ComponentAttribution(table, bias, names, real, delta, granularity)

    def _head_read_outs(self, block: Block, z: Tensor, covector: Tensor, rules: Mapping[str, Callable]) -> list[Tensor]:
        """Each head's direct read-out ``Σ_i ⟨z_h[i] W_O^h, g_i⟩`` (``z`` the output
        projection's input, ``g`` the covector before any attention post-norm), ``(B,)`` each,
        with its graph."""
        raw, _ = pull_back_norm(block, "attention_post_norm", rules, covector)
        weight = block.projection(self.spec.attention_output)[0].to(z.dtype)  # (H·e, d)
        n_heads = int(self.config.num_attention_heads)
        z = _sequence(z, raw.shape[0])
        per_head = z.reshape(*z.shape[:2], n_heads, -1)  # (B, n, H, e)
        w_o = weight.reshape(n_heads, -1, weight.shape[-1])  # (H, e, d)
        folded = torch.einsum("hed,bid->bihe", w_o, raw.to(z.dtype))
        return list(torch.einsum("bihe,bihe->hb", per_head, folded).unbind(0))

    def _gradient_chunk(self, inputs: Tensor) -> int:
        """How many read-outs may share one batched backward pass: as many as keep their
        gradients (and the pass's batched activations, about 8 of a gradient's size per
        block) within ``memory_budget``, at most :data:`GRADIENT_CHUNK`."""
        per_read_out = inputs.numel() * inputs.element_size() * (1 + 8 * len(self.blocks))
        return max(1, min(GRADIENT_CHUNK, int(self.memory_budget // max(per_read_out, 1))))

    @log_usage()
    @serialized
    def attribute_steps(
        self,
        input_ids: Tensor,
        targets: Tensor | Sequence[int],
        positions: Tensor | Sequence[int],
        forward_kwargs: dict[str, Any] | None = None,
        return_convergence_delta: bool = False,
        route: str = "backward",
        rules: Mapping[str, Callable] | None = None,
        return_bias: bool = False,
        reference: str | int | Tensor | None = None,
    ) -> Any:
        r"""Contributions to several outputs of one sequence from one forward pass: the
        logit of ``targets[t]`` at ``positions[t]`` for every ``t`` (teacher forcing: a
        prompt followed by generated tokens explains every generation step at once).

        Args:
            input_ids (Tensor): ``(1, n)`` or ``(n,)`` token ids of one sequence.
            targets (Tensor or list[int]): ``(T,)`` token ids (or classes).
            positions (Tensor or list[int]): ``(T,)`` the position whose output gives each.
            forward_kwargs, return_convergence_delta, route, rules, return_bias, reference:
                        see :meth:`attribute`.

        Returns:
            contributions ``(T, n)``, then the bias ``(T,)`` and the delta ``(T,)`` if asked.
        """
        self._refuse_seq2seq("attribute_steps")
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        if self.head.task == "base":
            raise ValueError("attribute_steps reads the logits of a model with a head")
        ids = torch.as_tensor(input_ids)
        ids = ids[None] if ids.dim() == 1 else ids
        (ids,), kwargs = self._request(ids, None, forward_kwargs, reference, name="input_ids")
        if ids.shape[0] != 1:
            raise ValueError("attribute_steps takes one sequence: input_ids of shape (1, n)")
        tokens = check_index(torch.as_tensor(targets, device=ids.device), "targets").reshape(-1)
        where = check_index(torch.as_tensor(positions, device=ids.device), "positions").reshape(-1)
        if tokens.numel() != where.numel() or tokens.numel() == 0:
            raise ValueError("give one position per target (and at least one target)")
        token_mask = self._token_mask(kwargs, ids)
        chosen = self._rules(rules)
        heads = [self._target(int(t), int(p), token_mask) for t, p in zip(tokens, where)]
        reference = self.reference if reference is None else reference
        n = ids.shape[1]
        answers = self._route((ids,), kwargs, heads, chosen, reference, route,
                              torch.arange(n, device=ids.device)[None], n,
                              with_bias=return_bias or return_convergence_delta)
        contributions, bias, real = self._stacked(answers, token_mask)
        out: list[Any] = [contributions]
        if return_bias:
            out.append(bias)
        if return_convergence_delta:
            out.append((contributions.sum(1) + bias - real).abs())
        return out[0] if len(out) == 1 else tuple(out)

    @log_usage()
    @serialized
    def explain(
        self,
        input_ids: Tensor,
        readouts: Sequence[ReadOut | int | Tensor],
        forward_kwargs: dict[str, Any] | None = None,
        route: str = "backward",
        maps: bool = False,
        check: bool = False,
        rules: Mapping[str, Callable] | None = None,
        reference: str | int | Tensor | None = None,
    ) -> ExplainedReadOuts:
        r"""Contributions, bias and delta of several read-outs of one batch, with the
        whole-model maps and the forward route's check if asked, in at most two passes of
        the model: one recording the forward route (it also gives the outputs that resolve
        a predicted unit, the bias player propagated on its own, the maps and the check),
        then, on the backward route, the backward pass.

        Args:
            input_ids (Tensor): ``(batch, n)`` token ids.
            readouts (list): read-outs (an index counts as in :meth:`attribute`);
                        ``NextToken()`` or ``ClassLogit()`` explain the predicted unit.
            forward_kwargs (dict, optional): keyword arguments of the forward.
            route (str): ``"backward"`` or ``"forward"``.
            maps (bool): also the whole-model maps (see ``maps()``).
            check (bool): on the backward route, also the forward route's contributions.
            rules (dict, optional): role → rule for this call.
            reference (str, int or Tensor, optional): as in :meth:`attribute` (the maps are
                        always of every position from zero).

        Returns:
            ExplainedReadOuts
        """
        self._refuse_seq2seq("explain")
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        if not readouts:
            raise ValueError("give at least one read-out")
        chosen = self._rules(rules)
        reference = self.reference if reference is None else reference
        zero = reference is None or (isinstance(reference, str) and reference == "zero")
        args, kwargs = self._request(input_ids, None, forward_kwargs, reference, name="input_ids")
        input_ids = args[0]
        token_mask = self._token_mask(kwargs, input_ids)
        batch, n = input_ids.shape
        groups = torch.arange(n, device=input_ids.device).expand(batch, n).contiguous()
        captured = self._capture(args, kwargs)
        outputs = captured[1].output
        mask = token_mask.long()
        resolved = [as_readout(r, self.task).resolve(outputs, mask) for r in readouts]
        targets = [self._target(r, None, token_mask) for r in resolved]
        whole, found = None, None
        if maps or check or route == "forward":  # the maps ride along where the players are from zero
            whole, found = self._propagate(captured, args, kwargs, targets, chosen, groups, n,
                                           maps=maps and zero, reference=reference)
        if maps and not zero:
            _, found = self._propagate(captured, args, kwargs, targets, chosen, groups, n, maps=True)
        answers = whole if route == "forward" else self._route(
            args, kwargs, targets, chosen, reference, route, groups, n, with_bias=True, captured=captured)
        contributions, bias, real = self._stacked(answers, token_mask)
        result = ExplainedReadOuts(resolved, contributions, bias,
                                   (contributions.sum(1) + bias - real).abs(), outputs, found)
        if whole is not None and (check or route == "forward"):
            forward = torch.cat([c for c, _, _ in whole])
            result.forward_contributions = forward
            result.forward_delta = (forward.sum(1) + torch.cat([b for _, b, _ in whole])
                                    - torch.cat([r for _, _, r in whole])).abs()
        return result

    @log_usage()
    @serialized
    def maps(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
        rules: Mapping[str, Callable] | None = None,
        return_convergence_delta: bool = False,
    ) -> Any:
        r"""Whole-model token-to-token maps: ``‖F_i(x_j)‖`` after every block, over the
        original input tokens ``(batch, n_blocks, n, n)`` (what attention rollout approximates).

        Players are propagated in groups that fit ``memory_budget`` (the propagation is
        linear in them), so memory stays bounded whatever ``n``.

        Args:
            inputs, additional_forward_args, forward_kwargs, rules: see :meth:`attribute`.
            return_convergence_delta (bool): also return, per block, the largest completeness
                        residual against the block's real output ``(batch, n_blocks)``.
        """
        self._refuse_seq2seq("maps")
        chosen = self._rules(rules)
        args, kwargs = self._request(inputs, additional_forward_args, forward_kwargs)
        light = self._light(args[0])
        blocks, _ = capture_layers(self.model, self.model, self.blocks, self.spec, args,
                                   None, kwargs, dtype=self.dtype,
                                   with_next_norms=False, light=light)
        prepare = self._replay if light else None
        x = blocks[0].inputs
        batch, n, d = x.shape
        token_mask = blocks[0].token_mask
        positions = torch.arange(n, device=x.device).expand(batch, n)
        size = self._group_size(x, chosen)
        maps = torch.zeros(batch, len(blocks), n, n, dtype=self.dtype, device=x.device)
        totals = [torch.zeros(batch, n, d, dtype=self.dtype, device=x.device) for _ in blocks]
        bias_total = [None] * len(blocks)
        progress = self._progress(len(blocks) * ((n + size - 1) // size))
        try:
            for first in range(0, n, size):
                players = list(range(first, min(n, first + size)))
                start = player_start(x, positions, players, token_mask)
                for index, dec in enumerate(propagate(blocks, self.chain, chosen, start,
                                                      self.memory_budget, progress, prepare)):
                    maps[:, index, :, first : first + len(players)] = dec.maps()
                    if return_convergence_delta:
                        totals[index] += dec.terms.sum(dim=2)
                        bias_total[index] = dec.bias
        finally:
            if progress is not None:
                progress.close()
        if not return_convergence_delta:
            return maps
        delta = torch.stack([
            ((total + bias - block.output).abs().amax(-1) * (1 if token_mask is None else token_mask)).amax(-1)
            for total, bias, block in zip(totals, bias_total, blocks)
        ], dim=1)
        return maps, delta

    # ------------------------------------------------------------------ the door
    def _request(self, inputs: Any, additional_forward_args: Any, forward_kwargs: Any,
                 reference: Any = None, name: str = "inputs") -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A call's positional and keyword arguments, checked once before any pass: token ids
        in the vocabulary and within a learned position table, masks of their shape with a
        real token per row, an encoder–decoder's target of the source's batch, a token id
        as reference within the vocabulary (:mod:`captum_ffb.engine.requests`)."""
        args = forward_arguments(inputs, additional_forward_args)
        kwargs = check_call(self.model, args, check_forward_kwargs(forward_kwargs), name)
        if isinstance(reference, int):  # a token id (a bool is refused)
            check_index(reference, "reference", vocabulary_size(self.model))
        return args, kwargs

    # ------------------------------------------------------------------ targets
    def _rules(self, rules: Mapping[str, Callable] | None) -> dict[str, Callable]:
        """The whole-model default rules, the constructor's replacements, then this call's."""
        return resolve_rules(self.chain, self.spec, {**self._user_rules, **(rules or {})},
                             f"a {self.model_type} model", defaults=whole_model_rules)

    def _token_mask(self, kwargs: dict[str, Any], ids: Tensor) -> Tensor:
        mask = kwargs.get("attention_mask")
        if isinstance(mask, Tensor) and mask.shape == ids.shape:
            return (mask != 0).to(ids.device)
        return torch.ones_like(ids, dtype=torch.bool)

    def _groups(self, feature_mask: Tensor | None, ids: Tensor) -> tuple[Tensor, int]:
        batch, n = ids.shape
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

    def _target(self, target: Any, position: Any, token_mask: Tensor) -> HeadTarget:
        """The head target of ``target`` (an index, one per row, or a read-out)."""
        name = type(self.model).__name__
        if isinstance(target, str):
            raise TypeError(f"target {target!r} is text: give its token id (tokenizer.encode(...)) or a read-out")
        check_index(target, "target")
        if isinstance(target, Direction) and self.task != "base":
            raise ValueError(f"a Direction reads a base model's hidden states; {name} has a head: "
                             "give a class, a token id or a Contrast")
        if self.task == "base" and not isinstance(target, Direction):
            raise ValueError(f"{name} is a base model: give a Direction target")
        readout = as_readout(target, self.task)
        return readout.head_target(self.head, token_mask, self.dtype, position)

    # ------------------------------------------------------------------ routes
    def _reference(self, reference: Any, x: Tensor, token_mask: Tensor | None, args, kwargs) -> Tensor | None:
        """The reference inputs ``(B, n, d)`` (``None`` for zero); see :meth:`attribute`."""
        return reference_inputs(reference, x, token_mask, lambda token: self._token_inputs(token, args, kwargs))

    def _shared(self, reference: Any, token_mask: Tensor, target: HeadTarget) -> Tensor | None:
        """For the centred reference, the ``(B, n)`` positions whose mean the players are
        measured from: those the explained output sees (:func:`visible_positions`)."""
        if not is_centered(reference):
            return None
        return visible_positions(token_mask, target.positions, self.spec.is_causal(self.config))

    def _token_inputs(self, token: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        """The first block's input for the inputs with every token id replaced by ``token``
        (same positions, masks and other arguments); the model stops at the first block."""
        found: list[Tensor] = []

        class _Reached(Exception):
            pass

        def hook(module, hook_args, hook_kwargs):
            found.append((hook_args[0] if hook_args else hook_kwargs["hidden_states"]).detach())
            raise _Reached

        ids = torch.full_like(args[0], int(token))
        handle = self.blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            with torch.no_grad():
                self.model(ids, *args[1:], **kwargs)
        except _Reached:
            pass
        finally:
            handle.remove()
        return found[0]

    def _capture(self, args, kwargs) -> tuple[list[Any], Any, bool]:
        """One pass of the model recording what the forward route needs: the blocks, the
        head's tensors and the output; and whether blocks are replayed one at a time."""
        light = self._light(args[0])
        blocks, recorded = capture_layers(
            self.model, self.model, self.blocks, self.spec, args, None, kwargs, dtype=self.dtype,
            with_next_norms=False, extra=self.head.modules(), keep_output=True, light=light,
        )
        return blocks, recorded, light

    def _propagate(self, captured, args, kwargs, targets: list[HeadTarget], rules, groups: Tensor,
                   n_groups: int, players: Sequence[int] | None = None, reference: Any = None,
                   maps: bool = False):
        """The forward route from a capture: the players through every block, then the head's
        rules for each target. With ``maps``, every position is its own player, the players
        go in groups that fit ``memory_budget`` and the whole-model maps ``(batch, blocks, n,
        n)`` come back too (else ``None``)."""
        blocks, recorded, light = captured
        x = blocks[0].inputs
        chosen_players = list(range(n_groups)) if players is None else [int(p) for p in players]
        if any(not 0 <= p < n_groups for p in chosen_players):
            raise ValueError(f"players must be among the {n_groups} players (0 … {n_groups - 1})")
        r = self._reference(reference, x, self._token_mask(kwargs, args[0]), args, kwargs)
        token_mask = blocks[0].token_mask
        parts = [chosen_players]
        found = None
        if maps:
            if r is not None or players is not None:
                raise ValueError("the whole-model maps are of every position from zero")
            batch, n, d = x.shape
            size = self._group_size(x, rules)
            parts = [chosen_players[first:first + size] for first in range(0, n, size)]
            found = torch.zeros(batch, len(blocks), n, n, dtype=self.dtype, device=x.device)
        real = self._token_mask(kwargs, args[0])
        if is_centered(reference) and len(targets) > 1:
            seen = [self._shared(reference, real, target) for target in targets]
            if any(not torch.equal(seen[0], other) for other in seen[1:]):  # one start per target
                answers = [self._propagate(captured, args, kwargs, [target], rules, groups, n_groups,
                                           players, reference)[0][0] for target in targets]
                return answers, None
        shared = self._shared(reference, real, targets[0]) if targets else None
        progress = self._progress(len(blocks) * len(parts))
        contributions = [None] * len(targets)
        biases = [None] * len(targets)
        try:
            with torch.no_grad():
                for part in parts:
                    start = player_start(x, groups, part, token_mask, r, shared)
                    for index, last in enumerate(propagate(blocks, self.chain, rules, start,
                                                           self.memory_budget, progress,
                                                           self._replay if light else None)):
                        if found is not None:
                            found[:, index, :, part[0]:part[0] + len(part)] = last.maps()
                    columns = torch.as_tensor(part, dtype=torch.long, device=x.device)
                    for k, target in enumerate(targets):
                        share, biases[k] = head_forward(last, self.head, target, rules, recorded.tensors,
                                                        self.spec, self.config, self.dtype)
                        if contributions[k] is None:
                            contributions[k] = share.new_zeros(share.shape[0], n_groups)
                        contributions[k][:, columns] = share
        finally:
            if progress is not None:
                progress.close()
        answers = [(c, b, target_value(self.head, recorded.output, target, self.dtype))
                   for c, b, target in zip(contributions, biases, targets)]
        return answers, found

    def _group_size(self, x: Tensor, rules) -> int:
        """How many players the maps propagate at once (all of them when they fit
        ``memory_budget``)."""
        batch, n, d = x.shape
        per_player = batch * n * d * (torch.finfo(self.dtype).bits // 8) * 12
        size = max(1, min(n, self.memory_budget // max(per_player, 1)))
        if size < n and not all(is_linear_in_players(r) for r in rules.values()):
            raise ValueError("a rule that is not linear in the players needs all players at once: "
                             "raise memory_budget")
        return size

    def _forward(self, args, kwargs, targets: list[HeadTarget], rules, groups: Tensor, n_groups: int,
                 players: Sequence[int] | None = None, reference: Any = None):
        """One capture and one propagation; the head's rules for each target."""
        captured = self._capture(args, kwargs)
        answers, _ = self._propagate(captured, args, kwargs, targets, rules, groups, n_groups,
                                     players, reference)
        return answers

    def _backward(self, args, kwargs, targets: list[HeadTarget], rules, reference: Any = None):
        """One forward pass through the frozen model; one backward pass per target."""
        head = self.head
        warn_if_padded_without_mask(args, kwargs, self.config)
        self._warn_if_reduced_precision()
        token_mask = self._token_mask(kwargs, args[0])
        shares = [self._shared(reference, token_mask, target) for target in targets]  # before the
        kwargs, targets = self._keep_needed_logits(kwargs, targets)  # positions index the kept logits
        if "use_cache" not in kwargs and "use_cache" in inspect.signature(self.model.forward).parameters:
            kwargs["use_cache"] = False  # no key/value cache to fill (nor to grow on a recomputation)
        watch = {} if head.output is None else {"output": head.output}
        training = self.model.training
        self.model.eval()
        answers = []
        try:
            with linearise(self.model, self.spec, self.blocks, rules, head.final_norm,
                           head.linearised_steps(), watch, self._recompute(args)) as frozen:
                output = self.model(*args, **kwargs)
                x = frozen.inputs.detach()
                centered = is_centered(reference)
                r = None if centered else self._reference(reference, x.to(self.dtype), token_mask, args, kwargs)
                inputs = x
                if r is not None:
                    x = x - r.to(x.dtype)
                for k, target in enumerate(targets):
                    if head.task == "base":
                        value = target_value(self.head, output, target, self.dtype)
                    else:
                        value = linearised_target_value(self.head, frozen.outputs["output"], target, rules)
                    (gradient,) = torch.autograd.grad(value.sum(), frozen.inputs,
                                                      retain_graph=k + 1 < len(targets))
                    if centered:  # from the mean of the positions seen, whose output is shared back: ḡ·x_k
                        seen = shares[k].to(inputs.dtype)
                        mean = torch.einsum("bn,bnd->bd", seen, inputs) / seen.sum(1, keepdim=True).clamp_min(1)
                        contributions = ((gradient * (inputs - mean[:, None])).sum(-1)
                                         + shared_mean(gradient, inputs, seen)).to(self.dtype)
                    else:
                        contributions = (gradient * x).sum(-1).to(self.dtype)
                    value = value.detach().to(self.dtype)
                    real = target_value(self.head, output, target, self.dtype).detach()
                    answers.append((contributions, value - contributions.sum(-1), real))
        finally:
            self.model.train(training)
        return answers

    def _route(self, args, kwargs, targets: list[HeadTarget], rules, reference: Any, route: str,
               groups: Tensor, n_groups: int, players: Sequence[int] | None = None,
               with_bias: bool = False, captured: Any = None):
        """The one path of :meth:`attribute`, :meth:`attribute_steps` and :meth:`explain`:
        ``(contributions per player, bias, real value)`` of each target by ``route``. On the
        backward route, with ``with_bias``, the bias player's contribution is computed on its
        own: the forward route with no other player (one capture, or ``captured``, and one
        propagation of ``n`` vectors per block), so that the convergence delta
        ``|Σ_j c_j + c_bias − real|`` checks the backward pass against an independent
        computation."""
        if route == "forward":
            if captured is not None:
                return self._propagate(captured, args, kwargs, targets, rules, groups, n_groups, players,
                                       reference)[0]
            return self._forward(args, kwargs, targets, rules, groups, n_groups, players, reference)
        answers = self._backward(args, kwargs, targets, rules, reference)
        if not with_bias:
            return answers
        ids = args[0]
        batch, n = ids.shape
        positions = torch.arange(n, device=ids.device).expand(batch, n)
        alone = (self._propagate(captured, args, kwargs, targets, rules, positions, n, [], reference)[0]
                 if captured is not None else self._forward(args, kwargs, targets, rules, positions, n, [], reference))
        return [(contributions, bias.to(contributions.dtype), real)
                for (contributions, _, real), (_, bias, _) in zip(answers, alone)]

    def _stacked(self, answers, token_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The answers of several targets, one row each (targets first): contributions
        ``(T·B, n)`` (zero on padding), bias and real value ``(T·B,)``."""
        contributions = torch.cat([c for c, _, _ in answers])
        contributions = contributions * token_mask.repeat(len(answers), 1).to(contributions.dtype)
        return contributions, torch.cat([b for _, b, _ in answers]), torch.cat([r for _, _, r in answers])

    def _warn_if_reduced_precision(self) -> None:
        """Once per instance: a bfloat16 / float16 model's backward-route delta is measured
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
                stacklevel=4,
            )

    def _light(self, ids: Tensor) -> bool:
        """Whether the forward route should record one block at a time (replaying each from
        its recorded input) rather than every block's attention probabilities at once: when
        those would not fit ``memory_budget``."""
        heads = getattr(self.config, "num_attention_heads", 1) or 1
        n = ids.shape[-1]
        return ids.shape[0] * heads * n * n * 4 * len(self.blocks) > self.memory_budget

    def _replay(self, block: Any) -> Any:
        return replay_block(block, [self.model])

    def _recompute(self, args: tuple[Any, ...]) -> bool:
        """Whether the backward route should recompute blocks instead of keeping their
        intermediate tensors: when those would not fit ``memory_budget``."""
        ids = args[0]
        width = getattr(self.config, "hidden_size", 0) or 0
        ff = getattr(self.config, "intermediate_size", 0) or 4 * width
        per_block = ids.numel() * (2 * ff + 6 * width) * 4
        return per_block * len(self.blocks) > self.memory_budget

    def _keep_needed_logits(self, kwargs: dict[str, Any], targets: list[HeadTarget]
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
        keep, index = torch.unique(torch.stack([t.positions for t in targets], dim=1), return_inverse=True)
        moved = [replace(t, positions=index[:, k]) for k, t in enumerate(targets)]
        return {**kwargs, "logits_to_keep": keep}, moved

    def _progress(self, total: int) -> Any:
        if not self.show_progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="propagating", unit="block")


def _chunks(read_outs: Sequence[tuple[int, str, Tensor]], size: int) -> Iterator[Sequence[Any]]:
    """The read-outs of one block at a time (they reach equally deep), at most ``size`` each."""
    start = 0
    while start < len(read_outs):
        stop = start + 1
        while stop < len(read_outs) and stop - start < size and read_outs[stop][0] == read_outs[start][0]:
            stop += 1
        yield read_outs[start:stop]
        start = stop


def _batched_gradients(values: Sequence[Tensor], inputs: Tensor) -> Tensor:
    """``(k, *inputs.shape)``: the gradient of each ``(B,)`` read-out (summed over the batch)
    with respect to ``inputs``, in one batched backward pass (one pass each where a rule's
    backward does not batch)."""
    if len(values) == 1:
        return torch.autograd.grad(values[0].sum(), inputs, retain_graph=True)[0][None]
    stacked = torch.stack([v.sum() for v in values])
    try:
        (grads,) = torch.autograd.grad(stacked, inputs, grad_outputs=torch.eye(len(values), dtype=stacked.dtype),
                                       retain_graph=True, is_grads_batched=True)
        return grads
    except RuntimeError:
        return torch.stack([torch.autograd.grad(v.sum(), inputs, retain_graph=True)[0] for v in values])


def _sequence(tensor: Tensor, batch: int) -> Tensor:
    """``(B·n, d)`` outputs (some families flatten before the FF) back to ``(B, n, d)``."""
    return tensor.reshape(batch, -1, tensor.shape[-1]) if tensor.dim() == 2 else tensor


def _keep_input(store: dict[int, Tensor], index: int) -> Callable:
    """A forward hook keeping a module's first input (with its graph) under ``index``."""

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if index not in store and args:
            store[index] = args[0]

    return hook
