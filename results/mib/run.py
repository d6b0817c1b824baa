"""Edge circuits by MIB's protocol on SmolLM2-135M-Instruct: CPR and CMD per task and edge estimator.

Run from the repository root (about an hour on one core of a shared machine; ``--jobs 2`` runs
two tasks at once; resumable: the prompts already scored in ``cache/`` are kept)::

    python results/mib/run.py                  # writes results.json and SUMMARY.md here
    python results/mib/run.py --report-only    # SUMMARY.md again from results.json
    python results/mib/run.py --export DIR     # MIB's submission files (the default's scores) in DIR

**Protocol** (:mod:`captum_ffb.patching.circuits`): the head graph of the model's components
(the input, 270 heads, 30 FF blocks, the logits; 44,371 edges); each estimator's edge scores
summed over a task's prompts; the circuits at MIB's edge shares (0.1 % … 100 %, top edges by
signed score for CPR and by absolute score for CMD, as MIB's leaderboard reads them; pruned); ``f(C) = (m̄(C) − m̄(∅)) / (m̄(N) − m̄(∅))`` with every edge outside
the circuit patched from the counterfactual prompt (``m̄``: the mean over the prompts of the
logit difference ``logit(good) − logit(bad)``); CPR the area under ``f``, CMD the area between
``f`` and 1. The circuits of the selection prompts are evaluated on the selection prompts, those
of the held-out prompts on the held-out prompts (a prompt is kept when the model gets it right).

**Tasks** (each prompt and its counterfactual of the same length; the counterfactual flips the
answer where the task allows):

* ``ioi``: the rows of the bundled IOI file whose names are one token; the counterfactual puts
  the indirect object where the subject is repeated (MIB's ``s2_io_flip``): the answer becomes
  the subject.
* ``induction``: ``X_1 … X_10 X_1 … X_9`` of random words, the counterfactual ``Y_1 … Y_10 X_1 …
  X_9``; ``good`` = ``X_10``, ``bad`` = ``Y_10``.
* ``recall``: capital cities (``"The capital of {country} is"``), another country in the
  counterfactual.
* ``agreement``: subject–verb number (BLiMP), the subject's number swapped.
* ``factual``: ``"The {landmark} is located in the city of"``, the subject replaced by another
  landmark of the same length (the Eiffel Tower against the Kremlin).
* ``determiner``: determiner–noun number (BLiMP), ``this ↔ these``, ``that ↔ those``.

MIB's own tasks beyond IOI (arithmetic, MCQA, ARC) are measured for accuracy first; the model
cannot do them (see SUMMARY.md), so the tasks above stand in.

**Choice**: among the edge estimators that cost no more passes than EAP-IG, the default is the
one whose largest shortfall from the best CPR over the tasks on the selection prompts is
smallest (ties: the lower largest excess CMD, then fewer passes).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import random
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
EVIDENCE = ROOT / "captum_ffb" / "evaluation" / "data" / "evidence"
CACHE = HERE / "cache"
TASKS = ("ioi", "induction", "recall", "agreement", "factual", "determiner")
ESTIMATORS = ("atp", "eap-ig", "gim", "relp", "frozen", "gim-ig")
#: The circuits' rankings: MIB's leaderboard reads CPR from the top signed scores, CMD from the top absolute ones.
RANKINGS = ("signed", "absolute")
PEER_NAMES = {"atp": "EAP (attribution patching)", "eap-ig": "EAP-IG-inputs", "gim": "GIM", "relp": "RelP",
              "frozen": "ours: the frozen decomposition",
              "gim-ig": "ours: GIM's gradients along EAP-IG's path"}


def _patching_study():
    """The prompt generators of ``results/patching/run.py`` (shared, not copied)."""
    spec = importlib.util.spec_from_file_location("patching_study", ROOT / "results" / "patching" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the tasks' prompts
def _one(tokenizer, word: str) -> int | None:
    ids = tokenizer(" " + word, add_special_tokens=False).input_ids
    return ids[0] if len(ids) == 1 else None


def _prompt(task, key, text, corrupted, ids, corrupted_ids, good, bad) -> dict:
    return dict(task=task, id=key, prompt=text, corrupted=corrupted, ids=ids, corrupted_ids=corrupted_ids,
                good=good, bad=bad)


def ioi_candidates(tokenizer):
    rows = list(csv.DictReader((EVIDENCE / "ioi.csv").open(encoding="utf-8")))
    for index, row in enumerate(rows):
        io, s, text = row["one_prefix_word_good"], row["one_prefix_word_bad"], row["one_prefix_prefix"]
        io_id, s_id = _one(tokenizer, io), _one(tokenizer, s)
        places = [m.start() for m in re.finditer(rf"\b{re.escape(s)}\b", text)]
        if io_id is None or s_id is None or len(places) < 2:
            continue
        last = places[-1]
        corrupted = text[:last] + io + text[last + len(s):]
        ids, corrupted_ids = tokenizer(text).input_ids, tokenizer(corrupted).input_ids
        if len(ids) == len(corrupted_ids):
            yield _prompt("ioi", f"row {index}", text, corrupted, ids, corrupted_ids, io_id, s_id)


def candidates(task: str, tokenizer):
    study = _patching_study()
    own = {"ioi": ioi_candidates}
    return own[task](tokenizer) if task in own else study.CANDIDATES[task](tokenizer)


def value_of(nd, ids: list[int], good: int, bad: int) -> float:
    from captum_ffb import Contrast
    from captum_ffb.engine.head import target_value
    from captum_ffb.engine.passes import run_model

    request = nd.request(torch.tensor([ids]), Contrast(good, bad))
    return float(target_value(nd.engine.head, run_model(nd.model, *request.args, **request.kwargs), request.target)[0])


def task_prompts(nd, tokenizer, task: str, count: int, tries: int = 100) -> tuple[list[dict], dict]:
    """The first ``count`` candidates the model gets right, and its accuracy on the first
    ``tries`` candidates (a prompt is right when ``logit(good) > logit(bad)``)."""
    found, tried, right = [], 0, 0
    for prompt in candidates(task, tokenizer):
        if tried >= tries and len(found) == count:
            break
        tried += 1
        if value_of(nd, prompt["ids"], prompt["good"], prompt["bad"]) > 0:
            right += tried <= tries
            if len(found) < count:
                found.append(prompt)
    return found, {"tried": min(tried, tries), "right": right}


def mib_formats_accuracy(nd, tokenizer, count: int = 40) -> dict[str, float]:
    """The model's accuracy on MIB's arithmetic (``"{a}+{b}="``, the sum's first token against
    another sum's) and on a four-option multiple-choice format (the right letter against
    another), where it is measured before the tasks are chosen."""
    rng = random.Random(0)
    right = {"arithmetic": 0, "mcqa": 0}
    colors = ("red", "blue", "green", "yellow", "black", "white", "brown", "pink")
    things = ("box", "ball", "car", "hat", "cup", "chair", "book", "door")
    for _ in range(count):
        a, b, c = rng.randint(10, 49), rng.randint(10, 49), rng.randint(10, 49)
        good = tokenizer(str(a + b), add_special_tokens=False).input_ids[0]
        bad = tokenizer(str(a + c), add_special_tokens=False).input_ids[0]
        if good != bad:
            right["arithmetic"] += value_of(nd, tokenizer(f"{a}+{b}=").input_ids, good, bad) > 0
        else:
            right["arithmetic"] += 0.5
        thing, options = rng.choice(things), rng.sample(colors, 4)
        answer = rng.randrange(4)
        other = (answer + 1 + rng.randrange(3)) % 4
        text = f"The {thing} is {options[answer]}. What color is the {thing}?\n" + "".join(
            f"{'ABCD'[i]}. {options[i]}\n" for i in range(4)) + "Answer:"
        letters = [tokenizer(" " + x, add_special_tokens=False).input_ids[0] for x in "ABCD"]
        right["mcqa"] += value_of(nd, tokenizer(text).input_ids, letters[answer], letters[other]) > 0
    return {task: n / count for task, n in right.items()}


# --------------------------------------------------------------------------- scoring and curves
def members(name: str) -> tuple[str, ...]:
    """The estimators a candidate averages (``"atp&relp"``: the mean of the two's scores)."""
    return tuple(name.split("&"))


def stepped(name: str) -> tuple[str, int]:
    """An estimator's name and its path's steps (``"eap-ig@4"``: EAP-IG on 4 steps)."""
    from captum_ffb.patching.estimators import EAP_IG_STEPS

    estimator, _, steps = name.partition("@")
    return estimator, int(steps) if steps else EAP_IG_STEPS


def combined(name: str, scored: list[dict]) -> tuple[np.ndarray, float]:
    """A candidate's scores summed over the prompts, and its mean seconds per prompt."""
    parts = members(name)
    scores = np.sum([np.mean([s[m] for m in parts], axis=0) for s in scored], axis=0)
    seconds = float(np.mean([sum(float(s[f"{m} seconds"]) for m in parts) for s in scored]))
    return scores, seconds


def _cached_scores(nd, graph, prompt: dict) -> dict:
    """Each estimator's edge scores of one prompt (cached under ``cache/``), with seconds."""
    from captum_ffb import Contrast
    from captum_ffb.patching import circuits

    path = CACHE / f"{prompt['task']}-{re.sub(r'[^a-z0-9]+', '_', prompt['id'])}.npz"
    found = dict(np.load(path)) if path.exists() else {}
    request = nd.request(torch.tensor([prompt["ids"]]), Contrast(prompt["good"], prompt["bad"]))
    other = nd.request(torch.tensor([prompt["corrupted_ids"]]), request.target)
    for name in {m for n in ESTIMATORS for m in members(n)}:
        if name in found:
            continue
        tic = time.perf_counter()
        estimator, steps = stepped(name)
        found[name] = circuits.edge_scores(nd.engine, request, other, graph, (estimator,), steps)[estimator].numpy()
        found[f"{name} seconds"] = np.array(time.perf_counter() - tic)
        CACHE.mkdir(exist_ok=True)
        np.savez_compressed(path, **found)
    return found


def _curve(nd, graph, pairs, scores, task: str, split: str, name: str, ranking: str, chosen: list[dict]) -> dict:
    """One ranking's faithfulness curve of a candidate's task scores (cached under ``cache/``)."""
    from captum_ffb.patching import circuits

    path = CACHE / f"curve-{task}-{split}-{name}-{ranking}.json"
    ids = [p["id"] for p in chosen]
    if path.exists() and json.loads(path.read_text())["prompts"] == ids:
        return json.loads(path.read_text())["result"]
    tic = time.perf_counter()
    curve = circuits.faithfulness_curve(nd.engine, pairs, graph, scores, absolute=ranking == "absolute")
    result = dict(cpr=curve.cpr, cmd=curve.cmd, f=list(curve.faithfulness), kept=list(curve.edges), clean=curve.clean,
                  counterfactual=curve.counterfactual, curve_seconds=time.perf_counter() - tic)
    path.write_text(json.dumps(dict(prompts=ids, result=result)))
    return result


def run_task(task: str, selection: int, heldout: int, estimators: tuple[str, ...] = ESTIMATORS,
             splits: tuple[str, ...] = ("selection", "heldout")) -> dict:
    """One task: its prompts, every estimator's curve on the selection and held-out prompts."""
    global ESTIMATORS
    ESTIMATORS = estimators
    from captum_ffb import Contrast, NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir
    from captum_ffb.patching import circuits
    from captum_ffb.patching.patches import check_estimators  # noqa: F401  (registers every estimator)

    torch.set_num_threads(1)
    loaded = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm")
    nd = NormDecomposition(loaded.model)
    graph = circuits.ComponentGraph.of(nd.engine, "head")
    prompts, accuracy = task_prompts(nd, loaded.tokenizer, task, selection + heldout)
    out = dict(task=task, accuracy=accuracy, edges=graph.n_edges, splits={})
    for split, chosen in (("selection", prompts[:selection]), ("heldout", prompts[selection:])):
        if split not in splits:
            continue
        scored = [_cached_scores(nd, graph, p) for p in chosen]
        pairs = []
        for p in chosen:
            request = nd.request(torch.tensor([p["ids"]]), Contrast(p["good"], p["bad"]))
            pairs.append((request, nd.request(torch.tensor([p["corrupted_ids"]]), request.target)))
        results = {}
        for name in ESTIMATORS:
            summed, seconds = combined(name, scored)
            curves = {ranking: _curve(nd, graph, pairs, torch.tensor(summed), task, split, name, ranking, chosen)
                      for ranking in RANKINGS}
            results[name] = dict(cpr=curves["signed"]["cpr"], cmd=curves["absolute"]["cmd"], seconds=seconds, **curves)
            print(f"{task} {split} {name}: CPR {results[name]['cpr']:.3f} CMD {results[name]['cmd']:.3f}", flush=True)
        out["splits"][split] = dict(prompts=[p["id"] for p in chosen], results=results)
    return out


# --------------------------------------------------------------------------- the report
def passes(name: str) -> float:
    def own(member: str) -> int:
        estimator, steps = stepped(member)
        return 1 + 2 * steps if estimator in ("eap-ig", "gim-ig") else 3

    return 1 + sum(own(m) - 1 for m in members(name))  # the counterfactual's forward pass shared


def choose(saved: dict, split: str = "selection") -> tuple[str | None, dict[str, tuple[float, float]]]:
    """The default: the smallest largest CPR shortfall over the tasks on the selection prompts
    among the estimators of at most EAP-IG's passes (ties: CMD excess, then passes; ``None``
    when none is that cheap); with each estimator's largest CPR shortfall and CMD excess on
    ``split``."""
    tasks = [saved["tasks"][t]["splits"][split]["results"] for t in saved["tasks"]]
    names = compared(saved, split)
    worst = {}
    for name in names:
        cpr = max(max(r[m]["cpr"] for m in names) - r[name]["cpr"] for r in tasks)
        cmd = max(r[name]["cmd"] - min(r[m]["cmd"] for m in names) for r in tasks)
        worst[name] = (cpr, cmd)
    allowed = [n for n in names if passes(n) <= passes("eap-ig")]
    best = min(allowed, key=lambda n: (round(worst[n][0], 6), round(worst[n][1], 6), passes(n)), default=None)
    return best, worst


def describe(name: str) -> str:
    def one(member: str) -> str:
        estimator, steps = stepped(member)
        return PEER_NAMES[estimator] + (f" on {steps} steps" if "@" in member else "")

    return " and ".join(one(m) for m in members(name)) + (", averaged" if "&" in name else "")


def compared(saved: dict, split: str | None = None) -> list[str]:
    """The estimators every task (and split, or ``split``) was run with."""
    runs = [d["splits"][s]["results"] for d in saved["tasks"].values() for s in d["splits"] if split in (None, s)]
    return [n for n in runs[0] if all(n in r for r in runs)] if runs else []


def _value(result: dict, key: str) -> float:
    """``key`` of one estimator's result (``"absolute.cpr"``: the absolute ranking's CPR)."""
    for part in key.split("."):
        result = result[part]
    return result


def _table(saved: dict, split: str, key: str, best_is_max: bool) -> list[str]:
    tasks = list(saved["tasks"])
    names = compared(saved, split)
    lines = [f"| estimator | {' | '.join(tasks)} | passes | seconds / prompt |", "|---|" + "---:|" * (len(tasks) + 2)]
    for name in names:
        cells = []
        for task in tasks:
            results = saved["tasks"][task]["splits"][split]["results"]
            values = [_value(results[m], key) for m in names]
            value = _value(results[name], key)
            top = max(values) if best_is_max else min(values)
            cells.append(f"**{value:.3f}**" if value == top else f"{value:.3f}")
        seconds = np.mean([saved["tasks"][t]["splits"][split]["results"][name]["seconds"] for t in tasks])
        lines.append(f"| `{name}` ({describe(name)}) | {' | '.join(cells)} | {passes(name):g} | {seconds:.1f} |")
    return lines


def with_candidates(saved: dict, candidates: dict | None) -> dict:
    """``saved`` with the averaged candidates' selection curves (``candidates.json``) beside
    the estimators' (they are run on the selection prompts only)."""
    if candidates is None:
        return saved
    merged = json.loads(json.dumps(saved))
    for task, data in merged["tasks"].items():
        extra = candidates["tasks"].get(task, {}).get("splits", {}).get("selection")
        if extra is not None and extra["prompts"] == data["splits"]["selection"]["prompts"]:
            data["splits"]["selection"]["results"].update(extra["results"])
    return merged


def report(saved: dict, candidates: dict | None = None) -> str:
    tasks = saved["tasks"]
    best, worst = choose(with_candidates(saved, candidates))
    lines = ["## Edge circuits by MIB's protocol (SmolLM2-135M-Instruct)", "",
             f"Written by `results/mib/run.py` ({saved['run']}, torch {saved['torch']}); the protocol is "
             "`captum_ffb.patching.circuits` (docs/circuits.md). Edges: "
             f"{next(iter(tasks.values()))['edges']:,} (the head graph: heads read their queries, keys and values "
             "as one reader). CPR is read from the circuits of the top signed scores and CMD from those of the "
             "top absolute scores, as MIB's leaderboard reads them (`circuits.mib_scores`). Bold: the best of the "
             "row's task.", "",
             "### Can the model do MIB's tasks?", "",
             "| task | accuracy (logit(good) > logit(bad)) | used |", "|---|---:|---|"]
    for task, acc in saved["mib_formats"].items():
        lines.append(f"| MIB {task} | {acc:.2f} | no: below 0.70 |" if acc < 0.7 else f"| MIB {task} | {acc:.2f} | yes |")
    for task, data in tasks.items():
        a = data["accuracy"]
        lines.append(f"| {task} | {a['right'] / max(a['tried'], 1):.2f} ({a['right']} of {a['tried']} tried) | yes |")
    for split, title in (("heldout", "Held-out prompts"), ("selection", "Selection prompts (the choice)")):
        if any(split not in d["splits"] for d in tasks.values()):
            continue
        counts = ", ".join(f"{t} {len(d['splits'][split]['prompts'])}" for t, d in tasks.items())
        lines += ["", f"### {title}", "", f"Prompts: {counts}.", "", "**CPR** (higher is better)", ""]
        lines += _table(saved, split, "cpr", True)
        lines += ["", "**CMD** (lower is better)", ""]
        lines += _table(saved, split, "cmd", False)
        if split == "heldout":
            lines += ["", "**CPR of the absolute ranking** (how this file read CPR before 2026-11-30; MIB reads CPR "
                      "from the signed ranking, whose top edges carry the behaviour and whose f can pass 1)", ""]
            lines += _table(saved, split, "absolute.cpr", True)
    if candidates is not None:
        merged = with_candidates(saved, candidates)
        lines += ["", "### Averaged candidates (selection prompts)", "",
                  "`a&b`: the mean of the two estimators' scores (their passes shared where they can be); "
                  "those of more passes than EAP-IG are measured for the record, not candidates.", "",
                  "**CPR**", ""]
        lines += _table(merged, "selection", "cpr", True)
        lines += ["", "**CMD**", ""]
        lines += _table(merged, "selection", "cmd", False)
    lines += ["", "### The default", "",
              f"`DEFAULT_CIRCUIT_ESTIMATOR` by the selection prompts: **`{best}`** (largest CPR shortfall from the "
              "best over the tasks, largest CMD excess; candidates of at most EAP-IG's passes):", ""]
    lines += [f"- `{name}`: {cpr:.3f}, {cmd:.3f}" + ("" if passes(name) <= passes("eap-ig") else
                                                       f" ({passes(name):g} passes: more than EAP-IG's, not a candidate)")
              for name, (cpr, cmd) in worst.items()]
    if all("heldout" in d["splits"] for d in tasks.values()):
        _, held = choose(saved, "heldout")
        wins = {name: sum(max(d["splits"]["heldout"]["results"].values(), key=lambda r: r["cpr"]) is
                          d["splits"]["heldout"]["results"][name] for d in tasks.values()) for name in held}
        lines += ["", "On the held-out prompts (largest CPR shortfall from the best, largest CMD excess; tasks where "
                  "it has the best CPR):", ""]
        lines += [f"- `{name}`: {cpr:.3f}, {cmd:.3f}; best on {wins[name]} of {len(tasks)}"
                  for name, (cpr, cmd) in held.items()]
    lines += stability(saved)
    only = [n for n in compared(saved, "selection") if n not in compared(saved, "heldout")]
    if only:
        lines += ["", "Run on the selection prompts only (not chosen by the rule above): "
                  + ", ".join(f"`{n}`" for n in only) + "."]
    lines += [f"\n{note}" for note in saved.get("notes", [])]
    lines += ["", "### Protocol checks", "",
              "- `tests/patching/test_circuits.py`: on a tiny Llama, the circuit with every edge gives the clean "
              "value and the empty circuit the counterfactual one (1e-12); cutting every edge into one head (or "
              "FF block) equals patching that head's (block's) output for real; a circuit cut into two readers "
              "equals the pass built by hand; CPR and CMD of hand-made curves; MIB's pruning of dangling edges.",
              "- On every prompt here the empty circuit's value is the counterfactual prompt's and the full "
              "circuit's the clean one's (f = 0 and 1 at the ends by construction: `clean`, `counterfactual` in "
              "results.json)."]
    return "\n".join(lines) + "\n"


def stability(saved: dict) -> list[str]:
    """The section on whether a task's best estimator stays the best from the selection prompts
    to the held-out ones (empty where a split is missing)."""
    tasks = saved["tasks"]
    if not all(s in d["splits"] for d in tasks.values() for s in ("selection", "heldout")):
        return []
    names = compared(saved)
    lines = ["", "### Does a task's best estimator stay the best?", "",
             f"Among the {len(names)} estimators run on both splits: each task's best on the selection prompts, "
             "its rank on the held-out prompts, the held-out best, and the held-out gap between the first and the "
             "second.", "",
             "| measure | task | best on selection | its held-out rank | best held out | held-out gap, 1st − 2nd |",
             "|---|---|---|---:|---|---:|"]
    kept = {}
    for key, larger in (("cpr", True), ("cmd", False)):
        kept[key] = 0
        for task, data in tasks.items():
            chosen, held = (data["splits"][s]["results"] for s in ("selection", "heldout"))
            first = sorted(names, key=lambda n: chosen[n][key], reverse=larger)[0]
            order = sorted(names, key=lambda n: held[n][key], reverse=larger)
            kept[key] += order[0] == first
            gap = abs(held[order[0]][key] - held[order[1]][key])
            lines.append(f"| {key.upper()} | {task} | `{first}` | {order.index(first) + 1} of {len(names)} | "
                         f"`{order[0]}` | {gap:.4f} |")
    lines += ["", f"The selection's best is the held-out best on {kept['cpr']} of {len(tasks)} tasks by CPR and on "
              f"{kept['cmd']} of {len(tasks)} by CMD; an estimator drawn at random would be on "
              f"{len(tasks) / len(names):.2f} of {len(tasks)} on average. At these prompt counts, which estimator "
              "is first on a task moves with the prompts drawn: picking on the selection prompts names a task's "
              "held-out best no more often than chance."]
    return lines


def export(saved: dict, directory: Path) -> list[Path]:
    """MIB's submission: one ``<task>_SmolLM2-135M/importances.json`` per task, the default's
    scores summed over the held-out prompts' cached scores."""
    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir
    from captum_ffb.patching import circuits

    candidates = HERE / "candidates.json"
    best, _ = choose(with_candidates(saved, json.loads(candidates.read_text()) if candidates.exists() else None))
    loaded = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm")
    graph = circuits.ComponentGraph.of(NormDecomposition(loaded.model).engine, "head")
    config = loaded.model.config
    cfg = {"n_layers": config.num_hidden_layers, "n_heads": config.num_attention_heads,
           "d_model": config.hidden_size, "parallel_attn_mlp": False}
    written = []
    for task, data in saved["tasks"].items():
        ids = data["splits"]["heldout"]["prompts"] + data["splits"]["selection"]["prompts"]
        files = [CACHE / f"{task}-{re.sub(r'[^a-z0-9]+', '_', i)}.npz" for i in ids]
        scores = torch.tensor(combined(best, [dict(np.load(f)) for f in files if f.exists()])[0])
        path = directory / f"{task}_SmolLM2-135M" / "importances.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(circuits.mib_graph(graph, scores, cfg)))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selection", type=int, default=4, help="selection prompts per task")
    parser.add_argument("--heldout", type=int, default=8, help="held-out prompts per task")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--jobs", type=int, default=1, help="tasks run at once (one process each)")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS),
                        help="the edge estimators compared (a&b: the mean of a's and b's scores)")
    parser.add_argument("--splits", default="selection,heldout", help="the splits run")
    parser.add_argument("--name", default="results.json", help="the results file written here")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--export", type=Path, help="write MIB's submission files for the default here")
    args = parser.parse_args(argv)
    estimators = tuple(n for n in args.estimators.split(",") if n)
    path = HERE / args.name
    if args.export is not None:
        for written in export(json.loads(path.read_text()), args.export):
            print(written)
        return 0
    if not args.report_only:
        tasks = [t for t in args.tasks.split(",") if t]
        started = time.perf_counter()
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            done = list(pool.map(run_task, tasks, [args.selection] * len(tasks), [args.heldout] * len(tasks),
                                 [estimators] * len(tasks), [tuple(args.splits.split(","))] * len(tasks)))
        from captum_ffb import NormDecomposition
        from captum_ffb.explained.models import load_model, smollm2_dir

        loaded = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm")
        formats = mib_formats_accuracy(NormDecomposition(loaded.model), loaded.tokenizer)
        path.write_text(json.dumps(dict(run=datetime.datetime.now().isoformat(timespec="minutes"),
                                        torch=torch.__version__, seconds=time.perf_counter() - started,
                                        mib_formats=formats, tasks={d["task"]: d for d in done}), indent=1))
    summary = "SUMMARY.md" if args.name == "results.json" else Path(args.name).stem + ".md"
    candidates = HERE / "candidates.json"
    extra = json.loads(candidates.read_text()) if summary == "SUMMARY.md" and candidates.exists() else None
    (HERE / summary).write_text(report(json.loads(path.read_text()), extra))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
