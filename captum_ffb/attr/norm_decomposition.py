"""``NormDecomposition``: exact contributions of the input tokens to a model's output, as a
Captum model-level attribution (as ``IntegratedGradients`` is to ``LayerIntegratedGradients``).

A thin adapter: it checks each request once at the door (:mod:`captum_ffb.engine.requests`),
turns what is explained into a read-out, and asks the one whole-model engine
(:class:`~captum_ffb.engine.whole.WholeModel`) for the numbers; every model shape is the
engine's business.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from captum.attr import Attribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_ffb._deprecation import keyword_only
from captum_ffb.attr.components import ComponentAttribution
from captum_ffb.engine import find_model, forward_arguments
from captum_ffb.engine.generation import DEFAULT_NEW_TOKENS, generate_greedily
from captum_ffb.engine.layers import DEFAULT_MEMORY_BUDGET
from captum_ffb.engine.locking import serialized
from captum_ffb.engine.requests import (
    check_call,
    check_forward_kwargs,
    check_index,
    vocabulary_size,
)
from captum_ffb.engine.whole import REFERENCES, Answer, HeadTarget, Request, WholeModel
from captum_ffb.models import LoadedModel
from captum_ffb.readouts import ClassLogit, Contrast, Direction, NextToken, ReadOut, as_readout
from captum_ffb.results import ExplainedOutput

#: What the players are measured from by default (see ``NormDecomposition.attribute()``):
#: each token from the mean of the input's tokens, that mean's own output shared back to them.
DEFAULT_REFERENCE = "centered"
#: ``ExplainedReadOuts`` is :class:`~captum_ffb.results.ExplainedOutput` (its name before 0.4).
ExplainedReadOuts = ExplainedOutput

_ATTRIBUTE = ("inputs", "target", "additional_forward_args", "forward_kwargs", "feature_mask", "target_position",
              "return_convergence_delta", "route", "rules", "return_bias", "players", "reference")
_COMPONENTS = ("inputs", "target", "additional_forward_args", "forward_kwargs", "feature_mask", "target_position",
               "granularity", "rules", "reference", "route")


class NormDecomposition(Attribution):
    r"""Exact contributions of a model's input tokens to one of its outputs.

    The model's blocks are chained (each block's decomposition starts from the previous
    one's) and followed by the head's rules, so that a scalar output (a class logit, the
    logit of a token at a position, a contrast of two logits, a direction read from pooled
    hidden states) is written exactly as ``Σ_j c_j + c_bias``, one ``c_j`` per input
    position (the first block's input vectors are the players) and one for everything owed
    to no token. The rules (:func:`~captum_ffb.rules.whole_model_rules`) are the paper's
    (frozen attention probabilities); :class:`~captum_ffb.rules.AttnLRPAttention` and the
    other rules that also credit queries and keys are one argument away. By default each
    token is measured from the mean of the input's tokens and that mean's own output is
    shared back to the tokens it is made of (``reference="centered"``), so the tokens own
    the whole output but for the model's own bias terms (``c_bias``). With the coefficients
    of each rule taken from the real forward pass, the model is linear in the players, so
    ``c_j`` costs one backward pass (``route="backward"``), and equals the forward
    propagation of the decompositions through every block (``route="forward"``, which also
    gives whole-model token-to-token maps). The convergence delta is the completeness
    residual ``|Σ_j c_j + c_bias − real|`` against the model's real output; on the backward
    route the bias player is computed on its own by the forward route with no other player,
    so the delta checks the backward pass against an independent computation.

    An encoder–decoder (T5, BART, Marian, Whisper, ...) is one more player layout:
    ``inputs`` is the source, ``forward_kwargs`` holds the target prefix
    (``decoder_input_ids``), and the players are ``[source | target]``.

    A model that computes in reduced precision (bfloat16, float16) is decomposed in its own
    precision on the backward route: its delta is then measured against the model's own
    low-precision output, while its contributions may differ from the float32 model's by
    about 1 %. A warning says so once; load the model in float32 for exact contributions.

    Args:
        forward_func (nn.Module): a Hugging Face model of a supported family (a
                    ``*ForCausalLM``, a ``*ForSequenceClassification``, an encoder–decoder
                    with its LM head, or a base model), or what
                    :func:`~captum_ffb.models.load_model` returns (its tokenizer comes along).
        rules (dict, optional): role → rule replacing the default rule of that role
                    (:func:`~captum_ffb.rules.whole_model_rules`).
        reference (str, int or Tensor): what the players are measured from when a call does
                    not say (see :meth:`attribute`): ``"centered"`` by default, ``"zero"`` for
                    the paper's.
        tokenizer (optional): the model's tokenizer, so that a target may be given as text
                    (``target=" Paris"``).
        model_type (str, optional): the architecture when the config does not say it.
        memory_budget (int): bytes the forward route's row chunks and player groups may take;
                    on the backward route, when the blocks' intermediate tensors would exceed
                    it, each block is run again during the backward pass instead.
        dtype (torch.dtype): the forward route's precision (float32 by default).
        show_progress (bool): progress bars over blocks and read-outs.

    Examples::

        >>> from captum_ffb import NormDecomposition
        >>> nd = NormDecomposition(model, tokenizer=tokenizer)      # e.g. SmolLM2
        >>> ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
        >>> contributions, delta = nd.attribute(ids, target=" Paris", return_convergence_delta=True)
        >>> contributions.shape                                       # (1, n): one per token
    """

    @keyword_only(1, ("forward_func", "model_type", "rules", "memory_budget", "dtype", "show_progress",
                      "reference"))
    def __init__(self, forward_func: nn.Module | Any, *, rules: Mapping[str, Callable] | None = None,
                 reference: str | int | Tensor = DEFAULT_REFERENCE, tokenizer: Any = None,
                 model_type: str | None = None, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                 dtype: torch.dtype = torch.float32, show_progress: bool = False) -> None:
        if isinstance(forward_func, LoadedModel):  # its tokenizer comes along
            tokenizer = forward_func.tokenizer if tokenizer is None else tokenizer
            forward_func = forward_func.model
        model = find_model(forward_func)
        if model is None:
            raise TypeError("NormDecomposition needs the model itself (an nn.Module) as forward_func")
        super().__init__(model)
        if isinstance(reference, str) and reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, a token id or a tensor, got {reference!r}")
        self.model = model
        #: the one whole-model engine this attribution asks
        self.engine = WholeModel(model, model_type, memory_budget, dtype, show_progress)
        self._user_rules = dict(rules or {})
        self.rules = self.engine.rules(self._user_rules)  # checked now: a wrong role fails here
        #: what the players are measured from when a call does not say
        self.reference = reference
        #: the tokenizer that reads text targets (``None``: token ids only)
        self.tokenizer = tokenizer

    def has_convergence_delta(self) -> bool:
        return True

    # the engine's facts, read through this attribution
    task = property(lambda self: self.engine.task, doc="``causal_lm``, ``sequence_classification``, "
                    "``seq2seq_lm`` or ``base``.")
    model_type = property(lambda self: self.engine.model_type, doc="The family.")
    spec = property(lambda self: self.engine.spec, doc="The read stack's block layout.")
    chain = property(lambda self: self.engine.chain, doc="The read stack's chain.")
    blocks = property(lambda self: self.engine.blocks, doc="The read stack's blocks.")
    head = property(lambda self: self.engine.head, doc="The resolved head.")
    config = property(lambda self: self.engine.config, doc="The model's config.")
    memory_budget = property(lambda self: self.engine.memory_budget,
                             lambda self, value: setattr(self.engine, "memory_budget", int(value)))
    dtype = property(lambda self: self.engine.dtype, lambda self, value: setattr(self.engine, "dtype", value))
    show_progress = property(lambda self: self.engine.show_progress,
                             lambda self, value: setattr(self.engine, "show_progress", value))

    # ------------------------------------------------------------------ public API
    @log_usage()
    @serialized
    @keyword_only(2, _ATTRIBUTE)
    def attribute(self, inputs: Tensor | tuple[Tensor, ...], target: Any = None, *,
                  additional_forward_args: Any = None, forward_kwargs: dict[str, Any] | None = None,
                  baselines: str | int | Tensor | None = None, reference: str | int | Tensor | None = None,
                  route: str = "backward", rules: Mapping[str, Callable] | None = None,
                  feature_mask: Tensor | None = None, target_position: int | Tensor | None = None,
                  return_bias: bool = False, return_convergence_delta: bool = False,
                  players: Sequence[int] | None = None) -> Any:
        r"""Signed contributions ``(batch, n)`` of the input positions to ``target``.

        Args:
            inputs (Tensor or tuple[Tensor, ...]): the model's positional inputs (token ids;
                        an encoder–decoder's source).
            target (int, str, Tensor or ReadOut): a class index for a sequence classifier; a
                        token id (or, with a tokenizer, its text) for a causal LM (its logit at
                        each row's last real position, or at ``target_position``); one per row
                        as a ``(batch,)`` tensor; :class:`Contrast` for ``logit(a) − logit(b)``;
                        :class:`Direction` for a base model; or any other read-out of
                        :mod:`captum_ffb.readouts`.
            additional_forward_args (Any, optional): further positional arguments.
            forward_kwargs (dict, optional): keyword arguments of the forward, e.g.
                        ``{"attention_mask": mask}`` (left or right padding) or an
                        encoder–decoder's ``decoder_input_ids``.
            baselines (str, int or Tensor, optional): Captum's name for ``reference``: give
                        one or the other.
            reference (str, int or Tensor, optional): what each player is measured from
                        (``None``: the instance's): ``c_j = L_j(x_j − r_j)`` with ``L_j`` the
                        frozen model's linear map of position ``j``, and ``Σ_j L_j(r_j)`` added
                        to the bias player. ``"zero"``: ``r = 0`` (the paper's); ``"mean"``:
                        each row's mean first-block input over its real tokens;
                        ``"centered"`` (default): the mean of the positions the output sees,
                        the mean's own output shared back to the tokens it averages; a token
                        id: the first-block input of that token at each position; a tensor
                        ``(d,)``, ``(n, d)`` or ``(batch, n, d)``.
            route (str): ``"backward"`` (one backward pass through the frozen model) or
                        ``"forward"`` (the decompositions carried through every block).
            rules (dict, optional): role → rule for this call.
            feature_mask (Tensor, optional): ``(batch, n)`` group ids in Captum's convention:
                        the groups are the players; every position gets its group's
                        contribution.
            target_position (int or Tensor, optional): the position whose output is read
                        (negative counts from the end; one per row as a ``(batch,)`` tensor).
            return_bias (bool): also return the bias player's contribution ``(batch,)``.
            return_convergence_delta (bool): also return ``|Σ_j c_j + c_bias − real|``
                        ``(batch,)``, last.
            players (list[int], optional): forward route only: propagate just these players
                        (positions, or group ids with a ``feature_mask``); the others get 0,
                        and every part carries the whole bias player.

        Returns:
            contributions ``(batch, n)`` (an encoder–decoder: the pair ``(source (batch,
            n_source), target (batch, n_target))``); with ``return_bias``, the bias next;
            with ``return_convergence_delta``, the delta last. Padded positions get exactly 0.
        """
        reference = self._reference_of(reference, baselines)
        request = self._request(inputs, additional_forward_args, forward_kwargs, reference)
        if target is None:
            raise ValueError("target is None: attribute() explains one output (a class, a token id or its "
                             "text, a Contrast or a Direction); for whole-model token-to-token maps call maps()")
        groups, n_groups = self._groups(feature_mask, players, request)
        head_target = self._target(target, target_position, request.read_mask)
        (answer,) = self.engine.answers(request, [head_target], self.engine.rules({**self._user_rules, **(rules or {})}),
                                        reference, route, groups, n_groups, players,
                                        with_bias=return_bias or return_convergence_delta)
        per_group = self._per_group(answer, request, groups, n_groups, route)
        out: list[Any] = [self._per_position(per_group, request, groups)]
        if return_bias:
            out.append(answer.bias)
        if return_convergence_delta:
            out.append((per_group.sum(1) + answer.bias - answer.real).abs())
        return out[0] if len(out) == 1 else tuple(out)

    @log_usage()
    @serialized
    @keyword_only(2, _COMPONENTS)
    def attribute_components(self, inputs: Tensor | tuple[Tensor, ...], target: Any = None, *,
                             additional_forward_args: Any = None, forward_kwargs: dict[str, Any] | None = None,
                             baselines: str | int | Tensor | None = None,
                             reference: str | int | Tensor | None = None, route: str | None = None,
                             rules: Mapping[str, Callable] | None = None, feature_mask: Tensor | None = None,
                             target_position: int | Tensor | None = None,
                             granularity: str = "sublayer") -> ComponentAttribution:
        r"""Which components, acting on which tokens, wrote the read-out: the exact table
        ``C[j, c]`` of direct effects with ``target = Σ_j Σ_c C[j, c] + Σ_c b[c]``.

        Each writer of the residual stream (the embeddings, each attention block or head,
        each FF block or expert, an encoder–decoder's cross-attentions) is read through the
        frozen later norms and the head (its *direct* effect), and that read-out is split
        over the tokens; summed over components it gives :meth:`attribute`'s contributions.

        Args:
            inputs, target, additional_forward_args, forward_kwargs, baselines, reference, rules,
            feature_mask, target_position: as in :meth:`attribute`; ``target=None`` explains
                        the predicted class or next token.
            route (str, optional): ``"backward"`` (one backward pass per writer),
                        ``"forward"`` (every token's share carried through every block), or
                        ``None``: the cheaper for this many players, blocks and writers
                        (encoder–decoders and per-expert splits take the forward route).
            granularity (str): ``"block"``, ``"sublayer"`` or ``"head"``.

        Returns:
            ComponentAttribution: ``contributions`` ``(batch, n, C)`` (an encoder–decoder's
            rows are its players ``[source | target]``), ``bias``, ``components``,
            ``value``, ``delta``.
        """
        if route == "auto":
            import warnings

            warnings.warn("route='auto' is now route=None (the cheaper route)", DeprecationWarning, stacklevel=4)
            route = None
        reference = self._reference_of(reference, baselines)
        request = self._request(inputs, additional_forward_args, forward_kwargs, reference)
        chosen = self.engine.rules({**self._user_rules, **(rules or {})})
        groups, n_groups = self._groups(feature_mask, None, request)
        captured = self.engine.capture(request)
        if target is None:
            if self.task == "base":
                raise ValueError(f"{type(self.model).__name__} is a base model: give a Direction target")
            target = NextToken(None, target_position) if self.task != "sequence_classification" else ClassLogit()
            target_position = None
        if isinstance(target, ReadOut):
            target = self._text_free(target).resolve(captured.output, request.read_mask.long())
        head_target = self._target(target, target_position, request.read_mask)
        table = self.engine.components(request, head_target, chosen, reference, granularity, route, groups,
                                       n_groups, captured)
        return ComponentAttribution(table.contributions, table.bias, table.names, table.real, table.delta,
                                    granularity)

    @log_usage()
    @serialized
    @keyword_only(2, ("inputs", "target", "forward_kwargs", "route", "maps", "check", "rules", "reference"),
                  renamed={"input_ids": "inputs", "readouts": "target"})
    def explain(self, inputs: Tensor, target: Sequence[ReadOut | int | str | Tensor], *,
                forward_kwargs: dict[str, Any] | None = None, route: str = "backward", maps: bool = False,
                check: bool = False, rules: Mapping[str, Callable] | None = None,
                reference: str | int | Tensor | None = None) -> ExplainedOutput:
        r"""Several read-outs of one batch explained in at most two passes of the model: one
        recording the forward route (the outputs that resolve a predicted unit, the bias
        player propagated on its own, the maps and the check), then, on the backward
        route, the backward pass.

        Args:
            inputs (Tensor): ``(batch, n)`` token ids (an encoder–decoder's source).
            target (list): read-outs (an index or a text counts as in :meth:`attribute`);
                        ``NextToken()`` or ``ClassLogit()`` explain the predicted unit.
            forward_kwargs (dict, optional): keyword arguments of the forward.
            route (str): ``"backward"`` or ``"forward"``.
            maps (bool): also the whole-model maps (see :meth:`maps`).
            check (bool): on the backward route, also the forward route's contributions.
            rules (dict, optional): role → rule for this call.
            reference (str, int or Tensor, optional): as in :meth:`attribute` (the maps are
                        always of every position from zero).

        Returns:
            ExplainedOutput: one row per read-out and batch row (read-outs first).
        """
        if isinstance(target, (ReadOut, int, str, Tensor)) and not (isinstance(target, Tensor) and target.dim()):
            target = [target]
        if not target:
            raise ValueError("target: give at least one read-out")
        reference = self.reference if reference is None else reference
        request = self._request(inputs, None, forward_kwargs, reference)
        chosen = self.engine.rules({**self._user_rules, **(rules or {})})
        zero = reference is None or (isinstance(reference, str) and reference == "zero")
        captured = self.engine.capture(request)
        mask = request.read_mask.long()
        resolved = [self._text_free(as_readout(self._text_free(r), self.task)).resolve(captured.output, mask)
                    for r in target]
        targets = [self._target(r, None, request.read_mask) for r in resolved]
        whole, found = None, None
        if maps or check or route == "forward":  # the maps ride along where the players are from zero
            whole, found = self.engine.forward(captured, request, targets, chosen, reference=reference,
                                               maps=maps and zero)
        if maps and not zero:
            _, found = self.engine.forward(captured, request, targets, chosen, maps=True)
        answers = whole if route == "forward" else self.engine.answers(
            request, targets, chosen, reference, route, with_bias=True, captured=captured)
        result = self._explained(answers, request)
        result.readouts, result.outputs, result.maps = resolved, captured.output, found
        if whole is not None and (check or route == "forward"):
            forward = self._explained(whole, request)
            result.forward_contributions, result.forward_delta = forward.contributions, forward.delta
        return result

    @log_usage()
    @serialized
    @keyword_only(2, ("inputs", "decoder_input_ids", "tokens", "forward_kwargs", "route", "rules", "reference"),
                  renamed={"decoder_input_ids": "forward_kwargs.decoder_input_ids", "tokens": "target"})
    def explain_target(self, inputs: Tensor, target: str | Sequence[int] | Tensor, *,
                       forward_kwargs: dict[str, Any] | None = None, route: str = "backward",
                       rules: Mapping[str, Callable] | None = None,
                       reference: str | int | Tensor | None = None) -> ExplainedOutput:
        r"""Every token of a forced target explained from one forward pass: a causal LM's
        continuation of its prompt (``inputs``), or an encoder–decoder's target for its
        source (``inputs``; ``forward_kwargs["decoder_input_ids"]`` is the decoder's input,
        its start token then the target but its last token, made from the target when left
        out).

        Args:
            inputs (Tensor): ``(1, n)`` the prompt or the source (or Whisper's features).
            target (str, list[int] or Tensor): the target's tokens ``(T,)``, or its text (with
                        a tokenizer).
            forward_kwargs, route, rules, reference: see :meth:`attribute`.

        Returns:
            ExplainedOutput: row ``t`` explains the logit of ``target[t]`` where it is read.

        Examples::

            >>> nd = NormDecomposition(marian, tokenizer=tokenizer)
            >>> out = nd.explain_target(src, "Hallo Welt")
            >>> out.source_share                                  # (T,): Σ source / logit
        """
        kwargs = check_forward_kwargs(forward_kwargs)
        source = torch.as_tensor(inputs)
        source = source[None] if source.dim() == 1 or (source.is_floating_point() and source.dim() == 2) else source
        if source.shape[0] != 1:
            raise ValueError("inputs: explain one input at a time (a batch of 1)")
        tokens = self._target_tokens(target, source.device)
        two_stacks = self.engine.source is not None
        if two_stacks:
            prefix = kwargs.get("decoder_input_ids")
            if prefix is None:
                start = getattr(self.model.config, "decoder_start_token_id", None)
                if start is None:
                    raise ValueError(f"{self.model_type}'s config has no decoder_start_token_id: give "
                                     "forward_kwargs['decoder_input_ids']")
                prefix = torch.cat([tokens.new_tensor([int(start)]), tokens[:-1]])[None]
            prefix = torch.as_tensor(prefix)
            prefix = prefix[None] if prefix.dim() == 1 else prefix
            if tokens.numel() > prefix.shape[1]:
                raise ValueError(f"target: give between 1 and {prefix.shape[1]} tokens (one per decoder position)")
            ids, kwargs, positions = source, {**kwargs, "decoder_input_ids": prefix}, range(tokens.numel())
        else:
            ids = torch.cat([source, tokens[None, :-1].to(source.device)], dim=1)
            if "attention_mask" in kwargs:
                kwargs["attention_mask"] = torch.cat([kwargs["attention_mask"],
                                                      torch.ones_like(tokens[None, :-1])], dim=1)
            positions = range(source.shape[1] - 1, source.shape[1] - 1 + tokens.numel())
        readouts = [NextToken(int(t), int(p)) for t, p in zip(tokens, positions)]
        result = self.explain(ids, readouts, forward_kwargs=kwargs, route=route, rules=rules, reference=reference)
        result.tokens = tokens
        if two_stacks:
            result.source_ids = source[0] if not source.is_floating_point() else torch.empty(0, dtype=torch.long)
            result.target_ids = kwargs["decoder_input_ids"][0]
        else:
            result.target_ids = ids[0]
        return result

    @log_usage()
    @serialized
    @keyword_only(1, ("inputs", "max_new_tokens", "forward_kwargs", "route", "rules", "reference"))
    def explain_generation(self, inputs: Tensor, *, max_new_tokens: int = DEFAULT_NEW_TOKENS,
                           forward_kwargs: dict[str, Any] | None = None, route: str = "backward",
                           rules: Mapping[str, Callable] | None = None,
                           reference: str | int | Tensor | None = None) -> ExplainedOutput:
        r"""Generate greedily from one input (a causal LM's prompt, an encoder–decoder's
        source), then explain every generated token (see :meth:`explain_target`; the
        generation's logits equal the forced decoding's: it is the same computation).

        Args:
            inputs (Tensor): ``(1, n)`` the prompt or the source.
            max_new_tokens (int): at most this many tokens, within the model's positions.
            forward_kwargs, route, rules, reference: see :meth:`attribute`.
        """
        source = torch.as_tensor(inputs)
        source = source[None] if source.dim() == 1 or (source.is_floating_point() and source.dim() == 2) else source
        check_call(self.model, (source,), check_forward_kwargs(forward_kwargs))  # before generating
        if self.task not in ("causal_lm", "seq2seq_lm"):
            raise ValueError(f"generating needs a causal LM or an encoder–decoder; {type(self.model).__name__} "
                             f"is a {self.task} model")
        tokens = generate_greedily(self.model, source, max_new_tokens, forward_kwargs)
        if tokens.numel() == 0:
            raise ValueError("the model generated nothing to explain")
        return self.explain_target(source, tokens, forward_kwargs=forward_kwargs, route=route, rules=rules,
                                   reference=reference)

    @log_usage()
    @serialized
    @keyword_only(2, ("inputs", "target", "target_position", "forward_kwargs", "return_convergence_delta",
                      "route", "rules", "return_bias", "reference"),
                  renamed={"input_ids": "inputs", "targets": "target", "positions": "target_position"})
    def attribute_steps(self, inputs: Tensor, target: Tensor | Sequence[int], *, target_position: Tensor | Sequence[int],
                        forward_kwargs: dict[str, Any] | None = None, route: str = "backward",
                        rules: Mapping[str, Callable] | None = None, reference: str | int | Tensor | None = None,
                        return_bias: bool = False, return_convergence_delta: bool = False) -> Any:
        r"""Contributions to several outputs of one sequence from one forward pass: the logit
        of ``target[t]`` at ``target_position[t]`` for every ``t`` (teacher forcing: a prompt
        followed by generated tokens explains every step at once).

        Returns:
            contributions ``(T, n)``, then the bias ``(T,)`` and the delta ``(T,)`` if asked.
        """
        ids = torch.as_tensor(inputs)
        ids = ids[None] if ids.dim() == 1 else ids
        tokens = check_index(torch.as_tensor(target, device=ids.device), "target").reshape(-1)
        where = check_index(torch.as_tensor(target_position, device=ids.device), "target_position").reshape(-1)
        if tokens.numel() != where.numel() or tokens.numel() == 0:
            raise ValueError("give one target_position per target (and at least one target)")
        if ids.dim() == 2 and ids.shape[0] != 1:
            raise ValueError("attribute_steps takes one sequence: inputs of shape (1, n)")
        reference = self.reference if reference is None else reference
        request = self._request(ids, None, forward_kwargs, reference)
        targets = [self._target(NextToken(int(t), int(p)), None, request.read_mask) for t, p in zip(tokens, where)]
        answers = self.engine.answers(request, targets, self.engine.rules({**self._user_rules, **(rules or {})}),
                                      reference, route, with_bias=return_bias or return_convergence_delta)
        result = self._explained(answers, request)
        out: list[Any] = [result.contributions]
        if return_bias:
            out.append(result.bias)
        if return_convergence_delta:
            out.append(result.delta)
        return out[0] if len(out) == 1 else tuple(out)

    @log_usage()
    @serialized
    @keyword_only(1, ("inputs", "additional_forward_args", "forward_kwargs", "rules", "return_convergence_delta"))
    def maps(self, inputs: Tensor | tuple[Tensor, ...], *, additional_forward_args: Any = None,
             forward_kwargs: dict[str, Any] | None = None, rules: Mapping[str, Callable] | None = None,
             return_convergence_delta: bool = False) -> Any:
        r"""Whole-model token-to-token maps: ``‖F_i(x_j)‖`` after every block, over the
        original input tokens ``(batch, n_blocks, n, n)`` (what attention rollout
        approximates); players are propagated in groups that fit ``memory_budget``.

        Args:
            inputs, additional_forward_args, forward_kwargs, rules: see :meth:`attribute`.
            return_convergence_delta (bool): also return, per block, the largest completeness
                        residual against the block's real output ``(batch, n_blocks)``.
        """
        self.engine.refuse_two_stacks("maps")
        request = self._request(inputs, additional_forward_args, forward_kwargs)
        return self.engine.maps(request, self.engine.rules({**self._user_rules, **(rules or {})}),
                                return_convergence_delta)

    # ------------------------------------------------------------------ the door
    def _request(self, inputs: Any, additional_forward_args: Any, forward_kwargs: Any,
                 reference: Any = None, name: str = "inputs") -> Request:
        """A call checked once before any pass: token ids in the vocabulary and within a
        learned position table, masks of their shape with a real token per row, an
        encoder–decoder's target of the source's batch, a token id as reference within the
        vocabulary (:mod:`captum_ffb.engine.requests`)."""
        args = forward_arguments(inputs, additional_forward_args)
        kwargs = check_call(self.model, args, check_forward_kwargs(forward_kwargs), name)
        if isinstance(reference, int):  # a token id (a bool is refused)
            check_index(reference, "reference", vocabulary_size(self.model))
        return self.engine.request(args, kwargs)

    def _reference_of(self, reference: Any, baselines: Any) -> Any:
        if baselines is not None and reference is not None:
            raise ValueError("give reference= or baselines= (Captum's name for it), not both")
        chosen = reference if reference is not None else baselines
        return self.reference if chosen is None else chosen

    def _groups(self, feature_mask: Tensor | None, players: Any, request: Request) -> tuple[Tensor, int]:
        ids = request.read_mask
        batch, n = ids.shape
        if feature_mask is not None or players is not None:
            self.engine.refuse_two_stacks("feature_mask" if feature_mask is not None else "players")
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

    def _target(self, target: Any, position: Any, read_mask: Tensor) -> HeadTarget:
        """The head target of ``target`` (an index, its text, one per row, or a read-out)."""
        name = type(self.model).__name__
        target = self._text_free(target)
        check_index(target, "target")
        if isinstance(target, Direction) and self.task != "base":
            raise ValueError(f"a Direction reads a base model's hidden states; {name} has a head: "
                             "give a class, a token id or a Contrast")
        if self.task == "base" and not isinstance(target, Direction):
            raise ValueError(f"{name} is a base model: give a Direction target")
        return as_readout(target, self.task).head_target(self.engine.head, read_mask, self.engine.dtype, position)

    def _text_free(self, target: Any) -> Any:
        """``target`` with every text (the target, a Contrast's or a NextToken's token) as its
        token id, read by the tokenizer."""
        if isinstance(target, str):
            return self._token_id(target)
        if isinstance(target, Contrast) and isinstance(target.positive, str) or \
                isinstance(target, Contrast) and isinstance(target.negative, str):
            return dataclasses.replace(target, positive=self._text_free(target.positive),
                                       negative=self._text_free(target.negative))
        if isinstance(target, NextToken) and isinstance(target.token, str):
            return dataclasses.replace(target, token=self._token_id(target.token))
        return target

    def _token_id(self, text: str) -> int:
        if self.tokenizer is None:
            raise TypeError(f"target {text!r} is text: give NormDecomposition(model, tokenizer=...) to read it, "
                            "or its token id")
        ids = self._encode(text)
        if len(ids) != 1:
            pieces = self.tokenizer.convert_ids_to_tokens(ids)
            raise ValueError(f"target {text!r} is {len(ids)} tokens for this tokenizer ({pieces}); give one "
                             "token (mind the leading space, e.g. ' Paris')")
        return int(ids[0])

    def _encode(self, text: str) -> list[int]:
        if self.engine.source is not None:
            return list(self.tokenizer(text_target=text, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _target_tokens(self, target: Any, device: torch.device) -> Tensor:
        """A forced target's tokens ``(T,)``, from ids or (with a tokenizer) its text."""
        if isinstance(target, str):
            if self.tokenizer is None:
                raise TypeError("target is text: give NormDecomposition(model, tokenizer=...) to read it, or "
                                "its token ids")
            target = self._encode(target)
        tokens = check_index(torch.as_tensor(target), "target", int(self.engine.head.output.weight.shape[0])
                             if self.engine.head.output is not None else None).reshape(-1).long()
        if tokens.numel() == 0:
            raise ValueError("target has no tokens")
        return tokens.to(device)

    # ------------------------------------------------------------------ answers as Captum's tensors
    def _per_group(self, answer: Answer, request: Request, groups: Tensor, n_groups: int, route: str) -> Tensor:
        """The contributions per player ``(B, P)``: the backward route's per position added up
        by group (one stack), the forward route's as they are (its groups were the players)."""
        if route == "forward" or self.engine.source is not None:
            return answer.contributions
        contributions = answer.contributions * request.read_mask.to(answer.contributions.dtype)
        per_group = contributions.new_zeros(contributions.shape[0], n_groups)
        return per_group.scatter_add_(1, groups, contributions)

    def _per_position(self, per_group: Tensor, request: Request, groups: Tensor) -> Any:
        """Each position's group's contribution (one stack), or the pair ``(source, target)``."""
        if self.engine.source is not None:
            n_source = per_group.shape[1] - request.read_mask.shape[1]
            return per_group[:, :n_source], per_group[:, n_source:]
        return per_group.gather(1, groups) * request.read_mask.to(per_group.dtype)

    def _explained(self, answers: list[Answer], request: Request) -> ExplainedOutput:
        """Several answers as one result, one row per answer and batch row (answers first)."""
        contributions = torch.cat([a.contributions for a in answers])
        n_source = contributions.shape[1] - request.read_mask.shape[1]  # the read stack's players last
        if n_source == 0:
            contributions = contributions * request.read_mask.repeat(len(answers), 1).to(contributions.dtype)
        real = torch.cat([a.real for a in answers])
        bias = torch.cat([a.bias if a.bias is not None else a.value - a.contributions.sum(-1) for a in answers])
        return ExplainedOutput(contributions, bias, real, (contributions.sum(1) + bias - real).abs(), n_source)
