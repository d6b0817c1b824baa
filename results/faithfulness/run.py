"""Rebuild the committed faithfulness results: ``python results/faithfulness/run.py [TASK ...]``.

TASK is ``minilm-sentiment``, ``smollm2-next-token``, ``smollm2-sentiment`` (the 0.2 runs:
``decomposition`` there is ``AttnLRPAttention`` from zero), ``smollm2-next-token-0.3`` (the 0.3
default and the position controls on the same snippets), ``smollm2-next-token-gim`` (GIM beside
the default, input × gradient and recency on the same snippets) or ``smollm2-next-token-schemes``
(ERASER under each removal scheme, the methods' Kendall τ between schemes; 100 snippets)
(default: all, in that order). Each run resumes from its shards in ``<task>/run/``. Every setting is
here; the same runs through the command line are printed by ``--print-commands``.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from captum_ffb.evaluation.evaluate import evaluate
from captum_ffb.evaluation.methods import option_items
from captum_ffb.explained.models import smollm2_dir

HERE = Path(__file__).resolve().parent
N = 300
MAX_TOKENS = 24  # SmolLM2 tasks: snippets of at most 24 tokens (1,336 of the 2,550 held out)

#: the default (``decomposition``: AttnLRPAttention, players from zero) and every other
#: attention rule × reference (``decomposition_lrp_attention`` is the default itself)
RULE_VARIANTS = ("decomposition,decomposition_frozen,decomposition_frozen_mean,"
                 "decomposition_ig_attention,decomposition_ig_attention_mean,"
                 "decomposition_lrp_attention_mean,decomposition_attnlrp_rules")

#: Each run repeats the rule variants and the baselines they are compared with most; the
#: other methods of the 2026-11-22 run (same snippets and protocols, unchanged code paths)
#: are kept in ``<task>/earlier-2026-11-22.csv`` and shown marked in the README by
#: ``tables.py``. Add them to ``methods`` to rerun them too.
RUNS = {
    "minilm-sentiment": dict(
        model=None, task="sentiment", max_tokens=None,
        methods=f"{RULE_VARIANTS},decomposition_no_ff,decomposition_linearised,attention_last,"
                "attention_mean,rollout,norm_rollout,saliency,input_x_gradient,integrated_gradients,"
                "random",
        options={"integrated_gradients": {"n_steps": 50}},
    ),
    "smollm2-next-token": dict(
        model="smollm2", task="next-token", max_tokens=MAX_TOKENS,
        methods=f"{RULE_VARIANTS},attention_last,integrated_gradients,attnlrp,random",
        options={"integrated_gradients": {"n_steps": 20}},
    ),
    "smollm2-sentiment": dict(
        model="smollm2", task="sentiment", max_tokens=MAX_TOKENS,
        methods=f"{RULE_VARIANTS},integrated_gradients,attnlrp,random",
        options={"integrated_gradients": {"n_steps": 20}},
    ),
    "smollm2-next-token-0.3": dict(
        model="smollm2", task="next-token", max_tokens=MAX_TOKENS,
        methods="decomposition,decomposition_complete_lrp_attention_centered,recency,previous_token,first_token",
        options={},
    ),
    "smollm2-next-token-gim": dict(
        model="smollm2", task="next-token", max_tokens=MAX_TOKENS,
        methods="decomposition,gim,input_x_gradient,recency",
        options={},
    ),
    "smollm2-next-token-schemes": dict(
        model="smollm2", task="next-token", max_tokens=MAX_TOKENS, n=100, protocols="schemes",
        methods="decomposition,decomposition_lrp_attention,decomposition_frozen,integrated_gradients,"
                "input_x_gradient,attention_last,recency,previous_token,first_token,random",
        options={"integrated_gradients": {"n_steps": 20}},
    ),
}


def command(name: str) -> str:
    """The ``captum-ffb evaluate`` line of a run."""
    run = RUNS[name]
    model = "" if run["model"] is None else " --model $SMOL"
    parts = [f"captum-ffb evaluate --task {run['task']}{model} --data rotten_tomatoes --n {run.get('n', N)}",
             f"--methods {run['methods']}", f"--protocol {run.get('protocols', 'all')}",
             f"--out results/faithfulness/{name}"]
    if run["max_tokens"]:
        parts.append(f"--max-tokens {run['max_tokens']}")
    parts += [f"--option {shlex.quote(item)}" for item in option_items(run["options"])]
    return " ".join(parts)


def main(argv: list[str]) -> int:
    if "--print-commands" in argv:
        for name in RUNS:
            print(command(name))
        return 0
    for name in argv or list(RUNS):
        run = dict(RUNS[name])
        if run["model"] == "smollm2":
            run["model"] = str(smollm2_dir(required=True))
        print(f"== {name}", flush=True)
        run.setdefault("n", N)
        run.setdefault("protocols", "all")
        evaluate(data="rotten_tomatoes", out=HERE / name, batch_size=16, **run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
