r"""Perturbation-based faithfulness metrics for any ``(B, n)`` token attribution.

Every function takes a scorer ``score_fn(input_ids, attention_mask, zeroed)`` (see
``captum_ffb.evaluation.perturbation``), the batch, the attribution and a ``protected``
mask. Protected positions (special tokens; padding always) are never perturbed and are not
counted in ``n``, the number of tokens a percentage refers to. Orderings use a stable sort:
equal relevances are taken in position order. The scorer may return one score per row or a
row of class scores; in the latter case the metrics follow ``target`` (default: the class
the unperturbed input predicts, as every protocol below does). All perturbed variants of
all examples are scored together, ``batch_size`` rows per call; results are float64 on the
CPU. Write ``s(x)`` for the target score of the unperturbed input.

Protocols, each as its reference implements it (repositories read at the commit given).
The references break ties in relevance with NumPy's unstable argsort; only ties can make a
difference to them.

**Perturbation curve** (:func:`perturbation_curve`; Samek et al. 2017). Deletion: step
``k`` perturbs the first ``k`` tokens of the order (MoRF: most relevant first; LeRF: least
relevant first). Insertion: step ``k`` keeps only the first ``k`` tokens and perturbs all
other unprotected tokens. Steps are every ``k = 0..n``, given numbers of tokens, or
fractions ``f`` with ``k = rounding(f·n)``. ``curve.aopc()`` is the mean over the steps of
``s(x) - s(x^(k))``; ``curve.auc()`` the trapezoidal area over ``x = k/n``.

**DecompX AOPC and accuracy** (:func:`decompx_aopc`; mohsenfayyaz/DecompX @b6bddf0,
``experiments/notebooks/v3/analysis_v3.ipynb``: ``CheckpointToLogit.mask`` and
``compute_aopc``, ``compute_accuracy``, ``plot_main_fig``). Excluding [CLS]/[SEP] and
padding (pass them as ``protected``), ``k = floor(n·K/100)`` (float product, so
``K = 70 %`` of 90 tokens is 62) of the most relevant tokens are replaced by ``[MASK]``
for ``K = 0, 10, …, 90``. ``AOPC(K)`` is the mean over examples of
``p(ŷ|x) - p(ŷ|x̃(K))``, ``ŷ`` the class predicted on ``x``, ``p`` the softmax
probability (the scorer's job). The reported number averages ``AOPC(K)`` over
``K = 10..90`` only (``np.mean(plot_y[1:])``: the ``K = 0`` point is left out).
Accuracy is the model's accuracy against the gold labels on the masked inputs, averaged
the same way. The "min" strategy (least relevant first) is ``most_relevant_first=False``.

**ERASER comprehensiveness and sufficiency** (:func:`comprehensiveness`,
:func:`sufficiency`, :func:`eraser_faithfulness`; jayded/eraserbenchmark @36467f1,
``rationale_benchmark/metrics.py``: ``score_classifications``, ``_instances_aopc``).
For a rationale ``r``: comprehensiveness ``s(x) - s(x \ r)``, sufficiency
``s(x) - s(r)`` (only ``r`` and the protected tokens kept). The binned versions take ``r``
as the top ``k_b`` tokens for bins ``b ∈ {1, 5, 10, 20, 50} %`` and average over the bins
(``_instances_aopc`` averages the per-bin deltas; ``divisor="bins"``). The ERASER scorer
receives per-bin scores and fixes no rounding; ALTI (mt-upc/transformer-contributions
@4f89039, ``aupc.py`` and ``evaluation.ipynb``) uses ``k_b = ceil(n·b)`` with [CLS]/[SEP]
kept, deletes the tokens, and divides the sum over the five bins by six (the ``k = 0`` step
counted with a zero delta; ``divisor="bins+1"``). Defaults here: ceil, deletion,
``divisor="bins"``. Not reproduced: ALTI's running minimum (comprehensiveness) or maximum
(sufficiency) of the probabilities along the bins.

**ferret AOPC comprehensiveness / sufficiency** (:func:`ferret_aopc`; g8a9/ferret @22935f8,
``ferret/evaluators/faithfulness_measures.py`` and ``utils_from_soft_to_discrete.py``).
Thresholds ``0.1, 0.2, …, 1.0`` (``np.arange(0.1, 1.1, 0.1)``, no 0 % step);
``k = int(t·n)`` (floor of the float product), ``n`` excluding the first and last token
(ferret's ``remove_first_last``: pass them as ``protected``).
A step with ``k = 0`` is skipped. With ``only_positive`` (ferret's default) the rationale
is the top ``k`` restricted to tokens with positive relevance; a step whose rationale is
empty or equal to the previous evaluated one is skipped. ``aopc_compr`` is the mean over
the evaluated steps of ``s(x) - s(x \ r_t)``, ``aopc_suff`` the mean of ``s(x) - s(r_t)``
(tokens deleted by default); with no step evaluated they are 0 and 1, as in ferret.
``s`` is the softmax probability of the explained class.

**ABPC** (:func:`abpc`; AttnLRP, Achtibat et al. 2024, the area between the perturbation
curves of Blücher et al. 2024; procedure as stated by the lxt maintainer in
rachtibat/LRP-eXplains-Transformers issue #40; the repository, @f043441, ships no
evaluation code).
Input embeddings of the perturbed tokens are set to zero, most relevant first and least
relevant first; ``s`` is the logit of the predicted output; ABPC is the area under
``LeRF(x) - MoRF(x)``. The step grid is not published: the default here is one token per
step over ``x = k/n ∈ [0, 1]`` with the trapezoidal rule (``reduction="mean"`` averages
over the steps instead).

**Leave-one-out and Kendall τ** (:func:`leave_one_out`, :func:`kendall_tau`,
:func:`taucorr_loo`; ferret ``TauLOO_Evaluation``). ``LOO_j = s(x) - s(x \ {j})`` with the
token deleted (ferret's default for classification) for every unprotected ``j``;
``taucorr_loo`` is Kendall's τ-b (``scipy.stats.kendalltau``'s default) between the
attribution and LOO over the unprotected positions.

Not reproduced anywhere: the reference pipelines' decode/re-tokenize round trips (they
turn ids back into text and tokenize again); here ids are perturbed directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from captum_ffb.evaluation.perturbation import (
    PERTURBATIONS,
    ScoreFn,
    check_batch,
    perturb,
    protected_or_padding,
    rank_positions,
    resolve_padding_side,
    tokens_for_fractions,
)

__all__ = [
    "DECOMPX_RATIOS",
    "ERASER_BINS",
    "FERRET_THRESHOLDS",
    "AbpcResult",
    "DecompXResult",
    "EraserResult",
    "FerretResult",
    "PerturbationCurve",
    "abpc",
    "comprehensiveness",
    "decompx_aopc",
    "eraser_faithfulness",
    "ferret_aopc",
    "kendall_tau",
    "leave_one_out",
    "perturbation_curve",
    "sufficiency",
    "taucorr_loo",
]

#: The fractions of tokens removed in DecompX's AOPC (0 to 0.9).
DECOMPX_RATIOS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: The fractions of tokens ERASER's AOPC removes or keeps.
ERASER_BINS = (0.01, 0.05, 0.1, 0.2, 0.5)
#: ferret's thresholds, as the float values it iterates over (0.30000000000000004, ...).
FERRET_THRESHOLDS = tuple(np.arange(0.1, 1.1, 0.1).tolist())


# ---------------------------------------------------------------------------------------
# scoring engine


@dataclass(frozen=True)
class PerturbOptions:
    r"""The keywords every perturbation metric shares (each metric takes them as ``**options``).

    Attributes:
        perturbation (str): how tokens are taken out: ``"remove"`` (deleted), ``"replace"``
                    (by ``token_id``) or ``"zero_embedding"``; each metric names its default.
        token_id (int, optional): the replacement id for ``"replace"``.
        target (optional): the class to follow when the scorer returns class scores (default:
                    the class predicted on the unperturbed input).
        pad_token_id (int): padding id for ``"remove"``.
        padding_side (str, optional): padding side for ``"remove"`` (default: inferred).
        batch_size (int): most rows per scorer call.
    """

    perturbation: str = "remove"
    token_id: int | None = None
    target: Any = None
    pad_token_id: int = 0
    padding_side: str | None = None
    batch_size: int = 64

    @classmethod
    def of(cls, options: dict[str, Any], perturbation: str | None = None) -> PerturbOptions:
        """The options given as keywords (a metric's default ``perturbation`` if not given);
        an unknown keyword is a ``TypeError`` that lists the known ones."""
        unknown = sorted(set(options) - set(cls.__dataclass_fields__))
        if unknown:
            raise TypeError(f"unknown option {unknown[0]!r}; the metrics take "
                            f"{', '.join(cls.__dataclass_fields__)}")
        if perturbation is not None and "perturbation" not in options:
            options = {**options, "perturbation": perturbation}
        return cls(**options)

    def fields(self) -> tuple[Any, ...]:
        """``(perturbation, token_id, target, pad_token_id, padding_side, batch_size)``."""
        return (self.perturbation, self.token_id, self.target, self.pad_token_id, self.padding_side,
                self.batch_size)


def _call(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor,
          zeroed: Tensor | None) -> Tensor:
    with torch.no_grad():
        out = score_fn(input_ids, attention_mask, zeroed)
    out = torch.as_tensor(out).detach()
    if out.dim() not in (1, 2) or out.shape[0] != input_ids.shape[0]:
        raise ValueError(
            f"score_fn must return (batch,) or (batch, classes) for {input_ids.shape[0]} rows, "
            f"got shape {tuple(out.shape)}"
        )
    return out


def _check_batch_size(batch_size: int) -> int:
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    return int(batch_size)


def _base_scores(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor,
                 batch_size: int) -> Tensor:
    chunks = [
        _call(score_fn, input_ids[i:i + batch_size], attention_mask[i:i + batch_size], None)
        for i in range(0, input_ids.shape[0], batch_size)
    ]
    if not chunks:
        raise ValueError("the batch is empty")
    return torch.cat([chunk.to("cpu", torch.float64) for chunk in chunks])


def _resolve_target(base: Tensor, target: Tensor | Sequence[int] | int | None) -> Tensor | None:
    if base.dim() == 1:
        if target is not None:
            raise ValueError("target needs class scores, but score_fn returns one score per row")
        return None
    if target is None:
        return base.argmax(dim=1)
    target = torch.as_tensor(target, dtype=torch.long).cpu()
    if target.dim() == 0:
        target = target.expand(base.shape[0])
    if target.shape != (base.shape[0],):
        raise ValueError(f"target must be one class or (batch,), got shape {tuple(target.shape)}")
    if ((target < 0) | (target >= base.shape[1])).any():
        raise ValueError(f"target classes must lie in [0, {base.shape[1]})")
    return target


def _pick(scores: Tensor, target: Tensor | None) -> Tensor:
    """``(B,)`` target scores from ``(B, C)`` class scores."""
    if target is None:
        return scores
    return scores.gather(1, target.unsqueeze(1)).squeeze(1)


@dataclass
class _Setup:
    input_ids: Tensor
    attention_mask: Tensor
    protected: Tensor
    base_scores: Tensor
    target: Tensor | None
    padding_side: str | None
    batch_size: int

    @property
    def base(self) -> Tensor:
        return _pick(self.base_scores, self.target)


def _setup(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor,
           attributions: Tensor | None, protected: Tensor | None, target,
           perturbation: str, token_id: int | None, padding_side: str | None,
           batch_size: int) -> _Setup:
    check_batch(input_ids, attention_mask)
    if perturbation not in PERTURBATIONS:
        raise ValueError(f"perturbation must be one of {PERTURBATIONS}, got {perturbation!r}")
    if perturbation == "replace" and token_id is None:
        raise ValueError("perturbation 'replace' needs a token_id")
    if attributions is not None and tuple(attributions.shape) != tuple(input_ids.shape):
        raise ValueError(
            f"attributions shape {tuple(attributions.shape)} differs from input_ids shape "
            f"{tuple(input_ids.shape)}"
        )
    batch_size = _check_batch_size(batch_size)
    protected = protected_or_padding(attention_mask, protected)
    side = resolve_padding_side(attention_mask, padding_side) if perturbation == "remove" else padding_side
    base_scores = _base_scores(score_fn, input_ids, attention_mask, batch_size)
    return _Setup(input_ids, attention_mask, protected, base_scores,
                  _resolve_target(base_scores, target), side, batch_size)


def _score(score_fn: ScoreFn, setup: _Setup, where: Tensor, perturbation: str,
           token_id: int | None, pad_token_id: int,
           keep_classes: bool = False) -> tuple[Tensor, Tensor | None]:
    """Target scores ``(B, S)`` of the variants ``where[b, s]`` (``(B, S, n)``), and their
    class scores ``(B, S, C)`` if ``keep_classes``.

    All variants are scored ``batch_size`` rows per call; a variant that perturbs nothing
    reuses the unperturbed score. The target is picked chunk by chunk, so that a scorer
    returning a whole vocabulary per row costs only one chunk of memory.
    """
    batch, steps, n = where.shape
    flat = where.reshape(batch * steps, n)
    example = torch.arange(batch, device=where.device).repeat_interleave(steps)
    on_cpu = example.cpu()
    target = None if setup.target is None else setup.target[on_cpu]
    scores = setup.base[on_cpu].clone()
    classes = None
    if keep_classes and setup.target is not None:
        classes = setup.base_scores[on_cpu].clone()
    todo = flat.any(dim=1).nonzero().squeeze(1)
    for start in range(0, todo.numel(), setup.batch_size):
        chosen = todo[start:start + setup.batch_size]
        rows = example[chosen]
        perturbed = perturb(setup.input_ids[rows], setup.attention_mask[rows], flat[chosen],
                            perturbation, token_id=token_id, pad_token_id=pad_token_id,
                            padding_side=setup.padding_side)
        raw = _call(score_fn, perturbed.input_ids, perturbed.attention_mask, perturbed.zeroed)
        if raw.shape[1:] != setup.base_scores.shape[1:]:
            raise ValueError(
                f"score_fn returned shape {tuple(raw.shape[1:])} per row for a perturbed "
                f"input but {tuple(setup.base_scores.shape[1:])} for the unperturbed one"
            )
        chosen = chosen.cpu()
        if target is None:
            scores[chosen] = raw.to("cpu", torch.float64)
        else:
            index = target[chosen].to(raw.device).unsqueeze(1)
            scores[chosen] = raw.gather(1, index).squeeze(1).to("cpu", torch.float64)
            if classes is not None:
                classes[chosen] = raw.to("cpu", torch.float64)
    scores = scores.reshape(batch, steps)
    return scores, (None if classes is None else classes.reshape(batch, steps, -1))


def _prefix_masks(ranks: Tensor, protected: Tensor, steps: Tensor, mode: str) -> Tensor:
    """``(B, S, n)`` positions to perturb: the first ``k`` (deletion) or all but them."""
    first = ranks.unsqueeze(1) < steps.to(ranks.device).unsqueeze(2)
    free = ~protected.unsqueeze(1)
    return (first if mode == "deletion" else ~first) & free


# ---------------------------------------------------------------------------------------
# curves


@dataclass(frozen=True)
class PerturbationCurve:
    """The target score along a perturbation sweep.

    Attributes:
        steps (Tensor): ``(B, S)`` long, tokens perturbed (deletion) or kept (insertion).
        n_tokens (Tensor): ``(B,)`` unprotected tokens per example.
        scores (Tensor): ``(B, S)`` target score at each step; NaN where the step does not
                    exist for the example (``k > n`` in a one-token-per-step sweep).
        base (Tensor): ``(B,)`` target score of the unperturbed input.
        mode (str): ``"deletion"`` or ``"insertion"``.
        most_relevant_first (bool): the order of the sweep.
        class_scores (Tensor or None): ``(B, S, C)`` every class's score at each step, when
                    asked for (``keep_class_scores``) and the scorer returns class scores.
        target (Tensor or None): ``(B,)`` the followed class.
    """

    steps: Tensor
    n_tokens: Tensor
    scores: Tensor
    base: Tensor
    mode: str
    most_relevant_first: bool
    class_scores: Tensor | None = None
    target: Tensor | None = None

    @property
    def valid(self) -> Tensor:
        """``(B, S)`` bool, the steps that exist."""
        return ~torch.isnan(self.scores)

    @property
    def fractions(self) -> Tensor:
        """``(B, S)`` ``steps / n_tokens`` (NaN for an example with no free token)."""
        n = self.n_tokens.to(torch.float64).unsqueeze(1)
        frac = self.steps.to(torch.float64) / n
        return frac.masked_fill(~self.valid | (n == 0), float("nan"))

    def drops(self) -> Tensor:
        """``(B, S)`` ``s(x) - s(x^(k))``."""
        return self.base.unsqueeze(1) - self.scores

    def aopc(self) -> Tensor:
        """``(B,)`` the mean over the existing steps of ``s(x) - s(x^(k))``."""
        return self.drops().nanmean(dim=1)

    def auc(self) -> Tensor:
        """``(B,)`` trapezoidal area under the curve over ``x = k/n``; NaN below 2 points."""
        x, y = self.fractions, self.scores
        both = ~torch.isnan(x[:, 1:]) & ~torch.isnan(x[:, :-1])
        pieces = (x[:, 1:] - x[:, :-1]) * (y[:, 1:] + y[:, :-1]) / 2
        area = torch.where(both, pieces, torch.zeros_like(pieces)).sum(dim=1)
        return area.masked_fill(both.sum(dim=1) == 0, float("nan"))

    def accuracy(self, labels: Tensor | Sequence[int]) -> Tensor:
        """``(S,)`` accuracy of the argmax class against ``labels`` at every step.

        Args:
            labels (Tensor or Sequence[int]): ``(B,)`` gold labels.
        """
        if self.class_scores is None:
            if self.target is None:
                raise ValueError("accuracy needs class scores, but score_fn returns one score per row")
            raise ValueError("accuracy needs the class scores: pass keep_class_scores=True")
        labels = torch.as_tensor(labels, dtype=torch.long).cpu()
        if labels.shape != self.base.shape:
            raise ValueError(f"labels must be (batch,) = {tuple(self.base.shape)}, got {tuple(labels.shape)}")
        correct = (self.class_scores.argmax(dim=-1) == labels.unsqueeze(1)).to(torch.float64)
        return correct.masked_fill(~self.valid, float("nan")).nanmean(dim=0)


def perturbation_curve(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor,
                       attributions: Tensor, protected: Tensor | None = None, *,
                       most_relevant_first: bool = True, mode: str = "deletion",
                       fractions: Sequence[float] | None = None,
                       counts: Sequence[int] | None = None, rounding: str = "floor",
                       keep_class_scores: bool = False, **options: Any) -> PerturbationCurve:
    """Deletion or insertion curve, most or least relevant first.

    Args:
        score_fn (Callable): the scorer.
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        attributions (Tensor): ``(B, n)`` relevance per position.
        protected (Tensor, optional): ``(B, n)`` bool, never perturbed nor counted.
        most_relevant_first (bool): MoRF if True, LeRF otherwise.
        mode (str): ``"deletion"`` (perturb the first ``k``) or ``"insertion"`` (keep only
                    the first ``k``).
        fractions (Sequence[float], optional): steps as increasing fractions of ``n``.
        counts (Sequence[int], optional): steps as increasing numbers of tokens (clipped to
                    ``n``). With neither, every ``k = 0..n``.
        rounding (str): how ``fractions`` become counts: ``"floor"``, ``"ceil"``, ``"round"``.
        keep_class_scores (bool): keep every class's score at every step (for
                    :meth:`PerturbationCurve.accuracy`); only with a class-score scorer.
        **options: the keywords every metric shares (:class:`PerturbOptions`: ``perturbation``,
                    ``token_id``, ``target``, ``pad_token_id``, ``padding_side``, ``batch_size``); ``perturbation`` is
                    ``"zero_embedding"`` unless given.

    Returns:
        PerturbationCurve: the curve and the unperturbed score.
    """
    perturbation, token_id, target, pad_token_id, padding_side, batch_size = \
        PerturbOptions.of(options, "zero_embedding").fields()
    if mode not in ("deletion", "insertion"):
        raise ValueError(f"mode must be 'deletion' or 'insertion', got {mode!r}")
    if fractions is not None and counts is not None:
        raise ValueError("give fractions or counts, not both")
    setup = _setup(score_fn, input_ids, attention_mask, attributions, protected, target,
                   perturbation, token_id, padding_side, batch_size)
    ranks, n_tokens = rank_positions(attributions.to(input_ids.device), setup.protected,
                                     descending=most_relevant_first)
    n_tokens = n_tokens.cpu()
    batch = input_ids.shape[0]
    if fractions is not None:
        _check_increasing(fractions, "fractions")
        steps = tokens_for_fractions(n_tokens, fractions, rounding)
        exists = torch.ones_like(steps, dtype=torch.bool)
    elif counts is not None:
        _check_increasing(counts, "counts")
        values = torch.as_tensor(list(counts), dtype=torch.long)
        if (values < 0).any():
            raise ValueError("counts must be non-negative")
        steps = torch.minimum(values.unsqueeze(0), n_tokens.unsqueeze(1))
        exists = torch.ones_like(steps, dtype=torch.bool)
    else:
        top = int(n_tokens.max())
        steps = torch.arange(top + 1).unsqueeze(0).expand(batch, top + 1).clone()
        exists = steps <= n_tokens.unsqueeze(1)
    where = _prefix_masks(ranks, setup.protected, steps, mode) & exists.to(ranks.device).unsqueeze(2)
    scores, class_scores = _score(score_fn, setup, where, perturbation, token_id, pad_token_id,
                                  keep_classes=keep_class_scores)
    scores = scores.masked_fill(~exists, float("nan"))
    if class_scores is not None:
        class_scores = class_scores.masked_fill(~exists.unsqueeze(2), float("nan"))
    return PerturbationCurve(steps, n_tokens, scores, setup.base, mode, most_relevant_first,
                             class_scores, setup.target)


def _check_increasing(values: Sequence[float], name: str) -> None:
    values = list(values)
    if not values:
        raise ValueError(f"{name} must not be empty")
    if any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"{name} must be in increasing order")


# ---------------------------------------------------------------------------------------
# DecompX


@dataclass(frozen=True)
class DecompXResult:
    """DecompX's AOPC (and accuracy) over masking ratios.

    Attributes:
        ratios (Tensor): ``(K,)`` the masking ratios.
        curve (PerturbationCurve): per-example scores, ``curve.drops()`` is
                    ``p(ŷ|x) - p(ŷ|x̃(K))``.
        aopc_per_ratio (Tensor): ``(K,)`` mean over examples of the drop.
        aopc (float): the mean of ``aopc_per_ratio`` over the nonzero ratios.
        accuracy_per_ratio (Tensor or None): ``(K,)`` accuracy on the masked inputs.
        accuracy (float or None): its mean over the nonzero ratios.
    """

    ratios: Tensor
    curve: PerturbationCurve
    aopc_per_ratio: Tensor
    aopc: float
    accuracy_per_ratio: Tensor | None = None
    accuracy: float | None = None


def decompx_aopc(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor,
                 attributions: Tensor, protected: Tensor | None = None, *, mask_token_id: int,
                 ratios: Sequence[float] = DECOMPX_RATIOS, most_relevant_first: bool = True,
                 labels: Tensor | Sequence[int] | None = None,
                 target: Tensor | Sequence[int] | int | None = None,
                 batch_size: int = 64) -> DecompXResult:
    """AOPC and accuracy of DecompX: the top ``floor(K % · n)`` tokens replaced by [MASK].

    Args:
        score_fn (Callable): the scorer, ideally returning class probabilities.
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        attributions (Tensor): ``(B, n)`` relevance per position.
        protected (Tensor, optional): ``(B, n)`` bool, e.g. [CLS] and [SEP].
        mask_token_id (int): the ``[MASK]`` id.
        ratios (Sequence[float]): increasing masking ratios (DecompX: 0, 0.1, …, 0.9).
        most_relevant_first (bool): DecompX's "max" strategy if True, "min" otherwise.
        labels (optional): ``(B,)`` gold labels, for the accuracy (needs class scores).
        target (optional): the class to follow (default: the predicted class).
        batch_size (int): most rows per scorer call.

    Returns:
        DecompXResult: per-ratio and aggregated AOPC (and accuracy).
    """
    curve = perturbation_curve(score_fn, input_ids, attention_mask, attributions, protected,
                               most_relevant_first=most_relevant_first, mode="deletion",
                               perturbation="replace", token_id=mask_token_id,
                               fractions=ratios, rounding="floor", target=target,
                               batch_size=batch_size, keep_class_scores=labels is not None)
    ratio_values = torch.as_tensor(list(ratios), dtype=torch.float64)
    nonzero = ratio_values > 0
    if not nonzero.any():
        nonzero = torch.ones_like(nonzero)
    per_ratio = curve.drops().mean(dim=0)
    accuracy_per_ratio = accuracy = None
    if labels is not None:
        accuracy_per_ratio = curve.accuracy(labels)
        accuracy = float(accuracy_per_ratio[nonzero].mean())
    return DecompXResult(ratio_values, curve, per_ratio, float(per_ratio[nonzero].mean()),
                         accuracy_per_ratio, accuracy)


# ---------------------------------------------------------------------------------------
# ERASER


def _rationale_scores(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor,
                      rationale: Tensor, protected: Tensor | None, keep: bool, perturbation,
                      token_id, target, pad_token_id, padding_side, batch_size) -> Tensor:
    if rationale.shape != input_ids.shape:
        raise ValueError(
            f"rationale shape {tuple(rationale.shape)} differs from input_ids shape "
            f"{tuple(input_ids.shape)}"
        )
    setup = _setup(score_fn, input_ids, attention_mask, None, protected, target, perturbation,
                   token_id, padding_side, batch_size)
    rationale = rationale.to(setup.protected.device, torch.bool) & ~setup.protected
    where = (~rationale if keep else rationale) & ~setup.protected
    scores, _ = _score(score_fn, setup, where.unsqueeze(1), perturbation, token_id, pad_token_id)
    return setup.base - scores[:, 0]


def comprehensiveness(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor,
                      rationale: Tensor, protected: Tensor | None = None, **options: Any) -> Tensor:
    r"""ERASER comprehensiveness ``s(x) - s(x \ r)`` of a hard rationale.

    Args:
        score_fn (Callable): the scorer.
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        rationale (Tensor): ``(B, n)`` bool, the rationale ``r`` (protected positions are
                    ignored).
        protected (Tensor, optional): ``(B, n)`` bool, never perturbed.
        **options: the keywords every metric shares (:class:`PerturbOptions`: ``perturbation``,
                    ``token_id``, ``target``, ``pad_token_id``, ``padding_side``, ``batch_size``); ``perturbation`` is
                    ``"remove"`` unless given.

    Returns:
        Tensor: ``(B,)``.
    """
    perturbation, token_id, target, pad_token_id, padding_side, batch_size = \
        PerturbOptions.of(options, "remove").fields()
    return _rationale_scores(score_fn, input_ids, attention_mask, rationale, protected, False,
                             perturbation, token_id, target, pad_token_id, padding_side,
                             batch_size)


def sufficiency(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor, rationale: Tensor,
                protected: Tensor | None = None, **options: Any) -> Tensor:
    """ERASER sufficiency ``s(x) - s(r)``: only the rationale (and protected tokens) kept.

    Args:
        score_fn (Callable): the scorer.
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        rationale (Tensor): ``(B, n)`` bool, the rationale ``r``.
        protected (Tensor, optional): ``(B, n)`` bool, never perturbed.
        **options: the keywords every metric shares (:class:`PerturbOptions`: ``perturbation``,
                    ``token_id``, ``target``, ``pad_token_id``, ``padding_side``, ``batch_size``); ``perturbation`` is
                    ``"remove"`` unless given.

    Returns:
        Tensor: ``(B,)``.
    """
    perturbation, token_id, target, pad_token_id, padding_side, batch_size = \
        PerturbOptions.of(options, "remove").fields()
    return _rationale_scores(score_fn, input_ids, attention_mask, rationale, protected, True,
                             perturbation, token_id, target, pad_token_id, padding_side,
                             batch_size)


@dataclass(frozen=True)
class EraserResult:
    """ERASER's binned comprehensiveness and sufficiency.

    Attributes:
        bins (Tensor): ``(K,)`` the bins (fractions).
        counts (Tensor): ``(B, K)`` rationale size ``k_b`` per example and bin.
        comprehensiveness (Tensor): ``(B, K)`` ``s(x) - s(x \\ r_b)``.
        sufficiency (Tensor): ``(B, K)`` ``s(x) - s(r_b)``.
        aopc_comprehensiveness (Tensor): ``(B,)`` aggregated over the bins.
        aopc_sufficiency (Tensor): ``(B,)`` aggregated over the bins.
    """

    bins: Tensor
    counts: Tensor
    comprehensiveness: Tensor
    sufficiency: Tensor
    aopc_comprehensiveness: Tensor
    aopc_sufficiency: Tensor


def eraser_faithfulness(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor,
                        attributions: Tensor, protected: Tensor | None = None, *,
                        bins: Sequence[float] = ERASER_BINS, rounding: str = "ceil",
                        divisor: str = "bins", **options: Any) -> EraserResult:
    """Comprehensiveness and sufficiency of the top ``k_b`` tokens, aggregated over bins.

    Args:
        score_fn (Callable): the scorer, ideally returning class probabilities.
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        attributions (Tensor): ``(B, n)`` relevance per position.
        protected (Tensor, optional): ``(B, n)`` bool, never perturbed nor counted.
        bins (Sequence[float]): increasing fractions (ERASER: 1, 5, 10, 20, 50 %).
        rounding (str): ``k_b = rounding(b · n)``; ALTI uses ``"ceil"``.
        divisor (str): ``"bins"`` averages over the bins (ERASER's scorer); ``"bins+1"``
                    divides the sum by ``len(bins) + 1`` (ALTI's evaluation).
        **options: the keywords every metric shares (:class:`PerturbOptions`: ``perturbation``,
                    ``token_id``, ``target``, ``pad_token_id``, ``padding_side``, ``batch_size``); ``perturbation`` is
                    ``"remove"`` unless given.

    Returns:
        EraserResult: per-bin and aggregated scores.
    """
    perturbation, token_id, target, pad_token_id, padding_side, batch_size = \
        PerturbOptions.of(options, "remove").fields()
    if divisor not in ("bins", "bins+1"):
        raise ValueError(f"divisor must be 'bins' or 'bins+1', got {divisor!r}")
    _check_increasing(bins, "bins")
    setup = _setup(score_fn, input_ids, attention_mask, attributions, protected, target,
                   perturbation, token_id, padding_side, batch_size)
    ranks, n_tokens = rank_positions(attributions.to(input_ids.device), setup.protected)
    counts = tokens_for_fractions(n_tokens.cpu(), bins, rounding)
    top = _prefix_masks(ranks, setup.protected, counts, "deletion")
    rest = ~top & ~setup.protected.unsqueeze(1)
    both = torch.cat([top, rest], dim=1)
    scores, _ = _score(score_fn, setup, both, perturbation, token_id, pad_token_id)
    drops = setup.base.unsqueeze(1) - scores
    k = len(bins)
    comp, suff = drops[:, :k], drops[:, k:]
    denominator = k if divisor == "bins" else k + 1
    return EraserResult(torch.as_tensor(list(bins), dtype=torch.float64), counts, comp, suff,
                        comp.sum(dim=1) / denominator, suff.sum(dim=1) / denominator)


# ---------------------------------------------------------------------------------------
# ferret


@dataclass(frozen=True)
class FerretResult:
    """ferret's ``aopc_compr`` and ``aopc_suff``.

    Attributes:
        thresholds (Tensor): ``(K,)`` the thresholds.
        counts (Tensor): ``(B, K)`` rationale size at each threshold (after
                    ``only_positive``).
        evaluated (Tensor): ``(B, K)`` bool, the thresholds that enter the mean.
        comprehensiveness (Tensor): ``(B, K)`` ``s(x) - s(x \\ r_t)``, NaN where skipped.
        sufficiency (Tensor): ``(B, K)`` ``s(x) - s(r_t)``, NaN where skipped.
        aopc_compr (Tensor): ``(B,)``.
        aopc_suff (Tensor): ``(B,)``.
    """

    thresholds: Tensor
    counts: Tensor
    evaluated: Tensor
    comprehensiveness: Tensor
    sufficiency: Tensor
    aopc_compr: Tensor
    aopc_suff: Tensor


def ferret_aopc(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor, attributions: Tensor,
                protected: Tensor | None = None, *,
                thresholds: Sequence[float] = FERRET_THRESHOLDS, only_positive: bool = True,
                **options: Any) -> FerretResult:
    """ferret's AOPC comprehensiveness and sufficiency (``aopc_compr``, ``aopc_suff``).

    Args:
        score_fn (Callable): the scorer, ideally returning class probabilities.
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        attributions (Tensor): ``(B, n)`` relevance per position.
        protected (Tensor, optional): ``(B, n)`` bool (ferret: the first and last token).
        thresholds (Sequence[float]): fractions of ``n``; ``k = floor(t · n)``.
        only_positive (bool): keep only tokens with positive relevance in a rationale.
        **options: the keywords every metric shares (:class:`PerturbOptions`: ``perturbation``,
                    ``token_id``, ``target``, ``pad_token_id``, ``padding_side``, ``batch_size``); ``perturbation`` is
                    ``"remove"`` unless given.

    Returns:
        FerretResult: per-threshold scores and the two AOPCs.
    """
    perturbation, token_id, target, pad_token_id, padding_side, batch_size = \
        PerturbOptions.of(options, "remove").fields()
    setup = _setup(score_fn, input_ids, attention_mask, attributions, protected, target,
                   perturbation, token_id, padding_side, batch_size)
    ranks, n_tokens = rank_positions(attributions.to(input_ids.device), setup.protected)
    n_tokens = n_tokens.cpu()
    counts = tokens_for_fractions(n_tokens, thresholds, "floor")
    if only_positive:
        free = ~setup.protected
        positive = ((attributions.to(free.device) > 0) & free).sum(dim=1).cpu()
        counts = torch.minimum(counts, positive.unsqueeze(1))
    evaluated = torch.zeros_like(counts, dtype=torch.bool)
    last = torch.zeros_like(n_tokens)  # size of the last evaluated rationale (0: none yet)
    for step in range(counts.shape[1]):
        fresh = (counts[:, step] > 0) & (counts[:, step] != last)
        evaluated[:, step] = fresh
        last = torch.where(fresh, counts[:, step], last)
    top = _prefix_masks(ranks, setup.protected, counts, "deletion")
    rest = ~top & ~setup.protected.unsqueeze(1)
    live = evaluated.to(top.device).unsqueeze(2)
    k = counts.shape[1]
    scores, _ = _score(score_fn, setup, torch.cat([top & live, rest & live], dim=1),
                       perturbation, token_id, pad_token_id)
    drops = setup.base.unsqueeze(1) - scores
    skipped = ~torch.cat([evaluated, evaluated], dim=1)
    drops = drops.masked_fill(skipped, float("nan"))
    comp, suff = drops[:, :k], drops[:, k:]
    none = ~evaluated.any(dim=1)
    aopc_compr = torch.where(none, torch.zeros(()), comp.nanmean(dim=1).nan_to_num(0.0))
    aopc_suff = torch.where(none, torch.ones(()), suff.nanmean(dim=1).nan_to_num(1.0))
    return FerretResult(torch.as_tensor(list(thresholds), dtype=torch.float64), counts,
                        evaluated, comp, suff, aopc_compr.to(torch.float64),
                        aopc_suff.to(torch.float64))


# ---------------------------------------------------------------------------------------
# ABPC


@dataclass(frozen=True)
class AbpcResult:
    """AttnLRP's area between the LeRF and MoRF perturbation curves.

    Attributes:
        morf (PerturbationCurve): most relevant first.
        lerf (PerturbationCurve): least relevant first.
        abpc (Tensor): ``(B,)`` area under ``LeRF - MoRF``.
    """

    morf: PerturbationCurve
    lerf: PerturbationCurve
    abpc: Tensor


def abpc(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor, attributions: Tensor,
         protected: Tensor | None = None, *, fractions: Sequence[float] | None = None,
         rounding: str = "floor", reduction: str = "trapezoid", **options: Any) -> AbpcResult:
    """Area between the least- and most-relevant-first deletion curves (higher is better).

    Args:
        score_fn (Callable): the scorer, ideally returning the target logit (AttnLRP).
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        attributions (Tensor): ``(B, n)`` relevance per position.
        protected (Tensor, optional): ``(B, n)`` bool, never perturbed nor counted.
        fractions (Sequence[float], optional): the step grid; default one token per step.
        rounding (str): how ``fractions`` become counts.
        reduction (str): ``"trapezoid"`` (area over ``x = k/n``) or ``"mean"`` (mean
                    over the steps of ``LeRF - MoRF``).
        **options: the keywords every metric shares (:class:`PerturbOptions`: ``perturbation``,
                    ``token_id``, ``target``, ``pad_token_id``, ``padding_side``, ``batch_size``); ``perturbation`` is
                    ``"zero_embedding"`` unless given.

    Returns:
        AbpcResult: both curves and the ABPC per example.
    """
    perturbation, token_id, target, pad_token_id, padding_side, batch_size = \
        PerturbOptions.of(options, "zero_embedding").fields()
    if reduction not in ("trapezoid", "mean"):
        raise ValueError(f"reduction must be 'trapezoid' or 'mean', got {reduction!r}")
    curves = [
        perturbation_curve(score_fn, input_ids, attention_mask, attributions, protected,
                           most_relevant_first=first, mode="deletion",
                           perturbation=perturbation, token_id=token_id, fractions=fractions,
                           rounding=rounding, target=target, pad_token_id=pad_token_id,
                           padding_side=padding_side, batch_size=batch_size)
        for first in (True, False)
    ]
    morf, lerf = curves
    if reduction == "trapezoid":
        value = lerf.auc() - morf.auc()
    else:
        value = (lerf.scores - morf.scores).nanmean(dim=1)
    return AbpcResult(morf, lerf, value)


# ---------------------------------------------------------------------------------------
# leave-one-out and Kendall's tau


def leave_one_out(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor,
                  protected: Tensor | None = None, **options: Any) -> Tensor:
    r"""The score drop ``s(x) - s(x \ {j})`` when each single token is taken out.

    Args:
        score_fn (Callable): the scorer.
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        protected (Tensor, optional): ``(B, n)`` bool, positions left alone.
        **options: the keywords every metric shares (:class:`PerturbOptions`: ``perturbation``,
                    ``token_id``, ``target``, ``pad_token_id``, ``padding_side``, ``batch_size``); ``perturbation`` is
                    ``"remove"`` unless given.

    Returns:
        Tensor: ``(B, n)`` float64, 0 at protected positions.
    """
    perturbation, token_id, target, pad_token_id, padding_side, batch_size = \
        PerturbOptions.of(options, "remove").fields()
    setup = _setup(score_fn, input_ids, attention_mask, None, protected, target, perturbation,
                   token_id, padding_side, batch_size)
    n = input_ids.shape[1]
    eye = torch.eye(n, dtype=torch.bool, device=setup.protected.device)
    where = eye.unsqueeze(0) & ~setup.protected.unsqueeze(2)
    scores, _ = _score(score_fn, setup, where, perturbation, token_id, pad_token_id)
    drops = setup.base.unsqueeze(1) - scores
    return drops.masked_fill(setup.protected.cpu(), 0.0)


def kendall_tau(x: Tensor, y: Tensor, mask: Tensor | None = None) -> Tensor:
    """Kendall's τ-b between the rows of ``x`` and ``y`` (ties handled as in scipy).

    Args:
        x (Tensor): ``(B, n)`` or ``(n,)``.
        y (Tensor): the same shape.
        mask (Tensor, optional): bool, the positions to compare (default: all).

    Returns:
        Tensor: ``(B,)`` (or a scalar for 1-D input), NaN when a row has fewer than two
        positions or is constant.
    """
    if x.shape != y.shape:
        raise ValueError(f"x shape {tuple(x.shape)} differs from y shape {tuple(y.shape)}")
    if x.dim() not in (1, 2):
        raise ValueError(f"x must be (n,) or (batch, n), got shape {tuple(x.shape)}")
    single = x.dim() == 1
    a = x.detach().to("cpu", torch.float64).reshape(-1, x.shape[-1])
    b = y.detach().to("cpu", torch.float64).reshape(-1, y.shape[-1])
    if mask is None:
        keep = torch.ones_like(a, dtype=torch.bool)
    else:
        if mask.shape != x.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} differs from x shape {tuple(x.shape)}")
        keep = mask.detach().to("cpu", torch.bool).reshape(a.shape)
    out = torch.full((a.shape[0],), float("nan"), dtype=torch.float64)
    for row in range(a.shape[0]):
        u, v = a[row][keep[row]], b[row][keep[row]]
        if not (torch.isfinite(u).all() and torch.isfinite(v).all()):
            raise ValueError("kendall_tau needs finite values at the compared positions")
        su = torch.sign(u.unsqueeze(0) - u.unsqueeze(1)).triu(1)
        sv = torch.sign(v.unsqueeze(0) - v.unsqueeze(1)).triu(1)
        denominator = math.sqrt(float(su.abs().sum()) * float(sv.abs().sum()))
        if denominator > 0:
            out[row] = float((su * sv).sum()) / denominator
    return out[0] if single else out


def taucorr_loo(score_fn: ScoreFn, input_ids: Tensor, attention_mask: Tensor, attributions: Tensor,
                protected: Tensor | None = None, *, loo: Tensor | None = None, **options: Any) -> Tensor:
    """ferret's ``taucorr_loo``: Kendall's τ-b between an attribution and leave-one-out.

    Args:
        score_fn (Callable): the scorer.
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        attributions (Tensor): ``(B, n)`` relevance per position.
        protected (Tensor, optional): ``(B, n)`` bool, left out of the comparison.
        loo (Tensor, optional): a precomputed :func:`leave_one_out` to reuse.
        **options: the keywords every metric shares (:class:`PerturbOptions`: ``perturbation``,
                    ``token_id``, ``target``, ``pad_token_id``, ``padding_side``, ``batch_size``); ``perturbation`` is
                    ``"remove"`` unless given.

    Returns:
        Tensor: ``(B,)`` τ per example.
    """
    perturbation, token_id, target, pad_token_id, padding_side, batch_size = \
        PerturbOptions.of(options, "remove").fields()
    check_batch(input_ids, attention_mask)
    if tuple(attributions.shape) != tuple(input_ids.shape):
        raise ValueError(
            f"attributions shape {tuple(attributions.shape)} differs from input_ids shape "
            f"{tuple(input_ids.shape)}"
        )
    if loo is None:
        loo = leave_one_out(score_fn, input_ids, attention_mask, protected,
                            perturbation=perturbation, token_id=token_id, target=target,
                            pad_token_id=pad_token_id, padding_side=padding_side,
                            batch_size=batch_size)
    elif tuple(loo.shape) != tuple(input_ids.shape):
        raise ValueError(f"loo shape {tuple(loo.shape)} differs from input_ids shape {tuple(input_ids.shape)}")
    free = ~protected_or_padding(attention_mask, protected)
    return kendall_tau(attributions, loo, free)
