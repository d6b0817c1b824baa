"""More greedy rounds than four (``greedy.py``'s ``greedy-union-10+path``): the same picks,
focused ablations and nested prompts, two rounds more (the decomposition run on the prompt
without the first five and six picks), fitted with the first 4, 5 and 6 nested prompts. The
focus candidates are the first five picks for every ``R ≥ 4`` (``focus // 2``), so the
ablations are ``greedy.json``'s, drawn again from their seeds.

Run from the repository root in the environment of ``run.py``, after ``greedy.py``::

    python results/context/selection/rounds.py   # about 10 min on two free cores; writes rounds.json
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from greedy import greedy_union_masks, pending, reduced_decomposition, resumed  # noqa: E402
from union import measured, report, save  # noqa: E402

from captum_ffb.long_context.surrogate import fit_surrogate  # noqa: E402

MORE = (5, 6)


def main() -> None:
    study, nd, greedy, path, out = resumed("rounds.json")
    tokenizer, template = study[:2]
    for n, row, (q, doc, spans, value), before in pending(study, greedy, out):
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
        save(out, path, row, measured(dict(set=row["set"], picks=picks, path_values=path_values), found, row, value))
    report(out)


if __name__ == "__main__":
    main()
