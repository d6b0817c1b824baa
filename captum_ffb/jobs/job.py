"""The job protocol and ``run_job()``, with the local backend."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from captum_ffb._deprecation import BACKEND_RENAMES, renamed_arguments
from captum_ffb.jobs.shards import ShardStore

#: Where ``run_job()`` runs batches.
BACKENDS = ("local", "ray")
#: ``BACKENDS`` (its name before 0.4).
ENGINES = BACKENDS


@dataclass(frozen=True)
class ModelSource:
    """How a worker loads the model: what :func:`captum_ffb.explained.models.load_model` takes.

    Attributes:
        name (str, optional): a model name or folder (``None``: the bundled default).
        causal_lm (bool): load with a language-model head.
        device (str): where the model runs in the worker.
        task (str, optional): the head to load (see :func:`captum_ffb.explained.models.load_model`).
    """

    name: str | None = None
    causal_lm: bool = False
    device: str = "cpu"
    task: str | None = None

    def load(self) -> Any:
        from captum_ffb.explained.models import load_model

        loaded = load_model(self.name, causal_lm=self.causal_lm, show_progress=False,
                            task=self.task)
        loaded.model.to(self.device)
        return loaded


class Job(Protocol):
    """What a backend runs. Jobs are picklable (workers get a copy): keep the model out of
    their state and load it in :meth:`setup`."""

    #: the shard format; shards of another version are recomputed
    shard_version: int

    def fingerprint(self) -> dict[str, Any]:
        """Settings and data identity; a run folder holds one fingerprint."""

    def plan(self) -> list[list[int]]:
        """The batches, as lists of item positions, in a deterministic order."""

    def setup(self) -> Any:
        """Per worker, once: load the model; returns the worker's state."""

    def run_batch(self, state: Any, index: int, batch: Sequence[int]) -> dict[str, np.ndarray]:
        """One batch → one shard."""


def fingerprint_of(settings: dict[str, Any], items: Sequence[Any]) -> str:
    """A stable hash of settings and the exact items of a job."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for item in items:
        digest.update(json.dumps(item, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def check_run(job: Job, out: str | os.PathLike, overwrite: bool = False) -> None:
    """Refuse, before anything is written, to run ``job`` into a folder that holds a run with
    other settings (unless ``overwrite``): see :meth:`ShardStore.check`."""
    ShardStore(out, job.shard_version).check(job.fingerprint(), overwrite)


@renamed_arguments(BACKEND_RENAMES)
def run_job(
    job: Job,
    out: str | os.PathLike,
    backend: str = "local",
    overwrite: bool = False,
    show_progress: bool = True,
    stop_after: int | None = None,
    description: str = "running",
    backend_options: dict[str, Any] | None = None,
) -> list[dict[str, np.ndarray]]:
    r"""Run every batch of ``job`` not yet on disk in ``out``, then return all shards in
    batch order.

    Args:
        job (Job): what to run.
        out (str or PathLike): the run's folder (``run.json`` and ``shards/``).
        backend (str): ``"local"`` (this process) or ``"ray"`` (workers; ``pip install
                    "captum_ffb[ray]"``).
        overwrite (bool): discard an earlier run with another fingerprint in ``out``.
        show_progress (bool): a progress bar over items.
        stop_after (int, optional): stop (``KeyboardInterrupt``) after this many new batches
                    (local backend; to test resuming).
        description (str): the progress bar's label.
        backend_options (dict, optional): the backend's settings (Ray: ``address``,
                    ``workers``, ``gpus_per_worker``).

    Returns:
        the shards, in batch order.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    store = ShardStore(out, job.shard_version)
    settings = job.fingerprint()
    store.open(settings, overwrite)
    batches = job.plan()
    done = store.done(len(batches))
    todo = [k for k in range(len(batches)) if k not in done]
    progress = None
    if show_progress:
        from tqdm.auto import tqdm

        progress = tqdm(total=sum(len(b) for b in batches),
                        initial=sum(len(batches[k]) for k in done), unit="seq",
                        desc=description, dynamic_ncols=True)
    try:
        if todo and backend == "local":
            _run_local(job, store, batches, todo, progress, stop_after)
        elif todo:
            from captum_ffb.jobs.ray import run_ray

            run_ray(job, store, batches, todo, progress, **(backend_options or {}))
    finally:
        if progress is not None:
            progress.close()
    return store.load_all(len(batches))


def _run_local(job: Job, store: ShardStore, batches: list[list[int]], todo: list[int],
               progress: Any, stop_after: int | None) -> None:
    state = job.setup()
    for new, index in enumerate(todo):
        if stop_after is not None and new >= stop_after:
            raise KeyboardInterrupt
        store.save(index, job.run_batch(state, index, batches[index]))
        if progress is not None:
            progress.update(len(batches[index]))
