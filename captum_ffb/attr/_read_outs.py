"""The read-out methods of :class:`~captum_ffb.attr.NormDecomposition`: several read-outs of
one batch (:meth:`ReadOutMethods.explain`), every token of a forced or generated target, and
the logits of teacher-forced steps, each from one forward pass. A mixin of the door: the
instance's engine, rules and reference come from :class:`~captum_ffb.attr._door.Door`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from captum.log import log_usage
from torch import Tensor

from captum_ffb._deprecation import keyword_only
from captum_ffb.attr._door import captum_return, one_input
from captum_ffb.engine.generation import DEFAULT_NEW_TOKENS, generate_greedily
from captum_ffb.engine.head import HeadTarget
from captum_ffb.engine.locking import serialized
from captum_ffb.engine.requests import check_call, check_forward_kwargs, check_index
from captum_ffb.explained.readouts import (
    AnswerLogProbability,
    NextToken,
    ReadOut,
    as_readout,
)
from captum_ffb.explained.results import ExplainedOutput


class ReadOutMethods:
    """Explaining read-outs, forced targets, generations and teacher-forced steps."""

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
            target (list): read-outs (an index or a text as in :meth:`~captum_ffb.attr.NormDecomposition.attribute`);
                        ``NextToken()`` or ``ClassLogit()`` explain the predicted unit.
            maps (bool): also the whole-model maps (of every position from zero).
            check (bool): on the backward route, also the forward route's contributions.
            forward_kwargs, route, rules, reference: as in :meth:`~captum_ffb.attr.NormDecomposition.attribute`.

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
            forward_kwargs, route, rules, reference: as in :meth:`~captum_ffb.attr.NormDecomposition.attribute`.

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

    def _answer_of(self, target: Any) -> AnswerLogProbability | None:
        """``target`` as an answer's log-probability: an :class:`AnswerLogProbability`, or a
        causal LM's target text of several tokens; ``None`` for every other target."""
        if isinstance(target, AnswerLogProbability):
            return target if target.positions is None else None  # with positions: fed already
        if isinstance(target, str) and self.task == "causal_lm" and self.tokenizer is not None:
            ids = self.engine.token_ids(self.tokenizer, target)
            return AnswerLogProbability(target) if len(ids) > 1 else None
        return None

    def _forced_answer(self, inputs: Tensor, answer: AnswerLogProbability, forward_kwargs: dict[str, Any] | None
                       ) -> tuple[Tensor, dict[str, Any], AnswerLogProbability]:
        """The prompt with the answer fed after it (but its last token), the keyword arguments,
        and the answer with the positions that predict its tokens."""
        if self.task != "causal_lm":
            raise ValueError(f"an answer's log-probability is read from a causal LM; {type(self.model).__name__} "
                             f"is a {self.task} model (an encoder–decoder: explain_target)")
        source = one_input(inputs)
        tokens = self._target_tokens(answer.tokens, source.device)
        ids, kwargs, positions = self.engine.forced(source, tokens, check_forward_kwargs(forward_kwargs))
        return ids, kwargs, AnswerLogProbability(tuple(int(t) for t in tokens), tuple(positions))

    def _attribute_answer(self, inputs: Tensor, answer: AnswerLogProbability,
                          forward_kwargs: dict[str, Any] | None, route: str, rules: Mapping[str, Callable] | None,
                          reference: Any, return_bias: bool, return_convergence_delta: bool) -> Any:
        """:meth:`attribute` of an answer's teacher-forced log-probability (one pass fixing the
        normalisers' weights, then one backward pass for the whole answer): contributions over
        the prompt and the answer's tokens but its last ``(1, n + T − 1)``, the bias and the
        delta where asked."""
        ids, kwargs, forced = self._forced_answer(inputs, answer, forward_kwargs)
        return self.attribute(ids, target=forced, forward_kwargs=kwargs, route=route, rules=rules,
                              reference=reference, return_bias=return_bias,
                              return_convergence_delta=return_convergence_delta)

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
