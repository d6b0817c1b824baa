r"""An evidence run: :class:`EvidenceJob` (per batch, every method's attribution scored against
the evidence) and :func:`evaluate_evidence`, which reads the pairs, keeps those the model gets
right, runs the job on any backend (resumable from its shards) and writes the report."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captum_ffb._deprecation import BACKEND_RENAMES, renamed_arguments
from captum_ffb.evaluation.evaluate import check_methods, check_peer
from captum_ffb.evaluation.evidence.data import (
    EvidenceExample,
    EvidenceRow,
    copy_examples,
    read_evidence,
    select_evidence,
)
from captum_ffb.evaluation.evidence.metrics import reciprocal_ranks, summarise_evidence
from captum_ffb.evaluation.evidence.report import write_evidence_report
from captum_ffb.evaluation.evidence.task import EvidenceTask, as_example
from captum_ffb.evaluation.methods import METHODS
from captum_ffb.explained.models import LoadedModel
from captum_ffb.io.files import atomic_open, check_out_dir, output_set
from captum_ffb.jobs.job import ModelSource, check_run, fingerprint_of, run_job

#: The default methods of an evidence run.
DEFAULT_METHODS = ("decomposition,decomposition_frozen,decomposition_lrp_attention,"
                   "decomposition_ig_attention,decomposition_frozen_mean,integrated_gradients,"
                   "input_x_gradient,attention_last,recency,previous_token,first_token,random")


@dataclass
class EvidenceJob:
    """The :class:`~captum_ffb.jobs.job.Job` of :func:`evaluate_evidence` (picklable)."""

    source: ModelSource
    examples: list[EvidenceExample]
    methods: list[str]
    batch_size: int = 16
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    precomputed: str | None = None
    seed: int = 0
    #: a model already loaded in this process (local backend only; workers load ``source``)
    loaded: Any = field(default=None, repr=False, compare=False)
    shard_version: int = 1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "loaded": None}  # workers load their own copy

    def fingerprint(self) -> dict[str, Any]:
        settings = {"model": self.source.name, "task": "evidence", "methods": self.methods,
                    "batch_size": self.batch_size, "options": self.options, "seed": self.seed}
        return {**settings, "examples": len(self.examples),
                "fingerprint": fingerprint_of(settings, [(e.subset, e.row, e.ids, e.good, e.bad, e.evidence)
                                                         for e in self.examples])}

    def plan(self) -> list[list[int]]:
        order = sorted(range(len(self.examples)), key=lambda k: (len(self.examples[k].ids), k))
        return [order[k:k + self.batch_size] for k in range(0, len(order), self.batch_size)]

    def setup(self) -> Any:
        torch.manual_seed(self.seed)
        task = EvidenceTask(self.loaded or self.source.load(), self.examples)
        pre = None
        if self.precomputed:
            data = np.load(self.precomputed, allow_pickle=False)
            pre = [data[f"r{k}"] for k in range(len(self.examples))]
        return task, pre

    def run_batch(self, state: Any, index: int, batch: Sequence[int]) -> dict[str, np.ndarray]:
        task, pre = state
        chosen = [self.examples[k] for k in batch]
        b = task.batch([as_example(e, k) for e, k in zip(chosen, batch)])
        evidence = torch.zeros(b.input_ids.shape, dtype=torch.bool)
        width = b.input_ids.shape[1]
        for row, e in enumerate(chosen):  # left padding: positions shift by the padding
            for position in e.evidence:
                evidence[row, width - len(e.ids) + position] = True
        values = task.values(b)
        target = task.targets(b.index)  # each row's (good, bad) token ids: what is explained
        out: dict[str, np.ndarray] = {"index": b.index.cpu().numpy(), "value": values.cpu().numpy()}
        for name in self.methods:
            options = {**METHODS[name].options, **self.options.get(name, {}), "seed": self.seed}
            if name == "attnlrp":
                options["precomputed"] = pre
            start = time.perf_counter()
            attr = METHODS[name].fn(task, b, target, options).float().cpu()
            out[f"{name}.seconds"] = np.array([time.perf_counter() - start])
            if not torch.isfinite(attr).all():
                raise RuntimeError(f"{name} gave non-finite attributions")
            rr, top1, share = reciprocal_ranks(attr, b.attention_mask.cpu(), evidence)
            out[f"{name}.rr"], out[f"{name}.top1"], out[f"{name}.share"] = rr.numpy(), top1.numpy(), share.numpy()
            out[f"{name}.token_share"] = (attr.sum(1) / values.cpu()).numpy()
        return out


def _correct(task: EvidenceTask, examples: list[EvidenceExample], batch_size: int) -> list[bool]:
    """Whether the model prefers the good word, per example."""
    kept = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        b = task.batch([as_example(e, start + k) for k, e in enumerate(chunk)])
        kept += (task.values(b) > 0).tolist()
    return kept


@renamed_arguments(BACKEND_RENAMES)
def evaluate_evidence(
    model: str | LoadedModel | None,
    data: str | os.PathLike | Sequence[str] | None = None,
    methods: str | Sequence[str] = DEFAULT_METHODS,
    out: str | os.PathLike = "captum_ffb_evidence",
    split: str = "heldout",
    n: int | None = 100,
    copy: int = 0,
    batch_size: int = 16,
    options: dict[str, dict[str, Any]] | None = None,
    backend: str = "local",
    backend_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    r"""Rank the annotated evidence of next-token predictions with ``methods``; write the run
    into ``out`` (``results.md``, ``results.csv``, ``results.json``, ``examples.csv``).

    Args:
        model (str or LoadedModel): a causal LM folder (a ``.gguf`` folder works), or one
                    loaded by :func:`~captum_ffb.explained.models.load_model` (its ``source`` is what
                    Ray workers load).
        data: see :func:`read_evidence` (``None``: every bundled subset).
        methods: names of :data:`~captum_ffb.evaluation.methods.METHODS` (comma list).
        out: the run's folder (resumable: the same command continues it).
        split (str): ``"heldout"``, ``"selection"`` or ``"all"`` of the bundled data.
        n (int, optional): pairs read per subset (before the model's mistakes are dropped).
        copy (int): copy-task sequences per length (:data:`COPY_LENGTHS`) to add as the
                    subset ``copy`` (0: none).
        batch_size, options, backend, backend_options, overwrite, show_progress, seed, device:
                    as for :func:`~captum_ffb.evaluation.evaluate.evaluate`.

    Returns:
        dict: the summary (:func:`summarise_evidence`), also in ``out/results.json``.

    Examples::

        >>> summary = evaluate_evidence("./SmolLM2", methods="decomposition,recency,random", n=50)
        >>> summary["methods"]["decomposition"]["all"]["mrr"]
    """
    chosen = check_methods(methods, batch_size, options)
    folder = check_out_dir(out)
    rows = read_evidence(data, split, n)  # a missing file or column fails before the model loads
    model, source, loaded = _causal_model(model, backend, device, chosen)
    examples, skipped = _right_pairs(loaded, rows, copy, seed, batch_size)
    precomputed = str(folder / "attnlrp.npz") if "attnlrp" in chosen else None
    job = EvidenceJob(source, examples, chosen, batch_size, options or {}, precomputed, seed,
                      loaded if backend == "local" else None)
    check_run(job, folder / "run", overwrite)  # a refused run writes nothing
    folder.mkdir(parents=True, exist_ok=True)
    if precomputed is not None and (overwrite or not Path(precomputed).is_file()):
        _attnlrp_contrasts(examples, Path(precomputed), str(model), batch_size)
    shards = run_job(job, folder / "run", backend=backend, overwrite=overwrite,
                     show_progress=show_progress, description="evidence", backend_options=backend_options)
    summary = summarise_evidence(shards, examples, chosen)
    summary.update(model=loaded.name, model_type=loaded.model_type, split=split,
                   data="bundled" if data is None else str(data), read=len(rows), skipped=skipped,
                   options={m: {**METHODS[m].options, **(options or {}).get(m, {})} for m in chosen})
    with output_set(folder, "the output folder") as files:  # the report as one set (the shards stay)
        write_evidence_report(summary, shards, examples, files.staging)
    return summary


def _causal_model(model: str | LoadedModel | None, backend: str, device: str,
                  chosen: Sequence[str]) -> tuple[str | None, ModelSource, LoadedModel]:
    """The model's name (a loaded model's ``source``), its source and the loaded model, checked:
    a causal LM, the peer's environment ready, an in-memory model on the local backend only."""
    from captum_ffb.explained.models import model_config, task_from_config

    given = model if isinstance(model, LoadedModel) else None
    if given is not None:
        model = given.source
        if model is None and backend != "local":
            raise ValueError("a model built in memory runs on the local backend only: give its folder")
    config = given.model.config if given is not None else model_config(model)
    if task_from_config(config) != "causal_lm":
        raise ValueError("the evidence task explains next tokens: it needs a causal LM")
    check_peer(chosen, config)
    source = ModelSource(name=model, task="causal_lm", device=device)
    loaded = given if given is not None else source.load()
    return model, source, loaded


