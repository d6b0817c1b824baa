"""Write the tables of ``results/evidence/README.md`` from the runs' ``results.json``.

``python results/evidence/tables.py`` replaces each ``<!-- table:NAME -->`` … ``<!-- /table -->``
block of the README with the table of that run (``selection`` or ``heldout``, and GIM's runs
beside the default, ``gim-selection`` and ``gim-heldout`` from ``gim/<split>/``), and the
``distance`` block with the held-out MRR by distance.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from captum_ffb.evaluation.evidence import distance_table, evidence_table

HERE = Path(__file__).resolve().parent


def main() -> None:
    readme = HERE / "README.md"
    text = readme.read_text(encoding="utf-8")
    for name in ("selection", "heldout", "gim-selection", "gim-heldout"):
        path = HERE / Path(*name.split("-")) / "results.json"
        if not path.is_file():
            continue
        summary = json.loads(path.read_text())
        text = _replace(text, name, evidence_table(summary))
        if name == "heldout":
            text = _replace(text, "distance", distance_table(summary))
    readme.write_text(text, encoding="utf-8")


def _replace(text: str, name: str, table: str) -> str:
    pattern = re.compile(rf"(<!-- table:{name} -->\n)(?:.*?\n)?(<!-- /table -->)", re.S)
    return pattern.sub(lambda m: m.group(1) + table.rstrip("\n") + "\n" + m.group(2), text)


if __name__ == "__main__":
    main()
