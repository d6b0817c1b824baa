r"""Faithfulness against ground truth: next-token predictions whose evidence is annotated.

Each example is a prefix, a grammatical and an ungrammatical next word, and the word of the
prefix that decides between them (BLiMP agreement and licensing, indirect object
identification; see ``data/evidence/README.md``). A method explains the contrast
``logit(good) − logit(bad)`` at the prefix's last position (the first token of each word, with
its leading space); only pairs the model gets right are scored. A faithful method ranks the
evidence first, whatever its position: every table holds the position-only controls
(``recency``, ``previous_token``, ``first_token``) and ``random`` beside the methods.

Scores per example (the evidence word may span several tokens: its best-ranked piece counts):

* **reciprocal rank** of the evidence (ties count at their mean rank, so a constant scores
  what a random order would on average), its mean over examples the **MRR**;
* **top-1**: the evidence ranked first, alone;
* **share**: ``Σ_evidence |a_j| / Σ_j |a_j|``, the part of the attribution's mass on it;
* **distance**: tokens between the evidence's last piece and the prediction (0: the
  evidence is the token just before it).

The copy task (:func:`~captum_ffb.evaluation.copy_task.copy_task`) joins as the subset
``copy``: random token sequences repeated at controlled distances, the evidence the answer's
earlier occurrence, the contrast ``logit(answer) − logit(the token that followed it)``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from captum_ffb.corpus import read_csv_records
from captum_ffb.evaluation.evaluate import check_methods, check_peer
from captum_ffb.evaluation.methods import METHODS
from captum_ffb.evaluation.tasks import Batch, EvaluationTask, Example
from captum_ffb.jobs.job import ModelSource, check_run, fingerprint_of, run_job
from captum_ffb.models import LoadedModel
from captum_ffb.outputs import atomic_open, check_out_dir
from captum_ffb.readouts import Contrast, NextToken
from captum_ffb.stats import mean_sem

#: The bundled data (see its README for sources and license).
EVIDENCE_DIR = Path(__file__).resolve().parent / "data" / "evidence"
#: The columns an evidence CSV needs.
COLUMNS = ("one_prefix_prefix", "one_prefix_word_good", "one_prefix_word_bad", "target")
#: The splits: rows at positions that are multiples of 5 were used to choose defaults.
SPLITS = ("heldout", "selection", "all")
#: Copy-task subset: lengths of the random sequence (evidence-to-prediction distance L − 2).
COPY_LENGTHS = (4, 8, 16, 32)
#: Distance buckets of the tables (tokens between the evidence and the prediction).
DISTANCE_BUCKETS = ((0, 0), (1, 1), (2, 3), (4, 7), (8, None))
#: The default methods of an evidence run.
DEFAULT_METHODS = ("decomposition,decomposition_frozen,decomposition_lrp_attention,"
                   "decomposition_ig_attention,decomposition_frozen_mean,integrated_gradients,"
                   "input_x_gradient,attention_last,recency,previous_token,first_token,random")


def bundled_subsets() -> list[str]:
    """The bundled subsets' names (``"ioi"``, ``"blimp_npi_present_1"``, …), sorted."""
    return sorted(path.stem for path in EVIDENCE_DIR.glob("*.csv"))


@dataclass(frozen=True)
class EvidenceRow:
    """One annotated pair, as read: ``subset``, ``row`` (its position in the file), the
    ``prefix``, the ``good`` and ``bad`` next words and the ``evidence`` word."""

    subset: str
    row: int
    prefix: str
    good: str
    bad: str
    evidence: str


