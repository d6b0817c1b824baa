"""Cost of attribution graphs, measured in one run.

Run from the repository root::

    python benchmarks/graphs.py                 # writes benchmarks/GRAPHS.md and .json
    python benchmarks/graphs.py --sizes 128 --memory 0 --quick

SmolLM2-135M-Instruct, the predicted next token of random ids: ``attribute_graph`` at head
granularity, pruned with circuit-tracer's default thresholds (the default ``max_nodes``),
against the input-gradient pass (``benchmarks/baseline.py``: the gradient of the explained
logit with respect to the input embeddings, no parameter gradient; what Captum's ``Saliency``
or ``InputXGradient`` costs) and ``attribute`` (the backward route), interleaved and timed in
the same run (best of ``--repeat``); ``score_split`` per call (after the first, which records
the pass); and, each in a process of its own, the peak resident memory of the *unpruned* graph
at ``--memory`` tokens (Linux: the high-water mark reset after the model has loaded).
``--threads`` torch threads (one by default; the report says how many).

``--first-only`` measures the first graph call of a fresh process against the next calls
(the model loaded, then ``attribute_graph`` three times on a prompt of the docs, with and
without a corrupted prompt's patch estimates) and adds them to the saved results.

``--scaling 512,1024,2048`` measures the pruned head graph at long inputs and adds the table to
the saved results: per n, in a process of its own each, the graph (seconds, the peak resident
memory above the loaded model, kept nodes, edges computed, and the seconds of its graph pass,
covectors, edges and pruning) and the input-gradient pass at the same n.
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

METHODS = [BASELINE, "attribute (backward route)", "attribute_graph (head, pruned)",
           "attribute_graph (sublayer, pruned)"]


def load():
    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir

    loaded = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm")
    return loaded.model, NormDecomposition(loaded.model)


def inputs(model: torch.nn.Module, n: int) -> tuple[torch.Tensor, int]:
    ids = torch.randint(100, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
    with torch.no_grad():
        token = int(model(ids, logits_to_keep=1).logits[0, -1].argmax())
    return ids, token


def timings(model, nd, n: int, repeat: int) -> tuple[list[dict], dict]:
    ids, token = inputs(model, n)

    runs = {
        BASELINE: lambda: input_gradient_pass(model, ids, token),
        "attribute (backward route)": lambda: nd.attribute(ids, target=token),
        "attribute_graph (head, pruned)": lambda: nd.attribute_graph(ids, token),
        "attribute_graph (sublayer, pruned)": lambda: nd.attribute_graph(ids, token, granularity="sublayer"),
    }
    for fn in runs.values():  # warm up
        fn()
    best = {name: float("inf") for name in runs}
    for _ in range(repeat):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    graph = nd.attribute_graph(ids, token)
    facts = {"kept_nodes": int(graph.node_mask.sum()), "kept_edges": int(graph.edge_mask.sum()),
             "kept_share": graph.kept_share, "nodes": len(graph.data), "edges_computed": len(graph.data.weights)}
    d = graph.data
    layer, head = next((d.layers[k], d.heads[k]) for k in graph.node_mask.nonzero()[:, 0].tolist()
                       if d.kinds[k] == "head")
    graph.score_split(layer, head, n - 1, 0)  # records the pass
    start = time.perf_counter()
    calls = 5
    for key in range(calls):
        graph.score_split(layer, head, n - 1, key)
    facts["score_split_s"] = (time.perf_counter() - start) / calls
    rows = [{"n": n, "method": name, "seconds": best[name],
             "ratio_to_input_gradient": best[name] / best[BASELINE]} for name in runs]
    return rows, facts


def alone(n: int) -> None:
    """In a process of its own: the unpruned head graph at ``n``; print its peak memory."""
    import gc

    model, nd = load()
    ids, token = inputs(model, n)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_bytes("VmRSS")
    start = time.perf_counter()
    graph = nd.attribute_graph(ids, token, prune=False)
    seconds = time.perf_counter() - start
    peak = _status_bytes("VmHWM")
    print(json.dumps({"n": n, "seconds": seconds, "peak_bytes": peak, "added_bytes": peak - before,
                      "nodes": len(graph.data), "edges": len(graph.data.weights)}))


#: the first-call prompt (the graphs page's), its corrupted twin and the explained token
FIRST_PROMPT = ("The Eiffel Tower is located in the city of", "The Colosseum is located in the city of", " Paris")


def first_calls() -> None:
    """In a fresh process: the model loaded, then three graph calls of each kind (the first
    pays for whatever is built, traced or warmed once); print their seconds."""
    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir

    start = time.perf_counter()
    loaded = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm")
    load_seconds = time.perf_counter() - start
    nd = NormDecomposition(loaded.model, tokenizer=loaded.tokenizer)
    clean, corrupted, target = FIRST_PROMPT
    kinds = {"attribute_graph": {}, "attribute_graph with corrupted_inputs": {"corrupted_inputs": corrupted}}
    found = {"load_seconds": load_seconds}
    for kind, options in kinds.items():
        times = []
        for _ in range(3):
            start = time.perf_counter()
            nd.attribute_graph(clean, target=target, **options)
            times.append(time.perf_counter() - start)
        found[kind] = times
    print(json.dumps(found))


def scaling_child(n: int, method: str) -> None:
    """In a process of its own: the pruned head graph (or the input-gradient pass) at ``n``
    after a warm-up at n = 64; print its seconds, peak memory and, for the graph, its sizes
    and where its time went."""
    import cProfile
    import gc
    import pstats

    model, nd = load()
    ids, token = inputs(model, n)
    warm = ids[:, :64]
    if method == BASELINE:
        input_gradient_pass(model, warm, token)
    else:
        nd.attribute_graph(warm, token)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_bytes("VmRSS")
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    graph = input_gradient_pass(model, ids, token) if method == BASELINE else nd.attribute_graph(ids, token)
    profile.disable()
    seconds = time.perf_counter() - start
    found = {"n": n, "method": method, "seconds": seconds, "added_bytes": _status_bytes("VmHWM") - before}
    if method != BASELINE:
        stats = pstats.Stats(profile).stats  # (file, line, name) → (calls, primitive, own, cumulative, callers)
        parts = {"graph pass": "graph_pass", "covectors": "covectors", "edges": "_edges_into",
                 "pruning": "prune_masks"}
        found["parts"] = {label: sum(v[3] for k, v in stats.items() if k[2] == name) for label, name in parts.items()}
        found.update(kept_nodes=int(graph.node_mask.sum()), edges_computed=len(graph.data.weights),
                     nodes=len(graph.data))
    print(json.dumps(found))


def scaling_markdown(rows: dict) -> list[str]:
    lines = ["", "## Long inputs: the pruned head graph (`--scaling`)", "",
             "Random ids, the predicted token, library defaults (head granularity, `max_nodes` 256, pruned), each "
             f"measurement in a process of its own after a warm-up at n = 64 and under Python's profiler (both), against the {BASELINE} at the same n. "
             "Peak: the resident memory's high-water mark above the loaded model. Parts: the seconds of the graph "
             "pass, the covectors, the edges' vector–Jacobian products and the pruning.", "",
             f"| n | {BASELINE} (s) | graph (s) | × | peak (GB) | kept nodes | edges computed | graph pass, "
             "covectors, edges, pruning (s) |", "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for n, row in rows.items():
        base, graph = row[BASELINE], row["graph"]
        parts = ", ".join(f"{v:.1f}" for v in graph["parts"].values())
        lines.append(f"| {n} | {base['seconds']:.2f} | {graph['seconds']:.2f} | "
                     f"{graph['seconds'] / base['seconds']:.1f}× | {graph['added_bytes'] / 1e9:.1f} | "
                     f"{graph['kept_nodes']} | {graph['edges_computed']} | {parts} |")
    return lines


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def markdown(result: dict) -> str:
    lines = ["# Attribution graphs: cost (SmolLM2-135M, next token)", "",
             f"{_threads(result)}, torch {result['torch']}, best of {result['repeat']}, run {result['run']}; by "
             "`python benchmarks/graphs.py`. Ratios are taken within this run. The pruned graph computes the "
             "edges of the default `max_nodes` (256) writer nodes, then prunes with circuit-tracer's thresholds "
             f"(0.8 / 0.98). The {BASELINE}: the gradient of the explained logit with respect to the input "
             "embeddings, no parameter gradient (`benchmarks/baseline.py`; what Captum's `Saliency` or "
             "`InputXGradient` costs).", "",
             f"| n | method | seconds | × {BASELINE} |", "|---|---|---:|---:|"]
    for row in result["rows"]:
        lines.append(f"| {row['n']} | {row['method']} | {row['seconds']:.2f} | {row['ratio_to_input_gradient']:.2f} |")
    lines += ["", "| n | graph nodes | edges computed | kept nodes | kept edges | kept share | `score_split` per call (s) |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for n, facts in result["facts"].items():
        lines.append(f"| {n} | {facts['nodes']} | {facts['edges_computed']} | {facts['kept_nodes']} | "
                     f"{facts['kept_edges']} | {facts['kept_share']:.1%} | {facts['score_split_s']:.3f} |")
    if result.get("memory"):
        m = result["memory"]
        lines += ["", f"Unpruned head graph at n = {m['n']} (every node's edges: {m['nodes']} nodes, {m['edges']} "
                  f"edges): {m['seconds']:.1f} s, peak resident memory {m['peak_bytes'] / 2**30:.2f} GiB "
                  f"({m['added_bytes'] / 2**30:.2f} GiB above the loaded model)."]
    if result.get("first"):
        f = result["first"]
        lines += ["", f"First call in a fresh process (run {result.get('first_run', '')}; `--first-only`): the model "
                  f"loaded ({f['load_seconds']:.1f} s, outside the calls), then three calls of each kind on "
                  f"{FIRST_PROMPT[0]!r} (head granularity, pruned; the corrupted prompt {FIRST_PROMPT[1]!r}).", "",
                  "| call | first (s) | second (s) | third (s) | first ÷ warm |", "|---|---:|---:|---:|---:|"]
        for kind in ("attribute_graph", "attribute_graph with corrupted_inputs"):
            t = f[kind]
            lines.append(f"| {kind} | {t[0]:.2f} | {t[1]:.2f} | {t[2]:.2f} | {t[0] / min(t[1:]):.2f}× |")
    if result.get("scaling"):
        lines += scaling_markdown(result["scaling"])
    return "\n".join(lines) + "\n"


def _threads(result: dict) -> str:
    threads = result.get("threads", 1)
    return "1 thread" if threads == 1 else f"{threads} threads"


def scaling_rows(sizes: str, threads: int) -> dict:
    """The long-input table's rows: per n, the input-gradient pass and the graph, each in a
    process of its own."""
    rows = {}
    for n in sizes.split(","):
        row = {}
        for method in (BASELINE, "graph"):
            out = subprocess.run([sys.executable, __file__, "--scaling-child", n, method, "--threads", str(threads)],
                                 capture_output=True, text=True, check=True)
            row[method] = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(row[method]), flush=True)
        rows[n] = row
    return rows


def added(found: dict, key: str, quick: bool) -> int:
    """``found`` added to the saved results under ``key`` (with its run's time), the report
    printed and (unless ``quick``) both files written again."""
    here = Path(__file__).parent
    saved = here / "GRAPHS.json"
    result = json.loads(saved.read_text(encoding="utf-8"))
    result[key] = found
    result[f"{key}_run"] = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M")
    text = markdown(result)
    print(text)
    if not quick:
        saved.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        (here / "GRAPHS.md").write_text(text, encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="128,512")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--memory", type=int, default=32, help="n for the unpruned graph's memory (0: skip)")
    parser.add_argument("--alone", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="n = 32, one repeat, no files")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--first-only", action="store_true",
                        help="measure the first graph call of a fresh process only; keep the other results")
    parser.add_argument("--first-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scaling", default=None, help="sizes of the long-input table (e.g. 512,1024,2048)")
    parser.add_argument("--scaling-child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.alone is not None:
        alone(args.alone)
        return 0
    if args.first_child:
        first_calls()
        return 0
    if args.scaling_child:
        scaling_child(int(args.scaling_child[0]), args.scaling_child[1])
        return 0
    here = Path(__file__).parent
    if args.scaling:
        return added(scaling_rows(args.scaling, args.threads), "scaling", args.quick)
    if args.first_only:
        out = subprocess.run([sys.executable, __file__, "--first-child", "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True)
        return added(json.loads(out.stdout.strip().splitlines()[-1]), "first", args.quick)
    sizes = [32] if args.quick else [int(s) for s in args.sizes.split(",")]
    model, nd = load()
    result = {"run": datetime.datetime.now().strftime("%Y-%m-%dT%H:%M"), "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(), "repeat": 1 if args.quick else args.repeat,
              "threads": args.threads, "rows": [], "facts": {}}
    for n in sizes:
        rows, facts = timings(model, nd, n, result["repeat"])
        result["rows"] += rows
        result["facts"][str(n)] = facts
        for row in rows:
            print(f"n={n} {row['method']}: {row['seconds']:.2f} s ({row['ratio_to_input_gradient']:.2f}× {BASELINE})",
                  flush=True)
    if args.memory and not args.quick:
        out = subprocess.run([sys.executable, __file__, "--alone", str(args.memory), "--threads", str(args.threads)],
                             capture_output=True,
                             text=True, check=True)
        result["memory"] = json.loads(out.stdout.strip().splitlines()[-1])
    if args.quick:
        print(markdown(result))
        return 0
    (here / "GRAPHS.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (here / "GRAPHS.md").write_text(markdown(result), encoding="utf-8")
    print(here / "GRAPHS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
