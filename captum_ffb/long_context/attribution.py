r"""Context attribution: which parts of a long context (documents, paragraphs, sentences,
lines, chat turns) drove a model's answer to a question.

The players are groups of tokens. The frozen model is linear in its input embeddings, so a
group's contribution is exactly the sum of its tokens' (``c_G = Σ_{j ∈ G} c_j``, what Captum's
``feature_mask`` would give a linear model) and the groups, the question, the remaining
tokens of the prompt and the bias player add up to the explained logit. One backward pass,
whatever the number of groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from captum_ffb.attr.norm_decomposition import NormDecomposition
from captum_ffb.core.pieces import token_text
from captum_ffb.explained.readouts import AnswerLogProbability
from captum_ffb.long_context.surrogate import (
    ablated_context,
    ablated_spans,
    ablation_masks,
    fit_surrogate,
    focus_groups,
)
from captum_ffb.texts.text import check_text

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["DEFAULT_ABLATIONS", "DEFAULT_FOCUS", "DEFAULT_PRIOR", "DEFAULT_ROUNDS", "DEFAULT_TEMPLATE", "GROUPINGS", "METHODS", "ContextAttribution", "context_attribution", "split_context"]

#: How a context is cut into groups.
GROUPINGS = ("paragraph", "sentence", "line")
#: How a group's part is measured (``context_attribution``'s ``method``).
METHODS = ("decomposition", "presence", "fitted")
#: ``"fitted"``'s ablated prompts by default, besides its nested prompts (chosen with them on
#: questions held out from the evaluation, at about half the cost of 16 and greedy rounds,
#: ``results/context/selection/``).
DEFAULT_ABLATIONS = 4
#: The method whose scores ``"fitted"`` shrinks toward by default (chosen with the ablations).
DEFAULT_PRIOR = "presence"
#: ``"fitted"``'s candidate groups, the only ones its ablations remove: the union of the
#: prior's top half and the decomposition's (the greedy picks first, with ``rerank``), filled
#: up by the prior's order (chosen on questions held out from the evaluation, over ablations of
#: every group, ``results/context/selection/``).
DEFAULT_FOCUS = 10
#: ``"fitted"``'s nested prompts by default: the decomposition's top 1, 2, … 4 groups removed,
#: added to the ablations (chosen on questions held out from the evaluation,
#: ``results/context/selection/``; ``rerank=True``: greedy rounds instead).
DEFAULT_ROUNDS = 4
#: How the prompt is made of the context and the question.
DEFAULT_TEMPLATE = "{context}\n\n{question}"
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+")


def split_context(context: str, group_by: str = "paragraph") -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the groups of ``context``: paragraphs (separated by
    blank lines), sentences (ended by ``.``, ``!`` or ``?`` and white space, or a paragraph's
    end) or lines; spans of white space only are dropped."""
    if not isinstance(group_by, str) or group_by not in GROUPINGS:
        raise ValueError(f"group_by must be one of {', '.join(GROUPINGS)}, got {group_by!r}")
    # Windows' and old Macs' line ends read as one: offsets stay those of ``context``
    lines = context.replace("\r\n", " \n").replace("\r", "\n")
    if group_by == "line":
        cuts = [m.end() for m in re.finditer(r"\n", lines)]
    elif group_by == "paragraph":
        cuts = [m.end() for m in re.finditer(r"\n[ \t]*\n\s*", lines)]
    else:
        cuts = sorted({m.end() for m in re.finditer(r"\n[ \t]*\n\s*", lines)}
                      | {m.end() for m in _SENTENCE_END.finditer(lines)})
    spans = []
    for start, end in zip([0, *cuts], [*cuts, len(context)]):
        text = context[start:end]
        if text.strip():
            left = start + len(text) - len(text.lstrip())
            spans.append((left, start + len(text.rstrip())))
    return spans


