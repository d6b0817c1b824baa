"""More greedy rounds than four (``greedy.py``'s ``greedy-union-10+path``): the same picks,
focused ablations and nested prompts, two rounds more (the decomposition run on the prompt
without the first five and six picks), fitted with the first 4, 5 and 6 nested prompts. The
focus candidates are the first five picks for every ``R ≥ 4`` (``focus // 2``), so the
ablations are ``greedy.json``'s, drawn again from their seeds.

Run from the repository root in the environment of ``run.py``, after ``greedy.py``::

    python results/context/selection/rounds.py   # about 10 min on two free cores; writes rounds.json
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
from greedy import greedy_union_masks, reduced_decomposition  # noqa: E402
from metrics import lds, random_masks, top_k_keep  # noqa: E402
from surrogate_choice import load_study  # noqa: E402
from union import _log_prob, questions, report  # noqa: E402

from captum_ffb.long_context.surrogate import fit_surrogate  # noqa: E402

MORE = (5, 6)


def main() -> None:
    from captum_ffb import NormDecomposition
    from captum_ffb.long_context.attribution import split_context

    tokenizer, template, scorer, engine, asked, documents = load_study()
    nd = NormDecomposition(scorer.model)
    greedy = json.loads((HERE / "greedy.json").read_text())
    path = HERE / "rounds.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    for n, row in enumerate(questions()):
        if row["id"] in out or row["id"] not in greedy:
            continue
        q, doc, before = asked[row["id"]], documents[row["doc"]], greedy[row["id"]]
        spans = split_context(doc["text"], "sentence")
        answer = engine.token_ids(tokenizer, q["answer"])
        value = partial(_log_prob, scorer, (tokenizer, template, doc["text"], spans, q), answer)
        presence = np.asarray(row["presence"])
        picks, path_values = list(before["picks"]), list(before["path_values"])
        for _ in MORE:  # the round after the last: without every pick so far
            keep = np.ones(len(spans), dtype=bool)
            keep[picks] = False
            scores, found = reduced_decomposition(nd, tokenizer, template, doc["text"], spans, keep, q)
            path_values.append(found)
            picks.append(int(np.argmax(np.where(keep, scores, -np.inf))))
        nested = np.ones((len(path_values), len(spans)), dtype=bool)
        for r in range(len(path_values)):
            nested[r, picks[:r + 1]] = False
        masks = greedy_union_masks(presence, picks[:5], seed=3000 + n)
        values = before["greedy_union_values"]
        found = {f"rounds-{r}": fit_surrogate(np.concatenate([masks, nested[:r]]), values + path_values[:r],
                                              presence).scores.numpy() for r in (4, *MORE)}
        lds_masks = random_masks(row["sources"], len(row["lds_values"]), seed=1000 + row["doc_index"])
        record = dict(set=row["set"], picks=picks, path_values=path_values, lds={}, drops={})
        for name, scores in found.items():
            record["lds"][name] = lds(scores, lds_masks, row["lds_values"])
            record["drops"][name] = {str(k): row["log_prob"] - value(top_k_keep(scores, min(k, len(spans))))
                                     for k in R.KS}
        out[row["id"]] = record
        path.write_text(json.dumps(out, indent=1))
        print(row["id"], {k: round(v["5"], 2) for k, v in record["drops"].items()}, flush=True)
    report(out)


if __name__ == "__main__":
    main()
