"""``NormDecomposition``: exact contributions of the input tokens to a model's output, as a
Captum model-level attribution (as ``IntegratedGradients`` is to ``LayerIntegratedGradients``).

A thin adapter: it checks each request once at the door (:mod:`captum_ffb.engine.requests`),
turns what is explained into a read-out, and asks the one whole-model engine
(:class:`~captum_ffb.engine.whole.WholeModel`) for the numbers; every model shape is the
engine's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from captum.attr import Attribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_ffb._deprecation import keyword_only
from captum_ffb.attr._door import Door, captum_return, check_reference, one_input, route_of
from captum_ffb.attr.components import ComponentAttribution
from captum_ffb.attr.graph import (
    DEFAULT_MAX_NODES,
    EDGE_THRESHOLD,
    NODE_THRESHOLD,
    AttributionGraph,
    check_positions,
    graph_target,
    output_label,
    token_labels,
)
from captum_ffb.engine import find_model
from captum_ffb.engine.generation import DEFAULT_NEW_TOKENS, generate_greedily
from captum_ffb.engine.locking import serialized
from captum_ffb.engine.model import wrapper_tokenizer
from captum_ffb.engine.patching import EXACT_ABOVE, check_estimators, corrupted_like
from captum_ffb.engine.requests import (
    check_call,
    check_forward_kwargs,
    check_index,
)
from captum_ffb.engine.whole import HeadTarget, WholeModel
from captum_ffb.models import LoadedModel
from captum_ffb.readouts import (
    NextToken,
    ReadOut,
    as_readout,
)
from captum_ffb.results import ExplainedOutput
from captum_ffb.vocabulary import check_granularity

#: What the players are measured from by default (see ``NormDecomposition.attribute()``):
#: each token from the mean of the input's tokens, that mean's own output shared back to them.
DEFAULT_REFERENCE = "centered"
#: ``ExplainedReadOuts`` is :class:`~captum_ffb.results.ExplainedOutput` (its name before 0.4).
ExplainedReadOuts = ExplainedOutput

_ENGINE_FACTS = ("task", "model_type", "spec", "chain", "blocks", "head", "config", "memory_budget", "dtype",
                 "show_progress")
_ATTRIBUTE = ("inputs", "target", "additional_forward_args", "forward_kwargs", "feature_mask", "target_position",
              "return_convergence_delta", "route", "rules", "return_bias", "players", "reference")
_COMPONENTS = ("inputs", "target", "additional_forward_args", "forward_kwargs", "feature_mask", "target_position",
               "granularity", "rules", "reference", "route")


class NormDecomposition(Door, Attribution):
    r"""Exact contributions of a model's input tokens to one of its outputs.

    A scalar output (a class logit, a token's logit, a contrast of two logits, a direction
    read from pooled hidden states) is written exactly as ``Σ_j c_j + c_bias``: the model's
    blocks chained, each rule's coefficients taken from the real forward pass (frozen
    attention probabilities, norm scales, activation coefficients: the paper's rules,
    :func:`~captum_ffb.rules.whole_model_rules`), so the model is linear in the players (the
    first block's input vectors) and ``c_j`` costs one backward pass (``route="backward"``);
    it equals the decompositions carried through every block (``route="forward"``). By
    default each token is measured from the mean of the tokens the output sees, that mean's
    own output shared back to them (``reference="centered"``): the tokens own the whole output
    but for the model's own bias terms. The convergence delta ``|Σ_j c_j + c_bias − real|`` is
    taken against the model's real output, the bias player computed on its own by the forward
    route. An encoder–decoder is one more player layout, ``[source | target]``. A bfloat16 or
    float16 model runs the backward route in its own precision (a warning says so once).

    Args:
        forward_func (nn.Module): a Hugging Face model of a supported family (a
                    ``*ForCausalLM``, a ``*ForSequenceClassification``, an encoder–decoder
                    with its LM head, or a base model), or what
                    :func:`~captum_ffb.models.load_model` returns, a TransformerLens
                    ``TransformerBridge`` or an nnsight ``LanguageModel`` of one (their
                    tokenizer comes along; :func:`~captum_ffb.engine.find_model`).
        rules (dict, optional): role → rule replacing the default rule of that role
                    (:func:`~captum_ffb.rules.whole_model_rules`).
        reference (str, int or Tensor): what the players are measured from when a call does
                    not say (see :meth:`attribute`).
        tokenizer (optional): the model's tokenizer, so that a target may be given as text
                    (``target=" Paris"``).
        model_type (str, optional): the architecture when the config does not say it.
        memory_budget (int, optional): bytes the row chunks and player groups may take
                    (default :data:`~captum_ffb.engine.layers.DEFAULT_MEMORY_BUDGET`); the
                    backward route recomputes blocks rather than exceed it (when not given:
                    rather than exceed half the memory available).
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
                 model_type: str | None = None, memory_budget: int | None = None,
                 dtype: torch.dtype = torch.float32, show_progress: bool = False) -> None:
        if isinstance(forward_func, LoadedModel):  # its tokenizer comes along
            tokenizer = forward_func.tokenizer if tokenizer is None else tokenizer
            forward_func = forward_func.model
        tokenizer = wrapper_tokenizer(forward_func) if tokenizer is None else tokenizer  # a bridge's, nnsight's
        model = find_model(forward_func)
        if model is None:
            raise TypeError("NormDecomposition needs the model itself (an nn.Module) as forward_func")
        super().__init__(model)
        if any(p.device.type == "meta" for p in model.parameters()):
            raise ValueError(f"{type(model).__name__}'s weights are on the meta device (not loaded): load them "
                             "(from_pretrained without device_map='meta'), then explain")
        check_reference(reference, model)
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

    def __getattr__(self, name: str) -> Any:
        """The engine's facts, read through this attribution: ``task``, ``model_type``,
        ``spec``, ``chain``, ``blocks``, ``head``, ``config``, ``memory_budget``, ``dtype``,
        ``show_progress`` (the last three settable here too)."""
        if name in _ENGINE_FACTS and "engine" in self.__dict__:
            return getattr(self.engine, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("memory_budget", "dtype", "show_progress") and "engine" in self.__dict__:
            setattr(self.engine, name, int(value) if name == "memory_budget" else value)
        else:
            super().__setattr__(name, value)

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
            inputs (Tensor or tuple[Tensor, ...]): token ids (an encoder–decoder's source).
            target (int, str, Tensor or ReadOut, optional): a class of a classifier; a token id
                        (or its text, with a tokenizer) whose logit a language model gives at
                        each row's last real position or ``target_position``; one per row as a
                        ``(batch,)`` tensor; a :class:`Contrast` (``logit(a) − logit(b)``); a
                        :class:`Direction` (base models); any read-out of
                        :mod:`captum_ffb.readouts`; ``None``: the model's prediction (the
                        predicted next token, or class), as in every method.
            additional_forward_args (Any, optional): further positional arguments.
            forward_kwargs (dict, optional): the forward's keyword arguments (an
                        ``attention_mask``, left or right padding; ``decoder_input_ids``).
            baselines: Captum's name for ``reference`` (give one or the other).
            reference (str, int or Tensor, optional): what each player is measured from,
                        ``c_j = L_j(x_j − r_j)`` with ``Σ_j L_j(r_j)`` added to the bias player:
                        ``"zero"`` (the paper's), ``"mean"`` (each row's mean input),
                        ``"centered"`` (the default: the mean of the positions the output sees,
                        its output shared back to the tokens), a token id, or a tensor ``(d,)``,
                        ``(n, d)`` or ``(batch, n, d)``; ``None``: the instance's.
            route (str): ``"backward"`` (one backward pass of the frozen model) or
                        ``"forward"`` (the decompositions carried through every block).
            rules (dict, optional): role → rule for this call.
            feature_mask (Tensor, optional): ``(batch, n)`` Captum's group ids: the groups are
                        the players, each position gets its group's contribution.
            target_position (int or Tensor, optional): the position read (negative from the end).
            return_bias (bool): also return the bias player ``(batch,)``.
            return_convergence_delta (bool): also return ``|Σ_j c_j + c_bias − real|``, last.
            players (list[int], optional): forward route: propagate only these players (the
                        others get 0; every part carries the whole bias player).

        Returns:
            contributions ``(batch, n)`` (an encoder–decoder: ``(source, target)``), then the
            bias and the delta where asked. Padded positions get exactly 0.
        """
        reference = self._reference_of(reference, baselines)
        request = self._request(inputs, additional_forward_args, forward_kwargs, reference)
        groups, n_groups = self.engine.groups(feature_mask, players, request)
        head_target = self._resolved(target, target_position, request)
        (answer,) = self.engine.answers(request, [head_target], self._rules(rules),
                                        reference, route, groups, n_groups, players,
                                        with_bias=return_bias or return_convergence_delta)
        per_group = self.engine.per_group(answer, request, groups, n_groups, route)
        return captum_return(self.engine.per_position(per_group, request, groups), answer.bias if return_bias else None,
                       (per_group.sum(1) + answer.bias - answer.real).abs() if return_convergence_delta else None)

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
        r"""Which components, acting on which tokens, wrote the read-out: the exact table of
        direct effects, ``target = Σ_j Σ_c C[j, c] + Σ_c b[c]`` (each writer of the residual
        stream read through the frozen later norms and the head, split over the tokens).

        Args:
            inputs, target, …: as in :meth:`attribute`; ``target=None`` explains the prediction.
            route (str, optional): ``"backward"`` (a backward pass per writer), ``"forward"``, or
                        ``None``: the cheaper one (encoder–decoders take the forward route).
            granularity (str): ``"block"``, ``"sublayer"`` or ``"head"``.

        Returns:
            ComponentAttribution: ``contributions`` ``(batch, n, C)`` (rows: the players in
            the layout's order), ``bias``, ``components``, ``value``, ``delta``.
        """
        route = route_of(route)
        reference = self._reference_of(reference, baselines)
        request = self._request(inputs, additional_forward_args, forward_kwargs, reference)
        chosen = self._rules(rules)
        groups, n_groups = self.engine.groups(feature_mask, None, request)
        # a prediction is read from a capture the table then reuses; a given target needs none
        captured = self.engine.capture(request) if self._predicts(target) else None
        head_target = self._resolved(target, target_position, request,
                                     outputs=None if captured is None else captured.output)
        table = self.engine.components(request, head_target, chosen, reference, granularity, route, groups,
                                       n_groups, captured)
        return ComponentAttribution(table.contributions, table.bias, table.names, table.real, table.delta,
                                    granularity)

    @log_usage()
    @serialized
    @keyword_only(2, renamed={"baseline_inputs": "corrupted_inputs"})
    def attribute_graph(self, inputs: Tensor | str, target: Any = None, *, granularity: str = "head", prune: bool = True,
                        node_threshold: float = NODE_THRESHOLD, edge_threshold: float = EDGE_THRESHOLD,
                        max_nodes: int | None = None, corrupted_inputs: Tensor | str | None = None,
                        additional_forward_args: Any = None, forward_kwargs: dict[str, Any] | None = None,
                        reference: str | int | Tensor | None = None, rules: Mapping[str, Callable] | None = None,
                        exact_above: float | None = None, exclude_positions: Sequence[int] = (),
                        estimators: str | Sequence[str] | None = None) -> AttributionGraph:
        r"""The exact attribution graph of one output of one input: the tokens, the writers of
        the stream at each position, the bias and the output, flow conserved at every node.

        Args:
            inputs (Tensor or str): ``(1, n)`` token ids, or the text (read by the tokenizer).
            target (int, str, ReadOut, optional): as in :meth:`attribute` (``None``: the
                        prediction).
            granularity (str): ``"sublayer"``, ``"head"`` (default) or ``"neuron"``.
            prune (bool): prune as circuit-tracer does (:meth:`~captum_ffb.attr.AttributionGraph.prune`).
            node_threshold, edge_threshold (float): the pruning's shares of influence kept.
            max_nodes (int, optional): compute edges for this many writer nodes only (largest
                        ``|value|``); what the others send is reported as left out (default:
                        :data:`~captum_ffb.attr.graph.DEFAULT_MAX_NODES` when pruning, every
                        node when not).
            corrupted_inputs (Tensor or str, optional): a corrupted input of the same length: every
                        node then carries patching estimates (:mod:`captum_ffb.engine.patching`;
                        ``baseline_inputs``, its name before 0.4, is read with a warning).
            exact_above (float, optional): the κ above which ``"atp+exact"`` patches a node
                        for real (default :data:`~captum_ffb.engine.patching.EXACT_ABOVE`;
                        ``math.inf``: never).
            exclude_positions (list[int]): positions whose writer nodes are set aside from
                        pruning and ranking (an attention sink's, e.g. ``[0]``; none by
                        default): ``max_nodes`` chooses them last, pruning runs without them,
                        :meth:`~captum_ffb.attr.AttributionGraph.ranking` skips them; their
                        values and edges stay in ``graph.data``.
            estimators (str or Sequence[str], optional): patching estimators to compute beyond
                        :data:`~captum_ffb.engine.patching.COMPUTED` and the default (a name or
                        names of :data:`~captum_ffb.engine.patching.ESTIMATORS` or
                        :data:`~captum_ffb.engine.patching.ALIASES`: ``"atp*"`` and ``"eap-ig"``
                        cost more passes); like ``exact_above``, only with ``corrupted_inputs``.
            additional_forward_args, forward_kwargs, reference, rules: as in :meth:`attribute`.

        Returns:
            AttributionGraph: pruned unless ``prune=False``; flow is conserved either way
            (pruning only hides nodes and edges, ``kept_share`` says how much of the output the
            kept graph holds). The default prunes among the ``max_nodes`` (256) writers of
            largest ``|value|`` only, so it keeps fewer nodes than
            ``attribute_graph(prune=False).prune()``, which prunes among all of them with the
            same thresholds (docs/graphs.md, "Which graph is the circuit").
        """
        exact_above, estimators = _graph_options(granularity, prune, node_threshold, edge_threshold, max_nodes,
                                                 corrupted_inputs is not None, exact_above, estimators)
        chosen = self._rules(rules)
        if getattr(chosen.get("attention"), "credits_scores", False):
            raise ValueError("rules: an attribution graph freezes the attention probabilities (the paper's "
                             "rules); its query–key pairs come from score_split")
        inputs = self._text_input(inputs)
        request = self.request(inputs, target, additional_forward_args=additional_forward_args,
                               forward_kwargs=forward_kwargs, reference=reference)
        if request.batch_size != 1:
            raise ValueError("inputs: an attribution graph explains one input at a time (a batch of 1)")
        width = int(request.read_mask.shape[1])
        if self.engine.source is not None:  # the layout [source | target]
            width += int(request.args[0].shape[1])
        excluded = check_positions(exclude_positions, width)
        corrupted = None
        if corrupted_inputs is not None:
            self.engine.refuse_two_stacks("patching estimates")
            corrupted_inputs = self._text_input(corrupted_inputs, "corrupted_inputs")
            corrupted = self.request(corrupted_like(corrupted_inputs, request), request.target,
                                     additional_forward_args=additional_forward_args, forward_kwargs=forward_kwargs,
                                     reference=request.reference, name="corrupted_inputs")
        limit = max_nodes if max_nodes is not None else (DEFAULT_MAX_NODES if prune else None)
        built = self.engine.graph(request, chosen, granularity, limit, corrupted, exact_above, excluded,
                                  estimators)
        graph = self._graph_of(built, request, granularity, excluded)
        return graph.prune(node_threshold, edge_threshold) if prune else graph

    def _graph_of(self, built: Any, request: Any, granularity: str, excluded: tuple[int, ...]) -> AttributionGraph:
        """The unpruned :class:`AttributionGraph` of the engine's ``built`` graph (its labels
        read by the tokenizer, its patching estimates where there are)."""
        tokens, ids = token_labels(self.tokenizer, request, built.n_source)
        graph = AttributionGraph.of(built.data, tokens, output_label(self.tokenizer, self.task, request.target),
                                    granularity, probability=built.probability, token_ids=ids,
                                    n_source=built.n_source, scorer=built.splitter,
                                    target=graph_target(self.tokenizer, self.engine, request.target, built.n_source or 0),
                                    excluded_positions=excluded)
        if built.estimates is not None:
            graph.patch_estimates = built.estimates.estimates
            graph.patch_kappa = built.estimates.kappa
            graph.patch_components = built.estimates.components
            graph.patch_seconds, graph.patch_passes = built.estimates.seconds, built.estimates.passes
            graph.edge_patcher = built.estimates.edges
        return graph

    @log_usage()
    @serialized
    @keyword_only(2, ("inputs", "target", "forward_kwargs", "route", "maps", "check", "rules", "reference"),
                  renamed={"input_ids": "inputs", "readouts": "target"})
    def explain(self, inputs: Tensor, target: Sequence[ReadOut | int | str | Tensor], *,
                forward_kwargs: dict[str, Any] | None = None, route: str = "backward", maps: bool = False,
                check: bool = False, rules: Mapping[str, Callable] | None = None,
                reference: str | int | Tensor | None = None) -> ExplainedOutput:
        r"""Several read-outs of one batch explained in at most two passes of the model (one
        recording the forward route: the outputs that resolve a predicted unit, the bias
        player, the maps and the check; then the backward pass).

        Args:
            inputs (Tensor): ``(batch, n)`` token ids (an encoder–decoder's source).
            target (list): read-outs (an index or a text as in :meth:`attribute`);
                        ``NextToken()`` or ``ClassLogit()`` explain the predicted unit.
            maps (bool): also the whole-model maps (of every position from zero).
            check (bool): on the backward route, also the forward route's contributions.
            forward_kwargs, route, rules, reference: as in :meth:`attribute`.

        Returns:
            ExplainedOutput: one row per read-out and batch row (read-outs first).
        """
        if isinstance(target, (ReadOut, int, str, Tensor)) and not (isinstance(target, Tensor) and target.dim()):
            target = [target]
        if not target:
            raise ValueError("target: give at least one read-out")
        reference = self.reference if reference is None else reference
        request = self._request(inputs, None, forward_kwargs, reference)
        resolved: list[ReadOut] = []

        def targets_of(outputs: Any) -> list[HeadTarget]:  # a predicted unit made concrete
            resolved.extend(self._text_free(as_readout(self._text_free(r), self.task)).resolve(
                outputs, request.read_mask.long()) for r in target)
            return [self._target(r, None, request.read_mask) for r in resolved]

        answers, checked, found, outputs = self.engine.explain(request, targets_of, self._rules(rules), reference,
                                                               route, maps, check)
        result = ExplainedOutput.from_answers(answers, request.read_mask)
        result.readouts, result.outputs, result.maps = resolved, outputs, found
        if checked is not None:
            forward = ExplainedOutput.from_answers(checked, request.read_mask)
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
        continuation of its prompt, or an encoder–decoder's target for its source (the
        decoder's input, ``forward_kwargs["decoder_input_ids"]``, made from the target when
        left out).

        Args:
            inputs (Tensor): ``(1, n)`` the prompt or the source (or Whisper's features).
            target (str, list[int] or Tensor): the target's tokens ``(T,)``, or its text.
            forward_kwargs, route, rules, reference: as in :meth:`attribute`.

        Returns:
            ExplainedOutput: row ``t`` explains the logit of ``target[t]`` where it is read
            (``source_share`` for an encoder–decoder).
        """
        source = one_input(inputs)
        tokens = self._target_tokens(target, source.device)
        ids, kwargs, positions = self.engine.forced(source, tokens, check_forward_kwargs(forward_kwargs))
        readouts = [NextToken(int(t), p) for t, p in zip(tokens, positions)]
        result = self.explain(ids, readouts, forward_kwargs=kwargs, route=route, rules=rules, reference=reference)
        result.tokens = tokens
        result.target_ids = kwargs.get("decoder_input_ids", ids)[0]
        if result.n_source:
            result.source_ids = source[0] if not source.is_floating_point() else torch.empty(0, dtype=torch.long)
        return result

    @log_usage()
    @serialized
    @keyword_only(1, ("inputs", "max_new_tokens", "forward_kwargs", "route", "rules", "reference"))
    def explain_generation(self, inputs: Tensor, *, max_new_tokens: int = DEFAULT_NEW_TOKENS,
                           forward_kwargs: dict[str, Any] | None = None, route: str = "backward",
                           rules: Mapping[str, Callable] | None = None,
                           reference: str | int | Tensor | None = None) -> ExplainedOutput:
        r"""Generate greedily from one input (a prompt, a source), at most ``max_new_tokens``
        within the model's positions, then explain every generated token
        (:meth:`explain_target`: the generation's logits are the forced decoding's)."""
        source = one_input(inputs)
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
        r"""The logit of ``target[t]`` at ``target_position[t]`` of one sequence for every ``t``,
        from one forward pass (teacher forcing): contributions ``(T, n)``, then the bias and
        the delta where asked."""
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
        answers = self.engine.answers(request, targets, self._rules(rules),
                                      reference, route, with_bias=return_bias or return_convergence_delta)
        result = ExplainedOutput.from_answers(answers, request.read_mask)
        return captum_return(result.contributions, result.bias if return_bias else None,
                       result.delta if return_convergence_delta else None)

    @log_usage()
    @serialized
    @keyword_only(1, ("inputs", "additional_forward_args", "forward_kwargs", "rules", "return_convergence_delta"))
    def maps(self, inputs: Tensor | tuple[Tensor, ...], *, additional_forward_args: Any = None,
             forward_kwargs: dict[str, Any] | None = None, rules: Mapping[str, Callable] | None = None,
             return_convergence_delta: bool = False) -> Any:
        r"""Whole-model token-to-token maps ``(batch, n_blocks, n, n)``: ``‖F_i(x_j)‖`` after
        every block over the input tokens (what attention rollout approximates); with
        ``return_convergence_delta`` also each block's largest completeness residual."""
        self.engine.refuse_two_stacks("maps")
        request = self._request(inputs, additional_forward_args, forward_kwargs)
        return self.engine.maps(request, self._rules(rules), return_convergence_delta)


def _graph_options(granularity: str, prune: Any, node_threshold: Any, edge_threshold: Any, max_nodes: Any,
                   corrupted: bool, exact_above: Any, estimators: Any) -> tuple[float, tuple[str, ...]]:
    """:meth:`NormDecomposition.attribute_graph`'s options checked (one-line errors naming each):
    returns ``exact_above`` (its default filled in) and the estimators to compute."""
    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1):
        raise ValueError(f"max_nodes must be a positive number of nodes, got {max_nodes!r}")
    for name, share in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if isinstance(share, bool) or not isinstance(share, (int, float)):
            raise TypeError(f"{name} must be a number between 0 and 1, got {type(share).__name__}")
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must lie between 0 and 1, got {share}")
    if not isinstance(prune, bool):
        raise TypeError(f"prune must be True or False, got {prune!r}")
    check_granularity(granularity, "graph")
    if not corrupted:
        given = [name for name, value in (("estimators", estimators), ("exact_above", exact_above))
                 if value is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} up patching "
                             "estimates, which need corrupted_inputs (a corrupted input of the same length)")
    exact_above = EXACT_ABOVE if exact_above is None else exact_above
    if isinstance(exact_above, bool) or not isinstance(exact_above, (int, float)) or not exact_above > 0:
        raise ValueError(f"exact_above must be a positive number (math.inf: never patch for real), got "
                         f"{exact_above!r}")
    return exact_above, check_estimators(estimators)
