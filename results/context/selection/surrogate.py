"""Data for choosing a surrogate fitted from our scores (run before any held-out use, on the
18 kept questions that ``run.py --per-kind 12`` does not evaluate; see ``README.md`` here).

For each question it stores: our two scores (``context_attribution`` by ``"decomposition"``
and ``"presence"``, the answer's log-probability explained), the answer's log-probability on
ContextCite's first 32 ablations (``context_cite.utils._create_mask``, seeds 0…31, p = 0.5: the first
``m`` are a ``m``-ablation ContextCiter's) and on the LDS's 32 ablations (seed 1000 + the
document's index, as ``run.py``). ``surrogate_choice.py`` fits and measures from them.

Run from the repository root in the environment of ``run.py`` (``context-cite`` importable)::

    python results/context/selection/surrogate.py     # writes surrogate.json here (about 25 min on two free cores)
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import run as R  # noqa: E402
from metrics import AnswerScorer, chat_template, random_masks  # noqa: E402

from captum_ffb import NormDecomposition  # noqa: E402
from captum_ffb.explained.models import load_model, smollm2_dir  # noqa: E402
from captum_ffb.long_context.attribution import split_context  # noqa: E402

ABLATIONS = 32
LDS_MASKS = 32


def main() -> None:
    from context_cite.utils import _create_mask

    torch.set_num_threads(2)
    loaded = load_model(smollm2_dir(required=True), show_progress=False)
    model, tokenizer = loaded.model, loaded.tokenizer
    template = chat_template(tokenizer)
    nd = NormDecomposition(model)
    env = dict(tokenizer=tokenizer, template=template, scorer=AnswerScorer(model), nd=nd)
    counter = R.Counter(model)
    data = json.loads((HERE.parent / "questions.json").read_text())
    evaluated = {q["id"] for q in R.select(data["questions"], 12)}
    chosen = [q for q in data["questions"] if q["kept"] and q["id"] not in evaluated]
    out_path = HERE / "surrogate.json"
    out = json.loads(out_path.read_text()) if out_path.exists() else {}
    for index, doc in enumerate(data["documents"]):
        rows = []
        for q in chosen:
            if q["doc"] != doc["id"] or q["id"] in out:
                continue
            prompt_ids = tokenizer(template.replace("{context}", doc["text"]).replace("{question}", q["question"])
                                   + q["lead"]).input_ids
            rows.append(dict(q=q, prompt_ids=prompt_ids, answer_ids=nd.engine.token_ids(tokenizer, q["answer"])))
        if not rows:
            continue
        spans = split_context(doc["text"], "sentence")
        tic = time.perf_counter()
        for row in rows:
            row["ours"] = {method: R.run_ours(nd, tokenizer, row["q"], doc["text"], template, counter, method)
                           for method in ("decomposition", "presence")}
            row["log_prob"] = env["scorer"].log_prob(row["prompt_ids"], row["answer_ids"])
        fit_masks = np.stack([_create_mask(len(spans), 0.5, seed) for seed in range(ABLATIONS)])
        lds_masks = random_masks(len(spans), LDS_MASKS, seed=1000 + index)
        fit_values = R.ablation_values(env, doc, spans, rows, fit_masks)
        lds_values = R.ablation_values(env, doc, spans, rows, lds_masks)
        for row, fitted, held in zip(rows, fit_values, lds_values):
            q = row["q"]
            out[q["id"]] = dict(doc=doc["id"], doc_index=index, kind=q["kind"], sources=len(spans),
                                answer_tokens=len(row["answer_ids"]), log_prob=row["log_prob"],
                                scores={m: r["scores"] for m, r in row["ours"].items()},
                                seconds={m: r["seconds"] for m, r in row["ours"].items()},
                                fit_masks=fit_masks.astype(int).tolist(), fit_values=fitted,
                                lds_values=held)
        out_path.write_text(json.dumps(out))
        print(f"{doc['id']}: {len(rows)} questions, {time.perf_counter() - tic:.0f}s", flush=True)


if __name__ == "__main__":
    main()
