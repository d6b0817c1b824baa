"""The choice of the fitted surrogate's settings, from ``surrogate.json`` (``surrogate.py``):
the LDS of every candidate over the 18 selection questions, then the top-k drops of the best
candidates (forward passes of the model) beside ContextCite's fits on the same ablations.

Candidates: ``cc-m`` (ContextCite's solver on the first ``m`` of its ablations, its target the
logit of the answer's probability); ``ours`` and ``ours-presence`` (the scores alone);
``fit-m-<prior>`` (:func:`captum_ffb.long_context.surrogate.fit_surrogate`: the log-probability
on the first ``m`` ablations fitted as ``b + M (c·s + δ)``, ``s`` the prior's scores, ``δ``
ridge-penalised with the penalty chosen by generalised cross-validation).

Run from the repository root in the environment of ``run.py``::

    python results/context/selection/surrogate_choice.py   # writes surrogate_choice.json and prints the tables
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import run as R  # noqa: E402
from metrics import (  # noqa: E402
    AnswerScorer,
    chat_template,
    lds,
    logit_of_log_prob,
    mean_se,
    random_masks,
    top_k_keep,
)

from captum_ffb.long_context.surrogate import fit_surrogate  # noqa: E402

SIZES = (4, 8, 12, 16, 24, 32)
PRIORS = {"ours": "decomposition", "ours-presence": "presence"}


def candidates(row: dict) -> dict[str, np.ndarray]:
    from context_cite.solver import LassoRegression

    masks = np.asarray(row["fit_masks"], dtype=bool)
    values = np.asarray(row["fit_values"])
    found = {name: np.asarray(row["scores"][method]) for name, method in PRIORS.items()}
    found["recency"] = np.arange(row["sources"], dtype=float)
    for m in SIZES:
        logits = np.asarray([logit_of_log_prob(v) for v in values[:m]], dtype=np.float32)
        found[f"cc-{m}"] = LassoRegression().fit(masks[:m], logits, row["answer_tokens"])[0]
        for name, method in PRIORS.items():
            found[f"fit-{m}-{name}"] = fit_surrogate(masks[:m], values[:m], row["scores"][method]).scores.numpy()
        found[f"fit-{m}-none"] = fit_surrogate(masks[:m], values[:m], None).scores.numpy()
    return found


def main() -> None:
    data = json.loads((HERE / "surrogate.json").read_text())
    table: dict[str, list[float]] = {}
    scored = {}
    for qid, row in data.items():
        masks = random_masks(row["sources"], 32, seed=1000 + row["doc_index"])
        scored[qid] = candidates(row)
        for name, scores in scored[qid].items():
            table.setdefault(name, []).append(lds(scores, masks, row["lds_values"]))
    print("| candidate | LDS |")
    for name, values in table.items():
        mean, se, n = mean_se(values)
        print(f"| {name} | {mean:.3f} ± {se:.3f} (n={n}) |")
    shortlist = [n for n in table if n in ("ours", "ours-presence", "recency", "cc-16", "cc-32")
                 or (n.startswith("fit-") and int(n.split("-")[1]) in (8, 16, 32) and not n.endswith("none"))]
    drops = measure_drops(data, scored, shortlist)
    print("| candidate | LDS | drop@1 | drop@3 | drop@5 |")
    for name in shortlist:
        cells = [mean_se(table[name])] + [mean_se([drops[q][name][k] for q in drops]) for k in R.KS]
        print(f"| {name} | " + " | ".join(f"{m:.3f} ± {s:.3f}" for m, s, _ in cells) + " |")
    (HERE / "surrogate_choice.json").write_text(json.dumps(dict(lds=table, drops=drops), indent=1))


def load_study() -> tuple:
    """SmolLM2 for the studies here (two threads): its tokenizer, the chat template, an answer
    scorer, the decomposition's engine (for the answers' token ids), and the question set's
    questions and documents by id."""
    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir

    torch.set_num_threads(2)
    loaded = load_model(smollm2_dir(required=True), show_progress=False)
    data = json.loads((HERE.parent / "questions.json").read_text())
    return (loaded.tokenizer, chat_template(loaded.tokenizer), AnswerScorer(loaded.model),
            NormDecomposition(loaded.model).engine, {q["id"]: q for q in data["questions"]},
            {d["id"]: d for d in data["documents"]})


def measure_drops(data: dict, scored: dict, names: list[str]) -> dict:
    from captum_ffb.long_context.attribution import split_context

    tokenizer, template, scorer, engine, questions, documents = load_study()
    out = {}
    for qid, row in data.items():
        q, doc = questions[qid], documents[row["doc"]]
        spans = split_context(doc["text"], "sentence")
        answer = engine.token_ids(tokenizer, q["answer"])
        seen: dict[bytes, float] = {}
        out[qid] = {}
        for name in names:
            out[qid][name] = {}
            for k in R.KS:
                keep = top_k_keep(scored[qid][name], min(k, len(spans)))
                if keep.tobytes() not in seen:
                    ids = R.masked_ids(tokenizer, template, doc["text"], spans, keep, q)
                    seen[keep.tobytes()] = scorer.log_prob(ids, answer)
                out[qid][name][k] = row["log_prob"] - seen[keep.tobytes()]
        print(qid, {n: round(out[qid][n][5], 2) for n in names}, flush=True)
    return out


if __name__ == "__main__":
    main()
