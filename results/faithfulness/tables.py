"""Write the tables of ``results/faithfulness/README.md``: ``python results/faithfulness/tables.py``.

Each task's table is its latest run (``<task>/results.json``) followed by the methods that
run did not repeat, taken from the 2026-11-22 run of the same 300 snippets and protocols
(``<task>/earlier-2026-11-22.csv``) and marked †; their cost / IG is against that run's IG.
The earlier ``decomposition`` row is left out: it was the paper's frozen rule, rerun as
``decomposition_frozen``. In the three 0.2 runs (:data:`RUNS_0_2`) ``decomposition`` was that
release's default, ``AttnLRPAttention`` from zero, and is shown under that rule's own name,
``decomposition_lrp_attention``; the 0.3 run's ``decomposition`` is today's default. The tables
replace the text between ``<!-- table:TASK -->`` and ``<!-- /table -->`` in the README.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

from captum_ffb.evaluation.report import markdown_table, scheme_text
from captum_ffb.io.files import write_text

HERE = Path(__file__).resolve().parent
TASKS = ("minilm-sentiment", "smollm2-next-token", "smollm2-sentiment", "smollm2-next-token-0.3",
         "smollm2-next-token-gim", "smollm2-next-token-schemes")
#: runs made when the default was ``AttnLRPAttention`` from zero
RUNS_0_2 = ("minilm-sentiment", "smollm2-next-token", "smollm2-sentiment")
EARLIER = "earlier-2026-11-22.csv"
MARK = " †"


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def rows_of(task: str) -> tuple[list[dict], set[str]]:
    """The table's rows (latest run, then the earlier run's other methods) and the names of
    the earlier ones."""
    latest = json.loads((HERE / task / "results.json").read_text())["rows"]
    if task in RUNS_0_2:  # that release's default, under its rule's name
        latest = [{**r, "method": "decomposition_lrp_attention"} if r["method"] == "decomposition" else r
                  for r in latest]
    done = {r["method"] for r in latest} | {"decomposition"}
    earlier = []
    path = HERE / task / EARLIER
    if path.is_file():
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                if row["method"] not in done:
                    earlier.append({k: (v if k == "method" else _number(v)) for k, v in row.items()
                                    if v != ""})
    rows = [r for r in latest if r["method"] != "random"] + earlier
    rows += [r for r in latest if r["method"] == "random"]
    return rows, {r["method"] for r in earlier}


def table(task: str) -> str:
    rows, marked = rows_of(task)
    summary = json.loads((HERE / task / "results.json").read_text())
    text = markdown_table({"rows": rows})
    if scheme_text(summary):
        text += "\n" + scheme_text(summary).rstrip("\n")
    for method in marked:
        text = text.replace(f"| `{method}` |", f"| `{method}`{MARK} |")
    return text


def main() -> None:
    readme = HERE / "README.md"
    text = readme.read_text()
    for task in TASKS:
        pattern = re.compile(rf"(<!-- table:{task} -->\n).*?(\n<!-- /table -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no <!-- table:{task} --> block")
        text = pattern.sub(lambda m, t=task: m.group(1) + table(t) + m.group(2), text)
    write_text(readme, text)


if __name__ == "__main__":
    main()
