"""One long sequence across workers: the players split into parts, the parts summed.

With the real coefficients frozen the model is linear in its players, so the forward route
can propagate any subset of players on its own (``NormDecomposition.attribute(...,
route="forward", players=...)``) and the parts add up exactly to the whole. Each part is one
batch of a :class:`~captum_ffb.jobs.Job`, so the parts run on any backend and a run that
stops resumes from the parts already done.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from captum_ffb._deprecation import BACKEND_RENAMES, renamed_arguments
from captum_ffb.jobs.job import ModelSource, fingerprint_of, run_job


@dataclass
class PlayerSplitJob:
    """Contributions to one target, the players propagated part by part (a job)."""

    model: ModelSource
    input_ids: list[list[int]]
    target: Any
    parts: list[list[int]]
    forward_kwargs: dict[str, Any] = field(default_factory=dict)
    memory_budget: int | None = None
    shard_version = 1

    def fingerprint(self) -> dict[str, Any]:
        settings = {"model": self.model.name, "target": repr(self.target), "parts": self.parts}
        return {"fingerprint": fingerprint_of(settings, self.input_ids), "parts": len(self.parts)}

    def plan(self) -> list[list[int]]:
        return [[k] for k in range(len(self.parts))]

    def setup(self) -> Any:
        from captum_ffb.attr import NormDecomposition

        loaded = self.model.load()
        options = {} if self.memory_budget is None else {"memory_budget": self.memory_budget}
        return NormDecomposition(loaded.model, **options)

    def run_batch(self, state: Any, index: int, batch: Sequence[int]) -> dict[str, np.ndarray]:
        (part,) = batch
        ids = torch.as_tensor(self.input_ids)
        contributions, bias, delta = state.attribute(
            ids, target=self.target, route="forward", players=self.parts[part],
            forward_kwargs=self.forward_kwargs, return_bias=True, return_convergence_delta=True)
        return {"contributions": contributions.numpy(), "bias": bias.numpy(),
                "players": np.asarray(self.parts[part])}


@renamed_arguments(BACKEND_RENAMES)
def attribute_split(
    model: ModelSource,
    input_ids: Tensor,
    target: Any,
    parts: int,
    out: str | os.PathLike,
    backend: str = "local",
    backend_options: dict[str, Any] | None = None,
    forward_kwargs: dict[str, Any] | None = None,
    memory_budget: int | None = None,
    players: Sequence[int] | None = None,
    show_progress: bool = True,
) -> tuple[Tensor, Tensor]:
    r"""Contributions of every position to ``target``, the players split into ``parts``
    parts that run as separate batches (on Ray workers with ``backend="ray"``) and are summed.

    Args:
        model (ModelSource): how each worker loads the model.
        input_ids (Tensor): ``(batch, n)`` token ids.
        target (Any): as in ``NormDecomposition.attribute()``.
        parts (int): how many parts the players are split into (contiguous ranges).
        out (str or PathLike): the run's folder (one shard per part; resumable).
        backend (str): ``"local"`` or ``"ray"``.
        backend_options (dict, optional): the backend's settings.
        forward_kwargs (dict, optional): the model's keyword arguments.
        memory_budget (int, optional): each worker's ``NormDecomposition`` budget.
        players (list[int], optional): only these positions (default: all); the rest get 0.
        show_progress (bool): a progress bar over parts.

    Returns:
        ``(contributions (batch, n), bias (batch,))``.
    """
    ids = torch.as_tensor(input_ids)
    chosen = list(range(ids.shape[-1])) if players is None else list(players)
    if not 1 <= parts <= len(chosen):
        raise ValueError(f"parts must lie between 1 and {len(chosen)}, got {parts}")
    groups = [chunk.tolist() for chunk in np.array_split(np.asarray(chosen), parts)]
    job = PlayerSplitJob(model, ids.tolist(), target, groups, dict(forward_kwargs or {}),
                         memory_budget)
    shards = run_job(job, out, backend, show_progress=show_progress, description="player parts",
                     backend_options=backend_options)
    total = sum(torch.as_tensor(s["contributions"]) for s in shards)
    return total, torch.as_tensor(shards[0]["bias"])