@dataclass
class ContextAttribution:
    """A long prompt's answer split over the groups of its context.

    Attributes:
        groups (list[str]): the groups' texts, in order.
        contributions (Tensor): ``(G,)`` each group's contribution (its tokens' sum).
        question (float): the question's tokens' contribution.
        rest (float): the prompt's other tokens' (a start token, the template's words).
        bias (float): the bias player (the model's own bias terms; for an answer's
                    log-probability also ``−T log V``, its value at the uniform logits).
        value (float): the explained logit (or contrast, or an answer's log-probability).
        delta (float): the completeness residual
                    ``|Σ groups + question + rest + answer + bias − value|``.
        target (str): what was explained, in words.
        token_groups (list[int]): each token's group (``-1``: the question, ``-2``: the rest,
                    ``-3``: the answer's own tokens, fed back when its log-probability is explained).
        tokens (list[str]): the prompt's tokens (then the answer's but its last).
        token_contributions (Tensor): ``(n,)`` every token's contribution.
        context (str): the context; ``spans`` each group's ``(start, end)`` in it.
        answer (float): the answer's own tokens' contribution (0 for a one-token target).
        method (str): how the contributions were measured (``context_attribution``'s
                    ``method``); for ``"presence"`` the question, the rest and the answer are
                    0, ``bias`` is the value without the context and ``token_contributions``
                    is ``None``; for ``"fitted"`` likewise, ``bias`` the fit's value with every
                    group removed and ``delta`` the fit's miss at the whole prompt.
    """

    groups: list[str]
    contributions: Tensor
    question: float
    rest: float
    bias: float
    value: float
    delta: float
    target: str
    token_groups: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    token_contributions: Tensor | None = None
    context: str = ""
    spans: list[tuple[int, int]] = field(default_factory=list)
    answer: float = 0.0
    method: str = "decomposition"

    def top(self, k: int = 5) -> list[tuple[int, str, float]]:
        """The ``k`` groups of largest ``|contribution|``: ``(index, text, contribution)``."""
        order = self.contributions.abs().argsort(descending=True)[:k].tolist()
        return [(g, self.groups[g], float(self.contributions[g])) for g in order]

    def terms(self) -> list[tuple[str, float]]:
        """The value's terms besides the groups, named: the question, the rest, the answer's
        own tokens (where explained) and the bias; for ``"presence"`` the value without the
        context, for ``"fitted"`` the fit's value with every group removed."""
        if self.method == "presence":
            return [("without the context", self.bias)]
        if self.method == "fitted":
            return [("every group removed, by the fit", self.bias)]
        answer = [("the answer's own tokens", self.answer)] if self.answer else []
        return [("question", self.question), ("rest of the prompt", self.rest), *answer, ("bias", self.bias)]

    def equation(self, digits: int = 4) -> str:
        """The completeness equation in words: ``value V = Σ G groups S + question … (delta D)``."""
        parts = " + ".join(f"{name} {value:.{digits}f}" for name, value in self.terms())
        return (f"value {self.value:.{digits}f} = Σ {len(self.groups)} groups {float(self.contributions.sum()):.{digits}f}"
                f" + {parts} (delta {self.delta:.1e})")

    def shares(self) -> Tensor:
        """``(G,)`` each group's contribution over the explained value."""
        import torch

        return self.contributions / self.value if self.value else torch.full_like(self.contributions, float("nan"))

    def to_dict(self) -> dict[str, Any]:
        """Plain Python: the groups (text, tokens, contribution, share), the question, the rest,
        the bias, the value, the delta and the target."""
        counts = [self.token_groups.count(g) for g in range(len(self.groups))]
        return {"target": self.target, "method": self.method, "value": self.value, "bias": self.bias, "question": self.question,
                "rest": self.rest, "answer": self.answer, "delta": self.delta,
                "groups": [{"index": g, "text": text, "tokens": counts[g], "contribution": float(c),
                            "share": float(s)}
                           for g, (text, c, s) in enumerate(zip(self.groups, self.contributions, self.shares()))]}


