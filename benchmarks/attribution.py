"""Benchmark of whole-model attribution: ratios measured in one run, written to a file.

Run from the repository root::

    python benchmarks/attribution.py            # writes benchmarks/ATTRIBUTION.md and .json
    python benchmarks/attribution.py --quick    # small sizes, a smoke test

It measures, on this machine and in one run:

1. SmolLM2-135M-Instruct, next-token attribution (``NormDecomposition``, backward route) at
   n = 128, 512, 2048 against the input-gradient pass (``benchmarks/baseline.py``: the
   gradient of the explained logit with respect to the input embeddings, no parameter
   gradient; what Captum's ``Saliency`` or ``InputXGradient`` costs), against Captum's
   ``LayerIntegratedGradients`` (50 steps, on the embedding layer) and against AttnLRP from
   the real ``lxt`` package (its own environment; skipped with a note when absent), all on the
   same inputs; peak memory of each size in a fresh process;
2. 32 generated tokens: ``LLMNormAttribution`` (every step from one forward pass) against
   Captum's ``LLMGradientAttribution`` (one gradient pass per step);
3. whole-model token-to-token maps of all-MiniLM-L6-v2 at n = 128 against 6 × the cost of one
   layer's decomposition.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.baseline import NAME as BASELINE  # noqa: E402
from benchmarks.baseline import input_gradient_pass  # noqa: E402


def best_time(fn: Callable[[], object], repeat: int = 3, warm: bool = True) -> float:
    """Best wall time of ``repeat`` calls (after one warm-up call)."""
    if warm:
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def load_smollm2():
    from captum_ffb.explained.models import load_model, smollm2_dir

    return load_model(smollm2_dir(required=True), causal_lm=True, show_progress=False)


def random_ids(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (1, n), generator=generator)


def _peak_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --------------------------------------------------------------------------- 1. next token
def next_token(n: int, ig: bool, repeat: int) -> dict:
    """Ours, the input-gradient pass, and Captum's LayerIntegratedGradients at one n."""
    from captum.attr import LayerIntegratedGradients

    from captum_ffb import NormDecomposition
    from captum_ffb.explain import first_token_share

    loaded = load_smollm2()
    model = loaded.model
    ids = random_ids(n, model.config.vocab_size)
    with torch.no_grad():
        token = int(model(ids).logits[0, -1].argmax())
    nd = NormDecomposition(model)

    def ours():  # the contributions alone (the delta's independent bias costs a forward route)
        return nd.attribute(ids, target=token)

    def base():  # the same target read the same way (only the last position's logits)
        input_gradient_pass(model, ids, token)

    contributions, bias, delta = nd.attribute(ids, target=token, return_bias=True,
                                              return_convergence_delta=True)
    ours_s = base_s = float("inf")
    for _ in range(repeat):  # interleaved: both see the same machine state
        ours_s = min(ours_s, best_time(ours, repeat=1, warm=False))
        base_s = min(base_s, best_time(base, repeat=1, warm=False))
    model.zero_grad(set_to_none=True)
    row = {"n": n, "ours_s": ours_s, "input_gradient_s": base_s,
           "ratio_to_input_gradient": ours_s / base_s,
           "delta": float(delta[0]),
           "first_token_share": float(first_token_share(contributions.detach())[0])}
    if ig:
        lig = LayerIntegratedGradients(lambda x: model(x, logits_to_keep=1).logits[:, -1, token],
                                       model.get_input_embeddings())
        pad = loaded.tokenizer.pad_token_id or 0
        baseline = torch.full_like(ids, pad)

        def integrated():
            # as many interpolation steps per pass as keep one pass near n = 1280 tokens
            return lig.attribute(ids, baselines=baseline, n_steps=50,
                                 internal_batch_size=max(1, 1280 // n))

        row["ig_s"] = best_time(integrated, repeat=1, warm=False)
        row["ig_over_ours"] = row["ig_s"] / ours_s
    return row


def memory_child(n: int) -> dict:
    """In a fresh process: peak RSS of one next-token attribution (model load included)."""
    from captum_ffb import NormDecomposition

    loaded = load_smollm2()
    model = loaded.model
    ids = random_ids(n, model.config.vocab_size)
    with torch.no_grad():
        token = int(model(ids[:, :8]).logits[0, -1].argmax())
    loaded_peak = _peak_bytes()
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    start = time.perf_counter()
    NormDecomposition(model).attribute(ids, target=token)
    return {"n": n, "peak_rss_gb": _peak_bytes() / 2**30, "model_loaded_gb": loaded_peak / 2**30,
            "seconds": time.perf_counter() - start}


def attnlrp(sizes: list[int]) -> dict:
    """AttnLRP (real lxt, its own environment) on the same random inputs."""
    try:
        from captum_ffb.evaluation.peers import attnlrp_available, attnlrp_relevance
    except ImportError:
        return {"note": "the AttnLRP peer is not part of this checkout"}
    if not attnlrp_available():
        return {"note": "no lxt environment: bash captum_ffb/evaluation/peers/setup_lxt.sh"}
    from transformers import AutoConfig  # noqa: F401  (the vocab size below)

    from captum_ffb.explained.models import smollm2_dir

    loaded = load_smollm2()
    vocab = loaded.model.config.vocab_size
    rows = []
    for n in sizes:
        ids = random_ids(n, vocab)
        with torch.no_grad():
            token = int(loaded.model(ids).logits[0, -1].argmax())
        examples = [{"input_ids": ids[0].tolist(), "target_position": n - 1, "target_id": token}]
        _, info = attnlrp_relevance(examples, smollm2_dir(required=True),
                                    threads=torch.get_num_threads(),
                                    timeout=3600)
        rows.append({"n": n, "seconds": float(info["seconds"][0]),
                     "peak_rss_gb": float(info["peak_rss_bytes"][0]) / 2**30,
                     "load_seconds": info["load_seconds"]})
    return {"rows": rows}


# --------------------------------------------------------------------------- 2. generation
def generation(steps: int) -> dict:
    from captum.attr import LayerIntegratedGradients, LLMGradientAttribution, TextTokenInput

    from captum_ffb import NormDecomposition

    try:
        from captum_ffb.attr.llm import LLMNormAttribution
    except ImportError:
        return {"note": "LLMNormAttribution is not part of this checkout"}
    loaded = load_smollm2()
    model, tokenizer = loaded.model, loaded.tokenizer
    prompt = "Write one sentence about the sea and the wind over the harbour:"
    inp = TextTokenInput(prompt, tokenizer)
    with torch.no_grad():
        out = model.generate(tokenizer(prompt, return_tensors="pt").input_ids,
                             max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
    target = out[0, -steps:]
    ours = LLMNormAttribution(NormDecomposition(model), tokenizer)
    captum = LLMGradientAttribution(LayerIntegratedGradients(model, model.get_input_embeddings()),
                                    tokenizer)
    ours_s = best_time(lambda: ours.attribute(inp, target=target), repeat=1)
    captum_s = best_time(lambda: captum.attribute(inp, target=target, n_steps=50), repeat=1,
                         warm=False)
    return {"steps": steps, "ours_s": ours_s, "captum_lig_s": captum_s,
            "speedup": captum_s / ours_s}


# --------------------------------------------------------------------------- 3. maps
def whole_model_maps(n: int) -> dict:
    from captum_ffb import LayerNormDecomposition, NormDecomposition
    from captum_ffb.explained.models import load_model

    loaded = load_model(show_progress=False)
    model = loaded.model
    ids = random_ids(n, model.config.vocab_size)
    nd = NormDecomposition(model)
    layer = LayerNormDecomposition(model, model.encoder.layer[2])
    maps_s = best_time(lambda: nd.maps(ids), repeat=2)
    layer_s = best_time(lambda: layer.attribute(ids), repeat=3)
    blocks = len(model.encoder.layer)
    return {"n": n, "maps_s": maps_s, "layer_s": layer_s, "blocks": blocks,
            "ratio_to_blocks_x_layer": maps_s / (blocks * layer_s)}


# --------------------------------------------------------------------------- report
def _fmt(value: object, digits: int = 3) -> str:
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def write(results: dict, out: Path) -> None:
    lines = ["# Whole-model attribution benchmark", "",
             f"Measured by `python benchmarks/attribution.py` on {results['date']}: {results['machine']}.",
             ""]
    lines += ["## SmolLM2-135M-Instruct, next-token attribution", "",
              f"The {BASELINE}: the gradient of the explained logit with respect to the input "
              "embeddings, no parameter gradient (`benchmarks/baseline.py`; what Captum's `Saliency` "
              "or `InputXGradient` costs).", "",
              f"| n | ours (s) | {BASELINE} (s) | × {BASELINE} | Captum LIG, 50 steps (s) | LIG / ours | delta | first-token share |",
              "|---|---|---|---|---|---|---|---|"]
    for row in results["next_token"]:
        lines.append(f"| {row['n']} | {_fmt(row['ours_s'])} | {_fmt(row['input_gradient_s'])} | "
                     f"{_fmt(row['ratio_to_input_gradient'])} | {_fmt(row.get('ig_s', '—'))} | "
                     f"{_fmt(row.get('ig_over_ours', '—'))} | {row['delta']:.1e} | "
                     f"{row['first_token_share']:.2f} |")
    lines += ["", "Peak memory, each size in a fresh process (the loaded model included):", "",
              "| n | peak RSS (GB) | after loading the model (GB) | seconds |", "|---|---|---|---|"]
    for row in results["memory"]:
        lines.append(f"| {row['n']} | {row['peak_rss_gb']:.2f} | {row['model_loaded_gb']:.2f} | "
                     f"{row['seconds']:.1f} |")
    peer = results["attnlrp"]
    lines += ["", "AttnLRP (`lxt` 2.1 in its own environment, transformers 4.53, eager attention; "
              "same inputs and target; seconds per example without loading; its process's peak "
              "memory, model included):", ""]
    if "rows" in peer:
        ours = {row["n"]: row["ours_s"] for row in results["next_token"]}
        lines += ["| n | AttnLRP (s) | AttnLRP / ours | AttnLRP peak RSS (GB) |", "|---|---|---|---|"]
        for row in peer["rows"]:
            lines.append(f"| {row['n']} | {_fmt(row['seconds'])} | "
                         f"{_fmt(row['seconds'] / ours[row['n']])} | {row['peak_rss_gb']:.2f} |")
    else:
        lines.append(peer["note"])
    gen = results["generation"]
    lines += ["", "## Generation", ""]
    if "note" in gen:
        lines.append(gen["note"])
    else:
        lines.append(f"{gen['steps']} generated tokens: ours {gen['ours_s']:.1f} s, Captum "
                     f"LLMGradientAttribution (LayerIntegratedGradients, 50 steps) "
                     f"{gen['captum_lig_s']:.1f} s: **{gen['speedup']:.1f}×**.")
    maps = results["maps"]
    lines += ["", "## Whole-model maps, all-MiniLM-L6-v2", "",
              f"n = {maps['n']}: all {maps['blocks']} blocks' maps {maps['maps_s']:.2f} s; one "
              f"layer's decomposition {maps['layer_s']:.2f} s; ratio to {maps['blocks']} × the "
              f"layer: **{maps['ratio_to_blocks_x_layer']:.2f}**.", ""]
    out.write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--only-attnlrp", action="store_true",
                        help="rerun the AttnLRP part into an existing results file")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "ATTRIBUTION.md"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.memory_child is not None:
        print(json.dumps(memory_child(args.memory_child)))
        return 0
    sizes = [32, 64] if args.quick else [128, 512, 2048]
    if args.only_attnlrp:
        out = Path(args.out)
        results = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
        if any("input_gradient_s" not in row for row in results["next_token"]):
            raise SystemExit(f"{out.with_suffix('.json')} was measured against the old baseline "
                             f"(forward + backward, every parameter's gradient), not the {BASELINE}: "
                             "rerun `python benchmarks/attribution.py` in full first")
        results["attnlrp"] = attnlrp(sizes)
        out.with_suffix(".json").write_text(json.dumps(results, indent=2), encoding="utf-8")
        write(results, out)
        return 0
    results: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores ({platform.machine()}, {torch.get_num_threads()} torch "
                   f"threads), Python {platform.python_version()}, torch {torch.__version__}, "
                   + ("GPU" if torch.cuda.is_available() else "no GPU"),
    }
    started = time.perf_counter()
    results["next_token"] = []
    for n in sizes:
        results["next_token"].append(next_token(n, ig=True, repeat=2 if n >= 2048 else 3))
        print("next token", results["next_token"][-1], flush=True)
    results["memory"] = []
    for n in sizes:
        child = subprocess.run([sys.executable, __file__, "--memory-child", str(n)],
                               capture_output=True, text=True, check=True, cwd=ROOT)
        results["memory"].append(json.loads(child.stdout.strip().splitlines()[-1]))
    print("memory", results["memory"], flush=True)
    results["attnlrp"] = attnlrp(sizes)
    print("attnlrp", results["attnlrp"], flush=True)
    results["generation"] = generation(4 if args.quick else 32)
    print("generation", results["generation"], flush=True)
    results["maps"] = whole_model_maps(32 if args.quick else 128)
    print("maps", results["maps"], flush=True)
    results["seconds"] = time.perf_counter() - started
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    write(results, out)
    print(f"wrote {out} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
