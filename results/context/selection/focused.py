"""Ablations focused on the prior's top candidates, against random ones (selection questions only).

``surrogate_choice.py`` chose the fitted surrogate's random design: every sentence kept with
p = ½. The top-k drop removes only a few sentences with everything else present, a regime
those ablations rarely visit. Here the ``m`` ablations remove only among the prior's top ``T``
sentences (each with probability ``r``; the rest always kept), so the fit refines the weights
of the candidates a top-k removal draws from, the others keeping the prior's scores times the
fitted factor. Designs (16 ablations each, the presence prior's scores as prior):

- ``focus-8``: the top 8, each removed with r = ½;
- ``focus-16``: the top 16, each removed with r = ¼;
- ``mix``: the first 8 of the random ablations and the first 8 of ``focus-8``.

For each of the 18 selection questions of ``surrogate.json`` it measures the answer's
log-probability on the focused ablations (stored in ``focused.json``), fits, and prints LDS
(the same 32 random ablations as before) and top-k drops beside ``surrogate_choice.py``'s
shortlist.

Run from the repository root in the environment of ``run.py``::

    python results/context/selection/focused.py     # about 25 min on two free cores
"""

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import run as R  # noqa: E402
from metrics import lds, mean_se, random_masks  # noqa: E402
from surrogate_choice import candidates, load_study, measure_drops  # noqa: E402

from captum_ffb.long_context.surrogate import fit_surrogate  # noqa: E402

DESIGNS = {"focus-8": (8, 0.5), "focus-16": (16, 0.25)}
M = 16


def focused_masks(prior: np.ndarray, top: int, removal: float, m: int, seed: int) -> np.ndarray:
    """``(m, S)``: only the ``top`` sentences of largest prior removed, each with ``removal``."""
    order = np.argsort(-prior, kind="stable")[:top]
    keep = np.ones((m, len(prior)), dtype=bool)
    keep[:, order] = np.random.default_rng(seed).random((m, len(order))) >= removal
    return keep


def measure(data: dict) -> dict:
    """The answer's log-probability on each focused design's ablations, per question."""
    from captum_ffb.long_context.attribution import split_context

    path = HERE / "focused.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    tokenizer, template, scorer, engine, questions, documents = load_study()
    for index, (qid, row) in enumerate(data.items()):
        if qid in out:
            continue
        q, doc = questions[qid], documents[row["doc"]]
        spans = split_context(doc["text"], "sentence")
        answer = engine.token_ids(tokenizer, q["answer"])
        prior = np.asarray(row["scores"]["presence"])
        out[qid] = {}
        for name, (top, removal) in DESIGNS.items():
            masks = focused_masks(prior, top, removal, M, seed=2000 + index)
            values = [scorer.log_prob(R.masked_ids(tokenizer, template, doc["text"], spans, keep, q), answer)
                      for keep in masks]
            out[qid][name] = dict(masks=masks.astype(int).tolist(), values=values)
        path.write_text(json.dumps(out))
        print(qid, "measured", flush=True)
    return out


def fits(row: dict, focused: dict) -> dict[str, np.ndarray]:
    prior = np.asarray(row["scores"]["presence"])
    found = {}
    for name in DESIGNS:
        masks, values = np.asarray(focused[name]["masks"], bool), np.asarray(focused[name]["values"])
        found[name] = fit_surrogate(masks, values, prior).scores.numpy()
    random_m = np.asarray(row["fit_masks"], bool)[:M // 2]
    random_v = np.asarray(row["fit_values"])[:M // 2]
    f8 = focused["focus-8"]
    masks = np.concatenate([random_m, np.asarray(f8["masks"], bool)[:M // 2]])
    values = np.concatenate([random_v, np.asarray(f8["values"])[:M // 2]])
    found["mix"] = fit_surrogate(masks, values, prior).scores.numpy()
    both = np.stack([prior, np.asarray(row["scores"]["decomposition"])])
    random_m, random_v = np.asarray(row["fit_masks"], bool)[:M], np.asarray(row["fit_values"])[:M]
    found["fit-16-both"] = fit_surrogate(random_m, random_v, both).scores.numpy()
    masks, values = np.asarray(f8["masks"], bool), np.asarray(f8["values"])
    found["focus-8-both"] = fit_surrogate(masks, values, both).scores.numpy()
    return found


def main() -> None:
    data = json.loads((HERE / "surrogate.json").read_text())
    focused = measure(data)
    names = ["ours", "ours-presence", "fit-16-ours", "fit-16-ours-presence", "cc-32", *DESIGNS, "mix",
             "fit-16-both", "focus-8-both"]
    scored, table = {}, {}
    for qid, row in data.items():
        masks = random_masks(row["sources"], 32, seed=1000 + row["doc_index"])
        every = {**candidates(row), **fits(row, focused[qid])}
        scored[qid] = {n: every[n] for n in names}
        for name in names:
            table.setdefault(name, []).append(lds(scored[qid][name], masks, row["lds_values"]))
    path = HERE / "focused_choice.json"
    drops = json.loads(path.read_text())["drops"] if path.exists() else {}
    new = [n for n in names if any(n not in drops.get(q, {}) for q in data)]
    if new:
        for qid, found in measure_drops(data, scored, new).items():
            drops.setdefault(qid, {}).update({n: {str(k): v for k, v in d.items()} for n, d in found.items()})
    print("| candidate | LDS | drop@1 | drop@3 | drop@5 |")
    for name in names:
        cells = [mean_se(table[name])] + [mean_se([drops[q][name][str(k)] for q in drops]) for k in R.KS]
        print(f"| {name} | " + " | ".join(f"{m:.3f} ± {s:.3f}" for m, s, _ in cells) + " |")
    path.write_text(json.dumps(dict(lds=table, drops=drops), indent=1))


if __name__ == "__main__":
    main()
