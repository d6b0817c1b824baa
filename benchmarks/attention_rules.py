"""Cost of the whole-model rules on the one-backward-pass route, measured in one run.

Run from the repository root::

    python benchmarks/attention_rules.py          # writes benchmarks/ATTENTION_RULES.md and .json
    python benchmarks/attention_rules.py --quick  # n = 32 only, a smoke test

SmolLM2-135M-Instruct, next-token attribution (``NormDecomposition``, backward route): the
default (the paper's rules, players centred on the input's mean token), the paper's rules from
zero, ``AttnLRPAttention`` (the previous default), ``CompleteAttnLRPAttention`` and
``IGAttention(4, exact=True)``, at n = 128, 512 and 2048, against the input-gradient pass
(``benchmarks/baseline.py``: the gradient of the explained logit with respect to the input
embeddings, no parameter gradient; what Captum's ``Saliency`` or ``InputXGradient`` costs).
Each time is the best of ``--repeat`` runs, interleaved so that every method sees the same
machine state. At
n = 2048 each method also runs once in a process of its own, which reports its peak resident
memory during the run (Linux: the high-water mark is reset after the model has loaded, so the
loader's own peak does not hide the method's) and that peak less the resident memory before it.
``--memory-only`` redoes only those rows and keeps the timed rows of the JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.baseline import NAME as BASELINE  # noqa: E402
from benchmarks.baseline import input_gradient_pass  # noqa: E402

#: name → (the attention rule from captum_ffb.rules, reference); ``None``: the default's.
METHODS = {
    "default (paper's rules, centred)": (None, None),
    "paper's rules, from zero": (lambda r: r.Attention(), "zero"),
    "AttnLRPAttention (previous default)": (lambda r: r.AttnLRPAttention(), "zero"),
    "CompleteAttnLRPAttention": (lambda r: r.CompleteAttnLRPAttention(), "zero"),
    "IGAttention(4, exact=True)": (lambda r: r.IGAttention(4, exact=True), "zero"),
}


def load_smollm2():
    from captum_ffb.explained.models import load_model, smollm2_dir

    return load_model(smollm2_dir(required=True), causal_lm=True, show_progress=False)


def runs_for(model, n: int) -> tuple[dict, torch.Tensor]:
    from captum_ffb import NormDecomposition
    from captum_ffb import rules as r

    ids = torch.randint(100, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
    with torch.no_grad():
        token = int(model(ids, logits_to_keep=1).logits[0, -1].argmax())

    runs = {BASELINE: lambda: input_gradient_pass(model, ids, token)}
    for name, (rule, reference) in METHODS.items():
        rules = None if rule is None else {"attention": rule(r)}
        nd = NormDecomposition(model, rules=rules)
        runs[name] = (lambda nd=nd, reference=reference: nd.attribute(ids, target=token, reference=reference))
    return runs, ids


def one(name: str, n: int) -> None:
    """In a process of its own: one method at ``n``, print seconds and peak RSS (bytes)."""
    torch.set_num_threads(1)
    model = load_smollm2().model
    runs, _ = runs_for(model, n)
    import gc

    gc.collect()
    before = _status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark (VmHWM)
    start = time.perf_counter()
    runs[name]()
    seconds = time.perf_counter() - start
    peak = _status_bytes("VmHWM")
    print(json.dumps({"seconds": seconds, "peak_rss": peak, "added": peak - before}))


def _status_bytes(field: str) -> int:
    """One ``kB`` field of ``/proc/self/status``, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--one", nargs=2, metavar=("NAME", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one[0], int(args.one[1]))
        return
    sizes = [32] if args.quick else [128, 512, 2048]
    rows = []
    if args.memory_only:
        rows = json.loads((ROOT / "benchmarks" / "ATTENTION_RULES.json").read_text())["rows"]
        if any("ratio_to_input_gradient" not in r for r in rows):
            raise SystemExit(f"benchmarks/ATTENTION_RULES.json was measured against the old baseline (forward + "
                             f"backward, every parameter's gradient), not the {BASELINE}: rerun "
                             "`python benchmarks/attention_rules.py` in full")
        sizes = []
    torch.set_num_threads(1)
    model = load_smollm2().model if sizes else None
    for n in sizes:
        runs, _ = runs_for(model, n)
        best = {name: float("inf") for name in runs}
        for fn in runs.values():
            fn()  # warm
        for _ in range(args.repeat if n < 2048 else 1):
            for name, fn in runs.items():
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
        for name, seconds in best.items():
            rows.append({"n": n, "method": name, "seconds": seconds,
                         "ratio_to_input_gradient": seconds / best[BASELINE]})
            print(f"n={n:4d} {name:38s} {seconds:8.3f} s  × {BASELINE} {seconds / best[BASELINE]:.2f}",
                  flush=True)
    memory = []
    if not args.quick:
        for name in [BASELINE, *METHODS]:
            done = subprocess.run([sys.executable, __file__, "--one", name, "2048"], capture_output=True,
                                  text=True, check=True)
            found = json.loads(done.stdout.strip().splitlines()[-1])
            memory.append({"n": 2048, "method": name, **found})
            print(f"alone n=2048 {name:38s} {found['seconds']:8.3f} s  peak {found['peak_rss'] / 2**30:.2f} GB"
                  f"  added {found['added'] / 2**30:.2f} GB",
                  flush=True)
    if args.quick:
        return
    meta = {"date": datetime.date.today().isoformat(), "machine": platform.platform(),
            "processor": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "repeat": args.repeat}
    (ROOT / "benchmarks" / "ATTENTION_RULES.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "alone": memory}, indent=2))
    lines = ["# Whole-model rules: cost on the backward route (SmolLM2-135M, next token)", "",
             f"Measured {meta['date']} on {meta['processor']}, {meta['threads']} thread"
             f"{'s' if meta['threads'] != 1 else ''}, torch {meta['torch']}, best of {args.repeat} "
             f"(one run at n = 2048); by `python benchmarks/attention_rules.py`. The {BASELINE}: the gradient "
             "of the explained logit with respect to the input embeddings, no parameter gradient "
             "(`benchmarks/baseline.py`; what Captum's `Saliency` or `InputXGradient` costs).", "",
             f"| n | method | seconds | × {BASELINE} |", "|---|---|---:|---:|"]
    lines += [f"| {r['n']} | {r['method']} | {r['seconds']:.3f} | {r['ratio_to_input_gradient']:.2f} |" for r in rows]
    lines += ["", "Each alone in a process of its own at n = 2048 (the model loaded; peak resident memory during "
              "the run, and that peak less the resident memory before it):", "",
              "| method | seconds | peak resident memory (GB) | added by the run (GB) |", "|---|---:|---:|---:|"]
    lines += [f"| {m['method']} | {m['seconds']:.1f} | {m['peak_rss'] / 2**30:.2f} | {m['added'] / 2**30:.2f} |"
              for m in memory]
    (ROOT / "benchmarks" / "ATTENTION_RULES.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
