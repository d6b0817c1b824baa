"""Weighting the nested prompts in the fitted default, on the selection questions.

The default (``presence-2+union-4+static`` of ``cheap.py``: presence's two gradients as the
prior, four ablations among the union of both methods' top groups, and the decomposition's top
1 … 4 removed, nested) fits all eight prompts alike. The nested prompts are the regime a top-k
drop measures (a few groups removed, every other kept); the random ablations remove about half
of ten candidates. Here the nested prompts count ``w`` times in the fit (their rows repeated),
at no extra pass: ``w = 1`` is the default and reproduces ``cheap.json``'s row.

The rule, set before this ran: a weight replaces 1 only if it gains more than one standard
error at k = 5 (question by question, against ``w = 1``), does not lose more than one standard
error at k = 3, and does not lower the LDS by more than 0.01; among several, the largest gain
at k = 5.

Run from the repository root in the environment of ``run.py``, after ``cheap.py``::

    python results/context/selection/weighted.py   # about 5 min on two free cores; writes weighted.json
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from greedy import pending, resumed, static_path  # noqa: E402
from union import measured, report, save, union_masks  # noqa: E402

from captum_ffb.long_context.surrogate import fit_surrogate  # noqa: E402

#: How many times the nested prompts count in the fit.
WEIGHTS = (1, 2, 4)


def weighted_fit(prior: np.ndarray, ablations: tuple, nested: tuple, weight: int) -> np.ndarray:
    """The surrogate around ``prior`` on the ablations and the nested prompts, these repeated
    ``weight`` times."""
    masks = np.concatenate([ablations[0]] + [nested[0]] * weight)
    values = list(ablations[1]) + list(nested[1]) * weight
    return fit_surrogate(masks, values, prior).scores.numpy()


def main() -> None:
    study, _, greedy, path, out = resumed("weighted.json")
    for n, row, (_, _, _, value), before in pending(study, greedy, out):
        presence, decomposition = np.asarray(row["presence"]), np.asarray(row["decomposition"])
        nested = (static_path(decomposition), before["static_values"])
        union = (union_masks(presence, decomposition, seed=3000 + n)[:4], before["union_values"][:4])
        found = {f"w={w}": weighted_fit(presence, union, nested, w) for w in WEIGHTS}
        save(out, path, row, measured(dict(set=row["set"]), found, row, value))
    report(out)
    compared(out)


def compared(out: dict) -> None:
    """Each weight against ``w = 1``, question by question: mean ± standard error (ahead / behind)."""
    rows = [r for r in out.values() if r["set"] == "selection"]
    print("\n| weight | LDS − w=1 | drop@3 − w=1 | drop@5 − w=1 |")
    for w in WEIGHTS[1:]:
        cells = []
        for part, key in (("lds", None), ("drops", "3"), ("drops", "5")):
            diff = np.array([(r[part][f"w={w}"] if key is None else r[part][f"w={w}"][key])
                             - (r[part]["w=1"] if key is None else r[part]["w=1"][key]) for r in rows])
            se = diff.std(ddof=1) / np.sqrt(len(diff))
            cells.append(f"{diff.mean():+.3f} ± {se:.3f} ({int((diff > 1e-9).sum())} / {int((diff < -1e-9).sum())})")
        print(f"| {w} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
