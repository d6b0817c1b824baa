r"""What an evidence run explains: :class:`EvidenceTask`, the contrast of each example's two
next tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from captum_ffb.evaluation.evidence.data import EvidenceExample
from captum_ffb.evaluation.tasks import Batch, EvaluationTask, Example
from captum_ffb.explained.readouts import Contrast


class EvidenceTask(EvaluationTask):
    r"""An :class:`~captum_ffb.evaluation.tasks.EvaluationTask` of kind ``"evidence"``: what is
    explained for each example is its contrast ``logit(good) − logit(bad)`` at the last
    position, so the methods' ``target`` is ``(B, 2)``: each row's good and bad token ids
    (:meth:`targets` of the batch's example indices, ``batch.index``).

    Args:
        loaded (LoadedModel): a causal LM.
        examples (Sequence[EvidenceExample]): the examples, by index.
    """

    kinds = ("evidence",)

    def __init__(self, loaded: Any, examples: Sequence[EvidenceExample]) -> None:
        super().__init__(loaded, "evidence")
        #: ``(E, 2)`` the good and bad token ids of every example
        self.pairs = torch.tensor([[e.good, e.bad] for e in examples], dtype=torch.long)

    def targets(self, index: Tensor) -> Tensor:
        """``(B, 2)`` the good and bad token ids of the examples at ``index`` (example indices,
        as in ``Batch.index``): the ``target`` the methods explain."""
        return self.pairs.to(index.device)[index]

    def decomposition_target(self, target: Tensor) -> tuple[Contrast, Tensor]:
        """The ``NormDecomposition`` target of ``(B, 2)`` good and bad token ids: their
        :class:`~captum_ffb.explained.readouts.Contrast`, with the sign 1."""
        return Contrast(target[:, 0], target[:, 1]), torch.ones(target.shape[0], device=target.device)

    def contrast(self, logits: Tensor, target: Tensor) -> Tensor:
        """``(B,)`` ``logit(good) − logit(bad)`` from last-position logits ``(B, V)`` and
        ``(B, 2)`` good and bad token ids."""
        target = target.to(logits.device)
        return logits.gather(1, target[:, :1])[:, 0] - logits.gather(1, target[:, 1:])[:, 0]

    def target_score(self, inputs_embeds: Tensor, attention_mask: Tensor, target: Tensor) -> Tensor:
        outputs = self.forward(attention_mask, inputs_embeds=inputs_embeds)
        return self.contrast(outputs.logits[:, -1], target)

    def values(self, batch: Batch) -> Tensor:
        """``(B,)`` the explained contrast on the unperturbed inputs."""
        with torch.no_grad():
            outputs = self.forward(batch.attention_mask, input_ids=batch.input_ids)
        return self.contrast(outputs.logits[:, -1], self.targets(batch.index))


def as_example(e: EvidenceExample, index: int) -> Example:
    """An evidence example as the task's :class:`~captum_ffb.evaluation.tasks.Example`: every
    token a player, no label, ``index`` its position in the run's examples."""
    return Example(e.ids, tuple(True for _ in e.ids), None, index)