def in_split(row: int, split: str) -> bool:
    """Whether the ``row``-th row of a file belongs to ``split``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    return split == "all" or (row % 5 == 0) == (split == "selection")


def read_evidence(data: str | os.PathLike | Sequence[str] | None = None, split: str = "heldout",
                  n: int | None = None) -> list[EvidenceRow]:
    r"""Annotated pairs from the bundled subsets or a CSV of the same columns.

    Args:
        data: ``None`` (every bundled subset), subset names (:func:`bundled_subsets`, a list
                    or a comma string), or a CSV file with the columns :data:`COLUMNS`.
        split (str): ``"heldout"`` (rows not at multiples of 5, the default), ``"selection"``
                    or ``"all"``; a file of your own is read whole.
        n (int, optional): the first ``n`` rows of the split per subset.

    Returns:
        list[EvidenceRow]
    """
    if data is None or isinstance(data, (list, tuple)) or (
            isinstance(data, str) and not data.endswith(".csv") and not Path(data).exists()):
        names = bundled_subsets() if data is None else (
            [s.strip() for s in data.split(",") if s.strip()] if isinstance(data, str) else list(data))
        unknown = [name for name in names if name not in bundled_subsets() and name != "copy"]
        if unknown:
            raise ValueError(f"unknown evidence subset {unknown[0]!r}; bundled: "
                             f"{', '.join(bundled_subsets())} (and copy), or give a CSV file")
        files = [(EVIDENCE_DIR / f"{name}.csv", split) for name in names if name != "copy"]
    else:
        files = [(Path(data), "all")]
    rows: list[EvidenceRow] = []
    for path, part in files:
        rows += _read_file(path, part, n)
    return rows


def _read_file(path: Path, split: str, n: int | None) -> list[EvidenceRow]:
    if not path.is_file():
        raise FileNotFoundError(f"--data {path}: no such file")
    header, records = read_csv_records(path)
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{path}: missing column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)}; an evidence CSV needs {', '.join(COLUMNS)}")
    out = []
    for k, (line, record) in enumerate(records):
        if not in_split(k, split):
            continue
        if n is not None and len(out) >= n:
            break
        empty = [c for c in COLUMNS if record.get(c) is None]
        if empty:
            raise ValueError(f"{path}: line {line} has no {', '.join(empty)} (too few fields)")
        out.append(EvidenceRow(path.stem, k, record["one_prefix_prefix"], record["one_prefix_word_good"],
                               record["one_prefix_word_bad"], record["target"]))
    return out


@dataclass(frozen=True)
class EvidenceExample:
    """A tokenised pair: ``ids``, the ``good`` and ``bad`` next-token ids, the ``evidence``
    positions, its ``distance`` to the prediction, and where it came from."""

    subset: str
    row: int
    ids: tuple[int, ...]
    good: int
    bad: int
    evidence: tuple[int, ...]

    @property
    def distance(self) -> int:
        return len(self.ids) - 1 - max(self.evidence)


def evidence_example(tokenizer: Any, row: EvidenceRow) -> tuple[EvidenceExample | None, str | None]:
    r"""Tokenise one pair: ``(example, None)``, or ``(None, why it is left out)``.

    Left out: the two words start with the same token (nothing to contrast), the evidence
    word is not in the prefix, or every token of the prefix is evidence (nothing to rank).

    Raises:
        ValueError: the tokenizer merges the evidence word with a neighbour (a token that
                    starts before it, past a space, or runs past its end).
    """
    encoded = tokenizer(row.prefix, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    good = tokenizer(" " + row.good.strip(), add_special_tokens=False)["input_ids"]
    bad = tokenizer(" " + row.bad.strip(), add_special_tokens=False)["input_ids"]
    if not good or not bad or good[0] == bad[0]:
        return None, "the good and bad words start with the same token"
    spans = [m.span() for m in re.finditer(r"(?<!\w)" + re.escape(row.evidence.strip()) + r"(?!\w)", row.prefix)]
    if not spans:
        return None, "the evidence word is not in the prefix"
    evidence = []
    for k, (a, b) in enumerate(offsets):
        for start, end in spans:
            if a < end and b > start:
                if row.prefix[a:start].strip() or b > end:
                    raise ValueError(
                        f"{row.subset} row {row.row}: the tokenizer merges the evidence word "
                        f"{row.evidence!r} with its neighbours (token {row.prefix[a:b]!r})")
                evidence.append(k)
    if len(set(evidence)) == len(ids):
        return None, "every token of the prefix is evidence"
    return EvidenceExample(row.subset, row.row, tuple(int(i) for i in ids), int(good[0]), int(bad[0]),
                           tuple(sorted(set(evidence)))), None


def copy_examples(tokenizer: Any, per_length: int = 20, lengths: Sequence[int] = COPY_LENGTHS,
                  seed: int = 0) -> list[EvidenceExample]:
    r"""The copy task as evidence examples: for each length ``L``, random sequences of ``L``
    distinct tokens followed by their first two again; the evidence is the answer's earlier
    occurrence (distance ``L − 2``), the contrast the answer against the token after it."""
    from captum_ffb.evaluation.copy_task import copy_task

    words = [t for t in range(len(tokenizer)) if re.fullmatch(r"Ġ?[a-z]{3,}", tokenizer.convert_ids_to_tokens(t) or "")]
    examples = []
    for length in lengths:
        task = copy_task(len(words), n_sequences=per_length, length=length, repeated=2, seed=seed + length)
        for k in range(len(task)):
            ids = [words[int(t)] for t in task.input_ids[k]]
            answer = int(task.answer_positions[k])
            examples.append(EvidenceExample("copy", length * 1000 + k, tuple(ids), ids[answer],
                                            ids[answer + 1], (answer,)))
    return examples


def reciprocal_ranks(attributions: Tensor, mask: Tensor, evidence: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""Reciprocal rank, top-1 and share of the evidence per row.

    Args:
        attributions (Tensor): ``(B, n)``, larger = more relevant.
        mask (Tensor): ``(B, n)`` 1 for the tokens ranked (the prefix's real tokens).
        evidence (Tensor): ``(B, n)`` bool, the evidence positions.

    Returns:
        ``(rr, top1, share)``, each ``(B,)``: a tie counts at its mean rank.
    """
    real = mask.bool()
    a = attributions.float().masked_fill(~real, float("-inf"))
    rr, top1 = [], []
    for row in range(a.shape[0]):
        values = a[row, real[row]]
        best = None
        for position in torch.nonzero(evidence[row] & real[row]).flatten().tolist():
            v = a[row, position]
            above = int((values > v).sum())
            ties = int((values == v).sum()) - 1
            rank = 1 + above + ties / 2
            best = rank if best is None else min(best, rank)
        rr.append(1.0 / best)
        top1.append(1.0 if best == 1 else 0.0)
    magnitude = attributions.float().abs() * real
    share = (magnitude * evidence).sum(1) / magnitude.sum(1).clamp_min(1e-30)
    return torch.tensor(rr), torch.tensor(top1), share.cpu()


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
    return Example(e.ids, tuple(True for _ in e.ids), None, index)


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
    #: a model already loaded in this process (local engine only; workers load ``source``)
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
        b = task.batch([_as_example(e, k) for e, k in zip(chosen, batch)])
        evidence = torch.zeros(b.input_ids.shape, dtype=torch.bool)
        width = b.input_ids.shape[1]
        for row, e in enumerate(chosen):  # left padding: positions shift by the padding
            for position in e.evidence:
                evidence[row, width - len(e.ids) + position] = True
        values = task.values(b)
        out: dict[str, np.ndarray] = {"index": b.index.cpu().numpy(), "value": values.cpu().numpy()}
        for name in self.methods:
            options = {**METHODS[name].options, **self.options.get(name, {}), "seed": self.seed}
            if name == "attnlrp":
                options["precomputed"] = pre
            start = time.perf_counter()
            attr = METHODS[name].fn(task, b, b.index, options).float().cpu()
            out[f"{name}.seconds"] = np.array([time.perf_counter() - start])
            if not torch.isfinite(attr).all():
                raise RuntimeError(f"{name} gave non-finite attributions")
            rr, top1, share = reciprocal_ranks(attr, b.attention_mask.cpu(), evidence)
            out[f"{name}.rr"], out[f"{name}.top1"], out[f"{name}.share"] = rr.numpy(), top1.numpy(), share.numpy()
            out[f"{name}.token_share"] = (attr.sum(1) / values.cpu()).numpy()
        return out


