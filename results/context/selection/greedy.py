"""Greedy removal rounds for the fitted surrogate, on the selection questions (``--held-out``:
the held-out ones too, a diagnosis; the held-out numbers are the library's run, ``../run.py``).

The held-out diagnosis (``README.md`` here) found the fitted surrogate losing top-k drops where
an answer needs several sentences removed together (an address stated across three
sentences, a fact stated twice): 16 ablations that remove each candidate with probability ½
rarely remove all of them, and the fit keeps the prior's order. A greedy round removes the
sentence the decomposition ranks first, attributes again on the shortened prompt (one forward
and one backward pass) and ranks again; after ``r`` rounds the prompts with the first
``1 … r`` picks removed are ablations measured on the way (the forward pass gives the answer's
log-probability). Candidates, each with ``R`` rounds after the first ranking:

* ``union-10``: the default (16 focused ablations, presence prior), again, as a check;
* ``union-10+path``: the same fit with the ``R`` nested prompts added as ablations;
* ``greedy-union-10+path``: the focused ablations drawn among presence's top 5 and the greedy
  picks (filled to 10 by presence), the nested prompts added;
* ``greedy-order``: the decomposition's scores with the greedy picks moved to the top in order
  (the greedy path itself, for its top-k drops; not a fit);
* ``union-12+path``: 12 focused ablations and the nested prompts (16 prompts, as the default);
* ``union-10+static``, ``union-12+static``: the same with the first ranking's top 1 … ``R``
  removed instead (no new ranking: forward passes only);
* ``decomposition``: the first ranking alone.

``greedy-union-10+path`` was chosen (``rounds=4``, the library's default): ``README.md`` here.

Run from the repository root in the environment of ``run.py``::

    python results/context/selection/greedy.py   # about 25 min on two free cores; writes greedy.json
"""

import argparse
import json
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from metrics import ablate  # noqa: E402
from surrogate_choice import load_study  # noqa: E402
from union import TOP, M, measured, prepared, questions, report, save, union_masks  # noqa: E402

from captum_ffb.long_context.surrogate import fit_surrogate  # noqa: E402

ROUNDS = 4


def resumed(name: str) -> tuple:
    """What a study after this one starts from: ``load_study()``'s parts, the decomposition
    bound to its model, ``greedy.json``, and the study's own file ``name`` here with what it
    holds so far."""
    from captum_ffb import NormDecomposition

    study = load_study()
    path = HERE / name
    return (study, NormDecomposition(study[2].model), json.loads((HERE / "greedy.json").read_text()), path,
            json.loads(path.read_text()) if path.exists() else {})


def pending(study: tuple, greedy: dict, out: dict) -> Iterator[tuple]:
    """The selection questions ``greedy.json`` holds (``greedy``) and ``out`` does not yet,
    each as its index, row, :func:`~union.prepared`'s parts (question, document, spans, value)
    and ``greedy.json``'s record (``study``: :func:`resumed`'s first part)."""
    tokenizer, template, scorer, engine, asked, documents = study
    for n, row in enumerate(questions()):
        if row["id"] in out or row["id"] not in greedy or row["set"] != "selection":
            continue
        yield n, row, prepared((tokenizer, template, scorer, engine), asked, documents, row), greedy[row["id"]]


def reduced_decomposition(nd, tokenizer, template: str, doc: str, spans: list, keep: np.ndarray, q: dict
                          ) -> tuple[np.ndarray, float]:
    """The decomposition's score of every kept sentence on the prompt with only ``keep``'s
    sentences (``-inf`` for the removed ones) and the answer's log-probability there."""
    from captum_ffb import context_attribution
    from captum_ffb.explained.readouts import AnswerLogProbability

    text = ablate(doc, spans, keep)
    found = context_attribution(nd, tokenizer, text, q["question"], group_by="sentence",
                                target=AnswerLogProbability(q["answer"]), template=template + q["lead"],
                                method="decomposition")
    kept = np.flatnonzero(keep)
    scores = np.full(len(spans), -np.inf)
    texts = [doc[s:e] for s, e in spans]
    if len(found.groups) == len(kept) and all(g == texts[j] for g, j in zip(found.groups, kept)):
        scores[kept] = found.contributions.numpy()
    else:  # the shortened text split otherwise: each found group to the kept sentence it starts with
        for group, value in zip(found.groups, found.contributions.tolist()):
            j = next((j for j in kept if group.startswith(texts[j]) or texts[j].startswith(group)), None)
            if j is not None and scores[j] == -np.inf:
                scores[j] = value
        scores[kept[scores[kept] == -np.inf]] = 0.0
    return scores, float(found.value)


