"""Patching estimates against real activation patching (SmolLM2-135M-Instruct, IOI).

Run from the repository root (about 15 minutes on 2 cores)::

    python results/patching/run.py         # writes RESULTS.md, results.json and SUMMARY.md here

The prompts are the rows of ``../shared/data/evidence/ioi.csv`` whose two names are one token
each; the first ``--selection`` usable rows choose, the next ``--heldout`` rows report. Each
prompt's corrupted version replaces the indirect object (IO) and the subject (S) everywhere by
two other one-token names of the file (same token count, only the name positions differ). The
explained value is ``logit(IO) − logit(S)`` at the last position (``Contrast(IO, S)``).

Ground truth: :func:`captum_ffb.activation_patching` at head granularity, one real forward
pass per head (its slice of the output projection's input, at every position) and per FF
block. Estimates: ``attribute_graph(..., corrupted_inputs=corrupted)``'s per-node estimates
summed over positions (``component_estimates``): ``"frozen"``, ``"atp"`` (attribution
patching, the field's estimate) and ``"atp+exact"`` at several thresholds on κ (from one graph
built at the smallest threshold: a node or component above a larger threshold is above the
smallest, so its real patch is already there). Controls that use no gradient: each component's depth
(its layer: the position-only control of a component table) and the size of its patch
(``Σ_positions ‖write − write_corrupted‖``, signed by nothing).

The threshold and then the default estimator are chosen on the selection rows by the mean of
the pooled Pearson r over heads and over FF blocks (ties: the larger threshold, fewer real
passes); held-out numbers are reported for every estimator.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
IOI = ROOT.parent / "shared" / "data" / "evidence" / "ioi.csv"
THRESHOLDS = (0.5, 1.0, 2.0)


def usable_prompts(tokenizer, count: int) -> list[dict]:
    """The first ``count`` rows with one-token names and an aligned corrupted prompt."""
    rows = list(csv.DictReader(IOI.open(encoding="utf-8")))

    def one_token(word: str) -> bool:
        return len(tokenizer(" " + word, add_special_tokens=False).input_ids) == 1

    names = sorted({w for r in rows for w in (r["one_prefix_word_good"], r["one_prefix_word_bad"]) if one_token(w)})
    found = []
    for index, row in enumerate(rows):
        if len(found) == count:
            break
        io, s, prompt = row["one_prefix_word_good"], row["one_prefix_word_bad"], row["one_prefix_prefix"]
        if not (one_token(io) and one_token(s)):
            continue
        ids = tokenizer(prompt).input_ids
        io_id = tokenizer(" " + io, add_special_tokens=False).input_ids[0]
        s_id = tokenizer(" " + s, add_special_tokens=False).input_ids[0]
        if io_id not in ids or s_id not in ids:
            continue
        pattern = rf"\b({re.escape(io)}|{re.escape(s)})\b"
        occurrences = len(re.findall(pattern, prompt))
        others = [w for w in names if w not in (io, s) and w not in prompt]
        random.Random(1000 + index).shuffle(others)
        for a, b in zip(others[0::2], others[1::2]):
            corrupted = re.sub(pattern, lambda m, a=a, b=b, io=io: a if m.group(0) == io else b, prompt)
            corrupted_ids = tokenizer(corrupted).input_ids
            if len(corrupted_ids) != len(ids):
                continue
            if sum(x != y for x, y in zip(ids, corrupted_ids)) != occurrences:
                continue
            found.append(dict(row=index, prompt=prompt, corrupted=corrupted, ids=ids, corrupted_ids=corrupted_ids,
                              io=io_id, s=s_id))
            break
    return found


def component_sums(graph, values: torch.Tensor) -> dict[str, float]:
    """Per-node values summed over positions, by component id."""
    from captum_ffb.baselines.patching import component_id

    d = graph.data
    sums: dict[str, float] = {}
    for k, kind in enumerate(d.kinds):
        if kind in ("head", "ff"):
            key = component_id(kind, d.layers[k], d.heads[k] if kind == "head" else -1)
            sums[key] = sums.get(key, 0.0) + float(values[k])
    return sums


def component_max(graph, values: torch.Tensor) -> dict[str, float]:
    """Per-node values' maximum over positions, by component id."""
    from captum_ffb.baselines.patching import component_id

    d = graph.data
    found: dict[str, float] = {}
    for k, kind in enumerate(d.kinds):
        if kind in ("head", "ff"):
            key = component_id(kind, d.layers[k], d.heads[k] if kind == "head" else -1)
            found[key] = max(found.get(key, 0.0), float(values[k]))
    return found


