"""The Ray backend: batches stream to a pool of actors, each loading the model once.

The driver keeps the plan and writes every shard itself (into ``--out``), so workers need no
shared file system: they receive the job once, call its ``setup()`` once, and return one
shard per batch. A worker that dies (killed, out of memory, a lost node) has its batch given
to a new worker; an error raised by the job itself stops the run (the shards already written
stay, and running the command again resumes). Ray is optional: ``pip install
"captum_ffb[ray]"``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captum_ffb.jobs.shards import ShardStore

#: How many times one batch may lose its worker before the run gives up.
MAX_RETRIES = 3


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError('--backend ray needs Ray: pip install "captum_ffb[ray]"') from None
    return ray


class _Worker:
    """One actor: the job's state (the loaded model) and one batch at a time."""

    def __init__(self, job: Any, threads: int | None) -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.job = job
        self.state = job.setup()

    def run(self, index: int, batch: Sequence[int]) -> dict[str, np.ndarray]:
        return self.job.run_batch(self.state, index, batch)

    def pid(self) -> int:
        return os.getpid()


def _runtime_env() -> dict[str, Any]:
    """Workers of an embedded Ray import the same ``captum_ffb`` as the driver."""
    package_parent = str(Path(__file__).resolve().parents[2])
    paths = [package_parent, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
                         "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
                         "TRANSFORMERS_OFFLINE": os.environ.get("TRANSFORMERS_OFFLINE", "1")}}


#: Ray's logger that announces, on every ``ray.init``, that token authentication is on.
_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"


@contextlib.contextmanager
def _quiet_token_notice() -> Iterator[None]:
    """Ray's "Token authentication is enabled for this Ray cluster ..." line is not printed
    (the authentication itself is left as Ray sets it); its errors still are."""
    logger = logging.getLogger(_TOKEN_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def start(ray: Any, address: str | None, workers: int | None) -> bool:
    """Start an embedded Ray (``address=None``) or join a cluster; ``True`` if we started it."""
    if ray.is_initialized():
        return False
    options: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                   logging_level=logging.ERROR, configure_logging=False)
    with _quiet_token_notice():
        if address is None:
            ray.init(num_cpus=max(1, workers or os.cpu_count() or 1), runtime_env=_runtime_env(),
                     **options)
        else:
            ray.init(address=address, **options)
    return True


def run_ray(
    job: Any,
    store: ShardStore,
    batches: list[list[int]],
    todo: list[int],
    progress: Any = None,
    address: str | None = None,
    workers: int | None = None,
    gpus_per_worker: float = 0,
    threads_per_worker: int | None = None,
) -> None:
    r"""Run the batches ``todo`` of ``job`` on Ray actors; the driver writes each shard.

    Args:
        job (Job): the job (sent once to every worker).
        store (ShardStore): where the shards go (the driver's ``--out``).
        batches (list[list[int]]): the job's plan.
        todo (list[int]): the batches still missing.
        progress (tqdm, optional): advanced by each batch's items as its shard is written.
        address (str, optional): ``None`` starts an embedded local Ray; ``"auto"`` (or a
                    ``host:port``) joins a running cluster.
        workers (int, optional): actors in the pool (default: the CPUs Ray offers, or the GPUs
                    over ``gpus_per_worker``).
        gpus_per_worker (float): GPUs each actor reserves (its model runs on one).
        threads_per_worker (int, optional): torch threads in each actor (default: one per
                    CPU the actor reserves).
    """
    ray = _import_ray()
    started = start(ray, address, workers)
    try:
        workers = _pool_size(ray.cluster_resources(), workers, len(todo), gpus_per_worker)
        remote = ray.remote(num_cpus=1, num_gpus=gpus_per_worker or 0)(_Worker)
        shared = ray.put(job)
        threads = threads_per_worker or 1

        def new_worker() -> Any:
            return remote.remote(shared, threads)

        _drain(ray, new_worker, workers, batches, todo, store, progress)
    finally:
        if started:
            ray.shutdown()


def _pool_size(resources: dict[str, Any], workers: int | None, batches: int,
               gpus_per_worker: float) -> int:
    """How many actors to start: ``workers``, or what the cluster offers, at most one per batch;
    ``ValueError`` when the cluster lacks the GPUs they reserve."""
    gpus = float(resources.get("GPU", 0))
    if workers is None:
        by_cpu = int(resources.get("CPU", 1))
        workers = int(gpus // gpus_per_worker) if gpus_per_worker else by_cpu
    workers = max(1, min(workers, batches))
    if gpus_per_worker and gpus_per_worker * workers > gpus + 1e-6:
        # actors that cannot be placed would wait for GPUs forever
        many = "workers need" if workers > 1 else "worker needs"
        raise ValueError(f"the Ray cluster has {gpus:g} GPUs, and {workers} {many} "
                         f"{gpus_per_worker * workers:g} with --gpus-per-worker "
                         f"{gpus_per_worker:g}; lower --workers or --gpus-per-worker (0: CPU)")
    return workers


def _drain(ray: Any, new_worker: Callable[[], Any], workers: int, batches: list[list[int]], todo: list[int],
           store: ShardStore, progress: Any) -> None:
    """Stream the batches ``todo`` through ``workers`` actors, saving each shard as it comes;
    a batch whose actor dies goes to a new one (at most :data:`MAX_RETRIES` times)."""
    pool = [new_worker() for _ in range(workers)]
    queue = list(todo)
    losses = dict.fromkeys(todo, 0)
    running: dict[Any, tuple[Any, int]] = {}

    def assign(actor: Any) -> None:
        if queue:
            index = queue.pop(0)
            running[actor.run.remote(index, batches[index])] = (actor, index)

    for actor in pool:
        assign(actor)
    while running:
        (ready,), _ = ray.wait(list(running), num_returns=1)
        actor, index = running.pop(ready)
        try:
            shard = ray.get(ready)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            losses[index] += 1
            if losses[index] > MAX_RETRIES:
                raise RuntimeError(f"batch {index} lost its worker {losses[index]} times") from None
            queue.insert(0, index)  # the batch goes to a new worker
            actor = new_worker()
        except ray.exceptions.RayTaskError as error:
            raise RuntimeError(f"batch {index} failed in a worker: {error.cause!r}") from error
        else:
            store.save(index, shard)
            if progress is not None:
                progress.update(len(batches[index]))
        assign(actor)
