"""Cost of the token × component attributions, measured in one run.

Run from the repository root::

    python benchmarks/components.py            # writes benchmarks/COMPONENTS.md and .json
    python benchmarks/components.py --sizes 128,512,2048 --forward-up-to 128 --memory 512
    python benchmarks/components.py --quick    # n = 32 only, a smoke test
    python benchmarks/components.py --sizes 512 --methods "input-gradient pass,attribute (backward route),attribute_components (sublayer)"
                                               # some rows only: added to the files' rows of
                                               # earlier runs

SmolLM2-135M-Instruct, the next token's logit: ``NormDecomposition.attribute_components`` at
the ``"sublayer"`` and ``"head"`` granularities against the input-gradient pass
(``benchmarks/baseline.py``: the gradient of the explained logit with respect to the input
embeddings, no parameter gradient; what Captum's ``Saliency`` or ``InputXGradient`` costs),
against ``attribute`` on
its default (backward) route and against ``attribute`` on the forward route, which
``attribute_components`` on its default route (``"auto"``: the cheaper one) and on each route
named (up to ``--forward-up-to`` tokens: the forward route grows as n²) and TransformerLens's direct logit attribution of
the same model (its bridge over a copy of the model, built once; ``run_with_cache``, then
``decompose_resid`` or ``stack_head_results`` through ``apply_ln_to_stack``, no token axis).
``--threads`` torch threads (one by default). Each time is the best of ``--repeat`` runs, interleaved so that every method sees
the same machine state. ``--memory N`` also runs each table method alone in a process of its
own at n = N and reports its peak resident memory during the call (Linux: the high-water mark
is reset after the model has loaded) and that peak less the memory before it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.baseline import NAME as BASELINE  # noqa: E402
from benchmarks.baseline import input_gradient_pass  # noqa: E402

METHODS = [BASELINE, "attribute (backward route)", "attribute (forward route)",
           "attribute_components (sublayer)", "attribute_components (head)",
           "attribute_components (sublayer, backward route)", "attribute_components (head, backward route)",
           "attribute_components (sublayer, forward route)", "attribute_components (head, forward route)",
           "TransformerLens DLA (sublayer)", "TransformerLens DLA (head)"]
#: ratio column → the method it divides by (within the same run)
RATIOS = {"ratio_to_input_gradient": BASELINE,
          "ratio_to_attribute": "attribute (backward route)",
          "ratio_to_sublayer": "attribute_components (sublayer)"}
#: the ratio key of runs against the old baseline (a forward + backward with every parameter's
#: gradient); their rows are not mixed with the input-gradient pass's
OLD_RATIO = "ratio_to_forward_backward"
#: runs from here on have the routes (earlier ones: the forward route only)
ROUTES_SINCE = "2026-11-24T20:00"
MEMORY_METHODS = [BASELINE, "attribute (backward route)", "attribute_components (sublayer)",
                  "attribute_components (head)"]


def lens_dla(model: torch.nn.Module, granularity: str):
    """TransformerLens's direct logit attribution of ``model`` (a bridge over a copy, built
    here, once), as a function of ``(ids, token)``; ``None`` without ``transformer_lens``."""
    try:
        from transformer_lens.model_bridge.sources import build_bridge_from_module
    except ImportError:
        return None
    import copy

    bridge = build_bridge_from_module(copy.deepcopy(model).eval(), type(model).__name__, hf_config=model.config)
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)

    def run(ids: torch.Tensor, token: int) -> torch.Tensor:
        with torch.no_grad():
            _, cache = bridge.run_with_cache(ids)
            direction = bridge.W_U[:, token] * bridge.ln_final.w
            if granularity == "head":
                stack = cache.stack_head_results(layer=-1, pos_slice=-1)
            else:
                stack = cache.decompose_resid(layer=-1, pos_slice=-1)
            return cache.apply_ln_to_stack(stack, layer=-1, pos_slice=-1)[:, 0] @ direction

    return run


def runs_for(model, nd, n: int, forward_up_to: int, lens: dict):
    """The timed functions at ``n`` tokens (random ids, the predicted next token)."""
    ids = torch.randint(100, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
    with torch.no_grad():
        token = int(model(ids, logits_to_keep=1).logits[0, -1].argmax())

    runs = {
        BASELINE: lambda: input_gradient_pass(model, ids, token),
        "attribute (backward route)": lambda: nd.attribute(ids, target=token),
        "attribute (forward route)": lambda: nd.attribute(ids, target=token, route="forward"),
        "attribute_components (sublayer)": lambda: nd.attribute_components(ids, target=token),
        "attribute_components (head)": lambda: nd.attribute_components(ids, target=token, granularity="head"),
        "attribute_components (sublayer, backward route)":
            lambda: nd.attribute_components(ids, target=token, route="backward"),
        "attribute_components (head, backward route)":
            lambda: nd.attribute_components(ids, target=token, granularity="head", route="backward"),
        "attribute_components (sublayer, forward route)":
            lambda: nd.attribute_components(ids, target=token, route="forward"),
        "attribute_components (head, forward route)":
            lambda: nd.attribute_components(ids, target=token, granularity="head", route="forward"),
    }
    if n > forward_up_to:  # the forward routes grow as n²; past them "auto" is the backward route
        runs = {name: fn for name, fn in runs.items()
                if "forward route)" not in name and not name.startswith("attribute_components (sublayer, b")
                and not name.startswith("attribute_components (head, b")}
    for granularity, fn in lens.items():
        if fn is not None:
            runs[f"TransformerLens DLA ({granularity})"] = lambda fn=fn: fn(ids, token)
    return runs


def auto_route(model: torch.nn.Module, name: str, n: int) -> str | None:
    """The route ``route="auto"`` takes for the table row ``name`` at ``n`` tokens."""
    from captum_ffb.engine.whole import component_route

    if not name.startswith("attribute_components") or "route)" in name:
        return None
    granularity = "head" if "(head" in name else "sublayer"
    config = model.config
    return component_route(n, int(config.num_hidden_layers), granularity, int(config.num_attention_heads), False)


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def alone(name: str, n: int) -> None:
    """In a process of its own: one method at ``n``; print seconds, peak and added memory."""
    import gc

    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir

    torch.set_num_threads(1)
    model = load_model(smollm2_dir(required=True), causal_lm=True, show_progress=False).model
    fn = runs_for(model, NormDecomposition(model, show_progress=False), n, 0, {})[name]
    gc.collect()
    before = _status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark (VmHWM)
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    peak = _status_bytes("VmHWM")
    print(json.dumps({"seconds": seconds, "peak_rss": peak, "added": peak - before}))


def write_markdown(meta: dict, rows: list[dict], memory: list[dict]) -> None:
    """``benchmarks/COMPONENTS.md`` from the rows of ``COMPONENTS.json``."""
    lines = ["# Token × component attributions: cost (SmolLM2-135M, next token)", "",
             f"torch {meta['torch']}, best of each run's repeats, its torch threads in the `threads` column; by "
             "`python benchmarks/components.py`. Ratios are taken within one run (the `run` column: "
             "its start), never across runs. `attribute_components` rows without a route take "
             f"`route=\"auto\"` (the column says which route it chose). The {BASELINE}: the gradient of the "
             "explained logit with respect to the input embeddings, no parameter gradient "
             "(`benchmarks/baseline.py`; what Captum's `Saliency` or `InputXGradient` costs).", "",
             f"| n | method | auto's route | seconds | × {BASELINE} | × attribute | × sublayer table | run | threads |",
             "|---|---|---|---:|---:|---:|---:|---|---:|"]

    def row(r: dict) -> str:
        return (f"| {r['n']} | {r['method']} | {r.get('route') or ''} | {r['seconds']:.2f} | " + " | ".join(
            "–" if r.get(key) is None else f"{r[key]:.2f}" for key in RATIOS) + f" | {r['run']} | {r.get('threads', 1)} |")

    lines += [row(r) for r in rows if r["run"] >= ROUTES_SINCE]
    earlier = [r for r in rows if r["run"] < ROUTES_SINCE]
    if earlier:
        lines += ["", f"Earlier runs (before {ROUTES_SINCE} `attribute_components` had the forward route "
                  "only, so its rows there are that route's):", "", *lines[4:6]]
        lines += [row(r) for r in earlier]
    if memory:
        lines += ["", f"Each alone in a process of its own at n = {memory[0]['n']} (the model loaded; peak resident "
                  "memory during the call, and that peak less the memory before it):", "",
                  "| method | seconds | peak resident memory (GB) | added by the call (GB) | run |",
                  "|---|---:|---:|---:|---|"]
        lines += [f"| {m['method']} | {m['seconds']:.1f} | {m['peak_rss'] / 2**30:.2f} | {m['added'] / 2**30:.2f} "
                  f"| {m['run']} |" for m in memory]
    (ROOT / "benchmarks" / "COMPONENTS.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default="128,512")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--forward-up-to", type=int, default=128, help="the forward routes up to this n")
    parser.add_argument("--memory", type=int, default=None, metavar="N", help="peak memory, each method alone, at n = N")
    parser.add_argument("--methods", default=None, help="comma-separated method names (default: all)")
    parser.add_argument("--tables-only", action="store_true", help="rewrite COMPONENTS.md from COMPONENTS.json")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the table says each run's)")
    parser.add_argument("--alone", nargs=2, metavar=("NAME", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.alone:
        alone(args.alone[0], int(args.alone[1]))
        return
    if args.tables_only:
        found = json.loads((ROOT / "benchmarks" / "COMPONENTS.json").read_text())
        if any(OLD_RATIO in r for r in found["rows"]) or any(m["method"] not in METHODS for m in found["memory"]):
            raise SystemExit(f"benchmarks/COMPONENTS.json holds runs against the old baseline (forward + "
                             f"backward, every parameter's gradient), not the {BASELINE}: rerun "
                             "`python benchmarks/components.py` (it drops those runs) before --tables-only")
        write_markdown(found["meta"], found["rows"], found["memory"])
        return
    torch.set_num_threads(args.threads)

    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir

    model = load_model(smollm2_dir(required=True), causal_lm=True, show_progress=False).model
    nd = NormDecomposition(model)
    lens = {granularity: lens_dla(model, granularity) for granularity in ("sublayer", "head")}
    sizes = [32] if args.quick else [int(n) for n in args.sizes.split(",")]
    run = datetime.datetime.now().isoformat(timespec="minutes")
    rows = []
    for n in sizes:
        runs = runs_for(model, nd, n, args.forward_up_to, lens)
        if args.methods:
            chosen = [name.strip() for name in re.split(r",(?![^()]*\))", args.methods)]  # not inside (…)
            unknown = [name for name in chosen if name not in METHODS]
            if unknown:
                raise SystemExit(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
            runs = {name: fn for name, fn in runs.items() if name in chosen}
        best = {name: float("inf") for name in runs}
        for fn in list(runs.values())[:1]:
            fn()  # warm
        for _ in range(args.repeat):
            for name, fn in runs.items():
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
                print(f"n={n:4d} {name:48s} {best[name]:8.2f} s", flush=True)
        model.zero_grad(set_to_none=True)
        for name, seconds in best.items():
            rows.append({"n": n, "method": name, "seconds": seconds, "run": run, "route": auto_route(model, name, n),
                         "threads": args.threads,
                         **{key: seconds / best[base] if base in best else None
                            for key, base in RATIOS.items()}})
            if BASELINE in best:
                print(f"n={n:4d} {name:48s} {seconds / best[BASELINE]:8.2f} × {BASELINE}", flush=True)
    memory = []
    if args.memory and not args.quick:
        for name in MEMORY_METHODS:
            done = subprocess.run([sys.executable, __file__, "--alone", name, str(args.memory)],
                                  capture_output=True, text=True, check=True)
            found = json.loads(done.stdout.strip().splitlines()[-1])
            memory.append({"n": args.memory, "method": name, "run": run, **found})
            print(f"alone n={args.memory} {name:40s} peak {found['peak_rss'] / 2**30:.2f} GB, "
                  f"added {found['added'] / 2**30:.2f} GB", flush=True)
    if args.quick:
        return
    meta = {"date": datetime.date.today().isoformat(), "machine": platform.platform(),
            "processor": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "repeat": args.repeat}
    path = ROOT / "benchmarks" / "COMPONENTS.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    old = [r for r in earlier.get("rows", []) if OLD_RATIO in r]
    if old:
        print(f"dropped {len(old)} rows of {path.name} measured against the old baseline (forward + backward)",
              flush=True)
    kept = [r for r in earlier.get("rows", [])
            if r["run"] != run and r["method"] in METHODS and OLD_RATIO not in r]
    rows = sorted(kept + rows, key=lambda r: (r["n"], r["run"], METHODS.index(r["method"])))
    memory = memory or [m for m in earlier.get("memory", []) if m["method"] in METHODS]
    path.write_text(json.dumps({"meta": meta, "rows": rows, "memory": memory}, indent=2))
    write_markdown(meta, rows, memory)


if __name__ == "__main__":
    main()