def _right_pairs(loaded: LoadedModel, rows: Sequence[EvidenceRow], copy: int, seed: int,
                 batch_size: int) -> tuple[list[EvidenceExample], dict[str, int]]:
    """The usable pairs (and copy-task sequences) the model gets right, and the counts of
    those left out by reason."""
    examples, skipped = select_evidence(loaded.tokenizer, rows, loaded.max_length)
    if copy:
        examples += copy_examples(loaded.tokenizer, copy, seed=seed)
    if not examples:
        raise ValueError("no usable evidence pairs" + (f" ({skipped})" if skipped else ""))
    task = EvidenceTask(loaded, examples)
    correct = _correct(task, examples, batch_size)
    wrong = sum(not c for c in correct)
    examples = [e for e, c in zip(examples, correct) if c]
    if wrong:
        skipped["the model prefers the bad word"] = wrong
    if not examples:
        raise ValueError("the model gets no pair right")
    return examples, skipped


def _attnlrp_contrasts(examples: list[EvidenceExample], path: Path, model_dir: str, batch_size: int) -> None:
    """AttnLRP's (lxt) relevance of each contrast, saved to ``path``."""
    from captum_ffb.evaluation.peers import attnlrp_relevance

    requests = [{"input_ids": list(e.ids), "target_position": -1, "contrast": (e.good, e.bad)} for e in examples]
    relevances, _ = attnlrp_relevance(requests, model_dir=model_dir, timeout=None)
    with atomic_open(path, "wb") as handle:
        np.savez(handle, **{f"r{k}": r for k, r in enumerate(relevances)})
