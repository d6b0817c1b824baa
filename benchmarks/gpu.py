r"""The GPU check in one command: the gpu-marked tests, then what attribution costs on the GPU.

For each model shape (random weights of a real model's shape: SmolLM2-135M in float32,
Llama-3.2-1B and Llama-3.1-8B in bfloat16) and input length, in one run on one card:

* the **input-gradient pass** (the denominator of every cost here): the gradient of the
  explained logit with respect to the input embeddings, no parameter gradient
  (``torch.autograd.grad(logit, inputs_embeds)``, what Gradient × Input costs);
* ``NormDecomposition.attribute`` (the default: the backward route, the centred reference);
* the pruned head graph (``attribute_graph``, head granularity, circuit-tracer's pruning) at
  the graph lengths;

each the median of ``--repeat`` calls after one warm-up call at that length, with its peak
memory (``torch.cuda.max_memory_allocated``, the weights included). A call that runs out of
memory is reported as such, and the run goes on. The results go to ``benchmarks/GPU.md`` and
``GPU.json`` (``--out``).

Usage (a lent GPU machine; one call, under 8 minutes on an H100 with the defaults)::

    python benchmarks/gpu.py                       # pytest -m gpu, then the table
    python benchmarks/gpu.py --skip-tests --shapes 1b --lengths 2048,8192
    python benchmarks/gpu.py --dry-run             # tiny shapes on the cpu: the script itself

The lent machines have torch and transformers but no Captum: carry its wheel (and the
package's other missing requirements) as the device tool's notes say, and put this checkout
on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.baseline import input_gradient_pass  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """A model shape (Llama family, random weights)."""

    name: str
    dtype: torch.dtype
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    lengths: tuple[int, ...]
    graph_lengths: tuple[int, ...]

    def config(self, longest: int) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, vocab_size=self.vocab,
                           max_position_embeddings=max(longest, 2048), rope_theta=500000.0,
                           tie_word_embeddings=self.vocab < 100_000, attn_implementation="sdpa")


SHAPES = {
    "smollm2": Shape("SmolLM2-135M", torch.float32, 576, 1536, 30, 9, 3, 49152, (2048, 8192, 32768), (1024, 4096)),
    "1b": Shape("Llama-3.2-1B", torch.bfloat16, 2048, 8192, 16, 32, 8, 128256, (2048, 8192, 32768), (1024, 4096)),
    "8b": Shape("Llama-3.1-8B", torch.bfloat16, 4096, 14336, 32, 32, 8, 128256, (2048, 8192, 16384), (1024, 4096)),
}
#: Tiny shapes for a dry run on the cpu (the script's own check).
DRY = {
    "smollm2": Shape("tiny (float32)", torch.float32, 32, 48, 2, 4, 2, 64, (16, 32), (8,)),
    "1b": Shape("tiny (bfloat16)", torch.bfloat16, 32, 48, 2, 4, 2, 64, (16, 32), (8,)),
}


def build(shape: Shape, device: torch.device, longest: int) -> torch.nn.Module:
    """A model of ``shape`` with random weights, made on ``device`` in its dtype."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(shape.dtype)  # initialised in its dtype: an 8B model in float32 would not fit
    try:
        with torch.device(device):
            model = LlamaForCausalLM(shape.config(longest))
    finally:
        torch.set_default_dtype(before)
    return model.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(call: Any, device: torch.device, repeat: int) -> dict[str, Any]:
    """Seconds (median of ``repeat`` after a warm-up) and peak memory (GiB) of ``call()``."""
    try:
        call()  # warm-up at this length
        _sync(device)
        seconds = []
        peak = 0.0
        for _ in range(repeat):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            start = time.perf_counter()
            call()
            _sync(device)
            seconds.append(time.perf_counter() - start)
            if device.type == "cuda":
                peak = max(peak, torch.cuda.max_memory_allocated(device) / 2**30)
        return {"seconds": statistics.median(seconds), "peak_gib": round(peak, 2) if device.type == "cuda" else None}
    except torch.OutOfMemoryError:
        return {"error": "out of memory"}
    except RuntimeError as error:  # a kernel refusing the size, a device error: say so, go on
        return {"error": str(error).splitlines()[0][:160]}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def input_gradient(model: torch.nn.Module, ids: torch.Tensor, target: int) -> None:
    """The denominator of every ratio: :func:`benchmarks.baseline.input_gradient_pass`."""
    input_gradient_pass(model, ids, target)


