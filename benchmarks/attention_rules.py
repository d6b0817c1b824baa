"""Cost of the attention rules on the one-backward-pass route, measured in one run.

Run from the repository root::

    python benchmarks/attention_rules.py          # writes benchmarks/ATTENTION_RULES.md and .json
    python benchmarks/attention_rules.py --quick  # n = 32 only, a smoke test

SmolLM2-135M-Instruct, next-token attribution (``NormDecomposition``, backward route) with the
default rules (``AttnLRPAttention``), the paper's frozen-probability rule and ``IGAttention``
(``--n-steps`` and 8 points) at n = 128 and 512, against one plain forward + backward pass of the model (loss = the target logit,
gradients of every parameter). Each time is the best of ``--repeat`` runs, interleaved so
that every method sees the same machine state.
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


def load_smollm2():
    from captum_ffb.models import load_model, smollm2_dir

    return load_model(smollm2_dir(required=True), causal_lm=True, show_progress=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--n-steps", type=int, default=32)
    args = parser.parse_args()

    from captum_ffb import NormDecomposition
    from captum_ffb.rules import Attention, IGAttention

    loaded = load_smollm2()
    model = loaded.model
    sizes = [32] if args.quick else [128, 512]
    methods = {"default (AttnLRPAttention)": None, "frozen Attention() (paper)": Attention(),
               f"IGAttention(n_steps={args.n_steps})": IGAttention(args.n_steps),
               "IGAttention(n_steps=8)": IGAttention(8)}
    rows = []
    for n in sizes:
        ids = torch.randint(100, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            token = int(model(ids).logits[0, -1].argmax())

        def plain(ids=ids, token=token):
            model.zero_grad(set_to_none=True)
            model(ids, logits_to_keep=1).logits[0, -1, token].backward()

        runs = {"forward + backward": plain}
        for name, rule in methods.items():
            nd = NormDecomposition(model, rules=None if rule is None else {"attention": rule})
            runs[name] = (lambda nd=nd, ids=ids, token=token: nd.attribute(ids, target=token))
        best = {name: float("inf") for name in runs}
        for fn in runs.values():
            fn()  # warm
        for _ in range(args.repeat):
            for name, fn in runs.items():
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
        for name, seconds in best.items():
            rows.append({"n": n, "method": name, "seconds": seconds,
                         "ratio_to_forward_backward": seconds / best["forward + backward"]})
            print(f"n={n:4d} {name:28s} {seconds:7.3f} s  ratio {seconds / best['forward + backward']:.2f}",
                  flush=True)
    if args.quick:
        return
    meta = {"date": datetime.date.today().isoformat(), "machine": platform.platform(),
            "processor": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "repeat": args.repeat}
    (ROOT / "benchmarks" / "ATTENTION_RULES.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = ["# Attention rules: cost on the backward route (SmolLM2-135M, next token)", "",
             f"Measured {meta['date']} on {meta['processor']}, {meta['threads']} thread"
             f"{'s' if meta['threads'] != 1 else ''}, torch "
             f"{meta['torch']}, best of {args.repeat}; by `python benchmarks/attention_rules.py`.", "",
             "| n | method | seconds | ratio to one forward + backward |", "|---|---|---|---|"]
    lines += [f"| {r['n']} | {r['method']} | {r['seconds']:.3f} | {r['ratio_to_forward_backward']:.2f} |" for r in rows]
    (ROOT / "benchmarks" / "ATTENTION_RULES.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