def select_evidence(tokenizer: Any, rows: Sequence[EvidenceRow], max_length: int | None = None
                    ) -> tuple[list[EvidenceExample], dict[str, int]]:
    """The usable examples of ``rows`` and how many were left out, by reason."""
    examples, skipped = [], {}
    for row in rows:
        example, why = evidence_example(tokenizer, row)
        if example is not None and max_length is not None and len(example.ids) > max_length:
            example, why = None, "longer than the model takes"
        if example is None:
            skipped[why] = skipped.get(why, 0) + 1
        else:
            examples.append(example)
    return examples, skipped


def _correct(task: EvidenceTask, examples: list[EvidenceExample], batch_size: int) -> list[bool]:
    """Whether the model prefers the good word, per example."""
    kept = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        b = task.batch([_as_example(e, start + k) for k, e in enumerate(chunk)])
        kept += (task.values(b) > 0).tolist()
    return kept


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
    engine: str = "local",
    engine_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    r"""Rank the annotated evidence of next-token predictions with ``methods``; write the run
    into ``out`` (``results.md``, ``results.csv``, ``results.json``, ``examples.csv``).

    Args:
        model (str or LoadedModel): a causal LM folder (a ``.gguf`` folder works), or one
                    loaded by :func:`~captum_ffb.models.load_model` (its ``source`` is what
                    Ray workers load).
        data: see :func:`read_evidence` (``None``: every bundled subset).
        methods: names of :data:`~captum_ffb.evaluation.methods.METHODS` (comma list).
        out: the run's folder (resumable: the same command continues it).
        split (str): ``"heldout"``, ``"selection"`` or ``"all"`` of the bundled data.
        n (int, optional): pairs read per subset (before the model's mistakes are dropped).
        copy (int): copy-task sequences per length (:data:`COPY_LENGTHS`) to add as the
                    subset ``copy`` (0: none).
        batch_size, options, engine, engine_options, overwrite, show_progress, seed, device:
                    as for :func:`~captum_ffb.evaluation.evaluate.evaluate`.

    Returns:
        dict: the summary (:func:`summarise_evidence`), also in ``out/results.json``.

    Examples::

        >>> summary = evaluate_evidence("./SmolLM2", methods="decomposition,recency,random", n=50)
        >>> summary["methods"]["decomposition"]["all"]["mrr"]
    """
    from captum_ffb.models import model_config, task_from_config

    chosen = check_methods(methods, batch_size, options)
    folder = check_out_dir(out)
    rows = read_evidence(data, split, n)  # a missing file or column fails before the model loads
    given = model if isinstance(model, LoadedModel) else None
    if given is not None:
        model = given.source
        if model is None and engine != "local":
            raise ValueError("a model built in memory runs on the local engine only: give its folder")
    config = given.model.config if given is not None else model_config(model)
    if task_from_config(config) != "causal_lm":
        raise ValueError("the evidence task explains next tokens: it needs a causal LM")
    check_peer(chosen, config)
    source = ModelSource(name=model, task="causal_lm", device=device)
    loaded = given if given is not None else source.load()
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
    precomputed = str(folder / "attnlrp.npz") if "attnlrp" in chosen else None
    job = EvidenceJob(source, examples, chosen, batch_size, options or {}, precomputed, seed,
                      loaded if engine == "local" else None)
    check_run(job, folder / "run", overwrite)  # a refused run writes nothing
    folder.mkdir(parents=True, exist_ok=True)
    if precomputed is not None and (overwrite or not Path(precomputed).is_file()):
        _attnlrp_contrasts(examples, Path(precomputed), str(model), batch_size)
    shards = run_job(job, folder / "run", engine=engine, overwrite=overwrite,
                     show_progress=show_progress, description="evidence", engine_options=engine_options)
    summary = summarise_evidence(shards, examples, chosen)
    summary.update(model=loaded.name, model_type=loaded.model_type, split=split,
                   data="bundled" if data is None else str(data), read=len(rows), skipped=skipped,
                   options={m: {**METHODS[m].options, **(options or {}).get(m, {})} for m in chosen})
    write_evidence_report(summary, shards, examples, folder)
    return summary