def one_prompt(nd, prompt: dict) -> dict:
    from captum_ffb import Contrast, activation_patching

    ids = torch.tensor([prompt["ids"]])
    corrupted = torch.tensor([prompt["corrupted_ids"]])
    target = Contrast(prompt["io"], prompt["s"])
    start = time.perf_counter()
    real = activation_patching(nd, ids, corrupted, target, "head", show_progress=False)
    patching_time = time.perf_counter() - start
    start = time.perf_counter()
    graph = nd.attribute_graph(ids, target, granularity="head", max_nodes=1, corrupted_inputs=corrupted,
                               exact_above=min(THRESHOLDS))
    graph_time = time.perf_counter() - start
    estimates = graph.patch_estimates
    kappa = graph.patch_kappa
    found = {"frozen": component_sums(graph, estimates["frozen"]), "atp": component_sums(graph, estimates["atp"])}
    largest = component_max(graph, kappa)
    whole = graph.patch_components["atp+exact"]
    passes = {}
    for tau in THRESHOLDS:
        # what exact_above=tau gives: real passes for the nodes and the components above tau
        sums = component_sums(graph, torch.where(kappa > tau, estimates["atp+exact"], estimates["atp"]))
        sums.update({c: whole[c] for c, k in largest.items() if k > tau})
        found[f"atp+exact (κ > {tau:g})"] = sums
        passes[f"{tau:g}"] = int((kappa > tau).sum()) + sum(k > tau for k in largest.values())
    components = sorted(real.effects)
    kinds = [c.split(".")[2] for c in components]
    # the controls: depth, and the size of the patch (from the graph's own clean and corrupted writes)
    found["control: depth (layer)"] = {c: float(c.split(".")[1]) for c in components}
    found["control: patch size"] = component_sums(graph, _patch_sizes(nd, ids, corrupted, target, graph))
    return dict(row=prompt["row"], components=components, kinds=kinds,
                real=[real.effects[c] for c in components],
                estimates={name: [values[c] for c in components] for name, values in found.items()},
                exact_passes=passes,
                clean=real.clean, corrupted=real.corrupted, seconds=dict(patching=patching_time, graph=graph_time))


def _patch_sizes(nd, ids, corrupted, target, graph) -> torch.Tensor:
    """Each node's ‖write − write_corrupted‖ (κ times the stream's norm after it writes)."""
    from captum_ffb.engine.patching import real_writers

    engine = nd.engine
    request = nd.request(ids, target)
    head_target = request.target
    other = nd.request(corrupted, head_target)
    clean, base = real_writers(engine, request, head_target, "head"), real_writers(engine, other, head_target, "head")
    d = graph.data
    sizes = torch.zeros(len(d), dtype=torch.float64)
    for k, kind in enumerate(d.kinds):
        if kind == "ff":
            key = f"block.{d.layers[k]}.ff"
            sizes[k] = float((clean.outputs[key] - base.outputs[key])[0, d.positions[k]].norm())
        elif kind == "head":
            key = f"block.{d.layers[k]}.attention"
            diff = clean.parts[key] - base.parts[key]
            sizes[k] = float(diff[0, d.positions[k], d.heads[k]].norm())  # the head's slice (before W_O)
    return sizes


def scores(results: list[dict], name: str, kind: str) -> dict:
    """Pooled Pearson and Spearman r, and the per-prompt Pearson r (mean, standard error, min)."""
    from scipy import stats

    pooled_real, pooled_est, per_prompt = [], [], []
    for result in results:
        mask = [k == kind for k in result["kinds"]]
        real = np.array(result["real"])[mask]
        est = np.array(result["estimates"][name])[mask]
        pooled_real.append(real)
        pooled_est.append(est)
        if real.std() > 0 and est.std() > 0:
            per_prompt.append(float(np.corrcoef(real, est)[0, 1]))
    real, est = np.concatenate(pooled_real), np.concatenate(pooled_est)
    pearson = float(np.corrcoef(real, est)[0, 1]) if est.std() > 0 else float("nan")
    spearman = float(stats.spearmanr(real, est).statistic) if est.std() > 0 else float("nan")
    per = np.array(per_prompt) if per_prompt else np.array([np.nan])
    return dict(pearson=pearson, spearman=spearman, per_prompt_mean=float(per.mean()),
                per_prompt_se=float(per.std(ddof=1) / np.sqrt(len(per))) if len(per) > 1 else float("nan"),
                per_prompt_min=float(per.min()), n=int(len(real)))