def context_attribution(nd: NormDecomposition | Any, tokenizer: Any, context: str, question: str,
                        group_by: str = "paragraph",
                        target: Any = None, template: str = DEFAULT_TEMPLATE,
                        max_tokens: int | None = None, method: str = "decomposition",
                        steps: int = 2, ablations: int = DEFAULT_ABLATIONS, prior: str = DEFAULT_PRIOR,
                        focus: int | None = DEFAULT_FOCUS, seed: int = 0, rounds: int = DEFAULT_ROUNDS,
                        rerank: bool = False, show_progress: bool = False) -> ContextAttribution:
    r"""Explain a causal LM's next token after ``template`` filled with ``context`` and
    ``question``, the context's tokens grouped.

    Args:
        nd (NormDecomposition): the bound causal LM (a model, or a loaded one, is bound here).
        tokenizer: its tokenizer (a fast one: the groups are found by character offsets).
        context (str): the long input (a document, passages, a chat history).
        question (str): what is asked of it.
        group_by (str): ``"paragraph"`` (blank lines), ``"sentence"`` or ``"line"``.
        target (int, str, ReadOut, optional): as in ``attribute`` (``None``: the predicted token);
                    a text of several tokens (or an ``AnswerLogProbability``) is the answer's
                    teacher-forced log-probability, its own tokens grouped as ``answer``.
        template (str): the prompt, with ``{context}`` and ``{question}`` once each.
        max_tokens (int, optional): refuse prompts longer than this.
        method (str): ``"decomposition"``: each group's exact share of the value in the
                    model's own pass (its tokens' contributions summed; one backward pass);
                    ``"presence"``: what removing each group does to the value, Integrated
                    Gradients of the groups' presence in attention
                    (:mod:`~captum_ffb.long_context.presence`; the question, the rest and
                    the answer are not players, the bias is the value without the context).
                    ``"fitted"``: a linear surrogate fitted on ``ablations`` prompts with
                    random groups removed from the text, shrunk toward the scores of
                    ``prior`` (:mod:`~captum_ffb.long_context.surrogate`; question, rest and
                    answer are not players, the bias is the fit's value with every group
                    removed).
                    The first explains the pass; the others predict ablations (they rank
                    random ablations better, ``docs/long_contexts.md``).
        steps (int): ``"presence"``'s midpoints (``2``, the default: gradients with every
                    group a quarter and three quarters present, chosen on held-out questions,
                    ``results/context/``; ``1``: one gradient at half presence).
        ablations (int): ``"fitted"``'s ablated prompts (one forward pass each; 4 by
                    default, chosen on held-out questions, ``results/context/selection/``).
        prior (str): the method whose scores ``"fitted"`` shrinks toward, ``"presence"``
                    (the default, chosen with ``ablations``) or ``"decomposition"``.
        focus (int, optional): ``"fitted"`` removes only among this many groups, the prior's
                    and the decomposition's top ``focus // 2``, filled up by the prior's order
                    (``None``: among every group, ContextCite's design).
        seed (int): the seed of ``"fitted"``'s ablations.
        rounds (int): ``"fitted"``'s nested prompts, added to the ablations: the
                    decomposition's top 1, 2, … ``rounds`` groups removed (one forward pass
                    each; ``0``: none).
        rerank (bool): ``"fitted"``'s nested prompts by greedy rounds: each without the group
                    the decomposition ranks first on the one before (one backward pass more
                    each).
        show_progress (bool): a progress bar over ``"fitted"``'s ablations.

    Returns:
        ContextAttribution: the groups' contributions, adding up with the question, the rest
        and the bias to the explained value (``"presence"``: with the value without the
        context, up to the reported residual).

    Examples::

        >>> found = context_attribution(nd, tokenizer, open("report.txt").read(),
        ...                             "Who signed the report?", group_by="paragraph")
        >>> found.top(3)
    """
    if not isinstance(nd, NormDecomposition):
        nd = NormDecomposition(nd, tokenizer=tokenizer)
    _check_inputs(tokenizer, context, question, template, max_tokens, method)
    spans = split_context(context, group_by)
    ids, token_groups, tokens = _encoded(nd, tokenizer, _fill_template(template, context, question), spans,
                                         max_tokens)
    if method == "presence":
        return _by_presence(nd, tokenizer, ids, target, token_groups, tokens, spans, context, steps)
    if method == "fitted":
        return _by_fitting(nd, tokenizer, (ids, token_groups, tokens, spans), target, (question, template, context),
                           (ablations, prior, focus, seed, rounds, rerank), show_progress, steps)
    return _by_decomposition(nd, tokenizer, ids, target, token_groups, tokens, spans, context)


