"""The copy task on SmolLM2: does each attribution find the known answer?

``python results/copy_task/run.py`` writes ``RESULTS.md`` and ``results.json`` here. Random
sequences of 10 distinct tokens, the first 5 repeated (``captum_ffb.evaluation.copy_task``);
the target is the next token of the repeat, ``a_5``. Only sequences SmolLM2 completes
correctly are kept. Deleting the answer's earlier occurrence (``answer``) or the current
token's earlier occurrence (``previous``) is what breaks an induction head; each method's
rank of those two positions, its first-token share and whether the answer is ranked first
are reported.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from captum_ffb.attr import NormDecomposition
from captum_ffb.evaluation.copy_task import copy_task
from captum_ffb.evaluation.perturbation import rank_positions
from captum_ffb.explain import first_token_share
from captum_ffb.explained.models import load_model, smollm2_dir
from captum_ffb.io.files import write_json, write_text
from captum_ffb.rules import Attention, AttnLRPAttention, IGAttention, attnlrp_rules

HERE = Path(__file__).resolve().parent
N_SEQUENCES = 64


def main() -> None:
    loaded = load_model(str(smollm2_dir(required=True)), causal_lm=True)
    model = loaded.model
    # ordinary word pieces only: ids above the byte and special range, below the rare tail
    task = copy_task(20000, n_sequences=N_SEQUENCES, length=10, repeated=5, seed=0,
                     exclude=list(range(0, 300)))
    with torch.no_grad():
        predicted = model(task.input_ids).logits[:, -1].argmax(-1)
    kept = (predicted == task.targets).nonzero().flatten()
    ids, targets = task.input_ids[kept], task.targets[kept]
    answer, previous = task.answer_positions[kept], task.previous_positions[kept]
    nd = NormDecomposition(model)
    variants = {
        "frozen (paper)": ({"attention": Attention()}, "zero"),
        "frozen, mean reference": ({"attention": Attention()}, "mean"),
        "IGAttention": ({"attention": IGAttention()}, "zero"),
        "IGAttention, mean reference": ({"attention": IGAttention()}, "mean"),
        "AttnLRPAttention (the default)": ({"attention": AttnLRPAttention()}, "zero"),
        "AttnLRPAttention, mean reference": ({"attention": AttnLRPAttention()}, "mean"),
        "attnlrp_rules (= lxt)": (attnlrp_rules(model), "zero"),
    }
    rows = []
    for name, (rules, reference) in variants.items():
        start = time.perf_counter()
        c = nd.attribute(ids, target=targets, rules=rules, reference=reference).detach()
        seconds = (time.perf_counter() - start) / len(ids)
        rank = rank_positions(c, torch.zeros_like(c, dtype=torch.bool))[0] + 1  # 1 = most relevant
        rows_ = torch.arange(len(ids))
        answer_rank, previous_rank = rank[rows_, answer].float(), rank[rows_, previous].float()
        share = first_token_share(c)
        rows.append({
            "method": name, "answer_first": float((answer_rank == 1).float().mean()),
            "answer_rank": float(answer_rank.mean()), "previous_rank": float(previous_rank.mean()),
            "both_in_top3": float(((answer_rank <= 3) & (previous_rank <= 3)).float().mean()),
            "first_token_share": float(share.mean()), "seconds": seconds,
        })
        print(rows[-1], flush=True)
    n = ids.shape[1]
    lines = ["# Copy task on SmolLM2-135M-Instruct", "",
             f"{len(ids)} of {N_SEQUENCES} random sequences completed correctly by the model "
             f"({n} tokens: 10 distinct random tokens, then the first 5 again); target: the next "
             "token of the repeat. Ranks count from 1 (most relevant) among all positions; seconds "
             "measured on 2 CPU cores shared with another run (rough).", "",
             "| method | answer ranked first | mean rank of the answer | mean rank of the "
             "current token's earlier occurrence | both in the top 3 | first-token share | "
             "s / sequence |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['answer_first']:.2f} | {r['answer_rank']:.1f} | "
                     f"{r['previous_rank']:.1f} | {r['both_in_top3']:.2f} | "
                     f"{r['first_token_share']:.3f} | {r['seconds']:.3f} |")
    write_text(HERE / "RESULTS.md", "\n".join(lines) + "\n")
    write_json(HERE / "results.json", {"kept": len(ids), "of": N_SEQUENCES, "rows": rows}, indent=1)


if __name__ == "__main__":
    main()
