"""The Ray backend on a local Ray with 2 CPUs: same shards as the local backend, a killed
worker's batch retried, an interrupted run resumed."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from captum_ffb.jobs import run_job

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@contextmanager
def _printed_to(sink):
    """What this process (and what it starts) writes to its standard output and error, into
    ``sink`` (a file), at the level of the file descriptors."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A local Ray of 2 CPUs for the module; what starting it printed (``None``: it was started
    before)."""
    from captum_ffb.jobs.ray import start

    path = tmp_path_factory.mktemp("ray") / "printed.txt"
    with path.open("w") as sink, _printed_to(sink), pytest.MonkeyPatch.context() as patch:
        patch.delenv("RAY_AUTH_MODE", raising=False)
        started = start(ray, None, 2)
    yield path.read_text() if started else None
    if started:
        ray.shutdown()


@dataclass
class CubesJob:
    """Cubes of the items in batches of two; one batch may kill its worker or fail once."""

    items: list[int]
    marker: str = ""
    action: str = ""  # "exit": the worker process dies; "raise": the job raises
    victim: int = 1
    shard_version = 1

    def fingerprint(self) -> dict:
        return {"fingerprint": f"cubes-{self.items}"}

    def plan(self) -> list[list[int]]:
        return [list(range(k, min(k + 2, len(self.items)))) for k in range(0, len(self.items), 2)]

    def setup(self) -> int:
        return os.getpid()

    def run_batch(self, state, index, batch):
        if index == self.victim and self.marker and not Path(self.marker).exists():
            Path(self.marker).write_text("done")
            if self.action == "exit":
                os._exit(1)
            raise RuntimeError("a job error")
        values = np.asarray([self.items[p] for p in batch], dtype=np.float64)
        return {"positions": np.asarray(batch), "cubes": values**3, "pid": np.asarray(state)}


def _cubes(shards):
    return np.concatenate([s["cubes"] for s in shards])


def test_same_shards_as_the_local_engine_on_two_workers(tmp_path, local_ray):
    job = CubesJob(list(range(9)))
    local = run_job(job, tmp_path / "local", show_progress=False)
    remote = run_job(job, tmp_path / "ray", backend="ray", show_progress=False,
                     backend_options={"workers": 2})
    np.testing.assert_array_equal(_cubes(local), _cubes(remote))
    assert len({int(s["pid"]) for s in remote}) == 2  # two workers shared the batches
    assert os.getpid() not in {int(s["pid"]) for s in remote}


def test_a_killed_worker_has_its_batch_retried(tmp_path, local_ray):
    job = CubesJob(list(range(8)), marker=str(tmp_path / "killed"), action="exit")
    shards = run_job(job, tmp_path / "out", backend="ray", show_progress=False,
                     backend_options={"workers": 2})
    assert (tmp_path / "killed").exists()  # a worker did die
    np.testing.assert_array_equal(_cubes(shards), np.arange(8.0) ** 3)
    positions = np.concatenate([s["positions"] for s in shards])
    assert sorted(positions.tolist()) == list(range(8))  # nothing lost, nothing twice


def test_an_interrupted_run_resumes_from_its_shards(tmp_path, local_ray):
    job = CubesJob(list(range(8)), marker=str(tmp_path / "failed"), action="raise", victim=3)
    with pytest.raises(RuntimeError, match="batch 3 failed"):
        run_job(job, tmp_path / "out", backend="ray", show_progress=False,
                backend_options={"workers": 1})
    written = sorted(p.name for p in (tmp_path / "out" / "shards").glob("*.npz"))
    assert "batch-00003.npz" not in written and written  # the earlier batches were kept
    shards = run_job(job, tmp_path / "out", backend="ray", show_progress=False,
                     backend_options={"workers": 2})
    np.testing.assert_array_equal(_cubes(shards), np.arange(8.0) ** 3)


def test_without_ray_installed_the_engine_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ValueError, match=r'pip install "captum_ffb\[ray\]"'):
        run_job(CubesJob([1, 2]), tmp_path, backend="ray", show_progress=False)


def test_analyze_on_ray_equals_the_local_engine(tmp_path, local_ray):
    """The corpus analysis through the CLI, local and on two Ray workers: same numbers."""
    import json

    from captum_ffb.cli import main
    from tests.models import CORPUS_LINES, TINY_MODELS, corpus_tokenizer

    folder = tmp_path / "model"
    TINY_MODELS["gpt2"].build().save_pretrained(folder)
    corpus_tokenizer(folder)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS_LINES) + "\n", encoding="utf-8")
    common = ["analyze", "--model", str(folder), "--data", str(corpus), "--batch-size", "2",
              "--no-figures", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--backend", "ray", "--workers", "2"]) == 0
    local = json.loads((tmp_path / "local" / "results.json").read_text())
    remote = json.loads((tmp_path / "ray" / "results.json").read_text())

    def numbers(value):
        if isinstance(value, dict):
            return [x for k in sorted(value) for x in numbers(value[k])]
        if isinstance(value, list):
            return [x for item in value for x in numbers(item)]
        return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []

    a, b = np.asarray(numbers(local["layers"]), float), np.asarray(numbers(remote["layers"]), float)
    assert a.size == b.size > 100
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_engine_flags_are_checked(tmp_path, capsys):
    from captum_ffb.cli import main

    assert main(["analyze", "--out", str(tmp_path), "--workers", "2"]) == 2
    assert "--workers needs --backend ray" in capsys.readouterr().err
    assert main(["analyze", "--out", str(tmp_path), "--backend", "ray", "--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["analyze", "--out"], ["evaluate", "--task", "sentiment", "--out"],
                                     ["explain", "--data", "texts.txt", "--out"]])
def test_gpus_per_worker_without_a_gpu_fails_before_ray_or_the_model_starts(
        tmp_path, capsys, monkeypatch, command):
    """An embedded Ray without GPUs would wait forever for ``--gpus-per-worker 1``."""
    import torch

    import captum_ffb.explained.models
    from captum_ffb.cli import main

    def never(*args, **kwargs):
        raise AssertionError("started too early")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ray, "init", never)
    monkeypatch.setattr(captum_ffb.explained.models, "load_model", never)
    monkeypatch.chdir(tmp_path)
    assert main([*command, str(tmp_path / "out"), "--backend", "ray", "--gpus-per-worker", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["captum-ffb: error: --gpus-per-worker 1 needs 1 GPUs, and this machine has 0; use "
                   "--gpus-per-worker 0 (CPU), or --address to join a Ray cluster with GPUs"]
    assert main([*command, str(tmp_path / "out"), "--backend", "ray", "--gpus-per-worker", "0.5",
                 "--workers", "3"]) == 2
    assert "--gpus-per-worker 0.5 with --workers 3 needs 1.5 GPUs" in capsys.readouterr().err


def test_a_cluster_without_enough_gpus_is_one_line(tmp_path, local_ray, capsys):
    """Joining a running Ray (here the local one) that has fewer GPUs than the workers need:
    a one-line error instead of actors waiting forever."""
    from captum_ffb.cli import main
    from tests.models import save_tiny_lm

    gpus = ray.cluster_resources().get("GPU", 0)
    with pytest.raises(ValueError, match=f"the Ray cluster has {gpus:g} GPUs, and 1 worker needs 64"):
        run_job(CubesJob([1, 2]), tmp_path / "job", backend="ray", show_progress=False,
                backend_options={"gpus_per_worker": 64})
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\na dog\n")
    model = save_tiny_lm(tmp_path / "model")
    capsys.readouterr()
    argv = ["explain", "--data", str(texts), "--model", str(model),
            "--out", str(tmp_path / "out"), "--quiet", "--backend", "ray", "--address", "auto",
            "--workers", "2", "--gpus-per-worker", "64"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"captum-ffb: error: the Ray cluster has {gpus:g} GPUs, and 1 worker needs 64")


def test_one_sequence_split_across_two_workers_adds_up(tmp_path, local_ray):
    """The players of one sequence in three parts on two Ray workers: the sum equals one
    process's forward route and its backward route."""
    import torch

    from captum_ffb import NormDecomposition
    from captum_ffb.jobs import ModelSource, attribute_split
    from tests.models import save_tiny, token_ids

    folder = save_tiny("llama", tmp_path / "model")
    source = ModelSource(str(folder), causal_lm=False)
    ids = token_ids(batch=1, n=9)
    direction = torch.linspace(-1, 1, 32)
    from captum_ffb import Direction

    target = Direction(direction, pooling="last")
    split, bias = attribute_split(source, ids, target, parts=3, out=tmp_path / "parts",
                                  backend="ray", backend_options={"workers": 2}, show_progress=False)
    model = source.load().model
    whole, whole_bias = NormDecomposition(model).attribute(ids, target=target, route="forward",
                                                           return_bias=True)
    torch.testing.assert_close(split, whole, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(bias, whole_bias, atol=1e-6, rtol=1e-6)
    backward = NormDecomposition(model).attribute(ids, target=target)
    torch.testing.assert_close(split, backward, atol=1e-5, rtol=1e-5)
    assert len(list((tmp_path / "parts" / "shards").glob("*.npz"))) == 3


def test_evaluate_on_ray_equals_the_local_engine(tmp_path, local_ray):
    """The faithfulness run through the CLI, local and on two Ray workers: same numbers."""
    import json

    from captum_ffb.cli import main
    from tests.models import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "model")
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat\na dog was tired\nshe loves math\nbig red cat\n")
    common = ["evaluate", "--model", str(folder), "--task", "next-token", "--data", str(texts),
              "--methods", "decomposition,rollout,random", "--batch-size", "1", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--backend", "ray", "--workers", "2"]) == 0
    local = json.loads((tmp_path / "local" / "results.json").read_text())
    remote = json.loads((tmp_path / "ray" / "results.json").read_text())
    keys = ("decompx_aopc", "decompx_accuracy", "comprehensiveness", "sufficiency", "abpc")
    for a, b in zip(local["rows"], remote["rows"]):
        assert a["method"] == b["method"]
        np.testing.assert_allclose([a[k] for k in keys], [b[k] for k in keys], rtol=1e-6, atol=1e-6)


def test_explain_corpus_on_ray_equals_the_local_engine(tmp_path, local_ray):
    """``explain --data`` local and on two Ray workers: the same explanations."""
    import json

    from captum_ffb.cli import main
    from tests.models import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "model")
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat\na dog was tired\nshe loves math\nbig red cat\nhello world\n")
    common = ["explain", "--data", str(texts), "--model", str(folder), "--batch-size", "2", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--backend", "ray", "--workers", "2"]) == 0
    local = [json.loads(x) for x in (tmp_path / "local" / "explanations.jsonl").read_text().splitlines()]
    remote = [json.loads(x) for x in (tmp_path / "ray" / "explanations.jsonl").read_text().splitlines()]
    assert [x["text"] for x in local] == [x["text"] for x in remote] and len(local) == 5
    for a, b in zip(local, remote):
        assert a["target"] == b["target"]
        np.testing.assert_allclose(a["contributions"], b["contributions"], rtol=1e-6, atol=1e-6)


def test_starting_ray_prints_nothing(local_ray):
    """No token-authentication notice, no "Started a local Ray instance" or dashboard line."""
    if local_ray is None:
        pytest.skip("Ray was started before this module")
    for line in ("Token authentication", "Started a local Ray instance", "dashboard"):
        assert line not in local_ray, local_ray
