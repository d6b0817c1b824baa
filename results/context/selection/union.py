"""Ablations focused on both priors' top sentences: on the selection questions and, after the
fact, on the held-out ones (a diagnosis, not a choice: see ``README.md`` here).

On the held-out questions ContextCite-64's top-5 drop beats the fitted surrogate's mostly on
answers stated twice in the document (removing one statement leaves the other; only removing
both drops the answer): presence ranks the second statement low (11th, 18th), the
decomposition ranks it among its first three. ``union-10`` removes, in each of 16 ablations,
each of the union of presence's and the decomposition's top 5 sentences (10 at most; filled up
to 10 by presence's order) with probability ½, every other sentence kept, and fits with the
presence prior (``union-10``) or both priors (``union-10-both``,
:func:`~captum_ffb.long_context.surrogate.fit_surrogate` with two rows).

Run from the repository root in the environment of ``run.py``::

    python results/context/selection/union.py     # about 30 min on two free cores; writes union.json
"""

import json
import sys
from functools import partial
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import run as R  # noqa: E402
from metrics import AnswerScorer, lds, mean_se, random_masks, top_k_keep  # noqa: E402
from surrogate_choice import load_study  # noqa: E402

from captum_ffb.long_context.surrogate import fit_surrogate  # noqa: E402

M, EACH, TOP = 16, 5, 10


def union_masks(presence: np.ndarray, decomposition: np.ndarray, seed: int) -> np.ndarray:
    """``(M, S)``: only the union's sentences removed, each with probability ½."""
    chosen = list(dict.fromkeys([*np.argsort(-presence, kind="stable")[:EACH],
                                 *np.argsort(-decomposition, kind="stable")[:EACH]]))
    for j in np.argsort(-presence, kind="stable"):
        if len(chosen) >= TOP:
            break
        if j not in chosen:
            chosen.append(j)
    keep = np.ones((M, len(presence)), dtype=bool)
    keep[:, chosen] = np.random.default_rng(seed).random((M, len(chosen))) >= 0.5
    return keep


def _log_prob(scorer: AnswerScorer, prompt: tuple, answer: list[int], keep: np.ndarray) -> float:
    """The answer's log-probability with only ``keep``'s sentences (``prompt``: the tokenizer,
    template, document, sentence spans and question)."""
    tokenizer, template, text, spans, q = prompt
    return scorer.log_prob(R.masked_ids(tokenizer, template, text, spans, keep, q), answer)


def questions() -> list[dict]:
    """Every selection and held-out question: its priors' scores, LDS ablations and values,
    and its peers' top-k drops where they were measured."""
    data = json.loads((HERE.parent / "questions.json").read_text())
    index = {d["id"]: i for i, d in enumerate(data["documents"])}
    rows = []
    for qid, row in json.loads((HERE / "surrogate.json").read_text()).items():
        rows.append(dict(id=qid, set="selection", doc=row["doc"], doc_index=row["doc_index"],
                         sources=row["sources"], log_prob=row["log_prob"],
                         presence=row["scores"]["presence"], decomposition=row["scores"]["decomposition"],
                         random=(row["fit_masks"][:M], row["fit_values"][:M]), lds_values=row["lds_values"],
                         peers={}))
    for q in json.loads((HERE.parent / "results.json").read_text())["questions"]:
        methods = q["methods"]
        rows.append(dict(id=q["id"], set="held-out", doc=q["doc"], doc_index=index[q["doc"]], sources=q["sources"],
                         log_prob=q["log_prob"], presence=methods["ours-presence"]["scores"],
                         decomposition=methods["ours"]["scores"], random=None,
                         lds_values=q["datamodel_log_probs"],
                         peers={n: dict(scores=methods[n]["scores"], drops=methods[n]["top_k_drop"])
                                for n in ("ours-fitted-every", "contextcite-64", "contextcite-32")}))
    return rows


def main() -> None:

    tokenizer, template, scorer, engine, asked, documents = load_study()
    path = HERE / "union.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    for n, row in enumerate(questions()):
        if row["id"] in out:
            continue
        q, doc, spans, value = prepared((tokenizer, template, scorer, engine), asked, documents, row)
        presence, decomposition = np.asarray(row["presence"]), np.asarray(row["decomposition"])
        masks = union_masks(presence, decomposition, seed=3000 + n)
        values = [value(keep) for keep in masks]
        found = {"union-10": fit_surrogate(masks, values, presence).scores.numpy(),
                 "union-10-both": fit_surrogate(masks, values, np.stack([presence, decomposition])).scores.numpy()}
        if row["random"] is not None:
            found["fit-16"] = fit_surrogate(np.asarray(row["random"][0], bool), row["random"][1], presence).scores.numpy()
        save(out, path, row, measured(dict(set=row["set"]), found, row, value))
    report(out)


def prepared(study: tuple, asked: dict, documents: dict, row: dict) -> tuple:
    """``row``'s question, document, sentence spans and its answer's log-probability as a
    function of a keep mask (``study``: the tokenizer, template, scorer and engine)."""
    from captum_ffb.long_context.attribution import split_context

    tokenizer, template, scorer, engine = study
    q, doc = asked[row["id"]], documents[row["doc"]]
    spans = split_context(doc["text"], "sentence")
    answer = engine.token_ids(tokenizer, q["answer"])
    return q, doc, spans, partial(_log_prob, scorer, (tokenizer, template, doc["text"], spans, q), answer)


def measured(record: dict, found: dict, row: dict, value) -> dict:
    """``record`` with each candidate's (``found``: name → scores) and each peer's LDS and
    top-k drops (``value``: the answer's log-probability with a keep mask's sentences)."""
    lds_masks = random_masks(row["sources"], len(row["lds_values"]), seed=1000 + row["doc_index"])
    record.update(lds={}, drops={})
    for name, scores in found.items():
        record["lds"][name] = lds(scores, lds_masks, row["lds_values"])
        record["drops"][name] = {str(k): row["log_prob"] - value(top_k_keep(scores, min(k, len(scores))))
                                 for k in R.KS}
    for name, peer in row["peers"].items():
        record["lds"][name] = lds(peer["scores"], lds_masks, row["lds_values"])
        record["drops"][name] = peer["drops"]
    return record


def save(out: dict, path: Path, row: dict, record: dict) -> None:
    """``record`` stored as ``row``'s in ``out``, written to ``path``, its top-5 drops printed."""
    out[row["id"]] = record
    path.write_text(json.dumps(out, indent=1))
    print(row["id"], {k: round(v["5"], 2) for k, v in record["drops"].items()}, flush=True)


def report(out: dict) -> None:
    for part in ("selection", "held-out"):
        rows = [r for r in out.values() if r["set"] == part]
        if not rows:
            continue
        print(f"\n{part} ({len(rows)} questions)\n| candidate | LDS | drop@1 | drop@3 | drop@5 |")
        for name in rows[0]["lds"]:
            cells = [mean_se([r["lds"][name] for r in rows])] + [mean_se([r["drops"][name][str(k)] for r in rows])
                                                                 for k in R.KS]
            print(f"| {name} | " + " | ".join(f"{m:.3f} ± {s:.3f}" for m, s, _ in cells) + " |")


if __name__ == "__main__":
    main()
