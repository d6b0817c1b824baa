"""Patching estimates against real activation and path patching (SmolLM2-135M-Instruct, six tasks).

Run from the repository root (about 2 hours on one core of a shared 2-core machine at the
default counts; resumable: the prompts already in ``results.json`` are kept)::

    python results/patching/run.py                 # writes RESULTS.md, results.json and SUMMARY.md here
    python results/patching/run.py --report-only   # the reports again from results.json

**Tasks** (each prompt a clean and a corrupted input of the same length; the explained value
is a logit difference ``logit(good) − logit(bad)`` at the last position; a prompt is kept when
the model gets it right, ``value(clean) > 0``; the first ``--selection`` kept prompts of a task
choose, the next ``--heldout`` report):

* ``ioi``: the rows of ``captum_ffb/evaluation/data/evidence/ioi.csv`` whose two names are one
  token each; the corrupted prompt replaces the indirect object (IO) and the subject (S)
  everywhere by two other one-token names of the file (seeded per row); ``good`` = IO,
  ``bad`` = S.
* ``induction``: ``X_1 … X_10 X_1 … X_9`` of random word tokens (ten distinct tokens of the
  tokenizer's lower-case words of 4–9 letters, ``random.Random(2000 + k)``); the corrupted
  prompt draws the first half anew, ``Y_1 … Y_10 X_1 … X_9`` (the repeat is broken, the query
  half unchanged); ``good`` = ``X_10``, ``bad`` = ``Y_10``.
* ``recall``: ``"The capital of {country} is"`` and two other templates over 40 countries
  whose capital is one token; the corrupted prompt names another country (same token count,
  ``random.Random(3000 + k)``); ``good`` = the capital, ``bad`` = the other country's capital.
* ``agreement``: the rows of ``blimp_regular_plural_subject_verb_agreement_1.csv`` whose
  prefix is ``The/This/That/These/Those <noun>``; the corrupted prompt swaps the subject's
  number (determiner and noun: ``These dancers`` → ``This dancer``, by English suffix rules,
  same token count); ``good``/``bad`` = the first tokens of the grammatical and ungrammatical
  verb (rows where they differ).
* ``factual``: ``"The {landmark} is located in the city of"`` over 31 landmarks, the corrupted
  prompt naming another landmark of the same token count (``random.Random(5000 + k)``: the
  Eiffel Tower against the Kremlin); ``good``/``bad`` = the first tokens of the two cities.
* ``determiner``: the rows of ``blimp_determiner_noun_agreement_1.csv`` ending in
  ``this/these/that/those``, the corrupted prompt swapping its number; ``good``/``bad`` = the
  first tokens of the grammatical and ungrammatical noun.

**Ground truth**: :func:`captum_ffb.activation_patching` at head granularity (each of the
270 heads and 30 FF blocks patched at every position, one real pass each) and at sublayer
granularity (each of the 30 attention sublayers). **Estimates**: ``attribute_graph(...,
corrupted_inputs=..., estimators=ESTIMATORS)`` at both granularities, its ``component_estimates``
(per-node estimates summed over positions; the ``"+exact"`` estimators' real passes and AtP*'s
whole-component numbers where they apply); every ``"+exact"`` estimator at several thresholds on
κ, from one graph built at the smallest (a node or component above a larger threshold is above
the smallest, so its real patch is already there). Controls that use no gradient: each
component's depth and the size of its patch. **Edges**: on the first ``--edge-prompts``
held-out prompts of each task, ``--edges`` edges of the (default, pruned) head graph, half
among its kept edges and half among all its edges (``random.Random(4000 + k)``), each estimated
(``graph.edge_patch_estimates``) and patched for real along its path
(``graph.edge_path_patching``).

**Choice**: among the estimators of at most three passes plus real patched passes (``frozen``,
``atp``, ``relp``, ``gim`` and their ``+exact`` variants at each threshold) and ``atp+verify``
(five, its frozen estimate's pass included, plus real patched passes), the default is the one whose
largest shortfall on the selection prompts, over the six tasks and over heads and FF blocks, from
the best estimator there (any estimator, AtP* and EAP-IG included) is smallest (pooled Pearson r
per task; ties: fewer passes). The edges' default: the edge estimator with the largest smallest
pooled r over the tasks on the selection prompts' edges (ties: fewer passes).

**Fresh held-out prompts** (``--fresh-heldout``, 4 per task): ``atp+verify`` was designed after
the held-out prompts had been seen, so the goal is checked again on prompts drawn after it was
last changed (the next ones each task gives). Twice: the first 4 fresh prompts per task showed a
miss (agreement's first FF block, flagged by neither estimate), the component of largest κ was
added to the verified ones, and those prompts joined the held-out ones (the last 4 of each
task's ``--heldout``); the fresh held-out prompts are the next 4. ``--add`` computes only what
is missing (the estimators of ``ADDED`` on the saved prompts, everything on new ones);
``--redo NAMES`` computes those estimators again on the saved prompts.
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
EVIDENCE = ROOT / "captum_ffb" / "evaluation" / "data" / "evidence"
THRESHOLDS = (0.5, 1.0, 2.0)
#: The goal: the default within this of the best estimator's pooled r on every task and kind
GOAL = 0.01
TASKS = ("ioi", "induction", "recall", "agreement", "factual", "determiner")
KINDS = ("head", "attention", "ff")
CHEAP = ("frozen", "atp", "relp", "gim")  # at most three passes (plus real patched passes with "+exact")
LINEAR = ("frozen", "atp", "relp", "gim", "eap-ig")
#: estimators added after the first run (``--add``): computed for the saved prompts without
#: patching them for real again
ADDED = ("gim", "atp+verify")
#: AtP*'s second stage on AtP+exact (designed after the held-out prompts were seen, so reported
#: again on ``--fresh-heldout`` prompts that played no part in it)
VERIFY = "atp+verify"
CAPITALS = ("France/Paris Germany/Berlin Italy/Rome Spain/Madrid Japan/Tokyo China/Beijing Russia/Moscow "
            "Egypt/Cairo Greece/Athens England/London Austria/Vienna Poland/Warsaw Ireland/Dublin "
            "Portugal/Lisbon Canada/Ottawa Kenya/Nairobi Norway/Oslo Sweden/Stockholm Finland/Helsinki "
            "Denmark/Copenhagen Hungary/Budapest Cuba/Havana Peru/Lima Chile/Santiago Iran/Tehran "
            "Iraq/Baghdad Syria/Damascus Australia/Canberra Belgium/Brussels Netherlands/Amsterdam "
            "Switzerland/Bern Philippines/Manila Korea/Seoul Afghanistan/Kabul Israel/Jerusalem "
            "Scotland/Edinburgh Wales/Cardiff Bulgaria/Sofia Tunisia/Tunis Jamaica/Kingston")
TEMPLATES = ("The capital of {} is", "{}'s capital city is", "The capital city of {} is called")
DETERMINERS = {"The": "The", "These": "This", "Those": "That", "This": "These", "That": "Those"}
LANDMARKS = ("Eiffel Tower/Paris; Kremlin/Moscow; Colosseum/Rome; Brandenburg Gate/Berlin; Acropolis/Athens; "
             "Sagrada Familia/Barcelona; Louvre/Paris; Vatican/Rome; Parthenon/Athens; Hagia Sophia/Istanbul; "
             "Sydney Opera House/Sydney; Burj Khalifa/Dubai; Prado Museum/Madrid; Rijksmuseum/Amsterdam; "
             "Golden Gate Bridge/San; Statue of Liberty/New; Space Needle/Seattle; Tower of London/London; "
             "Reichstag/Berlin; Pantheon/Rome; Bolshoi Theatre/Moscow; Trevi Fountain/Rome; Notre Dame/Paris; "
             "Arc de Triomphe/Paris; Westminster Abbey/London; Buckingham Palace/London; Alcazar/Seville; "
             "Topkapi Palace/Istanbul; Hermitage Museum/Saint; Uffizi Gallery/Florence; Leaning Tower/Pisa")
SWAPS = {"this": "these", "these": "this", "that": "those", "those": "that"}


# --------------------------------------------------------------------------- the tasks' prompts
def _one(tokenizer, word: str) -> int | None:
    ids = tokenizer(" " + word, add_special_tokens=False).input_ids
    return ids[0] if len(ids) == 1 else None


def _prompt(task: str, key: str, text: str, corrupted: str, ids: list[int], corrupted_ids: list[int], good: int,
            bad: int) -> dict:
    return dict(task=task, id=key, prompt=text, corrupted=corrupted, ids=ids, corrupted_ids=corrupted_ids,
                good=good, bad=bad)


def ioi_candidates(tokenizer):
    rows = list(csv.DictReader((EVIDENCE / "ioi.csv").open(encoding="utf-8")))
    names = sorted({w for r in rows for w in (r["one_prefix_word_good"], r["one_prefix_word_bad"])
                    if _one(tokenizer, w) is not None})
    for index, row in enumerate(rows):
        io, s, prompt = row["one_prefix_word_good"], row["one_prefix_word_bad"], row["one_prefix_prefix"]
        io_id, s_id = _one(tokenizer, io), _one(tokenizer, s)
        if io_id is None or s_id is None:
            continue
        ids = tokenizer(prompt).input_ids
        if io_id not in ids or s_id not in ids:
            continue
        pattern = rf"\b({re.escape(io)}|{re.escape(s)})\b"
        occurrences = len(re.findall(pattern, prompt))
        others = [w for w in names if w not in (io, s) and w not in prompt]
        random.Random(1000 + index).shuffle(others)
        for a, b in zip(others[0::2], others[1::2]):
            corrupted = re.sub(pattern, lambda m, a=a, b=b, io=io: a if m.group(0) == io else b, prompt)
            corrupted_ids = tokenizer(corrupted).input_ids
            if len(corrupted_ids) == len(ids) and sum(x != y for x, y in zip(ids, corrupted_ids)) == occurrences:
                yield _prompt("ioi", f"row {index}", prompt, corrupted, ids, corrupted_ids, io_id, s_id)
                break


def induction_candidates(tokenizer, half: int = 10):
    words = sorted(t for t in tokenizer.get_vocab() if t.startswith("Ġ") and t[1:].isalpha() and t[1:].islower()
                   and 4 <= len(t) - 1 <= 9)
    ids_of = tokenizer.convert_tokens_to_ids
    for k in range(10_000):
        rng = random.Random(2000 + k)
        chosen = rng.sample(words, 2 * half)
        x, y = ids_of(chosen[:half]), ids_of(chosen[half:])
        ids, corrupted_ids = x + x[:-1], y + x[:-1]
        text = tokenizer.decode(ids)
        yield _prompt("induction", f"seed {2000 + k}", text, tokenizer.decode(corrupted_ids), ids, corrupted_ids,
                      x[-1], y[-1])


def recall_candidates(tokenizer):
    pairs = [pair.split("/") for pair in CAPITALS.split()]
    pairs = [(c, k, _one(tokenizer, k)) for c, k in pairs if _one(tokenizer, k) is not None]
    for k in range(10_000):
        rng = random.Random(3000 + k)
        (country, _, capital), (other, _, other_capital) = rng.sample(pairs, 2)
        template = TEMPLATES[k % len(TEMPLATES)]
        text, corrupted = template.format(country), template.format(other)
        ids, corrupted_ids = tokenizer(text).input_ids, tokenizer(corrupted).input_ids
        if len(ids) == len(corrupted_ids):
            yield _prompt("recall", f"seed {3000 + k}", text, corrupted, ids, corrupted_ids, capital, other_capital)


def _other_number(noun: str) -> str:
    if noun.endswith("ies"):
        return noun[:-3] + "y"
    if noun.endswith(("sses", "shes", "ches", "xes", "zes")):
        return noun[:-2]
    if noun.endswith("s") and not noun.endswith("ss"):
        return noun[:-1]
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    if noun.endswith(("s", "sh", "ch", "x", "z")):
        return noun + "es"
    return noun + "s"


def agreement_candidates(tokenizer):
    rows = list(csv.DictReader((EVIDENCE / "blimp_regular_plural_subject_verb_agreement_1.csv").open(encoding="utf-8")))
    for index, row in enumerate(rows):
        match = re.fullmatch(r"(\w+) (\w+)", row["one_prefix_prefix"])
        if match is None or match.group(1) not in DETERMINERS:
            continue
        determiner, noun = match.groups()
        text = row["one_prefix_prefix"]
        corrupted = f"{DETERMINERS[determiner]} {_other_number(noun)}"
        ids, corrupted_ids = tokenizer(text).input_ids, tokenizer(corrupted).input_ids
        good = tokenizer(" " + row["one_prefix_word_good"], add_special_tokens=False).input_ids[0]
        bad = tokenizer(" " + row["one_prefix_word_bad"], add_special_tokens=False).input_ids[0]
        if len(ids) == len(corrupted_ids) and good != bad and ids != corrupted_ids:
            yield _prompt("agreement", f"row {index}", text, corrupted, ids, corrupted_ids, good, bad)


def factual_candidates(tokenizer):
    pairs = [item.split("/") for item in LANDMARKS.split("; ")]
    template = "The {} is located in the city of"
    for k in range(10_000):
        rng = random.Random(5000 + k)
        (a, city_a), (b, city_b) = rng.sample(pairs, 2)
        good, bad = (tokenizer(" " + c, add_special_tokens=False).input_ids[0] for c in (city_a, city_b))
        text, corrupted = template.format(a), template.format(b)
        ids, corrupted_ids = tokenizer(text).input_ids, tokenizer(corrupted).input_ids
        if good != bad and len(ids) == len(corrupted_ids):
            yield _prompt("factual", f"seed {5000 + k}", text, corrupted, ids, corrupted_ids, good, bad)


def determiner_candidates(tokenizer):
    path = EVIDENCE / "blimp_determiner_noun_agreement_1.csv"
    for index, row in enumerate(csv.DictReader(path.open(encoding="utf-8"))):
        text = row["one_prefix_prefix"]
        *head, last = text.split(" ")
        if last not in SWAPS:
            continue
        corrupted = " ".join([*head, SWAPS[last]])
        ids, corrupted_ids = tokenizer(text).input_ids, tokenizer(corrupted).input_ids
        good = tokenizer(" " + row["one_prefix_word_good"], add_special_tokens=False).input_ids[0]
        bad = tokenizer(" " + row["one_prefix_word_bad"], add_special_tokens=False).input_ids[0]
        if good != bad and len(ids) == len(corrupted_ids):
            yield _prompt("determiner", f"row {index}", text, corrupted, ids, corrupted_ids, good, bad)


CANDIDATES = {"ioi": ioi_candidates, "induction": induction_candidates, "recall": recall_candidates,
              "agreement": agreement_candidates, "factual": factual_candidates,
              "determiner": determiner_candidates}


def task_prompts(nd, tokenizer, task: str, count: int) -> list[dict]:
    """The first ``count`` candidates of ``task`` that the model gets right (``value > 0``)."""
    from captum_ffb import Contrast
    from captum_ffb.engine.head import target_value
    from captum_ffb.engine.passes import run_model

    found = []
    for prompt in CANDIDATES[task](tokenizer):
        if len(found) == count:
            break
        request = nd.request(torch.tensor([prompt["ids"]]), Contrast(prompt["good"], prompt["bad"]))
        value = float(target_value(nd.engine.head, run_model(nd.model, *request.args, **request.kwargs),
                                   request.target)[0])
        if value > 0:
            found.append(prompt)
    return found


# --------------------------------------------------------------------------- one prompt
def component_sums(graph, values: torch.Tensor, kinds=("head", "attention", "ff")) -> dict[str, float]:
    """Per-node values summed over positions, by component id."""
    from captum_ffb.core.vocabulary import component_of

    d = graph.data
    sums: dict[str, float] = {}
    for k, kind in enumerate(d.kinds):
        if kind in kinds:
            key = component_of(kind, d.layers[k], d.heads[k])
            sums[key] = sums.get(key, 0.0) + float(values[k])
    return sums


def component_max(graph, values: torch.Tensor) -> dict[str, float]:
    from captum_ffb.core.vocabulary import component_of

    d = graph.data
    found: dict[str, float] = {}
    for k, kind in enumerate(d.kinds):
        if kind in ("head", "attention", "ff"):
            key = component_of(kind, d.layers[k], d.heads[k])
            found[key] = max(found.get(key, 0.0), float(values[k]))
    return found


def graph_estimates(graph) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Every estimator's component estimates of one graph (built at the smallest threshold),
    with the ``"+exact"`` variants at each threshold, and their real passes."""
    estimates, kappa = graph.patch_estimates, graph.patch_kappa
    found = {name: graph.component_estimates(name) for name in (*LINEAR, "atp*", "atp+qk", VERIFY)}
    largest = component_max(graph, kappa)
    whole = graph.patch_components["atp+exact"]
    exact_nodes = estimates["atp+exact"]
    passes = {}
    for tau in THRESHOLDS:
        above = kappa > tau
        passes[f"{tau:g}"] = int(above.sum()) + sum(k > tau for k in largest.values())
        for name in LINEAR:
            sums = component_sums(graph, torch.where(above, exact_nodes, estimates[name]))
            sums.update({c: whole[c] for c, k in largest.items() if k > tau})
            found[f"{name}+exact (κ > {tau:g})"] = sums
    return found, passes


