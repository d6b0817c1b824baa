r"""The decomposition inside ferret (``ferret-xai``), the benchmark of explainers for text
classifiers: an explainer ferret's ``Benchmark`` takes, the classifier ferret calls for a base
model read through one of our read-outs, tables that work under pandas 3, and a loop that
explains and scores many texts.

* ``NormDecompositionExplainer`` (needs ferret): ``Benchmark(model, tokenizer,
  explainers=[NormDecompositionExplainer(model, tokenizer), ...])``; ``explain``,
  ``evaluate_explanation(s)`` and ``evaluate_samples`` work as with ferret's own explainers.
* :class:`ReadOutClassifier`: a base model and a two-class read-out
  (:class:`~captum_ffb.explained.readouts.BinaryDirection`, e.g. the bundled MiniLM sentiment head) as
  the Hugging Face-style classifier ferret calls (``.logits``, ``inputs_embeds``,
  ``get_input_embeddings``, ``config.id2label``); :func:`minilm_sentiment_classifier` builds
  it for the bundled all-MiniLM-L6-v2.
* :func:`explanation_table` and :func:`evaluation_table`: ferret's ``show_table`` and
  ``show_evaluation_table(apply_style=False)`` fail under pandas ≥ 2 (a removed pandas
  internal; ``DataFrame.format``); these build the same tables.
* :func:`benchmark_texts`: every explainer and metric of a ``Benchmark`` on a list of texts,
  each explained for its predicted class, with the seconds each explainer took.

ferret 0.4.2 pins ``transformers<5`` (and older captum, numpy, pandas, shap), so it is
installed without its requirements, next to what it imports::

    pip install "captum_ffb[ferret]" && pip install --no-deps ferret-xai==0.4.2 thermostat-datasets==1.1.0

Nothing of ferret is imported until it is used (``import ferret`` takes seconds).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from captum_ffb.integrations._readout_classifier import (
    ReadOutClassifier,
    minilm_sentiment_classifier,
)

if TYPE_CHECKING:
    import pandas as pd

    from captum_ffb.integrations._ferret_explainer import NormDecompositionExplainer

#: How to install the integration (ferret-xai itself without its pinned requirements).
FERRET_INSTALL = ("pip install 'captum_ffb[ferret]' && "
                  "pip install --no-deps ferret-xai==0.4.2 thermostat-datasets==1.1.0")

#: ferret's faithfulness metrics (short names), in its order; the plausibility ones need
#: human rationales.
FAITHFULNESS_METRICS = ("aopc_compr", "aopc_suff", "taucorr_loo")

__all__ = [
    "FAITHFULNESS_METRICS",
    "FERRET_INSTALL",
    "BenchmarkRun",
    "NormDecompositionExplainer",
    "ReadOutClassifier",
    "benchmark_texts",
    "evaluation_table",
    "explanation_table",
    "minilm_sentiment_classifier",
    "require_ferret",
]


def require_ferret() -> Any:
    """Import ferret, or raise an :class:`ImportError` that says how to install it."""
    try:
        return importlib.import_module("ferret")
    except ImportError as error:
        raise ImportError(f"the ferret integration needs ferret-xai: {FERRET_INSTALL}") from error


def __getattr__(name: str) -> Any:
    if name == "NormDecompositionExplainer":
        require_ferret()
        from captum_ffb.integrations._ferret_explainer import NormDecompositionExplainer

        return NormDecompositionExplainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _unique(labels: Sequence[str]) -> list[str]:
    """``labels`` with repeats suffixed ``.1``, ``.2``, … (as ferret's table meant to)."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        count = seen.get(label, 0)
        seen[label] = count + 1
        out.append(label if count == 0 else f"{label}.{count}")
    return out


def explanation_table(explanations: Sequence[Any], remove_first_last: bool = True,
                      style: bool = False) -> Any:
    """ferret's ``Benchmark.show_table``: one row per explainer, one column per token
    (repeated tokens suffixed ``.1``, ``.2``, …).

    Args:
        explanations (list[Explanation]): ferret explanations of one text.
        remove_first_last (bool): leave out the first and last token (``[CLS]``, ``[SEP]``).
        style (bool): a pandas ``Styler`` coloured with ferret's palette (from −1 to 1) and
                    two decimals, as ferret shows it; otherwise the ``DataFrame``.
    """
    import pandas as pd

    if not explanations:
        raise ValueError("no explanations")
    tokens = list(explanations[0].tokens)
    rows = {e.explainer: list(e.scores) for e in explanations}
    if any(len(scores) != len(tokens) for scores in rows.values()):
        raise ValueError("the explanations are not of one text (their token counts differ)")
    table = pd.DataFrame.from_dict(rows, orient="index", columns=_unique(tokens))
    if remove_first_last:
        table = table.iloc[:, 1:-1]
    if not style:
        return table
    from ferret.benchmark import SCORES_PALETTE

    return table.style.background_gradient(axis=1, cmap=SCORES_PALETTE, vmin=-1, vmax=1).format("{:.2f}")


def evaluation_table(evaluations: Sequence[Any]) -> pd.DataFrame:
    """ferret's ``show_evaluation_table(apply_style=False)``: one row per explainer, one
    column per metric.

    Args:
        evaluations (list[ExplanationEvaluation]): from ``Benchmark.evaluate_explanations``.
    """
    import pandas as pd

    rows = {e.explanation.explainer: {s.name: float(s.score) for s in e.evaluation_scores}
            for e in evaluations}
    return pd.DataFrame.from_dict(rows, orient="index")


@dataclass
class BenchmarkRun:
    """What :func:`benchmark_texts` measured.

    Attributes:
        explainers (list[str]): the explainers' names, in the benchmark's order.
        targets (list[int]): the class each text was explained and scored for.
        scores (dict): ``scores[explainer][metric]``: one score per text.
        seconds (dict): ``seconds[explainer]``: the seconds each explanation took.
        explanations (list): per text, the explanations scored (one per explainer).
    """

    explainers: list[str]
    targets: list[int] = field(default_factory=list)
    scores: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)
    explanations: list[list[Any]] = field(default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        """One row per explainer: each metric's mean and standard error over the texts where
        it is finite (Kendall's τ is undefined on a constant explanation), how many those
        are, and the mean seconds per text."""
        from captum_ffb.texts.stats import mean_sem

        rows = []
        for name in self.explainers:
            row: dict[str, Any] = {"explainer": name, "n": len(self.seconds[name]),
                                   "seconds_per_example": sum(self.seconds[name]) / len(self.seconds[name])}
            for metric, values in self.scores[name].items():
                scores = np.asarray(values, dtype=np.float64)
                row[metric], row[f"{metric}_sem"] = mean_sem(scores, finite_only=True)
                finite = int(np.isfinite(scores).sum())
                if finite < len(values):
                    row[f"{metric}_n"] = finite
            rows.append(row)
        return rows

    def table(self) -> pd.DataFrame:
        """:meth:`summary` as a ``DataFrame`` indexed by explainer."""
        import pandas as pd

        return pd.DataFrame(self.summary()).set_index("explainer")


def benchmark_texts(benchmark: Any, texts: Sequence[str], targets: Sequence[int] | None = None,
                    normalize_scores: bool = True, show_progress: bool = False) -> BenchmarkRun:
    r"""Explain every text with every explainer of a ferret ``Benchmark`` and score each
    explanation with its evaluators (as ``evaluate_samples`` does for ferret's datasets),
    timing each explainer.

    Args:
        benchmark (ferret.Benchmark): the explainers, the evaluators, the model.
        texts (list[str]): the texts.
        targets (list[int], optional): the class to explain per text; by default the class
                    the model predicts (ferret's default too).
        normalize_scores (bool): L1-normalise each explanation, as ``Benchmark.explain``
                    does by default (the faithfulness metrics rank, so they do not change).
        show_progress (bool): a progress bar over the texts.

    Returns:
        BenchmarkRun
    """
    from ferret.benchmark import lp_normalize
    from tqdm.auto import tqdm

    if targets is not None and len(targets) != len(texts):
        raise ValueError(f"{len(targets)} targets for {len(texts)} texts")
    names = [e.NAME for e in benchmark.explainers]
    if len(set(names)) != len(names):
        raise ValueError(f"two explainers share a name: {names}")
    run = BenchmarkRun(names, scores={n: {} for n in names}, seconds={n: [] for n in names})
    for k, text in enumerate(tqdm(texts, desc="ferret", disable=not show_progress)):
        if targets is None:
            target = int(benchmark.score(text, return_dict=False).argmax(-1))
        else:
            target = int(targets[k])
        run.targets.append(target)
        explanations = []
        for explainer in benchmark.explainers:
            start = time.perf_counter()
            explanations.append(explainer(text, target))
            run.seconds[explainer.NAME].append(time.perf_counter() - start)
        if normalize_scores:
            explanations = lp_normalize(explanations)
        run.explanations.append(explanations)
        for evaluation in benchmark.evaluate_explanations(explanations, target, show_progress=False):
            for score in evaluation.evaluation_scores:
                run.scores[evaluation.explanation.explainer].setdefault(score.name, []).append(
                    float(score.score))
    return run
