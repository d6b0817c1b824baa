"""Rebuild the committed evidence results: ``python results/evidence/run.py [selection|heldout] [--gim]``.

SmolLM2-135M-Instruct explains ``logit(good) − logit(bad)`` on the bundled annotated evidence
(:mod:`captum_ffb.evaluation.evidence`): the **selection** part (rows at multiples of 5, 100
per subset, the copy task with 10 sequences per length) is what the default was chosen on; the
**held-out** part (200 other rows per subset, 20 copy sequences per length) is what is reported.
Each run resumes from its shards in ``<split>/run/``. ``attnlrp`` is the real lxt 2.1 in its own
environment (``bash captum_ffb/evaluation/peers/setup_lxt.sh``); it is left out when that
environment is missing. ``--gim`` runs GIM (added after the main run) beside the default, gradient ×
input and recency on the same pairs into ``gim/<split>/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from captum_ffb.evaluation.evidence import evaluate_evidence
from captum_ffb.evaluation.peers import attnlrp_available
from captum_ffb.explained.models import smollm2_dir

HERE = Path(__file__).resolve().parent
#: every rule × reference the default was chosen among, the peers and the controls
METHODS = ("decomposition,decomposition_frozen,decomposition_frozen_mean,"
           "decomposition_lrp_attention,decomposition_lrp_attention_mean,decomposition_lrp_attention_centered,"
           "decomposition_complete_lrp_attention,decomposition_complete_lrp_attention_mean,"
           "decomposition_complete_lrp_attention_centered,decomposition_ig_attention,"
           "decomposition_ig_attention_centered,decomposition_attnlrp_rules,attnlrp,integrated_gradients,"
           "input_x_gradient,attention_last,rollout,recency,previous_token,first_token,random")
#: GIM (Edin et al. 2025) beside the default, its closest peer and the position control
GIM_METHODS = "decomposition,gim,input_x_gradient,recency"
SPLITS = {"selection": dict(n=100, copy=10), "heldout": dict(n=200, copy=20)}
OPTIONS = {"decomposition_ig_attention": {"n_steps": 4, "exact": True},
           "integrated_gradients": {"n_steps": 32}}


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    gim = "--gim" in argv
    methods = METHODS if attnlrp_available() else METHODS.replace("attnlrp,integrated", "integrated")
    methods = GIM_METHODS if gim else methods
    for split in [a for a in argv if a != "--gim"] or list(SPLITS):
        out = HERE / "gim" / split if gim else HERE / split
        summary = evaluate_evidence(str(smollm2_dir(required=True)), None, methods, out, split=split,
                                    batch_size=16, options=OPTIONS, **SPLITS[split])
        print(f"== {split}: {summary['n']} pairs", flush=True)
        print((out / "results.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