def _patch_sizes(nd, request, corrupted, graph) -> torch.Tensor:
    """Each node's ‖write − write_corrupted‖ (a head's slice before W_O)."""
    from captum_ffb.patching.patches import real_writers

    engine, target = nd.engine, request.target
    granularity = graph.granularity
    clean, base = real_writers(engine, request, target, granularity), real_writers(engine, corrupted, target, granularity)
    d = graph.data
    sizes = torch.zeros(len(d), dtype=torch.float64)
    for k, kind in enumerate(d.kinds):
        if kind in ("ff", "attention"):
            key = f"block.{d.layers[k]}.{kind}"
            sizes[k] = float((clean.outputs[key] - base.outputs[key])[0, d.positions[k]].norm())
        elif kind == "head":
            key = f"block.{d.layers[k]}.attention"
            sizes[k] = float((clean.parts[key] - base.parts[key])[0, d.positions[k], d.heads[k]].norm())
    return sizes


def one_prompt(nd, prompt: dict) -> dict:
    from captum_ffb import Contrast, activation_patching
    from captum_ffb.patching.patches import ESTIMATORS

    ids, corrupted = torch.tensor([prompt["ids"]]), torch.tensor([prompt["corrupted_ids"]])
    target = Contrast(prompt["good"], prompt["bad"])
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    real = activation_patching(nd, ids, corrupted, target, "head", show_progress=False)
    sub = activation_patching(nd, ids, corrupted, target, "sublayer", show_progress=False)
    seconds["activation patching"] = time.perf_counter() - start
    effects = {**real.effects, **sub.of("attention")}
    found: dict[str, dict[str, float]] = {}
    passes: dict[str, int] = {}
    costs: dict[str, dict[str, float]] = {}
    exact_components: list[str] = []
    request = nd.request(ids, target)
    other = nd.request(corrupted, request.target)
    for granularity in ("head", "sublayer"):
        start = time.perf_counter()
        graph = nd.attribute_graph(ids, target, granularity=granularity, max_nodes=1, corrupted_inputs=corrupted,
                                   exact_above=min(THRESHOLDS), estimators=ESTIMATORS)
        seconds[f"graph ({granularity})"] = time.perf_counter() - start
        estimates, exact_passes = graph_estimates(graph)
        exact_components.extend(sorted(graph.patch_components["atp+exact"]))
        estimates["control: patch size"] = component_sums(graph, _patch_sizes(nd, request, other, graph))
        for name, values in estimates.items():
            found.setdefault(name, {}).update(values)
        if granularity == "head":
            passes = exact_passes
            costs = {"seconds": dict(graph.patch_seconds), "passes": dict(graph.patch_passes)}
    components = sorted(effects)
    found["control: depth (layer)"] = {c: float(c.split(".")[1]) for c in components}
    kinds = ["head" if ".head." in c else c.split(".")[2] for c in components]
    return dict(task=prompt["task"], id=prompt["id"], n=len(prompt["ids"]), components=components, kinds=kinds,
                real=[effects[c] for c in components],
                estimates={name: [values[c] for c in components] for name, values in found.items()},
                exact_passes=passes, exact_components=exact_components, costs=costs, clean=real.clean, corrupted=real.corrupted, seconds=seconds)


