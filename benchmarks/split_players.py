"""One long sequence across workers, on SmolLM2-135M-Instruct: the players split into parts.

Run from the repository root (needs Ray and SmolLM2)::

    python benchmarks/split_players.py            # writes benchmarks/SPLIT_PLAYERS.md

1. n = 256: every player, in 4 parts on 2 Ray workers; the sum against the backward route.
2. n = 4096: the backward route for every position (time, peak memory), then two parts of a
   few players each on 2 Ray workers (forward route, one block at a time); those players'
   contributions against the backward route's, and the time per part. All 4096 players by
   the forward route would cost about n / (players per part) such parts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from benchmarks.attribution import random_ids
    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import smollm2_dir
    from captum_ffb.jobs import ModelSource, attribute_split

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", type=int, default=4096)
    parser.add_argument("--short", type=int, default=256)
    parser.add_argument("--players", type=int, default=4, help="players per part at --long")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "SPLIT_PLAYERS.md"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    source = ModelSource(str(smollm2_dir(required=True)), causal_lm=True)
    loaded = source.load()
    model = loaded.model
    nd = NormDecomposition(model)
    rows = {}
    work = Path(tempfile.mkdtemp(prefix="split_players_"))

    # 1. every player at a short length
    ids = random_ids(args.short, model.config.vocab_size, seed=1)
    with torch.no_grad():
        token = int(model(ids).logits[0, -1].argmax())
    backward = nd.attribute(ids, target=token)
    with torch.no_grad():
        real = model(ids).logits[0, -1, token]
    start = time.perf_counter()
    split, bias = attribute_split(source, ids, token, parts=4, out=work / "short", backend="ray",
                                  backend_options={"workers": 2}, show_progress=False)
    rows["short"] = {
        "n": args.short, "parts": 4, "workers": 2, "seconds": time.perf_counter() - start,
        "max_relative_difference": float((split - backward).abs().max() / backward.abs().max()),
        "completeness": float((split.sum() + bias - real).abs()),
    }
    print(json.dumps(rows["short"]), flush=True)

    # 2. the long sequence: backward for all, forward for two small parts
    ids = random_ids(args.long, model.config.vocab_size, seed=2)
    with torch.no_grad():
        token = int(model(ids).logits[0, -1].argmax())
    start = time.perf_counter()
    backward = nd.attribute(ids, target=token)
    backward_s = time.perf_counter() - start
    chosen = [0, 1, args.long // 2, args.long // 2 + 1, args.long - 2, args.long - 1]
    chosen = sorted(set(chosen))[: 2 * args.players]
    start = time.perf_counter()
    split, _ = attribute_split(source, ids, token, parts=2, out=work / "long", backend="ray",
                               backend_options={"workers": 2}, players=chosen, show_progress=False)
    split_s = time.perf_counter() - start
    scale = float(backward.abs().max())
    rows["long"] = {
        "n": args.long, "players": chosen, "parts": 2, "workers": 2,
        "backward_all_players_s": backward_s, "forward_two_parts_s": split_s,
        "max_difference_over_max_contribution": float((split[0, chosen] - backward[0, chosen]).abs().max()
                                                       / scale),
        "parts_for_every_player": args.long // max(1, len(chosen) // 2),
    }
    print(json.dumps(rows["long"]), flush=True)
    short, long = rows["short"], rows["long"]
    lines = [
        "# One sequence across workers (SmolLM2-135M-Instruct, Ray, 2 local workers)", "",
        f"- n = {short['n']}: all players in {short['parts']} parts on {short['workers']} "
        f"workers, {short['seconds']:.0f} s; the sum against the backward route: largest "
        f"relative difference {short['max_relative_difference']:.1e}; Σ + bias against the "
        f"real logit: {short['completeness']:.1e}.",
        f"- n = {long['n']}: the backward route gives every position in "
        f"{long['backward_all_players_s']:.0f} s. The forward route for players "
        f"{long['players']} in {long['parts']} parts on {long['workers']} workers took "
        f"{long['forward_two_parts_s']:.0f} s; against the backward route: largest difference "
        f"{long['max_difference_over_max_contribution']:.1e} of the largest contribution. Every "
        f"player would take about {long['parts_for_every_player']} such parts.", "",
    ]
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