def greedy_path(first: np.ndarray, score_round) -> tuple[list[int], np.ndarray, list[float]]:
    """The greedy picks (``ROUNDS + 1``), the nested keep masks after each of the first
    ``ROUNDS`` picks and their values."""
    keep = np.ones(len(first), dtype=bool)
    scores, picks, masks, values = first, [], [], []
    for r in range(ROUNDS + 1):
        pick = int(np.argmax(np.where(keep, scores, -np.inf)))
        picks.append(pick)
        keep = keep.copy()
        keep[pick] = False
        if r < ROUNDS:
            scores, value = score_round(keep)
            masks.append(keep)
            values.append(value)
    return picks, np.stack(masks), values


def static_path(first: np.ndarray) -> np.ndarray:
    """``(ROUNDS, S)``: the first ranking's top 1, 2, … ``ROUNDS`` removed (no new ranking)."""
    order = np.argsort(-first, kind="stable")
    keep = np.ones((ROUNDS, len(first)), dtype=bool)
    for r in range(ROUNDS):
        keep[r, order[:r + 1]] = False
    return keep


def greedy_union_masks(presence: np.ndarray, picks: list[int], seed: int) -> np.ndarray:
    """``(M, S)``: only presence's top 5 and the greedy picks removed (filled up to 10 by
    presence's order), each with probability ½."""
    chosen = list(dict.fromkeys([*np.argsort(-presence, kind="stable")[:5], *picks]))
    chosen += [j for j in np.argsort(-presence, kind="stable") if j not in chosen][:max(0, TOP - len(chosen))]
    keep = np.ones((M, len(presence)), dtype=bool)
    keep[:, chosen] = np.random.default_rng(seed).random((M, len(chosen))) >= 0.5
    return keep


def order_on_top(scores: np.ndarray, picks: list[int]) -> np.ndarray:
    """``scores`` with ``picks`` moved above every other score, in order."""
    out = np.asarray(scores, dtype=np.float64).copy()
    top = out.max() + np.abs(out).max() + 1.0
    for r, j in enumerate(picks):
        out[j] = top + len(picks) - r
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--held-out", action="store_true", help="also the held-out questions")
    args = parser.parse_args()
    from captum_ffb import NormDecomposition

    tokenizer, template, scorer, engine, asked, documents = load_study()
    nd = NormDecomposition(scorer.model)
    path = HERE / "greedy.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    for n, row in enumerate(questions()):
        if row["id"] in out or (row["set"] == "held-out" and not args.held_out):
            continue
        q, doc, spans, value = prepared((tokenizer, template, scorer, engine), asked, documents, row)
        presence, decomposition = np.asarray(row["presence"]), np.asarray(row["decomposition"])
        picks, path_masks, path_values = greedy_path(
            decomposition, partial(reduced_decomposition, nd, tokenizer, template, doc["text"], spans, q=q))
        masks = union_masks(presence, decomposition, seed=3000 + n)
        values = [value(keep) for keep in masks]
        greedy_masks = greedy_union_masks(presence, picks, seed=3000 + n)
        greedy_values = [value(keep) for keep in greedy_masks]
        static_masks = static_path(decomposition)
        static_values = [value(keep) for keep in static_masks]
        short = M - ROUNDS

        def fit(*parts, prior=presence) -> np.ndarray:
            return fit_surrogate(np.concatenate([p[0] for p in parts]), sum((list(p[1]) for p in parts), []),
                                 prior).scores.numpy()

        union, nested, static = (masks, values), (path_masks, path_values), (static_masks, static_values)
        found = {"union-10": fit(union),
                 "union-10+path": fit(union, nested),
                 f"union-{short}+path": fit((masks[:short], values[:short]), nested),
                 "greedy-union-10+path": fit((greedy_masks, greedy_values), nested),
                 "union-10+static": fit(union, static),
                 f"union-{short}+static": fit((masks[:short], values[:short]), static),
                 "greedy-order": order_on_top(decomposition, picks),
                 "decomposition": decomposition}
        record = dict(set=row["set"], picks=picks, path_values=path_values, static_values=static_values,
                      union_values=values, greedy_union_values=greedy_values)
        save(out, path, row, measured(record, found, row, value))
    report(out)


if __name__ == "__main__":
    main()
