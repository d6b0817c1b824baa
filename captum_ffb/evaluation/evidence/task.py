r"""What an evidence run explains: :class:`EvidenceTask`, the contrast of each example's two
next tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from captum_ffb.evaluation.evidence.data import EvidenceExample
from captum_ffb.evaluation.tasks import Batch, EvaluationTask, Example
from captum_ffb.readouts import Contrast, NextToken


class EvidenceTask(EvaluationTask):
    r"""An :class:`~captum_ffb.evaluation.tasks.EvaluationTask` on evidence examples: the
    method's ``target`` is the example's index, and what is explained is its contrast
    ``logit(good) − logit(bad)`` at the last position.

    Args:
        loaded (LoadedModel): a causal LM.
        examples (Sequence[EvidenceExample]): the examples, by index.
    """

    def __init__(self, loaded: Any, examples: Sequence[EvidenceExample]) -> None:
        super().__init__(loaded, "next-token")
        self.kind = "evidence"
        self.readout = NextToken()
        self.pairs = torch.tensor([[e.good, e.bad] for e in examples], dtype=torch.long)

    def decomposition_target(self, target: Tensor) -> tuple[Contrast, Tensor]:
        pairs = self.pairs.to(target.device)[target]
        return Contrast(pairs[:, 0], pairs[:, 1]), torch.ones(target.shape[0], device=target.device)

    def contrast(self, logits: Tensor, target: Tensor) -> Tensor:
        """``(B,)`` ``logit(good) − logit(bad)`` from last-position logits ``(B, V)``."""
        pairs = self.pairs.to(logits.device)[target]
        return logits.gather(1, pairs[:, :1])[:, 0] - logits.gather(1, pairs[:, 1:])[:, 0]

    def target_score(self, inputs_embeds: Tensor, attention_mask: Tensor, target: Tensor) -> Tensor:
        outputs = self.forward(attention_mask, inputs_embeds=inputs_embeds)
        return self.contrast(outputs.logits[:, -1], target)

    def values(self, batch: Batch) -> Tensor:
        """``(B,)`` the explained contrast on the unperturbed inputs."""
        with torch.no_grad():
            outputs = self.forward(batch.attention_mask, input_ids=batch.input_ids)
        return self.contrast(outputs.logits[:, -1], batch.index)


def _as_example(e: EvidenceExample, index: int) -> Example:
    """An evidence example as the task's :class:`~captum_ffb.evaluation.tasks.Example`: every
    token a player, no label, ``index`` its position in the run's examples."""
    return Example(e.ids, tuple(True for _ in e.ids), None, index)
