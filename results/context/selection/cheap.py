"""Cheaper fitted surrogates, on the selection questions: designs whose passes cost about half
of ContextCite-64's or less.

The default fitted surrogate (``greedy-union-10+path``: presence's two gradients, the
decomposition, four greedy rounds and 16 focused ablations) is level with ContextCite-64 on the
held-out questions at about its wall time (``../second/SUMMARY.md``). Its parts, measured on the
tqdm README (1,084 tokens): a forward pass 2.6 s, the decomposition 8.9 s (about 3.4 forward
passes), presence with one step 13 s and with two 25 s; ContextCite-64's 64 passes on prompts of
half the length take 60 s there, about 23 full forward passes. Candidates (the prior, then the
ablations fitted around it; every ablation is one forward pass):

* ``decomposition``, ``presence-1`` (one gradient at t = ½), ``presence-2``: the priors alone;
* ``decomposition+static``: the decomposition's top 1 … 4 removed, nested (4 passes);
* ``decomposition+focus-4+static``, ``decomposition+focus-8+static``: and 4 or 8 ablations that
  remove each of the decomposition's top 10 with probability ½;
* ``presence-1+static``, ``presence-2+static``: presence's own top 1 … 4 removed, nested;
* ``presence-2+union-4+static``: presence-2 and the decomposition (the default's priors), the
  decomposition's nested prompts and the first 4 of ``greedy.py``'s union ablations;
* with ``--more``, after the first run, from the passes ``greedy.py`` stored (only the top-k
  drops run the model): ``presence-2+union-8+static`` (8 union ablations), and
  ``presence-2+union-4`` and ``presence-2+union-8`` (no nested prompts).

Each part is timed here on the question (``seconds``: the decomposition, presence with one and
two steps, one forward pass of the whole prompt through the library), so that each candidate's
cost is the sum of its parts'.

Run from the repository root in the environment of ``run.py``, after ``greedy.py``::

    python results/context/selection/cheap.py   # about 35 min on two free cores; writes cheap.json
    python results/context/selection/cheap.py --more   # about 5 min more
"""

import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from greedy import pending, resumed, static_path  # noqa: E402
from union import TOP, measured, prepared, questions, report, save, union_masks  # noqa: E402

from captum_ffb.long_context.surrogate import fit_surrogate  # noqa: E402

#: Each candidate's parts: the prior's passes, then forward passes (``F``) of its ablations.
COSTS = {"decomposition": ("decomposition", 0), "presence-1": ("presence-1", 0), "presence-2": ("presence-2", 0),
         "decomposition+static": ("decomposition", 4), "decomposition+focus-4+static": ("decomposition", 8),
         "decomposition+focus-8+static": ("decomposition", 12), "presence-1+static": ("presence-1", 4),
         "presence-2+static": ("presence-2", 4), "presence-2+union-4+static": ("presence-2+decomposition", 8),
         "presence-2+union-8+static": ("presence-2+decomposition", 12),
         "presence-2+union-4": ("presence-2+decomposition", 4), "presence-2+union-8": ("presence-2+decomposition", 8)}


def focus_masks(scores: np.ndarray, m: int, seed: int) -> np.ndarray:
    """``(m, S)``: each of ``scores``' top 10 removed with probability ½, every other kept."""
    chosen = np.argsort(-scores, kind="stable")[:TOP]
    keep = np.ones((m, len(scores)), dtype=bool)
    keep[:, chosen] = np.random.default_rng(seed).random((m, len(chosen))) >= 0.5
    return keep


def timed_parts(nd, tokenizer, template: str, doc: str, q: dict) -> tuple[np.ndarray, dict]:
    """Presence with one step (its scores) and the seconds of each part through the library."""
    from captum_ffb import context_attribution
    from captum_ffb.explained.readouts import AnswerLogProbability
    from captum_ffb.long_context.presence import prompt_value

    kwargs = dict(group_by="sentence", target=AnswerLogProbability(q["answer"]), template=template + q["lead"])
    seconds = {}
    for name, options in (("decomposition", {}), ("presence-1", dict(method="presence", steps=1)),
                          ("presence-2", dict(method="presence", steps=2))):
        began = time.perf_counter()
        found = context_attribution(nd, tokenizer, doc, q["question"], **kwargs, **options)
        seconds[name] = time.perf_counter() - began
        if name == "presence-1":
            one_step = found.contributions.numpy()
    text = template.replace("{context}", doc).replace("{question}", q["question"]) + q["lead"]
    ids = tokenizer(text, return_tensors="pt").input_ids
    ids, _, readout = nd._forced_answer(ids, AnswerLogProbability(tuple(nd.engine.token_ids(tokenizer, q["answer"]))),
                                        None)
    began = time.perf_counter()
    prompt_value(nd.model, ids, readout)
    seconds["forward"] = time.perf_counter() - began
    return one_step, seconds


