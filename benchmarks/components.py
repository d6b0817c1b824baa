"""Cost of the token × component attributions, measured in one run.

Run from the repository root::

    python benchmarks/components.py            # writes benchmarks/COMPONENTS.md and .json
    python benchmarks/components.py --quick    # n = 32 only, a smoke test
    python benchmarks/components.py --sizes 512 --methods "forward + backward,attribute (backward route),attribute_components (sublayer)"
                                               # some rows only: added to the files' rows of
                                               # earlier runs

SmolLM2-135M-Instruct, the next token's logit: ``NormDecomposition.attribute_components`` at
the ``"sublayer"`` and ``"head"`` granularities against one plain forward + backward pass of
the model (loss = the target logit, gradients of every parameter), against ``attribute`` on
its default (backward) route and against ``attribute`` on the forward route, which
``attribute_components`` builds on. One thread. Each time is the best of ``--repeat`` runs
(one by default at n = 512), interleaved so that every method sees the same machine state.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
METHODS = ["forward + backward", "attribute (backward route)", "attribute (forward route)",
           "attribute_components (sublayer)", "attribute_components (head)"]
#: ratio column → the method it divides by (within the same run)
RATIOS = {"ratio_to_forward_backward": "forward + backward",
          "ratio_to_attribute": "attribute (backward route)",
          "ratio_to_forward_route": "attribute (forward route)"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default="128,512")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--methods", default=None, help="comma-separated method names (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from captum_ffb import NormDecomposition
    from captum_ffb.models import load_model, smollm2_dir

    model = load_model(smollm2_dir(required=True), causal_lm=True, show_progress=False).model
    nd = NormDecomposition(model)
    sizes = [32] if args.quick else [int(n) for n in args.sizes.split(",")]
    run = datetime.datetime.now().isoformat(timespec="minutes")
    rows = []
    for n in sizes:
        ids = torch.randint(100, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            token = int(model(ids).logits[0, -1].argmax())

        def plain(ids=ids, token=token):
            model.zero_grad(set_to_none=True)
            model(ids, logits_to_keep=1).logits[0, -1, token].backward()

        runs = {
            "forward + backward": plain,
            "attribute (backward route)": lambda ids=ids, token=token: nd.attribute(ids, target=token),
            "attribute (forward route)": lambda ids=ids, token=token: nd.attribute(ids, target=token, route="forward"),
            "attribute_components (sublayer)": lambda ids=ids, token=token: nd.attribute_components(ids, target=token),
            "attribute_components (head)":
                lambda ids=ids, token=token: nd.attribute_components(ids, target=token, granularity="head"),
        }
        if args.methods:
            chosen = [name.strip() for name in args.methods.split(",")]
            unknown = [name for name in chosen if name not in runs]
            if unknown:
                raise SystemExit(f"unknown method {unknown[0]!r}; choose from {', '.join(runs)}")
            runs = {name: fn for name, fn in runs.items() if name in chosen}
        best = {name: float("inf") for name in runs}
        plain()  # warm
        for _ in range(args.repeat):
            for name, fn in runs.items():
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
                print(f"n={n:4d} {name:34s} {best[name]:8.2f} s", flush=True)
        model.zero_grad(set_to_none=True)
        for name, seconds in best.items():
            rows.append({"n": n, "method": name, "seconds": seconds, "run": run,
                         **{key: seconds / best[base] if base in best else None
                            for key, base in RATIOS.items()}})
    if args.quick:
        return
    meta = {"date": datetime.date.today().isoformat(), "machine": platform.platform(),
            "processor": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "repeat": args.repeat}
    path = ROOT / "benchmarks" / "COMPONENTS.json"
    kept = json.loads(path.read_text())["rows"] if path.exists() else []
    rows = sorted([r for r in kept if r["run"] != run] + rows,
                  key=lambda r: (r["n"], r["run"], METHODS.index(r["method"])))
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = ["# Token × component attributions: cost (SmolLM2-135M, next token)", "",
             f"{meta['threads']} thread, torch {meta['torch']}, best of {args.repeat}; by "
             "`python benchmarks/components.py`. Ratios are taken within one run (the `run` column: "
             "its start), never across runs.", "",
             "| n | method | seconds | × forward + backward | × attribute | × forward route | run |",
             "|---|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['n']} | {r['method']} | {r['seconds']:.2f} | " + " | ".join(
        "–" if r[key] is None else f"{r[key]:.2f}" for key in RATIOS) + f" | {r['run']} |" for r in rows]
    (ROOT / "benchmarks" / "COMPONENTS.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