def _attnlrp_contrasts(examples: list[EvidenceExample], path: Path, model_dir: str, batch_size: int) -> None:
    """AttnLRP's (lxt) relevance of each contrast, saved to ``path``."""
    from captum_ffb.evaluation.peers import attnlrp_relevance

    requests = [{"input_ids": list(e.ids), "target_position": -1, "contrast": (e.good, e.bad)} for e in examples]
    relevances, _ = attnlrp_relevance(requests, model_dir=model_dir, timeout=None)
    with atomic_open(path, "wb") as handle:
        np.savez(handle, **{f"r{k}": r for k, r in enumerate(relevances)})


def _bucket(distance: int) -> str:
    for low, high in DISTANCE_BUCKETS:
        if distance >= low and (high is None or distance <= high):
            return str(low) if low == high else (f"{low}+" if high is None else f"{low}-{high}")
    return "?"


def summarise_evidence(shards: list[dict[str, np.ndarray]], examples: Sequence[EvidenceExample],
                       methods: Sequence[str]) -> dict[str, Any]:
    r"""Per method: MRR (± standard error), top-1 and share overall, per subset and per
    distance bucket; the token share ``Σ_j a_j / value`` (median, min, max) and seconds per
    example."""
    index = np.concatenate([s["index"] for s in shards]).astype(int)
    subsets = np.array([examples[k].subset for k in index])
    buckets = np.array([_bucket(examples[k].distance) for k in index])
    groups = {"all": np.ones(len(index), dtype=bool)}
    groups.update({name: subsets == name for name in sorted(set(subsets))})
    by_distance = {name: buckets == name for name in dict.fromkeys(_bucket(low) for low, _ in DISTANCE_BUCKETS)}
    summary: dict[str, Any] = {"n": int(len(index)), "subsets": {k: int(v.sum()) for k, v in groups.items()},
                               "distances": {k: int(v.sum()) for k, v in by_distance.items()}, "methods": {}}
    for method in methods:
        values = {key: np.concatenate([s[f"{method}.{key}"] for s in shards])
                  for key in ("rr", "top1", "share", "token_share")}
        row: dict[str, Any] = {}
        for name, chosen in {**groups, **{f"distance {k}": v for k, v in by_distance.items()}}.items():
            if not chosen.any():
                continue
            mrr, sem = mean_sem(values["rr"][chosen])
            row[name] = {"mrr": mrr, "mrr_sem": sem, "top1": float(values["top1"][chosen].mean()),
                         "share": float(values["share"][chosen].mean()), "n": int(chosen.sum())}
        ts = values["token_share"]
        row["token_share"] = {"median": float(np.median(ts)), "min": float(ts.min()), "max": float(ts.max())}
        seconds = sum(float(s[f"{method}.seconds"].sum()) for s in shards)
        row["seconds_per_example"] = seconds / max(len(index), 1)
        summary["methods"][method] = row
    return summary