def run_shape(shape: Shape, device: torch.device, repeat: int, lengths: list[int] | None,
              graph_lengths: list[int] | None) -> list[dict[str, Any]]:
    from captum_ffb import NormDecomposition

    chosen = lengths or list(shape.lengths)
    chosen_graphs = graph_lengths if graph_lengths is not None else list(shape.graph_lengths)
    longest = max([*chosen, *chosen_graphs, 1])
    model = build(shape, device, longest)
    nd = NormDecomposition(model)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    rows = []
    target = 7
    generator = torch.Generator().manual_seed(1)
    for n in sorted(set(chosen) | set(chosen_graphs)):
        ids = torch.randint(10, shape.vocab, (1, n), generator=generator).to(device)
        row: dict[str, Any] = {"model": shape.name, "dtype": str(shape.dtype).replace("torch.", ""), "n": n,
                               "weights_gib": round(weights, 2)}
        row["input_gradient"] = measure(functools.partial(input_gradient, model, ids, target), device, repeat)
        if n in chosen:
            row["attribute"] = measure(functools.partial(nd.attribute, ids, target=target), device, repeat)
        if n in chosen_graphs:
            row["graph"] = measure(functools.partial(nd.attribute_graph, ids, target, granularity="head"), device,
                                   max(1, repeat - 1))
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _cell(found: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    if found is None:
        return "–"
    if "error" in found:
        return found["error"]
    text = f"{found['seconds']:.3f} s"
    if base is not None and "seconds" in base:
        text += f" ({found['seconds'] / base['seconds']:.2f}×)"
    if found.get("peak_gib") is not None:
        text += f", {found['peak_gib']:.1f} GiB"
    return text


def _line(row: dict[str, Any]) -> str:
    base = row["input_gradient"]
    return (f"| {row['model']} | {row['dtype']} | {row['n']} | {_cell(base, None)} | "
            f"{_cell(row.get('attribute'), base)} | {_cell(row.get('graph'), base)} |")


def run_tests(timeout: int) -> dict[str, Any]:
    """``pytest -m gpu``: its summary line and exit code."""
    start = time.perf_counter()
    try:
        found = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                str(ROOT / "tests")], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"summary": f"stopped after {timeout} s", "code": None, "seconds": timeout}
    lines = [line for line in found.stdout.splitlines() if line.strip()]
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return {"summary": lines[-1] if lines else found.stderr[-300:], "code": found.returncode,
            "failures": failures[:20], "seconds": round(time.perf_counter() - start, 1)}


def report(result: dict[str, Any]) -> str:
    lines = [
        "# Attribution on a GPU: costs against the input-gradient pass",
        "",
        f"Run {result['run']} on {result['device']} (torch {result['torch']}, transformers "
        f"{result['transformers']}) by `python benchmarks/gpu.py {' '.join(result['argv'])}`.",
        "",
    ]
    tests = result.get("tests")
    if tests:
        lines += [f"`pytest -m gpu`: {tests['summary']} (exit {tests['code']}, {tests['seconds']} s).", ""]
        lines += [f"- {failure}" for failure in tests.get("failures", [])]
        lines += [""] if tests.get("failures") else []
    lines += [
        "Random weights of each model's shape. Each cell: the median seconds of "
        f"{result['repeat']} calls after a warm-up at that length, the ratio to the input-gradient "
        "pass (the gradient of the explained logit with respect to the input embeddings, no parameter "
        "gradient) and the peak memory, the weights included.",
        "",
        "| model | dtype | n | input-gradient pass | `attribute` | pruned head graph |",
        "|---|---|---:|---|---|---|",
        *(_line(row) for row in result["rows"]),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=None, help="comma list of smollm2, 1b, 8b (default: all)")
    parser.add_argument("--lengths", default=None, help="comma list of n for the input-gradient pass and attribute")
    parser.add_argument("--graph-lengths", default=None, help="comma list of n for the graph ('' for none)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu first")
    parser.add_argument("--test-timeout", type=int, default=150)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the cpu (checks the script)")
    parser.add_argument("--out", default=None, help="the report (default benchmarks/GPU.md; a dry run writes "
                        "none unless given)")
    args = parser.parse_args(argv)
    shapes = DRY if args.dry_run else SHAPES
    names = [s.strip() for s in (args.shapes or ",".join(shapes)).split(",") if s.strip()]
    unknown = [name for name in names if name not in shapes]
    if unknown:
        parser.error(f"unknown shape {unknown[0]!r}; choose from {', '.join(shapes)}")
    lengths = [int(v) for v in args.lengths.split(",")] if args.lengths else None
    graph_lengths = None if args.graph_lengths is None else [int(v) for v in args.graph_lengths.split(",") if v]
    device = torch.device("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    if device.type != "cuda" and not args.dry_run:
        parser.error("no CUDA device here: run it on a GPU machine, or --dry-run")
    import transformers

    result: dict[str, Any] = {
        "run": datetime.datetime.now().strftime("%Y-%m-%dT%H:%M"), "argv": list(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or 'cpu'})",
        "torch": torch.__version__, "transformers": transformers.__version__, "repeat": args.repeat, "rows": [],
    }
    if not args.skip_tests and not args.dry_run:
        result["tests"] = run_tests(args.test_timeout)
        print("pytest -m gpu:", result["tests"]["summary"], flush=True)
    print("| model | dtype | n | input-gradient pass | attribute | pruned head graph |", flush=True)
    for name in names:
        result["rows"] += run_shape(shapes[name], device, args.repeat, lengths, graph_lengths)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the shape's model is gone
    if args.out is None and args.dry_run:
        print(report(result))
        return 0
    out = Path(args.out or HERE / "GPU.md")
    out.write_text(report(result), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
