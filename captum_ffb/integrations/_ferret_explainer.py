"""The decomposition as a ferret explainer. It subclasses ferret's ``BaseExplainer``, so it
imports ferret: reach it through :mod:`captum_ffb.integrations.ferret`, which says how to
install ferret when it is missing."""

from __future__ import annotations

from typing import Any

import torch
from ferret.explainers import BaseExplainer
from ferret.explainers.explanation import Explanation
from ferret.explainers.utils import parse_explainer_args

from captum_ffb.attr.norm_decomposition import NormDecomposition
from captum_ffb.explained.readouts import ReadOut


class NormDecompositionExplainer(BaseExplainer):
    r"""ferret explainer: the signed contribution of every token (``[CLS]`` and ``[SEP]``
    included, as ferret's own explainers give them) to the explained class's logit, from
    :class:`~captum_ffb.attr.NormDecomposition`.

    ``target`` is what ferret passes: a class index. On a Hugging Face sequence classifier it
    is that class's logit; on a :class:`~captum_ffb.integrations.ferret.ReadOutClassifier` the
    read-out's logit of that class (the contributions to ``z`` with the sign of class 1, to
    ``−z`` for class 0). Any read-out of :mod:`captum_ffb.explained.readouts` is taken too (ferret's
    metrics then need a class index of their own). ``call_args`` (ferret's convention for
    options) go to :meth:`~captum_ffb.attr.NormDecomposition.attribute`, e.g.
    ``explainer(text, 1, call_args={"reference": "mean"})``.

    Args:
        model: a Hugging Face sequence classifier, or a
                    :class:`~captum_ffb.integrations.ferret.ReadOutClassifier`.
        tokenizer: its tokenizer.

    Examples::

        >>> from ferret import Benchmark, GradientExplainer
        >>> from captum_ffb.integrations.ferret import (NormDecompositionExplainer,
        ...                                             minilm_sentiment_classifier)
        >>> model, tokenizer = minilm_sentiment_classifier()
        >>> bench = Benchmark(model, tokenizer, explainers=[
        ...     NormDecompositionExplainer(model, tokenizer), GradientExplainer(model, tokenizer)])
        >>> explanations = bench.explain("a gorgeous, witty film", target=1)
        >>> evaluations = bench.evaluate_explanations(explanations, target=1)
    """

    NAME = "NormDecomposition"

    def __init__(self, model: Any, tokenizer: Any) -> None:
        from captum_ffb.integrations._readout_classifier import ReadOutClassifier

        super().__init__(model, tokenizer)
        self.readout_model = model if isinstance(model, ReadOutClassifier) else None
        self.decomposition = NormDecomposition(model if self.readout_model is None else model.model)

    def _target(self, target: int | ReadOut) -> tuple[int | ReadOut, float]:
        """The decomposition's target and the sign its contributions are multiplied by."""
        if self.readout_model is None or isinstance(target, ReadOut):
            return target, 1.0
        readout, sign = self.readout_model.readout.for_class(torch.tensor([int(target)]))
        return readout, float(sign[0])

    def compute_feature_importance(self, text: str, target: int | ReadOut = 1,
                                   **explainer_args: Any) -> Explanation:
        """The explanation of ``text`` for ``target`` (a class index or a read-out)."""
        _, call_args = parse_explainer_args(explainer_args)
        item = self._tokenize(text)
        ids = item["input_ids"].to(self.device)
        mask = item["attention_mask"].to(self.device)
        nd_target, sign = self._target(target)
        with torch.enable_grad():
            contributions = self.decomposition.attribute(
                ids, target=nd_target, forward_kwargs={"attention_mask": mask}, **call_args)
        scores = (contributions[0].detach().double() * sign).cpu().numpy()
        return Explanation(text, self.get_tokens(text), scores, self.NAME, target)
