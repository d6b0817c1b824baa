"""The measures of the ContextCite comparison (``results/context/run.py``), kept apart so that
``tests/long_context/test_context_benchmark.py`` checks them on cases whose answer is known.

A context is cut into sources (character spans); an *ablation* keeps some of them
(:func:`ablate`). Every measure compares a method's scores (one number per source, larger =
more support for the answer) with the answer's real log-probability after ablations:

* :func:`top_k_keep` and the top-k drop: remove the k top-scored sources, the drop of the
  answer's log-probability (larger = the method found what the answer needs);
* :func:`lds`: the linear datamodeling score, Spearman's correlation over random ablations
  (:func:`random_masks`) between the method's prediction (the sum of the kept sources' scores)
  and the real log-probability.

:class:`AnswerScorer` measures the answer's teacher-forced log-probability
``Σ_t log p(a_t | prompt, a_<t)`` in one pass of the model, reusing the key–value cache of the
longest prompt prefix it has already run (the tokens before the first removed source, or a
document's shared prefix).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

#: ContextCite's default prompt (``context_cite.context_citer.DEFAULT_PROMPT_TEMPLATE``), sent
#: as the user's message through the model's chat template; both methods explain the same prompt.
USER_MESSAGE = "Context: {context}\n\nQuery: {question}"


def chat_template(tokenizer: Any) -> str:
    """The prompt around a context and a question: :data:`USER_MESSAGE` as the user's turn of
    ``tokenizer``'s chat template, the assistant's turn opened (``{context}`` and ``{question}``
    left in place)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": USER_MESSAGE}], tokenize=False,
                                         add_generation_prompt=True)


def ablate(context: str, spans: Sequence[tuple[int, int]], keep: Sequence[bool]) -> str:
    """``context`` with only the kept sources: each kept source after the first keeps the
    white space before it (ContextCite's ``SimpleContextPartitioner`` convention; the
    library's :func:`~captum_ffb.long_context.surrogate.ablated_context`)."""
    from captum_ffb.long_context.surrogate import ablated_context

    return ablated_context(context, spans, [bool(k) for k in keep])


def random_masks(n_sources: int, n_masks: int, seed: int, keep_probability: float = 0.5) -> np.ndarray:
    """``(n_masks, n_sources)`` booleans, each source kept with ``keep_probability``, drawn by
    ``numpy.random.default_rng(seed)`` (ContextCite draws its own with ``RandomState(0…63)``)."""
    return np.random.default_rng(seed).random((n_masks, n_sources)) < keep_probability


def top_k_keep(scores: Sequence[float], k: int) -> np.ndarray:
    """The keep mask that removes the ``k`` sources of largest score (ties: the earlier source
    first)."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, kind="stable")
    keep = np.ones(len(scores), dtype=bool)
    keep[order[:k]] = False
    return keep


def lds(scores: Sequence[float], masks: np.ndarray, values: Sequence[float]) -> float:
    """Linear datamodeling score: Spearman's correlation between each mask's predicted value
    (the sum of its kept sources' ``scores``) and its real ``values``; ``nan`` when either side
    is constant (a method that scores every source the same ranks no ablation above another)."""
    from scipy.stats import spearmanr

    predicted = np.asarray(masks, dtype=np.float64) @ np.asarray(scores, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if np.ptp(predicted) == 0 or np.ptp(values) == 0:
        return float("nan")
    return float(spearmanr(predicted, values).statistic)


def logit_of_log_prob(log_prob: float) -> float:
    """ContextCite's target for a response: the logit of its probability,
    ``log P − log(1 − P)`` with ``log P = Σ_t log p(a_t | …)``."""
    if log_prob >= 0:
        return math.inf
    return log_prob - math.log(-math.expm1(log_prob))


def mean_se(values: Sequence[float]) -> tuple[float, float, int]:
    """The mean, its standard error and the count, over the finite ``values``."""
    finite = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if finite.size == 0:
        return float("nan"), float("nan"), 0
    se = float(finite.std(ddof=1) / math.sqrt(finite.size)) if finite.size > 1 else float("nan")
    return float(finite.mean()), se, int(finite.size)


class AnswerScorer:
    """The teacher-forced log-probability of an answer after a prompt, one pass of ``model``
    each, reusing the key–value cache of the longest prefix already run.

    Args:
        model: a Hugging Face causal LM (its ``forward`` takes ``past_key_values`` and
                    ``logits_to_keep``).
        keep (int): how many prefixes to remember (the most recent ones).

    Attributes:
        passes (int): the model's forward passes so far; ``tokens`` the tokens they ran.
    """

    def __init__(self, model: Any, keep: int = 4) -> None:
        self.model, self.keep = model, keep
        self._prefixes: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self._pinned: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self.passes, self.tokens = 0, 0

    def remember(self, ids: Sequence[int]) -> None:
        """Run ``ids`` and keep its cache, for later prompts that start with (part of) it."""
        ids = list(ids)
        with torch.no_grad():
            out = self.model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        self.passes, self.tokens = self.passes + 1, self.tokens + len(ids)
        self._store(ids, _cache_of(out))

    def log_prob(self, prompt: Sequence[int], answer: Sequence[int], remember: bool = False,
                 pin: bool = False) -> float:
        """``Σ_t log p(answer_t | prompt, answer_<t)``; ``remember`` keeps this prompt's cache
        among the recent ones, ``pin`` until :meth:`unpin`."""
        from transformers import DynamicCache

        prompt, answer = list(prompt), list(answer)
        sequence = prompt + answer[:-1]
        reused, layers = self._longest(sequence, limit=len(prompt) - 1)
        kwargs: dict[str, Any] = {}
        if reused:
            kwargs[_cache_argument(self.model)] = DynamicCache(ddp_cache_data=[(k[:, :, :reused], v[:, :, :reused])
                                                                     for k, v in layers])
        with torch.no_grad():
            out = self.model(torch.tensor([sequence[reused:]]), use_cache=remember or pin,
                             logits_to_keep=len(answer), **kwargs)
        self.passes, self.tokens = self.passes + 1, self.tokens + len(sequence) - reused
        logits = out.logits[0].to(torch.float64)
        value = float(torch.log_softmax(logits, -1)[torch.arange(len(answer)), torch.tensor(answer)].sum())
        if remember or pin:
            self._store(sequence, _cache_of(out), pin)
        return value

    def unpin(self) -> None:
        """Forget the pinned prefixes."""
        self._pinned = []

    def _store(self, ids: list[int], cache: Any, pin: bool = False) -> None:
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        if layers and layers[0][0].shape[2] != len(ids):
            return  # a cache that does not hold every token (a sliding window): not reused
        if pin:
            self._pinned.append((ids, layers))
        else:
            self._prefixes = [*self._prefixes, (ids, layers)][-self.keep:]

    def _longest(self, ids: list[int], limit: int) -> tuple[int, Any]:
        """The longest prefix of ``ids`` (at most ``limit`` tokens) already run, and its cache."""
        best, layers = 0, None
        for known, cached in self._pinned + self._prefixes:
            n = min(len(known), limit)
            same = next((i for i in range(n) if known[i] != ids[i]), n)
            if same > best:
                best, layers = same, cached
        return best, layers


def _cache_argument(model: Any) -> str:
    """The keyword of ``model.forward`` for a key–value cache (``cache`` in transformers 5,
    ``past_key_values`` before)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(out: Any) -> Any:
    """The key–value cache of a model's output, under either name."""
    found = getattr(out, "cache", None)
    return found if found is not None else out.past_key_values
