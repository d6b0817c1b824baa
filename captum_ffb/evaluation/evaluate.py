r"""Run the faithfulness protocols for several methods on one task, on any backend.

:func:`evaluate` loads the texts, builds an :class:`EvaluationJob` (batches of examples; per
batch every method's attribution, its cost, and every protocol's per-example scores) and runs
it with :func:`captum_ffb.jobs.run_job`, so a run is resumable from its shards and runs
locally or on Ray. :func:`summarise` turns the shards into one row per method.

Protocols (definitions in ``captum_ffb.evaluation.metrics``):

* ``decompx``: the top ``K %`` of the players replaced by the mask token (``[MASK]``; a causal
  LM has none: its ``unk`` token, else padding), ``K = 0 … 90``; AOPC of the predicted class's
  probability over ``K = 10 … 90``, and the accuracy on the masked inputs (against the gold
  labels when the data has them, else against the unperturbed prediction).
* ``eraser``: comprehensiveness and sufficiency of the top 1, 5, 10, 20, 50 % of the players,
  tokens deleted, on the predicted class's probability, averaged over the bins.
* ``abpc``: input embeddings of the players zeroed most and least relevant first, on the
  predicted class's logit, at 0, 20, …, 100 % of the players; the area between the curves.
* ``schemes`` (not in ``all``): ERASER's comprehensiveness and sufficiency under each way of
  taking a token out (:data:`SCHEMES`: deleted, its input embedding zeroed, replaced by the
  ``unk``/mask token), and Kendall's τ between the methods' rankings under each pair of
  schemes: a protocol whose schemes disagree does not separate the methods.

``keep_first`` leaves every example's first position unperturbed (the attention sink of
causal LMs, which have no BOS token in front: SmolLM2).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captum_ffb._deprecation import BACKEND_RENAMES, renamed_arguments
from captum_ffb.evaluation.methods import METHODS, check_option, resolve_methods, resolve_names
from captum_ffb.evaluation.metrics import (
    DECOMPX_RATIOS,
    ERASER_BINS,
    abpc,
    decompx_aopc,
    eraser_faithfulness,
    kendall_tau,
)
from captum_ffb.evaluation.tasks import EvaluationTask, Example
from captum_ffb.explained.readouts import PromptContrast
from captum_ffb.io.files import atomic_open, check_out_dir, output_set
from captum_ffb.jobs.job import ModelSource, check_run, fingerprint_of, run_job
from captum_ffb.texts.corpus import SkippedLine, read_rows, skip_reason, write_skipped
from captum_ffb.texts.corpus import read_texts as read_texts  # importable from here, as before
from captum_ffb.texts.stats import mean_sem

#: The protocols, in the order of the report; ``all`` means the first three.
PROTOCOLS = ("decompx", "eraser", "abpc", "schemes")
#: The ways of taking a token out that ``schemes`` compares: name → ``perturb``'s name.
SCHEMES = {"delete": "remove", "zero": "zero_embedding", "unk": "replace"}
#: ABPC's grid: fractions of the players zeroed.
ABPC_FRACTIONS = tuple(k / 5 for k in range(6))


def resolve_protocols(names: str | Sequence[str]) -> list[str]:
    """Protocol names from a comma list (``all`` = decompx, eraser and abpc)."""
    if names == "all" or (not isinstance(names, str) and list(names) == ["all"]):
        return list(PROTOCOLS[:3])
    return resolve_names(names, PROTOCOLS, "protocol")


class _PeakRss:
    """Peak resident memory above the level at entry, sampled every few milliseconds."""

    def __enter__(self) -> _PeakRss:
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


@dataclass
class EvaluationJob:
    """The :class:`~captum_ffb.jobs.job.Job` of :func:`evaluate` (picklable)."""

    source: ModelSource
    task: str
    examples: list[Example]
    methods: list[str]
    protocols: list[str]
    batch_size: int = 16
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    template: str | None = None
    labels: tuple[str, str] | None = None
    precomputed: str | None = None
    seed: int = 0
    keep_first: bool = False
    shard_version: int = 1

    def fingerprint(self) -> dict[str, Any]:
        settings = {"model": self.source.name, "task": self.task, "methods": self.methods,
                    "protocols": self.protocols, "batch_size": self.batch_size,
                    "options": self.options, "template": self.template, "labels": self.labels,
                    "seed": self.seed}
        if self.keep_first:  # only when set, so that earlier runs keep their fingerprint
            settings["keep_first"] = True
        return {**settings, "examples": len(self.examples),
                "fingerprint": fingerprint_of(settings, [(e.ids, e.players, e.label) for e in self.examples])}

    def plan(self) -> list[list[int]]:
        order = sorted(range(len(self.examples)), key=lambda k: (len(self.examples[k].ids), k))
        return [order[k:k + self.batch_size] for k in range(0, len(order), self.batch_size)]

    def setup(self) -> Any:
        torch.manual_seed(self.seed)
        loaded = self.source.load()
        task = EvaluationTask(loaded, self.task, self.template, self.labels, keep_first=self.keep_first)
        pre = None
        if self.precomputed:
            data = np.load(self.precomputed, allow_pickle=False)
            pre = {"relevance": [data[f"r{k}"] for k in range(len(self.examples))],
                   "seconds": data["seconds"], "peak_mb": data["peak_mb"]}
        return task, pre

    def run_batch(self, state: Any, index: int, batch: Sequence[int]) -> dict[str, np.ndarray]:
        task, pre = state
        b = task.batch([self.examples[k] for k in batch])
        target = task.predict(b)
        # a next token has no gold label (the data's labels are sentiment classes)
        gold = b.labels if self.task != "next-token" else torch.full_like(b.labels, -1)
        known = gold >= 0
        out: dict[str, np.ndarray] = {
            "index": b.index.cpu().numpy(), "label": gold.cpu().numpy(), "predicted": target.cpu().numpy(),
            "players": (~b.protected).sum(1).cpu().numpy(),
        }
        accuracy_labels = torch.where(known, gold, target)
        probabilities, logits = task.scorer("probabilities"), task.scorer("logits")
        common = {"target": target, "batch_size": 64}
        for name in self.methods:
            options = {**METHODS[name].options, **self.options.get(name, {}), "seed": self.seed}
            if name == "attnlrp":
                options["precomputed"] = None if pre is None else pre["relevance"]
            with _PeakRss() as memory:
                start = time.perf_counter()
                attr = METHODS[name].fn(task, b, target, options).float()
                seconds = time.perf_counter() - start
            if name == "attnlrp" and pre is not None:
                seconds = float(pre["seconds"][b.index.cpu().numpy()].sum())
                out[f"{name}.peak_mb"] = np.array([float(pre["peak_mb"][b.index.cpu().numpy()].max())])
            else:
                out[f"{name}.peak_mb"] = np.array([memory.extra_mb])
            out[f"{name}.seconds"] = np.array([seconds])
            if not torch.isfinite(attr).all():
                raise RuntimeError(f"{name} gave non-finite attributions")
            if "decompx" in self.protocols:
                r = decompx_aopc(probabilities, b.input_ids, b.attention_mask, attr, b.protected,
                                 mask_token_id=task.replacement_id, labels=accuracy_labels, **common)
                out[f"{name}.decompx_drop"] = r.curve.drops().cpu().numpy()
                correct = r.curve.class_scores.argmax(-1) == accuracy_labels.unsqueeze(1)
                out[f"{name}.decompx_correct"] = correct.cpu().numpy().astype(np.float64)
            if "eraser" in self.protocols:
                r = eraser_faithfulness(probabilities, b.input_ids, b.attention_mask, attr, b.protected,
                                        pad_token_id=task.pad_id, padding_side=task.padding_side, **common)
                out[f"{name}.comprehensiveness"] = r.aopc_comprehensiveness.cpu().numpy()
                out[f"{name}.sufficiency"] = r.aopc_sufficiency.cpu().numpy()
                out[f"{name}.comprehensiveness_bins"] = r.comprehensiveness.cpu().numpy()
                out[f"{name}.sufficiency_bins"] = r.sufficiency.cpu().numpy()
            if "abpc" in self.protocols:
                r = abpc(logits, b.input_ids, b.attention_mask, attr, b.protected,
                         fractions=ABPC_FRACTIONS, **common)
                out[f"{name}.abpc"] = r.abpc.cpu().numpy()
                out[f"{name}.morf"] = r.morf.scores.cpu().numpy()
                out[f"{name}.lerf"] = r.lerf.scores.cpu().numpy()
            if "schemes" in self.protocols:
                for scheme, perturbation in SCHEMES.items():
                    r = eraser_faithfulness(probabilities, b.input_ids, b.attention_mask, attr, b.protected,
                                            perturbation=perturbation, token_id=task.replacement_id,
                                            pad_token_id=task.pad_id, padding_side=task.padding_side, **common)
                    out[f"{name}.comprehensiveness_{scheme}"] = r.aopc_comprehensiveness.cpu().numpy()
                    out[f"{name}.sufficiency_{scheme}"] = r.aopc_sufficiency.cpu().numpy()
        return out


# ---------------------------------------------------------------------------------------
# data


def select_examples(task: EvaluationTask, texts: Sequence[str], labels: Sequence[int | None],
                    n: int | None = None, max_tokens: int | None = None,
                    ) -> tuple[list[Example], list[SkippedLine]]:
    r"""The first ``n`` usable texts as examples, and the texts left out before them (as
    ``analyze`` does): blank ones, those of more than ``max_tokens`` tokens, and those whose
    example (a causal LM's prompt included) is longer than the model takes.

    Returns:
        ``(examples, skipped)``; an example's ``index`` is its position among the examples,
        a skipped line's ``line`` the text's 1-based position in ``texts``.
    """
    limit = task.loaded.max_length
    examples: list[Example] = []
    skipped: list[SkippedLine] = []
    for k, (text, label) in enumerate(zip(texts, labels)):
        if n is not None and len(examples) >= n:
            break
        count = len(task.tokenizer(text)["input_ids"]) if max_tokens is not None and text.strip() else None
        reason = skip_reason(k, text, count, max_tokens, "--max-tokens")
        if reason is None:
            example = task.example(text, label, len(examples))
            reason = skip_reason(k, text, len(example.ids), limit, "the model's maximum")
        if reason is not None:
            skipped.append(reason)
            continue
        examples.append(example)
    return examples, skipped


# ---------------------------------------------------------------------------------------
# running and summarising


def _attnlrp_relevance(task: EvaluationTask, examples: list[Example], path: Path, model_dir: str,
                       batch_size: int) -> Path:
    """AttnLRP's relevance for every example (one ``lxt`` subprocess), saved to ``path``."""
    from captum_ffb.evaluation.peers import attnlrp_relevance

    if task.loaded.model_type not in ("llama",):
        raise ValueError(f"attnlrp runs on the Llama family only (lxt), not {task.loaded.model_type}")
    requests = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        predicted = task.predict(task.batch(chunk))
        for e, p in zip(chunk, predicted.tolist()):
            request: dict[str, Any] = {"input_ids": list(e.ids), "target_position": -1}
            if isinstance(task.readout, PromptContrast):
                pos, neg = task.readout.positive, task.readout.negative
                request["contrast"] = (pos, neg) if p == 1 else (neg, pos)
            else:
                request["target_id"] = int(p)
            requests.append(request)
    relevances, info = attnlrp_relevance(requests, model_dir=model_dir, timeout=None)
    peak = np.asarray(info["peak_rss_bytes"], dtype=np.float64) / 2**20
    with atomic_open(path, "wb") as handle:
        np.savez(handle, seconds=np.asarray(info["seconds"], dtype=np.float64), peak_mb=peak,
                 **{f"r{k}": r for k, r in enumerate(relevances)})
    return path


def check_methods(methods: str | Sequence[str], batch_size: int,
                  options: dict[str, dict[str, Any]] | None) -> list[str]:
    """The methods of an evaluation, checked with their options and the batch size (before any
    weights load); shared by :func:`evaluate` and the evidence task."""
    chosen = resolve_methods(methods)
    if batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {batch_size}")
    for method, settings in (options or {}).items():
        for key in settings:
            check_option(method, key)
    return chosen


def check_peer(chosen: Sequence[str], config: Any) -> None:
    """With ``attnlrp`` among the methods: the model is a Llama and lxt's environment is ready."""
    if "attnlrp" not in chosen:
        return
    from captum_ffb.evaluation.peers import attnlrp_setup_problem

    if config.model_type != "llama":
        raise ValueError(f"attnlrp runs on the Llama family only (lxt), not {config.model_type}")
    problem = attnlrp_setup_problem()
    if problem:
        raise ValueError(problem)


def _usable_examples(task: EvaluationTask, texts: Sequence[str], labels: Sequence[int | None], n: int | None,
                     max_tokens: int | None, data: Any) -> tuple[list[Example], list[SkippedLine]]:
    """:func:`select_examples`, with a one-line error when none is left or one has no player."""
    examples, skipped = select_examples(task, texts, labels, n, max_tokens)
    if not examples:
        raise ValueError(f"--data {data}: no texts" + (f" of at most {max_tokens} tokens" if max_tokens else "")
                         + f" ({len(skipped)} skipped)")
    empty = [e.index for e in examples if not any(e.players)]
    if empty:
        raise ValueError(f"text {empty[0]} has no token to perturb")
    return examples, skipped


@renamed_arguments(BACKEND_RENAMES)
def evaluate(
    model: str | None,
    task: str,
    data: str | os.PathLike = "rotten_tomatoes",
    methods: str | Sequence[str] = "decomposition,integrated_gradients,random",
    protocols: str | Sequence[str] = "all",
    out: str | os.PathLike = "captum_ffb_evaluate",
    n: int | None = 300,
    max_tokens: int | None = None,
    batch_size: int = 16,
    options: dict[str, dict[str, Any]] | None = None,
    backend: str = "local",
    backend_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
    seed: int = 0,
    template: str | None = None,
    labels: tuple[str, str] | None = None,
    stop_after: int | None = None,
    device: str = "cpu",
    keep_first: bool = False,
) -> dict[str, Any]:
    r"""Evaluate ``methods`` on ``task`` under ``protocols``; write the run into ``out``.

    Args:
        model (str, optional): a model folder or name (the bundled all-MiniLM-L6-v2 by default).
        task (str): ``"next-token"`` or ``"sentiment"``.
        data: ``"rotten_tomatoes"`` or a file (see ``read_texts()``).
        methods: names of :data:`~captum_ffb.evaluation.methods.METHODS` (comma list).
        protocols: names of :data:`PROTOCOLS` (comma list, or ``"all"``).
        out: the run's folder (shards, ``results.csv``/``.md``/``.json``, curves, HTML).
        n (int, optional): how many texts.
        max_tokens (int, optional): skip longer texts.
        batch_size (int): examples per batch (one shard each).
        options (dict, optional): per-method options, e.g. ``{"integrated_gradients":
                    {"n_steps": 20}}``.
        backend, backend_options: see :func:`captum_ffb.jobs.run_job`.
        overwrite (bool): discard an earlier run with other settings in ``out``.
        show_progress (bool): a progress bar.
        seed (int): seeds the random baseline and the sampling methods.
        template, labels: a causal LM's sentiment prompt and label tokens.
        stop_after (int, optional): stop after this many batches (to test resuming).
        device (str): where the model runs (here and in every worker).
        keep_first (bool): never perturb an example's first position (nor count it).

    Returns:
        dict: the summary (see :func:`summarise`), also written to ``out/results.json``.
    """
    chosen = check_methods(methods, batch_size, options)
    protocol_names = resolve_protocols(protocols)
    folder = check_out_dir(out)
    texts, text_labels = read_rows(data)  # a missing or malformed file fails before the model loads
    source, loaded, evaluation_task = _load_task(model, task, device, chosen, template, labels, keep_first)
    examples, skipped = _usable_examples(evaluation_task, texts, text_labels, n, max_tokens, data)
    gold = [e.label for e in examples]
    precomputed = str(folder / "attnlrp.npz") if "attnlrp" in chosen else None
    job = EvaluationJob(source, task, examples, chosen, protocol_names, batch_size,
                        options or {}, template, labels, precomputed, seed, keep_first)
    check_run(job, folder / "run", overwrite)  # a refused run writes nothing
    folder.mkdir(parents=True, exist_ok=True)
    write_skipped(folder / "skipped.csv", skipped)
    if precomputed is not None and (overwrite or not Path(precomputed).is_file()):
        if show_progress:
            print(f"AttnLRP (lxt) on {len(examples)} examples ...", flush=True)
        _attnlrp_relevance(evaluation_task, examples, Path(precomputed), str(model), batch_size)
    shards = run_job(job, folder / "run", backend=backend, overwrite=overwrite,
                     show_progress=show_progress, stop_after=stop_after, description="evaluating",
                     backend_options=backend_options)
    summary = summarise(shards, chosen, protocol_names, task)
    summary.update(model=loaded.name, model_type=loaded.model_type, task=task,
                   data=str(data), examples=len(examples), max_tokens=max_tokens,
                   options={m: {**METHODS[m].options, **(options or {}).get(m, {})} for m in chosen},
                   labelled=task != "next-token" and all(y is not None for y in gold), backend=backend,
                   keep_first=keep_first)
    _write_summary(summary, skipped, folder)
    return summary


def _load_task(model: str | None, task: str, device: str, chosen: Sequence[str], template: str | None,
               labels: tuple[str, str] | None,
               keep_first: bool) -> tuple[ModelSource, Any, EvaluationTask]:
    """The model's source, the loaded model and the evaluation task on it; the peer's
    environment is checked before the weights load."""
    from captum_ffb.explained.models import model_config, task_from_config

    config = model_config(model)
    check_peer(chosen, config)  # before the weights load
    head = task_from_config(config)
    source = ModelSource(name=model, task=head, device=device)
    loaded = source.load()
    return source, loaded, EvaluationTask(loaded, task, template, labels, keep_first=keep_first)


def _write_summary(summary: dict[str, Any], skipped: list[SkippedLine], folder: Path) -> None:
    """The summary, with the skipped texts, written as the run's report (one output set)."""
    from captum_ffb.evaluation.report import write_report

    summary["skipped"] = [asdict(s) for s in skipped]
    with output_set(folder, "the output folder") as files:  # the report as one set (the shards stay)
        write_report(summary, files.staging)


def _concat(shards: list[dict[str, np.ndarray]], key: str) -> np.ndarray:
    return np.concatenate([s[key] for s in shards], axis=0)


def _method_summary(shards: list[dict[str, np.ndarray]], method: str, protocols: Sequence[str],
                    next_token_with_labels: bool) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """One method's row (cost, each protocol's mean score and standard error) and its mean
    curves."""
    n = sum(len(s["index"]) for s in shards)
    row: dict[str, Any] = {"method": method,
                           "seconds_per_example": float(sum(s[f"{method}.seconds"][0] for s in shards)) / n,
                           "peak_mb": float(max(s[f"{method}.peak_mb"][0] for s in shards))}
    curves: dict[str, list[float]] = {}

    def scores(name: str) -> np.ndarray:
        return _concat(shards, f"{method}.{name}")

    if "decompx" in protocols:
        drops, correct = scores("decompx_drop"), scores("decompx_correct")
        row["decompx_aopc"], row["decompx_aopc_sem"] = mean_sem(drops[:, 1:].mean(1), finite_only=True)
        if not next_token_with_labels:  # shards before labels were ignored
            row["decompx_accuracy"] = float(correct[:, 1:].mean())
        curves["decompx"] = drops.mean(0).tolist()
        curves["decompx_accuracy"] = correct.mean(0).tolist()
    if "eraser" in protocols:
        row["comprehensiveness"], row["comprehensiveness_sem"] = mean_sem(scores("comprehensiveness"), finite_only=True)
        row["sufficiency"], row["sufficiency_sem"] = mean_sem(scores("sufficiency"), finite_only=True)
        curves["comprehensiveness"] = np.nanmean(scores("comprehensiveness_bins"), 0).tolist()
        curves["sufficiency"] = np.nanmean(scores("sufficiency_bins"), 0).tolist()
    if "abpc" in protocols:
        row["abpc"], row["abpc_sem"] = mean_sem(scores("abpc"), finite_only=True)
        curves["abpc_morf"] = np.nanmean(scores("morf"), 0).tolist()
        curves["abpc_lerf"] = np.nanmean(scores("lerf"), 0).tolist()
    if "schemes" in protocols:
        for scheme in SCHEMES:
            for score in ("comprehensiveness", "sufficiency"):
                key = f"{score}_{scheme}"
                row[key], row[f"{key}_sem"] = mean_sem(scores(key), finite_only=True)
    return row, curves


def scheme_agreement(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    r"""Kendall's τ between the methods' rankings under each pair of :data:`SCHEMES`, for
    comprehensiveness and sufficiency (``"comprehensiveness delete~zero"`` → τ): near 1 the
    schemes order the methods alike; near 0 the protocol does not separate them."""
    out: dict[str, float] = {}
    names = list(SCHEMES)
    for score in ("comprehensiveness", "sufficiency"):
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                x = torch.tensor([r[f"{score}_{a}"] for r in rows], dtype=torch.float64)
                y = torch.tensor([r[f"{score}_{b}"] for r in rows], dtype=torch.float64)
                finite = torch.isfinite(x) & torch.isfinite(y)
                out[f"{score} {a}~{b}"] = float(kendall_tau(x[finite], y[finite])) if finite.sum() > 1 else float("nan")
    return out


def summarise(shards: list[dict[str, np.ndarray]], methods: Sequence[str],
              protocols: Sequence[str], task: str | None = None) -> dict[str, Any]:
    r"""One row per method: cost and every protocol's score (mean over examples, with the
    standard error), plus the mean curves.

    Returns:
        dict with ``rows`` (list of dicts), ``curves`` (per method: ``decompx`` drops per
        ratio, ``abpc_morf`` / ``abpc_lerf`` mean logit per fraction, ERASER per bin),
        ``accuracy`` (the model's accuracy against the gold labels, when known) and grids.
    """
    label, predicted = _concat(shards, "label"), _concat(shards, "predicted")
    known = label >= 0
    summary: dict[str, Any] = {
        "n": sum(len(s["index"]) for s in shards), "rows": [], "curves": {},
        "accuracy": (float((label[known] == predicted[known]).mean())
                     if known.any() and task != "next-token" else None),
        "decompx_ratios": list(DECOMPX_RATIOS), "eraser_bins": list(ERASER_BINS),
        "abpc_fractions": list(ABPC_FRACTIONS),
        "players_mean": float(_concat(shards, "players").mean()),
    }
    for method in methods:
        row, curves = _method_summary(shards, method, protocols,
                                      next_token_with_labels=task == "next-token" and bool(known.any()))
        summary["rows"].append(row)
        summary["curves"][method] = curves
    if "schemes" in protocols:
        summary["scheme_tau"] = scheme_agreement(summary["rows"])
    ig = next((r for r in summary["rows"] if r["method"] == "integrated_gradients"), None)
    for row in summary["rows"]:
        row["cost_vs_ig"] = (row["seconds_per_example"] / ig["seconds_per_example"]
                             if ig and ig["seconds_per_example"] > 0 else float("nan"))
    return summary