def _encoded(nd: NormDecomposition, tokenizer: Any, filled: tuple[str, tuple[int, int], int],
             spans: list[tuple[int, int]], max_tokens: int | None = None) -> tuple[Any, list[int], list[str]]:
    """The prompt's token ids (on the model's device), each token's group and the tokens
    (``filled``: the prompt, the question's span and the context's offset in it);
    ``ValueError`` for a prompt of more than ``max_tokens`` tokens."""
    prompt, q_span, offset = filled
    if max_tokens is not None:  # refused before tokenising a context far too long (a token spans few characters)
        fewest = -(-len(prompt) // _longest_token(tokenizer))
        if fewest > max_tokens:
            raise ValueError(f"the prompt has {len(prompt):,} characters, at least {fewest:,} tokens: more than "
                             f"{max_tokens}")
    encoded = tokenizer(prompt, return_offsets_mapping=True, return_tensors="pt")
    if max_tokens is not None and encoded.input_ids.shape[1] > max_tokens:
        raise ValueError(f"the prompt has {encoded.input_ids.shape[1]} tokens, more than {max_tokens}")
    ids = encoded.input_ids.to(next(nd.model.parameters()).device)
    token_groups = _token_groups(encoded.offset_mapping[0].tolist(), spans, q_span, offset)
    return ids, token_groups, tokenizer.convert_ids_to_tokens(ids[0].tolist())


def _by_decomposition(nd: NormDecomposition, tokenizer: Any, ids: Any, target: Any, token_groups: list[int],
                      tokens: list[str], spans: list[tuple[int, int]], context: str) -> ContextAttribution:
    """:func:`context_attribution` by the decomposition (``method="decomposition"``)."""
    return _decomposed(nd, tokenizer, ids, target, token_groups, tokens, spans, context)[0]


def _decomposed(nd: NormDecomposition, tokenizer: Any, ids: Any, target: Any, token_groups: list[int],
                tokens: list[str], spans: list[tuple[int, int]], context: str) -> tuple[ContextAttribution, Any]:
    """:func:`_by_decomposition`'s result and the target it explained, read (``None``: the
    predicted token's id, named by the same pass)."""
    import torch

    contributions, bias, delta, label, target = _explained(nd, tokenizer, ids, target)
    answer_ids = target.tokens if isinstance(target, AnswerLogProbability) else None
    if answer_ids is not None:  # teacher-forced: the answer's own tokens are players too
        token_groups += [-3] * (answer_ids.numel() - 1)
        tokens += tokenizer.convert_ids_to_tokens(answer_ids[:-1].tolist())
    per_token = contributions[0].detach().to(torch.float64).cpu()  # the result's numbers, on the cpu
    index = torch.tensor(token_groups, device="cpu")
    groups = torch.zeros(len(spans), dtype=torch.float64, device="cpu")
    inside = index >= 0
    groups.index_add_(0, index[inside], per_token[inside])
    bias_value = float(bias[0])
    value = float(per_token.sum()) + bias_value
    return ContextAttribution(
        groups=[context[s:e] for s, e in spans], contributions=groups,
        question=float(per_token[index == -1].sum()), rest=float(per_token[index == -2].sum()), bias=bias_value,
        value=value, delta=float(delta[0]), target=label, token_groups=token_groups,
        tokens=tokens, token_contributions=per_token, context=context, spans=spans,
        answer=float(per_token[index == -3].sum())), target


def _read_target(nd: NormDecomposition, tokenizer: Any, target: Any) -> Any:
    """``target`` with its text read by this tokenizer (the attribution may have none): a text
    of one token is its id, of several an :class:`AnswerLogProbability` of their ids, as is
    an answer given as text."""
    if isinstance(target, str):
        found = nd.engine.token_ids(tokenizer, target)
        return AnswerLogProbability(tuple(found)) if len(found) > 1 else int(found[0])
    if isinstance(target, AnswerLogProbability) and isinstance(target.tokens, str):
        return AnswerLogProbability(tuple(nd.engine.token_ids(tokenizer, target.tokens)))
    return target


def _explained(nd: NormDecomposition, tokenizer: Any, ids: Any, target: Any) -> tuple[Any, Any, Any, str, Any]:
    """The prompt's contributions ``(1, n)`` (an answer's: ``(1, n + T − 1)``), the bias, the
    delta, what is explained in words, and the target read: a token's id (``None`` named as
    the predicted one) or an :class:`AnswerLogProbability` of the answer's token ids as a tensor."""
    target = _read_target(nd, tokenizer, target)
    if isinstance(target, AnswerLogProbability):
        answer = AnswerLogProbability(nd._target_tokens(target.tokens, ids.device))
        contributions, bias, delta = nd._attribute_answer(ids, answer, None, "backward", None, nd.reference, True,
                                                          True)
        return contributions, bias, delta, f"log p({tokenizer.decode(answer.tokens.tolist())!r})", answer
    # one pass of the frozen model: the prediction (target None) is read from its own logits
    request = nd._request(ids, None, None, nd.reference)
    groups, n_groups = nd.engine.groups(None, None, request)
    answer = nd._answer(request, target, None, nd._rules(None), nd.reference, "backward", groups, n_groups,
                        with_bias=True)
    if target is None:  # named once: its label is the predicted token
        target = int(answer.units[0])
    per_group = nd.engine.per_group(answer, request, groups, n_groups, "backward")
    contributions = nd.engine.per_position(per_group, request, groups)
    delta = (per_group.sum(1) + answer.bias - answer.real).abs()
    return contributions, answer.bias, delta, _label(tokenizer, target), target


def _by_presence(nd: NormDecomposition, tokenizer: Any, ids: Any, target: Any, token_groups: list[int],
                 tokens: list[str], spans: list[tuple[int, int]], context: str, steps: int,
                 ends: bool = True) -> ContextAttribution:
    """:func:`context_attribution` by the groups' presence (``method="presence"``; ``ends``: as
    :func:`~captum_ffb.long_context.presence.presence_attribution`'s)."""

    from captum_ffb.explained.readouts import NextToken
    from captum_ffb.long_context.presence import presence_attribution

    if nd.engine.head.task != "causal_lm":
        raise ValueError("presence attribution explains a causal LM's answer")
    target = _read_target(nd, tokenizer, target)
    if isinstance(target, AnswerLogProbability):
        ids, _, readout = nd._forced_answer(ids, target, None)
        token_groups = token_groups + [-3] * (ids.shape[1] - len(token_groups))
        tokens = tokens + tokenizer.convert_ids_to_tokens(ids[0, len(tokens):].tolist())
        label = f"log p({tokenizer.decode(list(readout.tokens))!r})"
    elif target is None or isinstance(target, int) and not isinstance(target, bool):
        readout = NextToken(target)
    else:
        raise TypeError(f"presence attribution explains a token (an id or a text) or an answer's log-probability, "
                        f"got {type(target).__name__}")
    found = presence_attribution(nd.model, ids, token_groups, len(spans), readout, steps, ends)
    if not isinstance(target, AnswerLogProbability):
        label = _label(tokenizer, found.unit)
    return ContextAttribution(
        groups=[context[s:e] for s, e in spans], contributions=found.contributions, question=0.0, rest=0.0,
        bias=found.without, value=found.value, delta=found.delta, target=label, token_groups=token_groups,
        tokens=tokens, token_contributions=None, context=context, spans=spans, method="presence")


def _by_fitting(nd: NormDecomposition, tokenizer: Any, encoded: tuple[Any, list[int], list[str], list[tuple[int, int]]],
                target: Any, prompt: tuple[str, str, str], settings: tuple[int, str, int | None, int, int, bool],
                show_progress: bool, steps: int) -> ContextAttribution:
    """:func:`context_attribution` by a surrogate fitted around a prior (``method="fitted"``;
    ``encoded``: the prompt's ids, each token's group, the tokens and the groups' spans;
    ``prompt``: the question, the template and the context; ``settings``: the ablations, the
    prior's method, the focus, the seed, the rounds and whether they re-rank): the prior's
    scores refined by :func:`~captum_ffb.long_context.surrogate.fit_surrogate` on prompts with
    random candidate groups removed from the text, and on the nested prompts. Where the
    decomposition runs, its value is the explained value and presence skips its own ends."""
    import torch

    from captum_ffb.engine.head import output_logits
    from captum_ffb.engine.passes import run_model

    ablations, prior, focus, seed, rounds, rerank = settings
    _check_fitting(nd, ablations, prior, focus, (seed, rounds, rerank))
    ids, token_groups, tokens, spans = encoded
    question, template, context = prompt
    target = _read_target(nd, tokenizer, target)
    focused = focus is not None and focus < len(spans)
    exact = None
    if focused or rounds or prior == "decomposition":  # its pass names the predicted token too
        exact, named = _decomposed(nd, tokenizer, ids, target, list(token_groups), list(tokens), spans, context)
        target = named if target is None else target
    elif target is None:  # the predicted token, named before the ablations read it
        target = int(output_logits(run_model(nd.model, ids))[0, -1].argmax())
    found = exact if prior == "decomposition" else _by_presence(
        nd, tokenizer, ids, target, list(token_groups), list(tokens), spans, context, steps, ends=exact is None)
    value = found.value if exact is None else exact.value
    picks, path_masks, path_values = _nested_path(nd, tokenizer, exact, (question, template), target, rounds,
                                                  rerank) if rounds else ([], None, None)
    among = focus_groups(found.contributions, exact.contributions, focus, leading=picks) if focused else None
    masks = ablation_masks(len(spans), ablations, seed, among=among)
    values = _ablation_values(nd, tokenizer, found, (question, template), target, masks, show_progress)
    if rounds:
        masks, values = torch.cat([masks, path_masks]), torch.cat([values, path_values])
    fit = fit_surrogate(masks, values, found.contributions)
    return ContextAttribution(
        groups=found.groups, contributions=fit.scores, question=0.0, rest=0.0, bias=fit.bias, value=value,
        delta=abs(float(fit.scores.sum()) + fit.bias - value), target=found.target,
        token_groups=found.token_groups, tokens=found.tokens, token_contributions=None, context=context,
        spans=spans, method="fitted")


def _check_fitting(nd: NormDecomposition, ablations: Any, prior: Any, focus: Any, seeded: tuple[Any, Any]) -> None:
    """``ValueError`` or ``TypeError`` for settings ``"fitted"`` cannot use (``seeded``: the
    seed, the rounds and whether they re-rank)."""
    seed, rounds, rerank = seeded
    if nd.engine.head.task != "causal_lm":
        raise ValueError("a fitted surrogate explains a causal LM's answer")
    if isinstance(ablations, bool) or not isinstance(ablations, int) or ablations < 3:
        raise ValueError(f"ablations must be an integer of at least 3, got {ablations!r}")
    if prior not in ("presence", "decomposition"):
        raise ValueError(f"prior must be 'presence' or 'decomposition', got {prior!r}")
    if focus is not None and (isinstance(focus, bool) or not isinstance(focus, int) or focus < 2):
        raise ValueError(f"focus must be None or an integer of at least 2, got {focus!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be an integer of at least 0, got {rounds!r}")
    if not isinstance(rerank, bool):
        raise TypeError(f"rerank must be True or False, got {type(rerank).__name__}")


def _nested_path(nd: NormDecomposition, tokenizer: Any, exact: ContextAttribution, prompt: tuple[str, str],
                 target: Any, rounds: int, rerank: bool) -> tuple[list[int], Tensor, Tensor]:
    """The nested prompts' picks, ``(r, G)`` keep masks and ``(r,)`` values,
    ``r = min(rounds, G − 1)``: the decomposition's top 1, 2, … ``r`` groups removed, one
    forward pass each (``rerank``: :func:`_greedy_path`'s); ``r + 1`` picks."""
    import torch

    if rerank:
        return _greedy_path(nd, tokenizer, exact, prompt, target, rounds)
    order = torch.sort(-exact.contributions, stable=True).indices
    r = min(rounds, len(exact.spans) - 1)
    masks = torch.ones(r, len(exact.spans), dtype=torch.bool)
    for row in range(r):
        masks[row, order[:row + 1]] = False
    values = _ablation_values(nd, tokenizer, exact, prompt, target, masks, False)
    return order[:r + 1].tolist(), masks, values


def _greedy_path(nd: NormDecomposition, tokenizer: Any, exact: ContextAttribution, prompt: tuple[str, str],
                 target: Any, rounds: int) -> tuple[list[int], Tensor, Tensor]:
    """The greedy picks, ``(r, G)`` nested keep masks and ``(r,)`` their values: each round
    removes the kept group the decomposition ranks first and runs the decomposition again on
    the shortened prompt (its value is the answer there), ``r = min(rounds, G − 1)``; the
    last ranking names one pick more."""
    import torch

    question, template = prompt
    keep = torch.ones(len(exact.spans), dtype=torch.bool)
    scores = exact.contributions.clone()
    picks, masks, values = [], [], []
    for _ in range(min(rounds, len(exact.spans) - 1)):
        picks.append(int(scores.masked_fill(~keep, -torch.inf).argmax()))
        keep = keep.clone()
        keep[picks[-1]] = False
        text, spans = ablated_spans(exact.context, exact.spans, keep.tolist())
        filled = _fill_template(template, text, question)
        ids, token_groups, tokens = _encoded(nd, tokenizer, filled, spans)
        shorter = _by_decomposition(nd, tokenizer, ids, target, token_groups, tokens, spans, text)
        scores = torch.full_like(exact.contributions, -torch.inf)
        scores[keep] = shorter.contributions
        masks.append(keep)
        values.append(shorter.value)
    if masks:
        picks.append(int(scores.masked_fill(~keep, -torch.inf).argmax()))
    return (picks, torch.stack(masks) if masks else torch.ones(0, len(exact.spans), dtype=torch.bool),
            torch.tensor(values, dtype=torch.float64))


def _ablation_values(nd: NormDecomposition, tokenizer: Any, found: ContextAttribution, prompt: tuple[str, str],
                     target: Any, masks: Tensor, show_progress: bool) -> Tensor:
    """``(m,)`` the explained value (a token's logit, or an answer's log-probability) on each
    prompt with only ``masks``' kept groups of the context, ``prompt`` its question and template."""
    import torch

    from captum_ffb.explained.readouts import NextToken
    from captum_ffb.long_context.presence import prompt_value

    question, template = prompt
    values = torch.empty(masks.shape[0], dtype=torch.float64)
    device = next(nd.model.parameters()).device
    rows = masks.tolist()
    if show_progress:
        from tqdm.auto import tqdm

        rows = tqdm(rows, desc="ablations", unit="pass")
    for row, keep in enumerate(rows):
        text = _fill_template(template, ablated_context(found.context, found.spans, keep), question)[0]
        ids = tokenizer(text, return_tensors="pt").input_ids.to(device)
        if isinstance(target, AnswerLogProbability):
            ids, _, readout = nd._forced_answer(ids, target, None)
        else:
            readout = NextToken(int(target))
        values[row] = prompt_value(nd.model, ids, readout)
    return values


def _check_inputs(tokenizer: Any, context: str, question: str, template: str,
                  max_tokens: int | None, method: str = "decomposition") -> None:
    """``TypeError`` or ``ValueError`` for a context, question or template that is not usable
    text, a ``max_tokens`` that is not a positive integer, an unknown method, or a slow
    tokenizer."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    for name, value in (("context", context), ("question", question), ("template", template)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    check_text(context, name="context")
    check_text(question, name="question")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise TypeError(f"max_tokens must be a positive integer, got {type(max_tokens).__name__}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if template.count("{context}") != 1 or template.count("{question}") != 1:
        raise ValueError("template must hold {context} and {question} once each, e.g. "
                         f"{DEFAULT_TEMPLATE!r}")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("context attribution needs a fast tokenizer (it maps groups to tokens by "
                         "character offsets)")


def _fill_template(template: str, context: str, question: str) -> tuple[str, tuple[int, int], int]:
    """The prompt, the question's character span in it and the context's offset in it."""
    head, _, tail = template.partition("{context}")
    if "{question}" in head:
        before, _, after = head.partition("{question}")
        q_start, offset = len(before), len(before) + len(question) + len(after)
        prompt = before + question + after + context + tail
    else:
        before, _, after = tail.partition("{question}")
        q_start, offset = len(head) + len(context) + len(before), len(head)
        prompt = head + context + before + question + after
    return prompt, (q_start, q_start + len(question)), offset


def _token_groups(offsets: list[list[int]], spans: list[tuple[int, int]], q_span: tuple[int, int],
                  offset: int) -> list[int]:
    """Each token's group, by its middle character: a context group's index, ``-1`` for the
    question, ``-2`` for the rest of the prompt (and tokens without characters)."""
    token_groups = []
    for start, end in offsets:
        found = -2
        if end > start:
            middle_char = (start + end - 1) // 2
            if q_span[0] <= middle_char < q_span[1]:
                found = -1
            else:
                for g, (s, e) in enumerate(spans):
                    if s + offset <= middle_char < e + offset:
                        found = g
                        break
        token_groups.append(found)
    return token_groups


def _longest_token(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` covers (its longest vocabulary entry)."""
    try:
        return max(1, max(len(token) for token in tokenizer.get_vocab()))
    except (AttributeError, TypeError, ValueError):
        return 64


def _label(tokenizer: Any, target: Any) -> str:
    if isinstance(target, str):
        return repr(target)
    if isinstance(target, int) and not isinstance(target, bool):
        return repr(token_text(tokenizer, target))
    return str(target)