def fit(prior: np.ndarray, *parts) -> np.ndarray:
    """The surrogate fitted around ``prior`` on every part's ``(masks, values)``."""
    return fit_surrogate(np.concatenate([p[0] for p in parts]), sum((list(p[1]) for p in parts), []),
                         prior).scores.numpy()


def more() -> None:
    """The candidates fitted on ``greedy.py``'s stored passes, added to ``cheap.json``."""
    (tokenizer, template, scorer, engine, asked, documents), _, greedy, path, out = resumed("cheap.json")
    for n, row in enumerate(questions()):
        if row["id"] not in out or "presence-2+union-8" in out[row["id"]]["lds"]:
            continue
        _, _, spans, value = prepared((tokenizer, template, scorer, engine), asked, documents, row)
        before = greedy[row["id"]]
        presence, decomposition = np.asarray(row["presence"]), np.asarray(row["decomposition"])
        nested = (static_path(decomposition), before["static_values"])
        masks, values = union_masks(presence, decomposition, seed=3000 + n), before["union_values"]
        found = {"presence-2+union-8+static": fit(presence, (masks[:8], values[:8]), nested),
                 "presence-2+union-4": fit(presence, (masks[:4], values[:4])),
                 "presence-2+union-8": fit(presence, (masks[:8], values[:8]))}
        record = measured(dict(set=row["set"]), found, row, value)
        for part in ("lds", "drops"):
            out[row["id"]][part].update(record[part])
        save(out, path, row, out[row["id"]])
    report(out)
    costs(out)


def main() -> None:
    if "--more" in sys.argv[1:]:
        more()
        return
    study, nd, greedy, path, out = resumed("cheap.json")
    tokenizer, template = study[:2]
    for n, row, (q, doc, _, value), before in pending(study, greedy, out):
        presence, decomposition = np.asarray(row["presence"]), np.asarray(row["decomposition"])
        one_step, seconds = timed_parts(nd, tokenizer, template, doc["text"], q)
        by_decomposition = (static_path(decomposition), before["static_values"])
        by_one = static_path(one_step)
        by_one = (by_one, [value(keep) for keep in by_one])
        by_two = static_path(presence)
        by_two = (by_two, [value(keep) for keep in by_two])
        focus = focus_masks(decomposition, 8, seed=5000 + n)
        focus = (focus, [value(keep) for keep in focus])
        union = (union_masks(presence, decomposition, seed=3000 + n)[:4], before["union_values"][:4])
        found = {"decomposition": decomposition, "presence-1": one_step, "presence-2": presence,
                 "decomposition+static": fit(decomposition, by_decomposition),
                 "decomposition+focus-4+static": fit(decomposition, (focus[0][:4], focus[1][:4]), by_decomposition),
                 "decomposition+focus-8+static": fit(decomposition, focus, by_decomposition),
                 "presence-1+static": fit(one_step, by_one), "presence-2+static": fit(presence, by_two),
                 "presence-2+union-4+static": fit(presence, union, by_decomposition)}
        record = measured(dict(set=row["set"], seconds=seconds), found, row, value)
        record["lds"]["default"] = before["lds"]["greedy-union-10+path"]
        record["drops"]["default"] = before["drops"]["greedy-union-10+path"]
        save(out, path, row, record)
    report(out)
    costs(out)


def costs(out: dict) -> None:
    """Each candidate's seconds from its parts', as a share of 23 forward passes (about
    ContextCite-64's wall time on these prompts)."""
    print("\n| candidate | forward passes' worth (median) |")
    for name, (prior, forwards) in COSTS.items():
        worth = [(sum(r["seconds"][p] for p in prior.split("+")) + forwards * r["seconds"]["forward"])
                 / r["seconds"]["forward"] for r in out.values()]
        print(f"| {name} | {np.median(worth):.1f} |")


if __name__ == "__main__":
    main()
