"""The job protocol and the local engine: shards, resuming, refusing other settings."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from captum_ffb.jobs import ShardStore, run_job


@dataclass
class SquaresJob:
    """A toy job: the squares of the items, in batches of three."""

    items: list[int]
    seed: int = 0
    calls: list[int] = field(default_factory=list)
    shard_version = 1

    def fingerprint(self) -> dict:
        return {"fingerprint": f"squares-{self.seed}-{self.items}"}

    def plan(self) -> list[list[int]]:
        return [list(range(k, min(k + 3, len(self.items)))) for k in range(0, len(self.items), 3)]

    def setup(self) -> str:
        return "state"

    def run_batch(self, state, index, batch):
        assert state == "state"
        self.calls.append(index)
        values = np.asarray([self.items[p] for p in batch])
        return {"positions": np.asarray(batch), "squares": values**2}


def _squares(shards) -> list[int]:
    return np.concatenate([s["squares"] for s in shards]).tolist()


def test_runs_every_batch_once_and_resumes(tmp_path):
    job = SquaresJob(list(range(8)))
    with pytest.raises(KeyboardInterrupt):
        run_job(job, tmp_path, show_progress=False, stop_after=2)
    assert job.calls == [0, 1]
    shards = run_job(job, tmp_path, show_progress=False)
    assert job.calls == [0, 1, 2]  # only the missing batch ran
    assert _squares(shards) == [k * k for k in range(8)]


def test_a_damaged_or_older_shard_is_recomputed(tmp_path):
    job = SquaresJob(list(range(6)))
    run_job(job, tmp_path, show_progress=False)
    store = ShardStore(tmp_path, version=1)
    store.path(1).write_bytes(b"not a shard")
    job.calls.clear()
    assert _squares(run_job(job, tmp_path, show_progress=False)) == [k * k for k in range(6)]
    assert job.calls == [1]
    assert ShardStore(tmp_path, version=2).load(0) is None  # another format counts as missing


def test_a_truncated_shard_is_recomputed(tmp_path):
    """Half of a real shard (a zip cut short: ``BadZipFile``) is computed again on resume."""
    clean = _squares(run_job(SquaresJob(list(range(6))), tmp_path / "clean", show_progress=False))
    job = SquaresJob(list(range(6)))
    run_job(job, tmp_path / "cut", show_progress=False)
    path = ShardStore(tmp_path / "cut").path(0)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    assert ShardStore(tmp_path / "cut").load(0) is None
    job.calls.clear()
    assert _squares(run_job(job, tmp_path / "cut", show_progress=False)) == clean
    assert job.calls == [0]


def test_other_settings_are_refused_unless_overwritten(tmp_path):
    run_job(SquaresJob([1, 2]), tmp_path, show_progress=False)
    with pytest.raises(ValueError, match="other settings"):
        run_job(SquaresJob([1, 2], seed=1), tmp_path, show_progress=False)
    assert _squares(run_job(SquaresJob([3], seed=1), tmp_path, overwrite=True,
                            show_progress=False)) == [9]


def test_unknown_engine(tmp_path):
    with pytest.raises(ValueError, match="unknown backend 'spark'"):
        run_job(SquaresJob([1]), tmp_path, backend="spark")