#: Methods whose ``Σ_j a_j`` is meant to be the explained value (the others: "–").
def _completes(method: str) -> bool:
    return method.startswith("decomposition") or method == "attnlrp"


#: Short names of the bundled subsets for table headings.
SHORT = {"blimp_anaphor_gender_agreement": "anaphor gender", "blimp_anaphor_number_agreement": "anaphor number",
         "blimp_determiner_noun_agreement_1": "det.–noun", "blimp_distractor_agreement_relational_noun": "distractor",
         "blimp_npi_present_1": "NPI", "blimp_regular_plural_subject_verb_agreement_1": "plural subj.–verb"}


def _number(value: Any, digits: int = 3) -> str:
    return "–" if value is None or value != value else f"{value:.{digits}f}"


def evidence_table(summary: dict[str, Any]) -> str:
    """The Markdown table: per method the overall MRR ± s.e., top-1, evidence share, token
    share (``Σ tokens / value``: median [min, max], for the methods meant to add up to the
    value), the MRR of each subset and the seconds per example."""
    subsets = [k for k in summary["subsets"] if k != "all"]
    head = ["method", "MRR", "top-1", "evidence share", "Σ tokens / value",
            *[f"{SHORT.get(s, s)} ({summary['subsets'][s]})" for s in subsets], "s / example"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for method, row in summary["methods"].items():
        overall, share = row["all"], row["token_share"]
        token = (f"{_number(share['median'])} [{_number(share['min'])}, {_number(share['max'])}]"
                 if _completes(method) else "–")
        cells = [f"`{method}`", f"{_number(overall['mrr'])} ± {_number(overall['mrr_sem'])}",
                 _number(overall["top1"]), _number(overall["share"]), token,
                 *[_number(row[s]["mrr"]) if s in row else "–" for s in subsets],
                 _number(row["seconds_per_example"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def distance_table(summary: dict[str, Any]) -> str:
    """MRR per distance bucket (tokens between the evidence and the prediction)."""
    buckets = [k for k, v in summary["distances"].items() if v]
    head = ["method", *[f"{k} ({summary['distances'][k]})" for k in buckets]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * len(buckets)]
    for method, row in summary["methods"].items():
        lines.append("| " + " | ".join([f"`{method}`", *[_number(row.get(f"distance {k}", {}).get("mrr"))
                                                            for k in buckets]]) + " |")
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (JSON's ``null``)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def write_evidence_report(summary: dict[str, Any], shards: list[dict[str, np.ndarray]],
                          examples: Sequence[EvidenceExample], folder: Path) -> None:
    """``results.json``, ``results.md``, ``results.csv`` (method × group) and ``examples.csv``
    (one row per example and method) into ``folder``."""
    import json

    from captum_ffb.outputs import write_text

    write_text(folder / "results.json", json.dumps(_finite(summary), indent=2, allow_nan=False, default=str))
    counts = ", ".join(f"{k} {v}" for k, v in summary["subsets"].items() if k != "all")
    skipped = "; ".join(f"{why}: {count}" for why, count in summary.get("skipped", {}).items()) or "none"
    text = (f"# Evidence of next-token predictions\n\nModel `{summary.get('model')}`, split "
            f"`{summary.get('split')}`: {summary['n']} pairs scored ({counts}) of {summary.get('read')} read; "
            f"left out: {skipped}.\n\nMRR of the evidence token (± standard error), top-1, the share of "
            f"|attribution| on it, and `Σ tokens / value` (median [min, max]) for the methods meant to "
            f"add up to the explained contrast; then the MRR per subset.\n\n{evidence_table(summary)}\n\n"
            f"## By distance from the evidence to the prediction (tokens; examples)\n\n{distance_table(summary)}\n")
    write_text(folder / "results.md", text)
    lines = ["method,group,n,mrr,mrr_sem,top1,share"]
    for method, row in summary["methods"].items():
        for group, scores in row.items():
            if isinstance(scores, dict) and "mrr" in scores:
                lines.append(f"{method},{group},{scores['n']},{scores['mrr']:.6f},{scores['mrr_sem']:.6f},"
                             f"{scores['top1']:.6f},{scores['share']:.6f}")
    write_text(folder / "results.csv", "\n".join(lines) + "\n")
    methods = list(summary["methods"])
    rows = ["subset,row,distance,value," + ",".join(f"{m}.rr" for m in methods)]
    for shard in shards:
        for k, position in enumerate(shard["index"].astype(int)):
            e = examples[position]
            rows.append(f"{e.subset},{e.row},{e.distance},{shard['value'][k]:.6f}," +
                        ",".join(f"{shard[f'{m}.rr'][k]:.4f}" for m in methods))
    write_text(folder / "examples.csv", "\n".join(rows) + "\n")
