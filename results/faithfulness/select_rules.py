"""Choose the whole-model default rules by evidence: ``python results/faithfulness/select_rules.py``.

Every attention rule (the paper's frozen probabilities, ``IGAttention``, ``AttnLRPAttention``),
each with the players measured from zero and from the mean input vector, on the three tasks of
``run.py``, every protocol, on a *selection* set that the reported results never see: 100
usable snippets from the last 600 of the 2,550 held-out Rotten Tomatoes snippets (the reported
300 come from the first ~600). Writes ``selection/<task>-<reference>/`` and
``selection/SELECTION.md``: per task and score the best variant, and the number of wins.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from captum_ffb.evaluation.data import rotten_tomatoes_split
from captum_ffb.evaluation.evaluate import evaluate
from captum_ffb.explained.models import smollm2_dir
from captum_ffb.io.files import write_text

HERE = Path(__file__).resolve().parent
OUT = HERE / "selection"
N = 100
TAIL = 600
VARIANTS = ("decomposition_frozen", "decomposition_ig_attention", "decomposition_lrp_attention")
REFERENCES = ("zero", "mean")
TASKS = {  # name: (model, task, max_tokens), as in run.py
    "minilm-sentiment": (None, "sentiment", None),
    "smollm2-next-token": ("smollm2", "next-token", 24),
    "smollm2-sentiment": ("smollm2", "sentiment", 24),
}
#: score: True when higher is better
SCORES = {"decompx_aopc": True, "decompx_accuracy": False, "comprehensiveness": True,
          "sufficiency": False, "abpc": True}


def selection_data() -> Path:
    """The selection set's file: the last ``TAIL`` held-out snippets with their labels."""
    split = rotten_tomatoes_split("heldout")
    path = OUT / "heldout_tail.jsonl"
    OUT.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": t, "label": int(y)})
             for t, y in zip(split.texts[-TAIL:], split.labels[-TAIL:])]
    write_text(path, "\n".join(lines) + "\n")
    return path


def run(names: list[str]) -> None:
    data = selection_data()
    for name in names:
        model, task, max_tokens = TASKS[name]
        if model == "smollm2":
            model = str(smollm2_dir(required=True))
        for reference in REFERENCES:
            print(f"== {name}, reference {reference}", flush=True)
            evaluate(model, task, data, ",".join(VARIANTS), "all", OUT / f"{name}-{reference}",
                     n=N, max_tokens=max_tokens, batch_size=16,
                     options={v: {"reference": reference} for v in VARIANTS})


def summarise() -> str:
    """A Markdown page: every variant's scores per task, the best per score, the wins."""
    lines = ["# Choosing the default rules (selection set, never reported)", "",
             f"{N} usable snippets from the last {TAIL} held-out ones; every protocol. "
             "Bold: best of the six variants.", ""]
    wins: dict[str, int] = {}
    for name in TASKS:
        rows = {}
        for reference in REFERENCES:
            path = OUT / f"{name}-{reference}" / "results.json"
            if not path.is_file():
                continue
            for row in json.loads(path.read_text())["rows"]:
                rows[f"{row['method']} ({reference})"] = row
        if not rows:
            continue
        scores = [s for s in SCORES if any(r.get(s) is not None for r in rows.values())]
        lines += [f"## {name}", "", "| variant | " + " | ".join(scores) + " |",
                  "|---|" + "---:|" * len(scores)]
        best = {}
        for score in scores:
            values = {k: r[score] for k, r in rows.items() if r.get(score) is not None}
            best[score] = (max if SCORES[score] else min)(values, key=values.get)
            wins[best[score]] = wins.get(best[score], 0) + 1
        for key, row in rows.items():
            cells = []
            for score in scores:
                value = row.get(score)
                text = "" if value is None else f"{value:.3f}"
                cells.append(f"**{text}**" if best[score] == key else text)
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Wins (scores × tasks)", "", "| variant | wins |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(wins.items(), key=lambda kv: -kv[1])]
    page = "\n".join(lines) + "\n"
    write_text(OUT / "SELECTION.md", page)
    return page


if __name__ == "__main__":
    args = sys.argv[1:]
    if args != ["--summary"]:
        run(args or list(TASKS))
    print(summarise())
