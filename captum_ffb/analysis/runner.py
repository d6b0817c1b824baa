"""The corpus runner: batches of sequences through the decomposition, statistics per batch,
written as they are done, resumed after an interruption, aggregated at the end.

Each batch is written atomically to ``OUT/shards/batch-NNNNN.npz`` (write to a temporary
file, then rename) holding everything that batch contributes: per-sequence
contextualization changes, FF-amp sums and counts per token pair, norm sums and per-
dimension sums. ``OUT/run.json`` holds a fingerprint of the settings and the exact model
inputs. Rerunning the same command skips the batches already on disk, so an interrupted run
loses at most the batch in flight and counts no sequence twice; a different fingerprint is
refused unless ``overwrite=True``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from captum_ffb._deprecation import BACKEND_RENAMES, renamed_arguments
from captum_ffb.analysis.corpus import PreparedSequence, SkippedLine, prepare_sequences
from captum_ffb.architectures import get_architecture
from captum_ffb.attr import LayerNormDecomposition
from captum_ffb.engine import NEXT_NORM_SCOPE, next_norms, norm_parameters
from captum_ffb.engine.positions import pad_sequences
from captum_ffb.explained.models import LoadedModel
from captum_ffb.io.files import check_out_dir
from captum_ffb.jobs import ModelSource, run_job
from captum_ffb.jobs.job import fingerprint_of
from captum_ffb.texts.stats import (
    PairTable,
    contextualization_change,
    correlations,
    ff_amp_pairs,
    maps_without_dims,
    pair_pmi,
    smallest_dims,
    spearman,
)

__all__ = ["AnalysisConfig", "Measure", "analyze_corpus", "is_causal", "measures_for"]

SHARD_VERSION = 3


@dataclass
class AnalysisConfig:
    r"""Settings of a corpus analysis.

    Attributes:
        max_seqs (int, optional): analyse the first ``max_seqs`` usable lines.
        mask_rate (float): share of tokens masked for masked LMs (the paper: 0.12); 0 turns
                    masking off. Causal models are never masked.
        seed (int): seed of the masking and of the random-dimension control.
        batch_size (int): most sequences per batch (padded, with an attention mask).
        memory_gb (float): memory a batch's decompositions may take (GiB); long sequences
                    go in smaller batches, down to one sequence.
        max_tokens (int, optional): longest sequence analysed, special tokens included
                    (default: the model's maximum); longer lines are skipped and reported.
        ablation_fraction (float): share of dimensions with the smallest γ ignored in the
                    ablation (the paper: 1 %; at least one dimension).
        top_k (int): FF-amp pairs listed per layer.
        min_count (int): FF-amp pairs seen fewer times are left out (the paper: 2).
        include_special (bool): list FF-amp pairs with special tokens ([CLS], [MASK], ...).
        pmi (bool): also correlate FF-amp with sentence-level PMI of the pair.
        causal (bool, optional): treat the model as causal; detected from its config when
                    ``None``.
    """

    max_seqs: int | None = None
    mask_rate: float = 0.12
    seed: int = 0
    batch_size: int = 16
    memory_gb: float = 2.0
    max_tokens: int | None = None
    ablation_fraction: float = 0.01
    top_k: int = 50
    min_count: int = 2
    include_special: bool = False
    pmi: bool = False
    causal: bool | None = None

    def check(self) -> None:
        if not 0.0 <= self.mask_rate < 1.0:
            raise ValueError(f"mask rate must lie in [0, 1); got {self.mask_rate}")
        if self.max_seqs is not None and self.max_seqs < 1:
            raise ValueError(f"--max-seqs must be at least 1; got {self.max_seqs}")
        if not self.memory_gb > 0:
            raise ValueError(f"memory budget must be positive; got {self.memory_gb}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be at least 1; got {self.batch_size}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError(f"max tokens must be at least 2; got {self.max_tokens}")
        if not 0.0 < self.ablation_fraction < 1.0:
            raise ValueError(f"ablation fraction must lie in (0, 1); got {self.ablation_fraction}")
        if self.top_k < 1 or self.min_count < 1:
            raise ValueError("top-k and min-count must be at least 1")


@dataclass(frozen=True)
class Measure:
    """One contextualization-change measurement between two scopes of a layer.

    Attributes:
        kind (str): ``"consecutive"`` (Fig. 3), ``"relative"`` (to the map before FF,
                    Fig. 6), ``"ablation"`` (FF without the smallest-γ dimensions, Fig. 32)
                    or ``"ablation_random"`` (the same number of random dimensions, a control).
        label (str): ``"+FF"``, ``"FF+RES"``, ...
        source (str): the earlier scope.
        target (str): the later scope.
    """

    kind: str
    label: str
    source: str
    target: str


def _parts(scope: str) -> list[str]:
    return re.findall(r"[A-Z][a-z]*", scope)


def measures_for(chain_name: str, scopes: Sequence[str], ff_pair: tuple[str, str]) -> list[Measure]:
    r"""The measurements of a chain: consecutive steps, changes relative to the map before
    FF, and the two ablations. Pre-LN chains get the next layer's LN1 as a last scope."""
    extended = list(scopes) + ([NEXT_NORM_SCOPE] if chain_name == "pre_ln" else [])
    out = []
    for source, target in zip(extended, extended[1:]):
        label = "+" + _parts(target)[-1].upper()
        if target == NEXT_NORM_SCOPE:
            label += " (next LN1)"
        out.append(Measure("consecutive", label, source, target))
    before = ff_pair[0]
    start = len(_parts(before))
    for target in extended[extended.index(before) + 1 :]:
        added = [p.upper() for p in _parts(target)[start:]]
        out.append(Measure("relative", "+" + added[0] if len(added) == 1 else "+".join(added),
                           before, target))
    out.append(Measure("ablation", "+FF without smallest-γ dims", *ff_pair))
    out.append(Measure("ablation_random", "+FF without random dims", *ff_pair))
    return out


def is_causal(model: nn.Module) -> bool:
    """Whether ``model`` attends only to the past, from its family's spec and config."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    return get_architecture(config.model_type).is_causal(config)


# --------------------------------------------------------------------------- the run
class _Run:
    """Everything fixed for one run: model, layers, measures, norms, dimensions."""

    def __init__(self, loaded: LoadedModel, config: AnalysisConfig, causal: bool) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.config = config
        self.causal = causal
        self.blocks = list(loaded.blocks)
        parameter = next(self.model.parameters(), None)
        self.device = parameter.device if parameter is not None else torch.device("cpu")
        self.lnd = LayerNormDecomposition(self.model, self.blocks)
        self.spec = self.lnd.spec  # the family's layout of these blocks
        chain = self.lnd.chain
        if chain.name not in ("post_ln", "pre_ln"):
            raise ValueError(
                f"the corpus analysis covers Post-LN and Pre-LN models; {loaded.model_type} "
                f"uses the {chain.name!r} chain"
            )
        self.chain = chain
        self.scopes = list(chain.scopes)
        #: every scope computed: Pre-LN chains add the norm that reads the layer's output
        self.computed = self.scopes + ([NEXT_NORM_SCOPE] if chain.name == "pre_ln" else [])
        self.ff_pair = chain.ff_pair
        #: the scope right after the FF output: FF output plus the bypassed vector (RES2)
        self.res_scope = self.scopes[self.scopes.index(self.ff_pair[1]) + 1]
        self.measures = measures_for(chain.name, chain.scopes, chain.ff_pair)
        self.following_role: list[str] = []
        self.gamma: list[Tensor | None] = []
        self.dims: list[Tensor] = []
        self.random_dims: list[Tensor] = []
        self._setup_norms()

    def _setup_norms(self) -> None:
        """The norm whose γ meets each layer's FF output, and the dimensions to ignore."""
        spec, model_config = self.spec, self.model.config
        following = next_norms(self.model, spec, self.blocks) if self.chain.name == "pre_ln" else [
            block.get_submodule(spec.norm2) for block in self.blocks
        ]
        last = len(self.blocks) - 1
        for index, module in enumerate(following):
            if self.chain.name != "pre_ln":
                role = "norm2 (LN2)"
            elif module is None:
                role = "none"
            else:
                role = "next layer's norm1" if index < last else "final norm"
            self.following_role.append(role)
            gamma = None
            if module is not None:
                gamma = norm_parameters(module, spec, model_config)[0]
                gamma = None if gamma is None else gamma.detach().float().cpu()
            self.gamma.append(gamma)
            if gamma is None:  # a norm without γ, or no norm after the last Pre-LN layer
                self.dims.append(torch.zeros(0, dtype=torch.long))
                self.random_dims.append(torch.zeros(0, dtype=torch.long))
                continue
            dims = smallest_dims(gamma, self.config.ablation_fraction)
            self.dims.append(dims)
            rng = np.random.default_rng([self.config.seed, 7, index])
            chosen = rng.choice(gamma.numel(), size=dims.numel(), replace=False)
            self.random_dims.append(torch.as_tensor(np.sort(chosen).astype(np.int64)))

    def batch(self, sequences: Sequence[PreparedSequence]) -> dict[str, np.ndarray]:
        """All statistics one batch contributes, from one forward pass."""
        ids_cpu, mask_cpu = _pad(sequences, self.loaded.tokenizer)
        ids, mask = ids_cpu.to(self.device), mask_cpu.to(self.device)
        batch, n = ids.shape
        n_layers = len(self.blocks)
        changes = np.full((batch, n_layers, len(self.measures)), np.nan)
        deltas = np.zeros((batch, n_layers))
        real = mask.bool()
        out: dict[str, np.ndarray] = {}
        ff_norm, bypass_norm = np.zeros(n_layers), np.zeros(n_layers)
        ff_abs, ff_in_abs = [], []
        layers = self.lnd.iter_layers(
            ids, forward_kwargs={"attention_mask": mask}, scope=self.computed,
            convergence_delta=True, relative_delta=True,
        )
        for index, result in layers:
            decs = result.decompositions
            deltas[:, index] = torch.stack(list(result.delta.values())).amax(0).cpu().numpy()
            with torch.no_grad():
                maps = {name: dec.maps().cpu() for name, dec in decs.items()}
                before, after = self.ff_pair
                if self.dims[index].numel():
                    for kind, dims in (("ablation", self.dims[index]),
                                       ("ablation_random", self.random_dims[index])):
                        for scope in (before, after):
                            maps[f"{kind}:{scope}"] = maps_without_dims(
                                decs[scope].terms, dims.to(self.device), mask).cpu()
            for b in range(batch):
                for k, measure in enumerate(self.measures):
                    source, target = measure.source, measure.target
                    if measure.kind.startswith("ablation"):
                        source, target = f"{measure.kind}:{source}", f"{measure.kind}:{target}"
                    if source in maps and target in maps:
                        changes[b, index, k] = contextualization_change(
                            maps[source][b], maps[target][b], mask_cpu[b], self.causal
                        )
            firsts, seconds, scores = [], [], []
            for b in range(batch):
                first, second, score = ff_amp_pairs(
                    maps[before][b], maps[after][b], ids_cpu[b], mask_cpu[b], self.causal
                )
                firsts.append(first)
                seconds.append(second)
                scores.append(score)
            table = PairTable.from_pairs(
                np.concatenate(firsts), np.concatenate(seconds), np.concatenate(scores)
            )
            out[f"pairs_{index}_keys"] = table.keys
            out[f"pairs_{index}_sums"] = table.sums
            out[f"pairs_{index}_counts"] = table.counts
            # FF input, FF output and the vector RES2 bypasses, from the decompositions' totals
            # (equal to the real tensors up to the completeness residual reported above)
            ff_in = decs[before].total()[real]
            ff = decs[after].total()[real]
            bypass = decs[self.res_scope].total()[real] - ff
            ff_norm[index] = float(torch.linalg.vector_norm(ff, dim=-1).double().sum())
            bypass_norm[index] = float(torch.linalg.vector_norm(bypass, dim=-1).double().sum())
            ff_abs.append(ff.abs().double().sum(0).cpu().numpy())
            ff_in_abs.append(ff_in.abs().double().sum(0).cpu().numpy())
            del decs, maps
        out.update(
            seq=np.asarray([s.index for s in sequences], dtype=np.int64),
            n_tokens=mask_cpu.sum(1).numpy().astype(np.int64),
            changes=changes,
            delta=deltas,
            tokens=np.asarray(int(real.sum())),
            ff_norm_sum=ff_norm,
            bypass_norm_sum=bypass_norm,
            ff_out_abs_sum=np.stack(ff_abs),
            ff_in_abs_sum=np.stack(ff_in_abs),
        )
        return out


def _pad(sequences: Sequence[PreparedSequence], tokenizer: Any) -> tuple[Tensor, Tensor]:
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad_sequences([s.ids for s in sequences], 0 if pad is None else int(pad), "right")


def plan_batches(
    sequences: Sequence[PreparedSequence],
    batch_size: int,
    bytes_per_cell: int = 0,
    budget: int = 0,
) -> list[list[int]]:
    r"""Positions of ``sequences`` per batch: sorted by length (less padding), then by index,
    at most ``batch_size`` per batch and, when ``budget`` is set, at most as many as keep
    ``batch · n² · bytes_per_cell`` within it (never fewer than one).

    Args:
        sequences (list[PreparedSequence]): the sequences.
        batch_size (int): most sequences per batch.
        bytes_per_cell (int): memory one ``(i, j)`` pair of one sequence needs.
        budget (int): bytes a batch may take; 0 for no limit.
    """
    order = sorted(range(len(sequences)), key=lambda k: (len(sequences[k].ids), sequences[k].index))
    batches: list[list[int]] = []
    for position in order:
        n = len(sequences[position].ids)  # the longest so far: the order is by length
        current = batches[-1] if batches else None
        fits = current is not None and len(current) < batch_size and (
            not budget or (len(current) + 1) * n * n * bytes_per_cell <= budget
        )
        if fits:
            current.append(position)
        else:
            batches.append([position])
    return batches


def _hidden_size(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    for key in ("hidden_size", "n_embd", "d_model", "dim"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1024


# --------------------------------------------------------------------------- the job
def _fingerprint(loaded: LoadedModel, config: AnalysisConfig, causal: bool, mask_rate: float,
                 max_tokens: int, sequences: Sequence[PreparedSequence]) -> str:
    head = {
        "model": loaded.name, "model_type": loaded.model_type, "layers": len(loaded.blocks),
        "causal": causal, "mask_rate": mask_rate, "seed": config.seed,
        "batch_size": config.batch_size, "memory_gb": config.memory_gb, "max_tokens": max_tokens,
        "ablation_fraction": config.ablation_fraction, "shard_version": SHARD_VERSION,
    }
    return fingerprint_of(head, [[s.index, s.ids] for s in sequences])


@dataclass
class AnalysisJob:
    r"""The paper's analyses over prepared sequences, as a job for :func:`captum_ffb.jobs.run_job`.

    Attributes:
        config (AnalysisConfig): the settings.
        sequences (list[PreparedSequence]): the usable lines, tokenised (and masked).
        batches (list[list[int]]): the planned batches.
        settings (dict): what ``run.json`` records (with the fingerprint).
        model (ModelSource): how a worker loads the model.
        causal (bool): whether the model is causal.
    """

    config: AnalysisConfig
    sequences: list[PreparedSequence]
    batches: list[list[int]]
    settings: dict[str, Any]
    model: ModelSource
    causal: bool
    loaded: LoadedModel | None = None  # this process's model; never sent to workers

    shard_version = SHARD_VERSION

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "loaded": None}

    def fingerprint(self) -> dict[str, Any]:
        return self.settings

    def plan(self) -> list[list[int]]:
        return self.batches

    def setup(self) -> _Run:
        loaded = self.loaded if self.loaded is not None else self.model.load()
        return _Run(loaded, self.config, self.causal)

    def run_batch(self, state: _Run, index: int, batch: Sequence[int]) -> dict[str, np.ndarray]:
        return state.batch([self.sequences[p] for p in batch])


def model_source(loaded: LoadedModel) -> ModelSource:
    """How another process loads the same model (an error for a model built in memory)."""
    if loaded.source is None:
        raise ValueError(
            "this model was not loaded with captum_ffb.explained.models.load_model, so other processes "
            "cannot load it: save it to a folder and load it from there"
        )
    path = Path(loaded.source).expanduser()
    name = str(path.resolve()) if path.exists() else loaded.source
    parameter = next(loaded.model.parameters(), None)
    device = str(parameter.device) if parameter is not None else "cpu"
    return ModelSource(name, causal_lm=loaded.causal_lm, device=device, task=loaded.task)


# --------------------------------------------------------------------------- entry point
@renamed_arguments(BACKEND_RENAMES)
def analyze_corpus(
    loaded: LoadedModel,
    lines: Sequence[str],
    out_dir: str | os.PathLike,
    config: AnalysisConfig | None = None,
    source: str = "corpus",
    overwrite: bool = False,
    show_progress: bool = True,
    stop_after: int | None = None,
    backend: str = "local",
    backend_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    r"""Run the paper's analyses over a corpus; resumable.

    Args:
        loaded (LoadedModel): from :func:`captum_ffb.explained.models.load_model`.
        lines (list[str]): the corpus, one sequence per entry.
        out_dir (str or PathLike): folder for ``run.json`` and the batch shards (the report
                    writer puts its files there too).
        config (AnalysisConfig, optional): the settings.
        source (str): the corpus' name, for the report.
        overwrite (bool): discard an earlier run with other settings in ``out_dir``.
        show_progress (bool): show a progress bar.
        stop_after (int, optional): stop (raising ``KeyboardInterrupt``) after this many new
                    batches; for testing the resume path.
        backend (str): ``"local"`` or ``"ray"`` (see :func:`captum_ffb.jobs.run_job`).
        backend_options (dict, optional): the backend's settings.

    Returns:
        the summary dict (see ``captum_ffb.analysis.report.write_report()``).
    """
    config = config or AnalysisConfig()
    config.check()
    out = check_out_dir(out_dir)
    tokenizer = loaded.tokenizer
    causal = is_causal(loaded.model) if config.causal is None else bool(config.causal)
    masked_lm = not causal and getattr(tokenizer, "mask_token_id", None) is not None
    mask_rate = config.mask_rate if masked_lm else 0.0
    max_tokens = min(config.max_tokens or loaded.max_length, loaded.max_length)
    sequences, skipped = prepare_sequences(
        lines, tokenizer, max_tokens, config.max_seqs, mask_rate, config.seed
    )
    if not sequences:
        raise ValueError(f"no usable line in {source} ({len(skipped)} skipped)")
    settings = {
        "fingerprint": _fingerprint(loaded, config, causal, mask_rate, max_tokens, sequences),
        "model": loaded.name, "source": source, "config": asdict(config), "causal": causal,
        "mask_rate": mask_rate, "max_tokens": max_tokens, "sequences": len(sequences),
    }
    run = _Run(loaded, config, causal)  # checks the chain before any batch runs
    # dense terms of every scope computed and the ablation temporaries, float32
    cell = 4 * _hidden_size(loaded.model) * (len(run.computed) + 3)
    batches = plan_batches(sequences, config.batch_size, cell, int(config.memory_gb * 2**30))
    job = AnalysisJob(config, list(sequences), batches, settings,
                      model_source(loaded) if backend != "local" else ModelSource(), causal, loaded)
    shards = run_job(job, out, backend, overwrite, show_progress, stop_after, "analysing",
                     backend_options)
    return summarise(run, sequences, skipped, shards, source, mask_rate, max_tokens, lines)


# --------------------------------------------------------------------------- aggregation
def _stats(values: np.ndarray) -> dict[str, float | int]:
    finite = values[np.isfinite(values)]
    return {
        "mean": float(finite.mean()) if finite.size else math.nan,
        "std": float(finite.std()) if finite.size else math.nan,
        "n": int(finite.size),
        "undefined": int(values.size - finite.size),
    }


@dataclass
class _Totals:
    """The batch shards put together, in sequence order."""

    seq: np.ndarray
    order: np.ndarray
    changes: np.ndarray
    deltas: np.ndarray
    n_tokens: np.ndarray
    tokens: int
    ff_norm: np.ndarray
    bypass_norm: np.ndarray
    ff_out_abs: np.ndarray
    ff_in_abs: np.ndarray


def _totals(shards: Sequence[dict[str, np.ndarray]], count: int) -> _Totals:
    """Concatenate and order the shards; check they cover every sequence exactly once."""
    seq = np.concatenate([s["seq"] for s in shards])
    if np.unique(seq).size != seq.size or seq.size != count:
        raise RuntimeError("the batch shards do not cover every sequence exactly once")
    order = np.argsort(seq, kind="stable")
    tokens = int(sum(int(s["tokens"]) for s in shards))
    return _Totals(
        seq, order,
        np.concatenate([s["changes"] for s in shards])[order],
        np.concatenate([s["delta"] for s in shards])[order],
        np.concatenate([s["n_tokens"] for s in shards])[order],
        tokens,
        sum(s["ff_norm_sum"] for s in shards) / tokens,
        sum(s["bypass_norm_sum"] for s in shards) / tokens,
        sum(s["ff_out_abs_sum"] for s in shards) / tokens,
        sum(s["ff_in_abs_sum"] for s in shards) / tokens,
    )


def _ff_amp_top(table: PairTable, tokenizer: Any, config: Any, special: set[int]) -> tuple[Any, list[dict[str, Any]]]:
    """The layer's pairs listed (mean FF-amp, at least ``min_count`` times) and the top ones."""
    listed = table.means(config.min_count, exclude=special)
    top = [
        {"rank": r + 1, "receiver": tokenizer.convert_ids_to_tokens(a),
         "giver": tokenizer.convert_ids_to_tokens(b), "ff_amp": v, "count": c}
        for r, (a, b, v, c) in enumerate(listed.top(config.top_k))
    ]
    return listed, top


def _outliers(run: _Run, index: int, totals: _Totals) -> dict[str, Any]:
    """LN2's γ against the FF's outputs and inputs, and the dimensions left out (Sec. 5)."""
    gamma = run.gamma[index]
    outliers: dict[str, Any] = {"norm": run.following_role[index]}
    if gamma is not None:
        g = gamma.double().numpy()
        dims = run.dims[index].tolist()
        outliers.update(
            gamma_vs_ff_out=correlations(g, totals.ff_out_abs[index]),
            gamma_vs_ff_in=correlations(g, totals.ff_in_abs[index]),
            ignored_dims=dims,
            ignored_gamma=[float(g[d]) for d in dims],
            ignored_ff_out_mean_abs=[float(totals.ff_out_abs[index][d]) for d in dims],
            random_dims=run.random_dims[index].tolist(),
            gamma=g.tolist(),
        )
    return outliers


def _pmi(table: PairTable, config: Any, all_special: set[int], documents: list[list[int]]) -> dict[str, Any]:
    """Spearman's ρ between a layer's pairs' FF-amp and their PMI over the corpus."""
    pmi_table = table.means(config.min_count, exclude=all_special)
    distinct = pmi_table.first != pmi_table.second
    first, second = pmi_table.first[distinct], pmi_table.second[distinct]
    values = pmi_table.sums[distinct]
    pmi = pair_pmi(documents, first, second)
    finite = np.isfinite(pmi)
    return {"spearman": spearman(values[finite], pmi[finite]), "pairs": int(finite.sum()),
            "documents": len(documents)}


def _layer(run: _Run, index: int, shards: Sequence[dict[str, np.ndarray]], totals: _Totals,
           special: set[int], all_special: set[int], pmi_documents: list[list[int]] | None) -> dict[str, Any]:
    """One layer's entry of the summary."""
    config, tokenizer = run.config, run.loaded.tokenizer
    table = PairTable.merge(
        PairTable(s[f"pairs_{index}_keys"], s[f"pairs_{index}_sums"], s[f"pairs_{index}_counts"])
        for s in shards
    )
    listed, top = _ff_amp_top(table, tokenizer, config, special)
    measures = [{**asdict(measure), **_stats(totals.changes[:, index, k])} for k, measure in enumerate(run.measures)]
    ff, bypass = totals.ff_norm[index], totals.bypass_norm[index]
    layer: dict[str, Any] = {
        "layer": index + 1,
        "changes": measures,
        "ff_amp_top": top,
        "ff_amp_pairs": len(listed),
        "norms": {
            "ff_output": float(ff),
            "bypassed": float(bypass),
            "bypassed_over_ff": float(bypass / ff) if ff > 0 else math.nan,
        },
        "outliers": _outliers(run, index, totals),
        "ff_out_mean_abs": totals.ff_out_abs[index].tolist(),
        "ff_in_mean_abs": totals.ff_in_abs[index].tolist(),
        "completeness_residual_max": float(totals.deltas[:, index].max()),
    }
    if pmi_documents is not None:
        layer["pmi"] = _pmi(table, config, all_special, pmi_documents)
    return layer


def _averages(run: _Run, layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measure's mean over the layers (the finite ones)."""
    averages = []
    for k, measure in enumerate(run.measures):
        finite = [v for v in (layer["changes"][k]["mean"] for layer in layers) if math.isfinite(v)]
        averages.append({**asdict(measure), "mean_over_layers": float(np.mean(finite)) if finite else math.nan})
    return averages


def summarise(
    run: _Run,
    sequences: Sequence[PreparedSequence],
    skipped: Sequence[SkippedLine],
    shards: Sequence[dict[str, np.ndarray]],
    source: str,
    mask_rate: float,
    max_tokens: int,
    lines: Sequence[str],
) -> dict[str, Any]:
    """Aggregate the batch shards into the summary dict: the totals, one entry per layer, the
    averages over layers and the per-sequence changes."""
    config, tokenizer = run.config, run.loaded.tokenizer
    totals = _totals(shards, len(sequences))
    special = set() if config.include_special else set(tokenizer.all_special_ids)
    pmi_documents = None
    if config.pmi:
        documents, _ = prepare_sequences(lines, tokenizer, max_tokens)
        pmi_documents = [[t for t, s in zip(d.ids, d.special) if not s] for d in documents]
    layers = [_layer(run, index, shards, totals, special, set(tokenizer.all_special_ids), pmi_documents)
              for index in range(len(run.blocks))]
    return {
        "model": run.loaded.name,
        "model_type": run.loaded.model_type,
        "chain": run.chain.name,
        "scopes": run.computed,
        "ff_pair": list(run.ff_pair),
        "causal": run.causal,
        "source": source,
        "settings": {
            **asdict(config), "mask_rate_applied": mask_rate, "max_tokens_applied": max_tokens,
        },
        "sequences": len(sequences),
        "tokens": totals.tokens,
        "masked_tokens": int(sum(len(s.masked) for s in sequences)),
        "skipped": [asdict(s) for s in skipped],
        "measures": [asdict(m) for m in run.measures],
        "layers": layers,
        "averages": _averages(run, layers),
        "per_sequence": {
            "line": (totals.seq[totals.order] + 1).tolist(),
            "n_tokens": totals.n_tokens.tolist(),
            "changes": totals.changes.tolist(),
        },
    }