def edge_check(nd, prompt: dict, count: int, seed: int) -> dict:
    from captum_ffb import Contrast
    from captum_ffb.patching.patches import EDGE_ESTIMATORS

    ids, corrupted = torch.tensor([prompt["ids"]]), torch.tensor([prompt["corrupted_ids"]])
    start = time.perf_counter()
    graph = nd.attribute_graph(ids, Contrast(prompt["good"], prompt["bad"]), granularity="head",
                               corrupted_inputs=corrupted)
    d = graph.data
    real_edges = (d.sources != d.bias) & (d.targets != d.bias)
    kept = (graph.edge_mask & graph.node_mask[d.sources] & graph.node_mask[d.targets] & real_edges).nonzero()[:, 0]
    rest = (real_edges & ~graph.edge_mask).nonzero()[:, 0]
    rng = random.Random(seed)
    chosen = rng.sample(kept.tolist(), min(count // 2, len(kept)))
    chosen += rng.sample(rest.tolist(), min(count - len(chosen), len(rest)))
    edges = torch.tensor(sorted(chosen))
    build = time.perf_counter() - start
    start = time.perf_counter()
    real = graph.edge_path_patching(edges)
    seconds = {"path patching": time.perf_counter() - start, "graph": build}
    estimates = {}
    for name in EDGE_ESTIMATORS:
        start = time.perf_counter()
        estimates[name] = graph.edge_patch_estimates(name, edges)[edges].tolist()
        seconds[name] = time.perf_counter() - start
    ids_ = graph.ids()
    return dict(task=prompt["task"], id=prompt["id"], edges=[[ids_[int(d.sources[e])], ids_[int(d.targets[e])]]
                                                             for e in edges.tolist()],
                kept=[bool(graph.edge_mask[e]) for e in edges.tolist()], weights=d.weights[edges].tolist(),
                real=real.tolist(), estimates=estimates, seconds=seconds)


def add_estimates(nd, result: dict, prompt: dict, names: tuple[str, ...] = ADDED) -> dict:
    """A saved prompt's results with the estimators ``names`` (and their ``"+exact"`` variants
    at each threshold, from the same real patches as the others') added, with their costs."""
    from captum_ffb import Contrast

    ids, corrupted = torch.tensor([prompt["ids"]]), torch.tensor([prompt["corrupted_ids"]])
    target = Contrast(prompt["good"], prompt["bad"])
    from captum_ffb.patching.estimators import get_estimator

    estimates = {}
    result["exact_components"] = []
    for granularity in ("head", "sublayer"):
        graph = nd.attribute_graph(ids, target, granularity=granularity, max_nodes=1, corrupted_inputs=corrupted,
                                   exact_above=min(THRESHOLDS), estimators=(*names, "atp+exact"))
        kappa, exact_nodes = graph.patch_kappa, graph.patch_estimates["atp+exact"]
        largest = component_max(graph, kappa)
        whole = graph.patch_components["atp+exact"]
        result["exact_components"].extend(sorted(whole))
        for name in names:
            estimates.setdefault(name, {}).update(graph.component_estimates(name))
            if not get_estimator(name).linear:  # a variant: no "+exact" of its own
                continue
            for tau in THRESHOLDS:
                above = kappa > tau
                sums = component_sums(graph, torch.where(above, exact_nodes, graph.patch_estimates[name]))
                sums.update({c: whole[c] for c, k in largest.items() if k > tau})
                estimates.setdefault(f"{name}+exact (κ > {tau:g})", {}).update(sums)
        if granularity == "head":
            for name in names:
                result["costs"]["seconds"][name] = graph.patch_seconds[name]
                result["costs"]["passes"][name] = graph.patch_passes[name]
    for name, values in estimates.items():
        result["estimates"][name] = [values[c] for c in result["components"]]
    return result


def add_edge_estimates(nd, check: dict, prompt: dict, names: tuple[str, ...] = ADDED) -> dict:
    """A saved edge check with the edge estimators ``names`` added (the same edges, by id)."""
    from captum_ffb import Contrast

    graph = nd.attribute_graph(torch.tensor([prompt["ids"]]), Contrast(prompt["good"], prompt["bad"]),
                               granularity="head", corrupted_inputs=torch.tensor([prompt["corrupted_ids"]]))
    index = {node: k for k, node in enumerate(graph.ids())}
    d = graph.data
    where = {(int(s), int(t)): e for e, (s, t) in enumerate(zip(d.sources.tolist(), d.targets.tolist()))}
    edges = torch.tensor([where[(index[s], index[t])] for s, t in check["edges"]])
    from captum_ffb.patching.patches import EDGE_ESTIMATORS

    for name in (n for n in names if n in EDGE_ESTIMATORS):
        tic = time.perf_counter()
        check["estimates"][name] = graph.edge_patch_estimates(name, edges)[edges].tolist()
        check["seconds"][name] = time.perf_counter() - tic
    return check


# --------------------------------------------------------------------------- scores
def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")


def scores(results: list[dict], name: str, kind: str) -> dict:
    """Pooled Pearson and Spearman r, and the mean top-10 recall (the share of the 10
    components of largest |real effect| among the 10 of largest |estimate|, per prompt)."""
    from scipy import stats

    pooled_real, pooled_est, recalls = [], [], []
    for result in results:
        mask = np.array([k == kind for k in result["kinds"]])
        real = np.array(result["real"])[mask]
        est = np.array(result["estimates"][name])[mask]
        pooled_real.append(real)
        pooled_est.append(est)
        top = min(10, len(real))
        truth = set(np.argsort(-np.abs(real))[:top].tolist())
        guess = set(np.argsort(-np.abs(est))[:top].tolist())
        recalls.append(len(truth & guess) / top)
    real, est = np.concatenate(pooled_real), np.concatenate(pooled_est)
    spearman = float(stats.spearmanr(real, est).statistic) if est.std() > 0 else float("nan")
    return dict(pearson=_pearson(real, est), spearman=spearman, recall=float(np.mean(recalls)), n=int(len(real)))


def edge_scores(checks: list[dict], name: str, kept: bool | None = None) -> dict:
    from scipy import stats

    real = np.array([v for c in checks for v, k in zip(c["real"], c["kept"]) if kept is None or k == kept])
    est = np.array([v for c in checks for v, k in zip(c["estimates"][name], c["kept"]) if kept is None or k == kept])
    ok = ~np.isnan(est)
    real, est = real[ok], est[ok]
    spearman = float(stats.spearmanr(real, est).statistic) if len(est) > 2 and est.std() > 0 else float("nan")
    return dict(pearson=_pearson(real, est), spearman=spearman, n=int(len(real)))


def choose(selection: dict[str, list[dict]], candidates: list[str], everything: list[str], costs: dict[str, float]
           ) -> tuple[str, dict[str, float]]:
    """The candidate with the smallest largest shortfall from the best estimator (of
    ``everything``) over tasks and over heads and FF blocks (ties: fewer passes)."""
    best = {(task, kind): max(scores(rows, name, kind)["pearson"] for name in everything)
            for task, rows in selection.items() for kind in ("head", "ff")}
    shortfall = {}
    for name in candidates:
        shortfall[name] = max(best[(task, kind)] - scores(rows, name, kind)["pearson"]
                              for task, rows in selection.items() for kind in ("head", "ff"))
    chosen = min(candidates, key=lambda name: (round(shortfall[name], 6), costs.get(name, 0.0)))
    return chosen, shortfall


# --------------------------------------------------------------------------- reports
def _rounded(value):
    if isinstance(value, float):
        return float(f"{value:.7g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def _fmt(x: float) -> str:
    return "—" if x != x else f"{x:.3f}"


def table(rows: list[dict], names: list[str], costs: dict[str, tuple[float, float]] | None = None) -> list[str]:
    head = "| estimator | heads r | heads ρ | heads top-10 | attention r | attention ρ | attention top-10 | FF r | FF ρ | FF top-10 |"
    rule = "|---|" + "---:|" * 9
    if costs is not None:
        head += " passes | s |"
        rule += "---:|---:|"
    lines = [head, rule]
    for name in names:
        cells = []
        for kind in KINDS:
            s = scores(rows, name, kind)
            cells += [_fmt(s["pearson"]), _fmt(s["spearman"]), _fmt(s["recall"])]
        line = f"| {name} | " + " | ".join(cells) + " |"
        if costs is not None:
            passes, seconds = costs.get(name, (float("nan"), float("nan")))
            line += f" {passes:.1f} | {seconds:.2f} |" if passes == passes else " — | — |"
        lines.append(line)
    return lines


def estimator_costs(results: list[dict]) -> dict[str, tuple[float, float]]:
    """Name → (passes, seconds) per prompt (head graph; the ``+exact`` variants' real passes
    at their threshold)."""
    costs = {}
    base = {}
    for name in ("frozen", "atp", "relp", "gim", "eap-ig", "atp*", "atp+qk"):
        base[name] = (float(np.mean([r["costs"]["passes"][name] for r in results])),
                      float(np.mean([r["costs"]["seconds"][name] for r in results])))
        costs[name] = base[name]
    exact_seconds = float(np.mean([r["costs"]["seconds"]["atp+exact"] - r["costs"]["seconds"]["atp"]
                                   for r in results]))
    if all(VERIFY in r["costs"]["passes"] for r in results):
        costs[VERIFY] = (float(np.mean([r["costs"]["passes"][VERIFY] for r in results])),
                         float(np.mean([r["costs"]["seconds"][VERIFY] for r in results])))
    for tau in THRESHOLDS:
        extra = float(np.mean([r["exact_passes"][f"{tau:g}"] for r in results]))
        smallest = float(np.mean([r["exact_passes"][f"{min(THRESHOLDS):g}"] for r in results]))
        for name in LINEAR:
            share = extra / smallest if smallest else 0.0
            costs[f"{name}+exact (κ > {tau:g})"] = (base[name][0] + extra, base[name][1] + share * exact_seconds)
    return costs


def per_task(spec: str, tasks: list[str]) -> dict[str, int]:
    """``"5"`` → 5 for every task; ``"ioi=14,recall=5"`` → those (0 for a task not named)."""
    if "=" not in spec:
        return {task: int(spec) for task in tasks}
    given = dict(item.split("=") for item in spec.split(",") if item)
    return {task: int(given.get(task, 0)) for task in tasks}


def _counts(first: dict[str, int], second: dict[str, int] | None, tasks: list[str]) -> str:
    return ", ".join(f"{t} {first[t]}" + (f" / {second[t]}" if second is not None else "") for t in tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selection", default="ioi=14,induction=9,recall=5,agreement=5,factual=4,determiner=4",
                        help="selection prompts per task: one number for every task, or task=number,...")
    parser.add_argument("--heldout", default="ioi=26,induction=13,recall=12,agreement=12,factual=8,determiner=8",
                        help="held-out prompts per task (as --selection)")
    parser.add_argument("--fresh-heldout", default="4",
                        help="prompts per task after the held-out ones, kept out of every choice (as --selection)")
    parser.add_argument("--edge-prompts", default="ioi=4,induction=2,recall=2,agreement=2,factual=2,determiner=2",
                        help="held-out prompts per task whose edges are checked (as --selection)")
    parser.add_argument("--edge-selection", default="4", help="selection prompts per task whose edges choose")
    parser.add_argument("--edges", type=int, default=30, help="edges checked per prompt")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--report-only", action="store_true", help="rebuild the reports from results.json")
    parser.add_argument("--fresh", action="store_true", help="ignore the prompts already in results.json")
    parser.add_argument("--redo", default="",
                        help="estimators (comma-separated) computed again on the saved prompts (no real patching again)")
    parser.add_argument("--add", action="store_true",
                        help=f"add the estimators {', '.join(ADDED)} to the saved prompts (no real patching again)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tasks = [t for t in args.tasks.split(",") if t]
    for option in ("selection", "heldout", "fresh_heldout", "edge_prompts", "edge_selection"):
        setattr(args, option, per_task(getattr(args, option), tasks))
    path = HERE / "results.json"
    saved = json.loads(path.read_text()) if path.exists() and not args.fresh else {}
    if saved.get("version") != 2:
        saved = {}
    done = {(r["task"], r["id"]): r for r in saved.get("prompts", [])}
    done_edges = {(c["task"], c["id"]): c for c in saved.get("edges", [])}
    plan: dict[str, list[dict]] = saved.get("plan", {})
    started = time.perf_counter()
    elapsed = float(saved.get("seconds", 0.0))
    if not args.report_only:
        from captum_ffb import NormDecomposition
        from captum_ffb.explained.models import load_model, smollm2_dir
        from captum_ffb.patching.patches import EDGE_ESTIMATORS

        loaded = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm")
        nd = NormDecomposition(loaded.model)
        for task in tasks:
            wanted = args.selection[task] + args.heldout[task] + args.fresh_heldout[task]
            if len(plan.get(task, [])) < wanted:  # the planned prompts first, then new ones
                known = {p["id"] for p in plan.get(task, [])}
                more = [p for p in task_prompts(nd, loaded.tokenizer, task, wanted) if p["id"] not in known]
                plan[task] = plan.get(task, []) + more[:wanted - len(plan.get(task, []))]
        jobs = []
        for task in tasks:
            selected = args.selection[task]
            prompts = plan[task][:selected + args.heldout[task] + args.fresh_heldout[task]]
            for k, prompt in enumerate(prompts):
                jobs.append(("prompt", prompt, k))
            for k in range(args.edge_selection[task]):
                jobs.append(("edges", prompts[k], 4000 + k))
            for k in range(args.edge_prompts[task]):
                jobs.append(("edges", prompts[selected + k], 4000 + selected + k))
        def save() -> None:
            path.write_text(json.dumps(dict(version=2, plan=plan, seconds=elapsed + time.perf_counter() - started,
                                            run=datetime.datetime.now().isoformat(timespec="minutes"),
                                            torch=torch.__version__, prompts=_rounded(list(done.values())),
                                            edges=_rounded(list(done_edges.values())))))

        redo = tuple(n for n in args.redo.split(",") if n)
        ran = 0
        for number, (job, prompt, k) in enumerate(jobs):
            key = (prompt["task"], prompt["id"])
            saved_one = done.get(key) if job == "prompt" else done_edges.get(key)
            wanted_names = ADDED if job == "prompt" else [n for n in ADDED if n in EDGE_ESTIMATORS]
            missing = saved_one is not None and any(n not in saved_one["estimates"] for n in wanted_names)
            again = saved_one is not None and job == "prompt" and bool(redo)
            if saved_one is not None and not (args.add and missing) and not again:
                continue
            tic = time.perf_counter()
            if job == "prompt":
                names = redo if again else ADDED
                done[key] = add_estimates(nd, saved_one, prompt, names) if saved_one else one_prompt(nd, prompt)
            else:
                done_edges[key] = add_edge_estimates(nd, saved_one, prompt) if saved_one else \
                    edge_check(nd, prompt, args.edges, k)
            print(f"{number + 1}/{len(jobs)} {job} {prompt['task']} {prompt['id']} (n={len(prompt['ids'])}): "
                  f"{time.perf_counter() - tic:.1f} s", flush=True)
            ran += 1
            if ran % 10 == 0:  # (the file is large: written every ten prompts, and at the end)
                save()
        if ran:
            save()
        saved = json.loads(path.read_text())
    report(saved, tasks, args)
    return 0


def report(saved: dict, tasks: list[str], args) -> None:
    from captum_ffb.patching.patches import (
        DEFAULT_EDGE_ESTIMATOR,
        DEFAULT_ESTIMATOR,
        EDGE_ESTIMATORS,
        EXACT_ABOVE,
    )

    by_key = {(r["task"], r["id"]): r for r in saved["prompts"]}
    selection, heldout, fresh = {}, {}, {}
    for task in tasks:
        prompts = [by_key[(task, p["id"])] for p in saved["plan"][task] if (task, p["id"]) in by_key]
        selected, held = args.selection[task], args.selection[task] + args.heldout[task]
        selection[task], heldout[task] = prompts[:selected], prompts[selected:held]
        fresh[task] = prompts[held:held + args.fresh_heldout[task]]
    everyone_sel = [r for t in tasks for r in selection[t]]
    everyone_held = [r for t in tasks for r in heldout[t]]
    everyone_fresh = [r for t in tasks for r in fresh[t]]
    all_rows = everyone_sel + everyone_held + everyone_fresh
    costs = estimator_costs(all_rows)
    hybrids = [f"{b}+exact (κ > {tau:g})" for b in LINEAR for tau in THRESHOLDS]
    verify = [VERIFY] if VERIFY in costs else []
    everything = [*LINEAR, "atp+qk", "atp*", *hybrids, *verify]
    candidates = [*CHEAP, *(f"{b}+exact (κ > {tau:g})" for b in CHEAP for tau in THRESHOLDS), *verify]
    chosen, shortfall = choose(selection, candidates, everything, {k: v[0] for k, v in costs.items()})
    library = chosen.split(" (")[0]
    tau = float(chosen.split("> ")[1].rstrip(")")) if "κ" in chosen else None
    agrees = library == DEFAULT_ESTIMATOR and (tau is None or tau == EXACT_ABOVE)
    controls = ["control: depth (layer)", "control: patch size"]
    shown = [*LINEAR, "atp+qk", "atp*", *[f"{b}+exact (κ > {t:g})" for b in LINEAR for t in THRESHOLDS], *verify,
             *controls]
    # edges
    edge_by_key = {(c["task"], c["id"]): c for c in saved.get("edges", [])}
    edge_sel = {t: [edge_by_key[(t, p["id"])] for p in saved["plan"][t][:args.edge_selection[t]]
                    if (t, p["id"]) in edge_by_key] for t in tasks}
    edge_held = {t: [edge_by_key[(t, p["id"])] for p in saved["plan"][t][args.selection[t]:args.selection[t] + args.edge_prompts[t]]
                     if (t, p["id"]) in edge_by_key] for t in tasks}
    edge_choice = None
    if all(edge_sel[t] for t in tasks):
        edge_choice = max(EDGE_ESTIMATORS, key=lambda n: (min(edge_scores(edge_sel[t], n)["pearson"] for t in tasks),
                                                          -(1 + 2 * 5 if n == "eap-ig" else 3)))
    hours = saved.get("seconds", 0.0) / 3600
    stamp = saved.get("run", "?")
    lines = ["# Patching estimates against activation and path patching", "",
             f"Run {stamp} by `python results/patching/run.py` (torch {saved.get('torch')}, 1 thread, 2-core "
             f"machine shared with other work): {hours:.2f} hours of computing in all. SmolLM2-135M-Instruct; "
             f"selection / held-out prompts per task: {_counts(args.selection, args.heldout, tasks)} (the tasks, prompts and "
             "corruptions: the script's docstring); per prompt 270 heads, 30 attention sublayers and 30 FF blocks, "
             "each patched at every position from the corrupted run. r: Pearson with real activation patching, "
             "pooled over the prompts; ρ: Spearman, pooled; top-10: the mean share of the 10 components of "
             "largest |effect| found among the 10 of largest |estimate|.", "",
             "Estimators: `frozen` (the frozen model's gradient), `atp` (attribution patching), `relp` (relevance "
             "patching, Rezaei Jafari et al. 2025), `eap-ig` (EAP-IG's integrated gradients over the input "
             "embeddings, 5 steps; Hanna et al. 2024), `atp+qk` (AtP with AtP*'s QK fix), `atp*` (QK fix and "
             "GradDrop; Kramár et al. 2024), each `X+exact (κ > τ)`: `X` with the nodes and components whose "
             "patch moves the stream by more than τ times its size patched for real.", "",
             f"**Chosen on the selection prompts: {chosen}** (largest shortfall from the best estimator over "
             f"tasks × {{heads, FF}}: {shortfall[chosen]:.3f}); the library's default: `{DEFAULT_ESTIMATOR}`, "
             f"`EXACT_ABOVE = {EXACT_ABOVE:g}` ({'they agree' if agrees else 'THEY DISAGREE'}).", "",
             "## The goal on the held-out prompts", "",
             *goal_lines(heldout, everyone_held, tasks, chosen, everything, candidates)[0], "",
             *fresh_lines(fresh, everyone_fresh, tasks, chosen, everything, candidates, shown),
             *verify_lines(selection, tasks, everything), "",
             "## Held-out prompts, every task pooled", "", *table(everyone_held, shown, costs), ""]
    for task in tasks:
        lines += [f"## Held-out prompts: {task} ({len(heldout[task])} prompts, "
                  f"n = {min(r['n'] for r in heldout[task])}–{max(r['n'] for r in heldout[task])} tokens)", "",
                  *table(heldout[task], shown), ""]
    lines += ["## Selection prompts: the choice", "",
              "Largest shortfall (pooled r per task, heads and FF blocks) from the best estimator of the task and "
              "kind, for each candidate of at most three passes plus real patched passes:", "",
              "| candidate | largest shortfall | passes per prompt |", "|---|---:|---:|"]
    for name in sorted(candidates, key=lambda n: shortfall[n]):
        lines.append(f"| {name} | {shortfall[name]:.3f} | {costs[name][0]:.1f} |")
    lines += ["", "Pooled r on the selection prompts, per task (heads / FF):", "",
              "| estimator | " + " | ".join(tasks) + " |", "|---|" + "---:|" * len(tasks)]
    for name in [*LINEAR, "atp+qk", "atp*", *[f"{b}+exact (κ > {t:g})" for b in LINEAR for t in THRESHOLDS], *verify]:
        cells = [f"{_fmt(scores(selection[t], name, 'head')['pearson'])} / {_fmt(scores(selection[t], name, 'ff')['pearson'])}"
                 for t in tasks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Cost per prompt", "",
              "Passes: forward and backward passes of the whole model (the corrupted pass counted in each; a "
              "`+exact` estimator's real patched passes at its threshold added); seconds: the head graph's, "
              "measured per estimator (AtP*'s and the QK fix's together under `atp*` and `atp+qk`).", "",
              "| what | passes | seconds |", "|---|---:|---:|"]
    for name in (*LINEAR, "atp+qk", "atp*", *[f"{b}+exact (κ > {t:g})" for b in CHEAP for t in THRESHOLDS], *verify):
        lines.append(f"| {name} | {costs[name][0]:.1f} | {costs[name][1]:.2f} |")
    gt = float(np.mean([r["seconds"]["activation patching"] for r in all_rows]))
    lines += [f"| activation patching (heads, FF blocks and attention sublayers: 330 real passes) | 330 | {gt:.1f} |",
              ""]
    if edge_choice is not None:
        lines += ["## Edges: estimates against real path patching", "",
                  f"Per task, the first held-out prompts' head graphs ({_counts(args.edge_prompts, None, tasks)}; default pruning), "
                  f"{args.edges} edges each: half among the kept edges, half among the others. Path patching: one "
                  "forward pass per edge in which only the target's computation at its position (for a head, only "
                  "that head's slice) sees the source's corrupted write. The edges' default is chosen on "
                  f"the first selection prompts' ({_counts(args.edge_selection, None, tasks)}; the largest smallest r over tasks): "
                  f"**{edge_choice}** (the library's: `{DEFAULT_EDGE_ESTIMATOR}`, "
                  f"{'they agree' if edge_choice == DEFAULT_EDGE_ESTIMATOR else 'THEY DISAGREE'}). Circuits cut from "
                  "edge scores have their own default, chosen by MIB's protocol (`results/mib`).", "",
                  "| task | edges | " + " | ".join(f"{n} r / ρ" for n in EDGE_ESTIMATORS) + " | frozen r (kept) | "
                  "frozen r (others) |", "|---|---:|" + "---:|" * (len(EDGE_ESTIMATORS) + 2)]
        for task in [*tasks, "pooled"]:
            rows = [c for t in tasks for c in edge_held[t]] if task == "pooled" else edge_held[task]
            if not rows:
                continue
            cells = []
            for name in EDGE_ESTIMATORS:
                s = edge_scores(rows, name)
                cells.append(f"{_fmt(s['pearson'])} / {_fmt(s['spearman'])}")
            n_edges = edge_scores(rows, "frozen")["n"]
            lines.append(f"| {task} | {n_edges} | " + " | ".join(cells) +
                         f" | {_fmt(edge_scores(rows, 'frozen', True)['pearson'])} | "
                         f"{_fmt(edge_scores(rows, 'frozen', False)['pearson'])} |")
        per_edge = {n: float(np.mean([c["seconds"][n] for t in tasks for c in edge_held[t]])) for n in EDGE_ESTIMATORS}
        real_s = float(np.mean([c["seconds"]["path patching"] for t in tasks for c in edge_held[t]]))
        lines += ["", "Seconds per prompt (its edges): path patching " + f"{real_s:.1f}; " +
                  "; ".join(f"{n} {v:.1f}" for n, v in per_edge.items()), ""]
    (HERE / "RESULTS.md").write_text("\n".join(lines))
    goal, bests = goal_lines(heldout, everyone_held, tasks, chosen, everything, candidates)
    summary = summary_lines(selection, heldout, everyone_held, tasks, chosen, costs, edge_held, edge_choice, goal,
                            bests)
    if everyone_fresh:
        summary += fresh_lines(fresh, everyone_fresh, tasks, chosen, everything, candidates, None)
    (HERE / "SUMMARY.md").write_text("\n".join(summary))
    print("\n".join(lines))


def goal_lines(heldout: dict[str, list[dict]], everyone_held: list[dict], tasks: list[str], chosen: str,
               everything: list[str], candidates: list[str]) -> tuple[list[str], list[str]]:
    """Per task (and pooled) and kind: the best estimator on the held-out prompts, the default's
    r, its shortfall, and whether the goal holds (within :data:`GOAL` of the best), with the
    best of the candidates (at most three passes plus real patched passes); and the estimators
    that were best somewhere."""
    bests: list[str] = []
    lines = ["| task | kind | best estimator | best r | best candidate (≤ 3 passes + exact) | its r | default r | "
             "shortfall | goal met |", "|---|---|---|---:|---|---:|---:|---:|---|"]
    for task in [*tasks, "pooled"]:
        rows = everyone_held if task == "pooled" else heldout[task]
        if not rows:
            continue
        for kind, label in (("head", "heads"), ("ff", "FF blocks")):
            found = {name: scores(rows, name, kind)["pearson"] for name in everything}
            best = max(found, key=lambda name: found[name])
            cheap = max(candidates, key=lambda name: found[name])
            bests += [best, cheap]
            mine = found[chosen]
            met = found[best] - mine <= GOAL
            lines.append(f"| {task} | {label} | {best} | {found[best]:.3f} | {cheap} | {found[cheap]:.3f} | {mine:.3f} | "
                         f"{found[best] - mine:.3f} | "
                         f"{'yes' if met else '**no**'} |")
    return lines, bests


def fresh_lines(fresh: dict[str, list[dict]], everyone: list[dict], tasks: list[str], chosen: str,
                everything: list[str], candidates: list[str], shown: list[str] | None) -> list[str]:
    """The goal again on the ``--fresh-heldout`` prompts (drawn after ``atp+verify`` was designed on
    the others), and with ``shown`` the pooled table there."""
    if not everyone:
        return []
    lines = [f"## The goal on the fresh held-out prompts ({', '.join(f'{t} {len(fresh[t])}' for t in tasks)})", "",
             f"`{VERIFY}` was designed after the held-out prompts above had been seen (they showed which estimates "
             "miss which components; their last 4 per task were the first fresh set, whose miss on agreement's "
             "first FF block added the component of largest κ), so it is reported again on prompts drawn after "
             "its last change, which played no part in any choice:", "", *goal_lines(fresh, everyone, tasks, chosen, everything, candidates)[0], ""]
    if shown is not None:
        lines += ["Every estimator on the fresh held-out prompts, every task pooled:", "", *table(everyone, shown), ""]
    return lines


def verify_lines(selection: dict[str, list[dict]], tasks: list[str], everything: list[str]) -> list[str]:
    """How many components of each kind ``atp+verify`` should patch, read off the selection
    prompts: for each count ``k``, its largest shortfall from the best estimator, each
    component's real effect taken from activation patching (what its real patched pass gives)."""
    from captum_ffb.patching.estimators import verify_scores
    from captum_ffb.patching.patches import VERIFY_TOP

    rows_of = {t: [r for r in selection[t] if "exact_components" in r] for t in tasks}
    if not all(rows_of[t] for t in tasks):
        return []
    best = {(t, kind): max(scores(selection[t], n, kind)["pearson"] for n in everything if n != VERIFY)
            for t in tasks for kind in ("head", "ff")}
    base = "atp+exact (κ > 0.5)"
    lines = ["## How many components `atp+verify` patches", "",
             "On the selection prompts, `atp+exact (κ > 0.5)` with the k components of each kind of largest "
             "|a − f| + (|a| + |f|)/2 (AtP's and the frozen estimate, among those it did not patch) given their "
             "real effect, without the one of largest κ (added after `VERIFY_TOP` was fixed; the components' κ "
             "are not saved here); the largest shortfall from the best other estimator over tasks × {heads, FF}:",
             "",
             "| k | largest shortfall | real passes added (mean) |", "|---:|---:|---:|"]
    chosen = None
    for k in range(0, 9):
        worst, added = -1.0, []
        for t in tasks:
            verified = []
            for r in rows_of[t]:
                value = dict(zip(r["components"], r["estimates"][base]))
                real = dict(zip(r["components"], r["real"]))
                score = verify_scores(dict(zip(r["components"], r["estimates"]["atp"])),
                                      dict(zip(r["components"], r["estimates"]["frozen"])))
                done = set(r["exact_components"])
                for kind in ("head", "attention", "ff"):
                    pool = sorted((c for c, kd in zip(r["components"], r["kinds"]) if kd == kind and c not in done),
                                  key=lambda c: -score[c])[:k]
                    value.update({c: real[c] for c in pool})
                    added.append(len(pool) if kind != "attention" else 0)
                verified.append({**r, "estimates": {"k": [value[c] for c in r["components"]]}})
            worst = max(worst, *(best[(t, kind)] - scores(verified, "k", kind)["pearson"] for kind in ("head", "ff")))
        if chosen is None and worst <= GOAL:
            chosen = k
        lines.append(f"| {k} | {worst:.3f} | {sum(added) / sum(len(rows_of[t]) for t in tasks):.1f} |")
    lines += ["", f"The smallest k within {GOAL} on every task and kind: {chosen}; the library's `VERIFY_TOP`: "
              f"{VERIFY_TOP} ({'they agree' if chosen == VERIFY_TOP else 'THEY DISAGREE'})."]
    return lines


def summary_lines(selection, heldout, everyone_held, tasks, chosen, costs, edge_held, edge_choice, goal, bests
                  ) -> list[str]:
    from captum_ffb.patching.patches import DEFAULT_EDGE_ESTIMATOR, EDGE_ESTIMATORS

    names = ["frozen", "atp", "relp", "gim", "eap-ig", "atp*", chosen, *bests]
    names = list(dict.fromkeys(names))
    lines = ["### How the default was chosen", "",
             "On SmolLM2-135M-Instruct (`results/patching`: IOI, induction on repeated random tokens, capital-city "
             "recall with the country corrupted, subject–verb agreement with the subject's number corrupted, factual recall with the subject corrupted, determiner–noun agreement with the determiner's number corrupted; "
             "selection / held-out prompts: " + ", ".join(f"{t} {len(selection[t])} / {len(heldout[t])}" for t in tasks)
             + "), Pearson r "
             "of the component estimates with real activation patching on the **held-out** prompts, heads / FF "
             "blocks:", "",
             "| estimator | " + " | ".join(tasks) + " | pooled | attention sublayers (pooled) | passes |",
             "|---|" + "---:|" * (len(tasks) + 3)]
    for name in names:
        cells = [f"{_fmt(scores(heldout[t], name, 'head')['pearson'])} / {_fmt(scores(heldout[t], name, 'ff')['pearson'])}"
                 for t in tasks]
        pooled = f"{_fmt(scores(everyone_held, name, 'head')['pearson'])} / {_fmt(scores(everyone_held, name, 'ff')['pearson'])}"
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {pooled} | "
                     f"{_fmt(scores(everyone_held, name, 'attention')['pearson'])} | {costs[name][0]:.1f} |")
    lines += ["", f"The default (`DEFAULT_ESTIMATOR`) is {chosen}: of the estimators of at most three passes plus "
              "real patched passes (and `atp+verify`: five, its frozen estimate's pass included), the one whose largest shortfall from the best estimator (any, AtP* and EAP-IG "
              "included) over the tasks and over heads and FF blocks was smallest on the selection prompts. Every "
              "number (Spearman, top-10 recall, attention sublayers, each threshold, the selection prompts, the "
              "costs) is in `results/patching/RESULTS.md`.", "",
              f"The goal on the held-out prompts (the default within {GOAL} of the best estimator on every task, "
              "heads and FF blocks apart):", "", *goal, ""]
    if edge_choice is not None:
        lines += ["Edges, against real path patching (held-out prompts' head graphs; Pearson r per task):", "",
                  "| edge estimator | " + " | ".join(tasks) + " |", "|---|" + "---:|" * len(tasks)]
        for name in EDGE_ESTIMATORS:
            lines.append(f"| `{name}` | " + " | ".join(_fmt(edge_scores(edge_held[t], name)['pearson']) for t in tasks)
                         + " |")
        agree = edge_choice == DEFAULT_EDGE_ESTIMATOR
        held_mins = {n: min(edge_scores(edge_held[t], n)["pearson"] for t in tasks) for n in EDGE_ESTIMATORS}
        lines += ["", f"The per-edge criterion (the largest smallest r over the tasks' selection edges) chooses "
                  f"`{edge_choice}`; the edges' default (`DEFAULT_EDGE_ESTIMATOR`) is `{DEFAULT_EDGE_ESTIMATOR}`"
                  f"{'' if agree else ' (THEY DISAGREE)'}. Smallest r over the tasks on the held-out edges: "
                  + ", ".join(f"`{n}` {_fmt(v)}" for n, v in held_mins.items()) + ". "
                  "Circuits cut from edge scores have their own default (`DEFAULT_CIRCUIT_ESTIMATOR`), chosen by MIB's "
                  "protocol on six tasks (`results/mib`, docs/circuits.md).", ""]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
