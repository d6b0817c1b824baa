"""``NormDecomposition``: exact contributions of the input tokens to a model's output, as a
Captum model-level attribution (as ``IntegratedGradients`` is to ``LayerIntegratedGradients``).

A thin adapter: it checks each request once at the door (:mod:`captum_ffb.engine.requests`),
turns what is explained into a read-out, and asks the one whole-model engine
(:class:`~captum_ffb.engine.whole.WholeModel`) for the numbers; every model shape is the
engine's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from captum.attr import Attribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_ffb._deprecation import keyword_only, moved_names
from captum_ffb.attr._door import Door, captum_return, check_reference, route_of
from captum_ffb.attr._read_outs import ReadOutMethods
from captum_ffb.components import pipeline as components
from captum_ffb.components.table import ComponentAttribution
from captum_ffb.engine import find_model
from captum_ffb.engine.bound import Request
from captum_ffb.engine.locking import serialized
from captum_ffb.engine.model import wrapper_tokenizer
from captum_ffb.engine.whole import Answer, WholeModel
from captum_ffb.explained.models import LoadedModel
from captum_ffb.explained.readouts import TopLogits
from captum_ffb.explained.results import ExplainedOutput
from captum_ffb.graph.lens import decoded_lens
from captum_ffb.graph.pipeline import GraphOptions, build, check_graph_options
from captum_ffb.graph.record import (
    DEFAULT_MAX_NODES,
    EDGE_THRESHOLD,
    NODE_THRESHOLD,
    AttributionGraph,
    BoundGraph,
    check_positions,
    graph_target,
    output_label,
    token_labels,
)
from captum_ffb.patching.patches import corrupted_like

#: What the players are measured from by default (see ``NormDecomposition.attribute()``):
#: each token from the mean of the input's tokens, that mean's own output shared back to them.
DEFAULT_REFERENCE = "centered"
#: ``ExplainedReadOuts`` is :class:`~captum_ffb.explained.results.ExplainedOutput` (its name before 0.4).
ExplainedReadOuts = ExplainedOutput

_ENGINE_FACTS = ("task", "model_type", "spec", "chain", "blocks", "head", "config", "memory_budget", "dtype",
                 "show_progress")
_ATTRIBUTE = ("inputs", "target", "additional_forward_args", "forward_kwargs", "feature_mask", "target_position",
              "return_convergence_delta", "route", "rules", "return_bias", "players", "reference")
_COMPONENTS = ("inputs", "target", "additional_forward_args", "forward_kwargs", "feature_mask", "target_position",
               "granularity", "rules", "reference", "route")


class NormDecomposition(Door, ReadOutMethods, Attribution):
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
                    :func:`~captum_ffb.explained.models.load_model` returns, a TransformerLens
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
                        each row's last real position or ``target_position``; a causal LM's
                        text of several tokens (or an :class:`AnswerLogProbability`): the
                        answer's teacher-forced log-probability, with contributions over the
                        prompt and the answer's tokens but its last ``(1, n + T − 1)``; one per row as a
                        ``(batch,)`` tensor; a :class:`Contrast` (``logit(a) − logit(b)``); a
                        :class:`Direction` (base models); any read-out of
                        :mod:`captum_ffb.explained.readouts`; ``None``: the model's prediction (the
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
            return_bias (bool): also return the bias player ``(batch,)``: on the backward
                        route from a pass of its own (the forward route with no other player),
                        or exactly 0 with no such pass where the model has no nonzero bias
                        term, the rules are the defaults and the reference is zero or centred.
            return_convergence_delta (bool): also return ``|Σ_j c_j + c_bias − real|``, last.
            players (list[int], optional): forward route: propagate only these players (the
                        others get 0; every part carries the whole bias player).

        Returns:
            contributions ``(batch, n)`` (an encoder–decoder: ``(source, target)``), then the
            bias and the delta where asked. Padded positions get exactly 0.
        """
        reference = self._reference_of(reference, baselines)
        answer = self._answer_of(target)
        if answer is not None:
            extra = {"additional_forward_args": additional_forward_args, "feature_mask": feature_mask,
                     "target_position": target_position, "players": players}
            given = [name for name, value in extra.items() if value is not None]
            if given:
                raise ValueError(f"an answer's log-probability (a target of several tokens) takes no {given[0]}")
            return self._attribute_answer(inputs, answer, forward_kwargs, route, rules, reference, return_bias,
                                          return_convergence_delta)
        request = self._request(inputs, additional_forward_args, forward_kwargs, reference)
        groups, n_groups = self.engine.groups(feature_mask, players, request)
        with_bias = return_bias or return_convergence_delta
        chosen = self._rules(rules)
        answer = self._answer(request, target, target_position, chosen, reference, route, groups, n_groups, players,
                              with_bias)
        per_group = self.engine.per_group(answer, request, groups, n_groups, route)
        return captum_return(self.engine.per_position(per_group, request, groups), answer.bias if return_bias else None,
                       (per_group.sum(1) + answer.bias - answer.real).abs() if return_convergence_delta else None)

    def _answer(self, request: Request, target: Any, target_position: Any, rules: dict[str, Callable],
                reference: Any, route: str, groups: Tensor | None = None, n_groups: int | None = None,
                players: Sequence[int] | None = None, with_bias: bool = False) -> Answer:
        """``attribute``'s passes: a causal LM's prediction on the backward route is read from
        the frozen pass itself (no pass of its own) where nothing else needs a capture; else
        the capture or prediction pass :meth:`_passes` decides. The answer's ``units`` name
        the predicted unit where ``target`` asked for the prediction."""
        no_bias = with_bias and self.engine.holds_no_bias(rules, reference)  # decided once, passed down
        needs_bias_pass = with_bias and not no_bias
        if target is None and route == "backward" and self.engine.task == "causal_lm" and players is None \
                and not needs_bias_pass:
            stand_in = self._target(0, target_position, request.read_mask)  # the positions read
            (answer,) = self.engine.answers(request, [stand_in], rules, reference, route, groups, n_groups,
                                            with_bias=with_bias, no_bias=no_bias,
                                            predict=lambda units: self._target(units, target_position,
                                                                               request.read_mask))
            return answer
        head_target, captured = self._passes(target, target_position, request,
                                             captures=route == "forward" or (needs_bias_pass and self._predicts(target)))
        (answer,) = self.engine.answers(request, [head_target], rules, reference, route, groups, n_groups, players,
                                        with_bias=with_bias, captured=captured, no_bias=no_bias)
        if self._predicts(target) and head_target.indices is not None:
            answer = replace(answer, units=head_target.indices[:, 0])
        return answer

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
        head_target, captured = self._passes(target, target_position, request, captures=self._predicts(target))
        table = components.build(self.engine, request, head_target, chosen, reference, granularity, route, groups,
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
                        estimators: str | Sequence[str] | None = None,
                        verify_top: int | None = None) -> AttributionGraph:
        r"""The exact attribution graph of one output of one input: the tokens, the writers of
        the stream at each position, the bias and the output, flow conserved at every node.

        Args:
            inputs (Tensor or str): ``(1, n)`` token ids, or the text (read by the tokenizer).
            target (int, str, ReadOut, optional): as in :meth:`attribute` (``None``: the
                        prediction).
            granularity (str): ``"sublayer"``, ``"head"`` (default) or ``"neuron"``.
            prune (bool): prune as circuit-tracer does (:meth:`~captum_ffb.graph.record.AttributionGraph.prune`).
            node_threshold, edge_threshold (float): the pruning's shares of influence kept.
            max_nodes (int, optional): compute edges for this many writer nodes only (largest
                        ``|value|``); what the others send is reported as left out (default:
                        :data:`~captum_ffb.graph.record.DEFAULT_MAX_NODES` when pruning, every
                        node when not).
            corrupted_inputs (Tensor or str, optional): a corrupted input of the same length: every
                        node then carries patching estimates (:mod:`captum_ffb.patching.patches`;
                        ``baseline_inputs``, its name before 0.4, is read with a warning).
            exact_above (float, optional): the κ above which ``"atp+exact"`` patches a node
                        for real (default :data:`~captum_ffb.patching.patches.EXACT_ABOVE`;
                        ``math.inf``: never).
            exclude_positions (list[int]): positions whose writer nodes are set aside from
                        pruning and ranking (an attention sink's, e.g. ``[0]``; none by
                        default): ``max_nodes`` chooses them last, pruning runs without them,
                        :meth:`~captum_ffb.graph.record.AttributionGraph.ranking` skips them; their
                        values and edges stay in ``graph.data``.
            estimators (str or Sequence[str], optional): patching estimators to compute beyond
                        :data:`~captum_ffb.patching.patches.COMPUTED` and the default (a name or
                        names of :data:`~captum_ffb.patching.patches.ESTIMATORS` or
                        :data:`~captum_ffb.patching.patches.ALIASES`: ``"atp*"`` and ``"eap-ig"``
                        cost more passes); like ``exact_above``, only with ``corrupted_inputs``.
            verify_top (int, optional): the components of each kind ``"atp+verify"`` patches for
                        real by its estimates, one more by κ (default :data:`~captum_ffb.patching.patches.VERIFY_TOP`;
                        0: none); only with ``corrupted_inputs``.
            additional_forward_args, forward_kwargs, reference, rules: as in :meth:`attribute`.

        Returns:
            AttributionGraph: pruned unless ``prune=False``; flow is conserved either way
            (pruning only hides nodes and edges, ``kept_share`` says how much of the output the
            kept graph holds). The default prunes among the ``max_nodes`` (256) writers of
            largest ``|value|`` only, so it keeps fewer nodes than
            ``attribute_graph(prune=False).prune()``, which prunes among all of them with the
            same thresholds (docs/graphs.md, "Which graph is the circuit").
        """
        exact_above, estimators, verify_top = check_graph_options(
            granularity, prune, node_threshold, edge_threshold, max_nodes, corrupted_inputs is not None, exact_above,
            estimators, verify_top)
        chosen = self._rules(rules)
        if getattr(chosen.get("attention"), "credits_scores", False):
            raise ValueError("rules: an attribution graph freezes the attention probabilities (the paper's "
                             "rules); its query–key pairs come from score_split")
        inputs = self._text_input(inputs)
        answer = self._answer_of(target)
        if answer is not None:  # the prompt and the answer but its last token, each token read where predicted
            inputs, forward_kwargs, target = self._forced_answer(inputs, answer, forward_kwargs)
            if corrupted_inputs is not None:
                corrupted_inputs = self._forced_answer(self._text_input(corrupted_inputs, "corrupted_inputs"),
                                                       answer, None)[0]
        request = self.request(inputs, target, additional_forward_args=additional_forward_args,
                               forward_kwargs=forward_kwargs, reference=reference)
        if request.batch_size != 1:
            raise ValueError("inputs: an attribution graph explains one input at a time (a batch of 1)")
        width = int(request.read_mask.shape[1])
        if self.engine.source is not None:  # the layout [source | target]
            width += int(request.args[0].shape[1])
        excluded = check_positions(exclude_positions, width)
        corrupted = None if corrupted_inputs is None else \
            self._corrupted_request(corrupted_inputs, request, additional_forward_args, forward_kwargs)
        limit = max_nodes if max_nodes is not None else (DEFAULT_MAX_NODES if prune else None)
        built = build(self.engine, request, GraphOptions(chosen, granularity, limit, corrupted, exact_above, excluded,
                                                         estimators, self._several(target), verify_top))
        graph = self._graph_of(built, request, granularity, excluded)
        return graph.prune(node_threshold, edge_threshold) if prune else graph

    def _corrupted_request(self, corrupted_inputs: Tensor | str, request: Request, additional_forward_args: Any,
                           forward_kwargs: dict[str, Any] | None) -> Request:
        """The request of a graph's corrupted run: ``request``'s target, reference and arguments."""
        self.engine.refuse_two_stacks("patching estimates")
        corrupted_inputs = self._text_input(corrupted_inputs, "corrupted_inputs")
        return self.request(corrupted_like(corrupted_inputs, request), request.target,
                            additional_forward_args=additional_forward_args, forward_kwargs=forward_kwargs,
                            reference=request.reference, name="corrupted_inputs")

    def _several(self, target: Any) -> bool:
        """Whether ``target`` asks for several outputs (:class:`~captum_ffb.explained.readouts.TopLogits`),
        which a one-stack causal LM without soft-capped logits can give."""
        several = isinstance(target, TopLogits)
        if several and (self.engine.source is not None or self.engine.head.softcap is not None):
            raise ValueError("TopLogits: several outputs are for a one-stack causal LM without soft-capped logits")
        return several

    def _graph_of(self, built: Any, request: Any, granularity: str, excluded: tuple[int, ...]) -> BoundGraph:
        """The unpruned graph of the engine's ``built`` graph, bound to the model (its labels
        read by the tokenizer, its patching estimates where there are)."""
        tokens, ids = token_labels(self.tokenizer, request, built.n_source)
        estimates = built.estimates
        patching = {} if estimates is None else {
            "patch_estimates": estimates.estimates, "patch_kappa": estimates.kappa,
            "patch_components": estimates.components, "patch_seconds": estimates.seconds,
            "patch_passes": estimates.passes, "edge_patcher": estimates.edges}
        return BoundGraph.of(built.data, tokens, output_label(self.tokenizer, self.task, request.target), granularity,
                             probability=built.probability, token_ids=ids, n_source=built.n_source,
                             scorer=built.splitter, excluded_positions=excluded,
                             target=graph_target(self.tokenizer, self.engine, request.target, built.n_source or 0),
                             lens=decoded_lens(built.lens, self.tokenizer), **patching)

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


#: Names this module handed out before 0.4 (imported here then), still importable for one release.
__getattr__ = moved_names(__name__, {"DEFAULT_NEW_TOKENS": "captum_ffb.engine.generation",
                                     "EXACT_ABOVE": "captum_ffb.patching.patches"})