def choose(selection: list[dict], names: list[str]) -> str:
    """The name with the largest mean of the pooled Pearson r over heads and FF blocks (ties:
    the later name in ``names``)."""
    best, best_score = names[0], -np.inf
    for name in names:
        score = np.mean([scores(selection, name, kind)["pearson"] for kind in ("head", "ff")])
        if score >= best_score - 1e-12:
            best, best_score = name, score
    return best


def table(results: list[dict], names: list[str]) -> list[str]:
    lines = ["| estimator | heads r (pooled) | heads r per prompt | heads ρ | FF r (pooled) | FF r per prompt | FF ρ |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        h, f = scores(results, name, "head"), scores(results, name, "ff")
        lines.append(f"| {name} | {h['pearson']:.3f} | {h['per_prompt_mean']:.3f} ± {h['per_prompt_se']:.3f} | "
                     f"{h['spearman']:.3f} | {f['pearson']:.3f} | {f['per_prompt_mean']:.3f} ± "
                     f"{f['per_prompt_se']:.3f} | {f['spearman']:.3f} |")
    return lines


def _rounded(value):
    """Floats to 7 significant digits (the per-prompt numbers, kept small on disk)."""
    if isinstance(value, float):
        return float(f"{value:.7g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selection", type=int, default=20)
    parser.add_argument("--heldout", type=int, default=30)
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild the reports from results.json (after a change of the library's default)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from captum_ffb.engine.patching import DEFAULT_ESTIMATOR, EXACT_ABOVE

    if args.report_only:
        saved = json.loads((HERE / "results.json").read_text())
        results, stamp = saved["prompts"], saved["run"]
    else:
        from captum_ffb import NormDecomposition
        from captum_ffb.models import load_model, smollm2_dir

        loaded = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm")
        nd = NormDecomposition(loaded.model)
        prompts = usable_prompts(loaded.tokenizer, args.selection + args.heldout)
        results = []
        for number, prompt in enumerate(prompts):
            results.append(one_prompt(nd, prompt))
            print(f"{number + 1}/{len(prompts)} row {prompt['row']}: {results[-1]['seconds']}", flush=True)
        stamp = datetime.datetime.now().isoformat(timespec="minutes")
    selection, heldout = results[:args.selection], results[args.selection:]
    hybrids = [f"atp+exact (κ > {tau:g})" for tau in reversed(THRESHOLDS)]  # ties: the larger threshold
    hybrid = choose(selection, hybrids)
    estimators = ["frozen", "atp", hybrid]
    chosen = choose(selection, estimators)
    names = ["frozen", "atp", *reversed(hybrids), "control: depth (layer)", "control: patch size"]
    tau = float(hybrid.split("> ")[1].rstrip(")"))
    library = "atp+exact" if chosen.startswith("atp+exact") else chosen
    agrees = library == DEFAULT_ESTIMATOR and (library != "atp+exact" or tau == EXACT_ABOVE)

    def mean(key: str, rows: list[dict]) -> float:
        return float(np.mean([r["seconds"][key] for r in rows]))

    passes = {t: float(np.mean([r["exact_passes"][t] for r in results])) for t in results[0]["exact_passes"]}
    held = {name: {kind: scores(heldout, name, kind) for kind in ("head", "ff")} for name in names}
    (HERE / "results.json").write_text(json.dumps(dict(
        run=stamp, torch=torch.__version__, selection_rows=[r["row"] for r in selection],
        heldout_rows=[r["row"] for r in heldout], chosen_threshold=tau, chosen=chosen,
        library_default=[DEFAULT_ESTIMATOR, EXACT_ABOVE], agrees=agrees,
        selection={name: {kind: scores(selection, name, kind) for kind in ("head", "ff")} for name in names},
        heldout=held, exact_passes_per_prompt=passes,
        seconds_per_prompt=dict(activation_patching=mean("patching", results), graph_with_estimates=mean("graph", results)),
        prompts=_rounded(results))))
    header = [f"Run {stamp} by `python results/patching/run.py` (torch {torch.__version__}, 1 thread). "
              f"SmolLM2-135M-Instruct; IOI rows of `ioi.csv` with one-token names; value "
              f"`logit(IO) − logit(S)`; {len(selection)} selection prompts (rows {selection[0]['row']}–"
              f"{selection[-1]['row']}), {len(heldout)} held-out prompts (rows {heldout[0]['row']}–"
              f"{heldout[-1]['row']}); 270 heads and 30 FF blocks per prompt. r: Pearson with real "
              "activation patching (pooled over prompts, and per prompt: mean ± standard error); "
              "ρ: Spearman, pooled."]
    lines = ["# Patching estimates against activation patching", "", *header, "",
             f"Chosen on the selection prompts: threshold κ > {tau:g}, then the estimator **{chosen}** "
             f"(the library's default: `{DEFAULT_ESTIMATOR}`, `EXACT_ABOVE = {EXACT_ABOVE:g}`; "
             f"{'they agree' if agrees else 'THEY DISAGREE'}).", "",
             "## Held-out prompts", "", *table(heldout, names), "",
             "## Selection prompts", "", *table(selection, names), "",
             "## Cost per prompt", "",
             f"- activation patching (300 real patched passes): {mean('patching', results):.2f} s",
             f"- the graph with every estimate (a clean and a corrupted pass, the frozen pass, the real "
             f"gradient, the real passes at κ > {min(THRESHOLDS):g}): {mean('graph', results):.2f} s",
             "- real patched passes per prompt: " + ", ".join(f"κ > {t}: {v:.2f}" for t, v in passes.items()), ""]
    (HERE / "RESULTS.md").write_text("\n".join(lines))
    atp, ours, frozen = held["atp"], held[hybrid], held["frozen"]
    summary = [
        "### How the default was chosen", "",
        f"On IOI with SmolLM2-135M-Instruct (`results/patching`, {len(selection)} selection and "
        f"{len(heldout)} held-out prompts, 270 heads and 30 FF blocks each), correlation of the "
        "component estimates with real activation patching on the **held-out** prompts:", "",
        "| estimator | heads r | FF r | real passes per prompt |", "|---|---:|---:|---:|",
        f"| `\"atp\"` (attribution patching) | {atp['head']['pearson']:.3f} | {atp['ff']['pearson']:.3f} | 0 |",
        f"| `\"frozen\"` | {frozen['head']['pearson']:.3f} | {frozen['ff']['pearson']:.3f} | 0 |",
        f"| `\"atp+exact\"` (κ > {tau:g}) | {ours['head']['pearson']:.3f} | {ours['ff']['pearson']:.3f} | "
        f"{passes[f'{tau:g}']:.2f} |",
        f"| control: depth | {held['control: depth (layer)']['head']['pearson']:.3f} | "
        f"{held['control: depth (layer)']['ff']['pearson']:.3f} | 0 |",
        f"| control: patch size | {held['control: patch size']['head']['pearson']:.3f} | "
        f"{held['control: patch size']['ff']['pearson']:.3f} | 0 |", "",
        f"The default is `\"{DEFAULT_ESTIMATOR}\"` with `EXACT_ABOVE = {EXACT_ABOVE:g}` (threshold and estimator "
        "chosen on the selection prompts). Its gain is on the FF blocks only, where attribution patching "
        "fails (a corrupted name that changes an FF block's write by more than the stream holds); on the heads "
        f"it is attribution patching ({ours['head']['pearson']:.3f} against {atp['head']['pearson']:.3f}). The "
        f"frozen estimator, exact for the frozen model, is the weakest on heads ({frozen['head']['pearson']:.3f}): "
        "with the attention probabilities frozen, a name cannot change where a head looks. Activation patching "
        "itself costs "
        f"{mean('patching', results):.1f} s per prompt here, the graph with every estimate "
        f"{mean('graph', results):.1f} s. Every number, per prompt and on the selection prompts too, is in "
        "`results/patching/RESULTS.md`.", ""]
    (HERE / "SUMMARY.md").write_text("\n".join(summary))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
