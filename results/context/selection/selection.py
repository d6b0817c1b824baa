"""The choice of presence attribution's default number of steps (run before the held-out
evaluation, on the 18 kept questions that ``run.py --per-kind 12`` does not evaluate).

For each question: the LDS over 32 random ablations of its document (seed 1000 + the
document's index, as ``run.py``) and the top-k drops of the gradient of the answer's
log-probability with respect to the sentences' presence at t = 1, ¾, ½, ¼ (every sentence
equally present), and of the two-step midpoint rule (the mean of the gradients at ¼ and ¾);
recency beside. It predates ``captum_ffb.long_context.presence``: the presences ride on
forward pre-hooks of each attention module that add ``log t`` to the mask of eager
attention, the same mask the library builds (at t = 1 the value is the model's own, printed
per question by the probe this file started from). Run from the repository root:
``python results/context/selection/selection.py`` (about 40 minutes on two cores); it writes
``selection.json`` here. ``selection.log`` is the run's output.
"""

import json
import sys
import time

import numpy as np
import torch

sys.path.insert(0, "results/context")
sys.argv = sys.argv[:1]
import run as R  # noqa: E402
from metrics import AnswerScorer, chat_template, lds, random_masks, top_k_keep  # noqa: E402

from captum_ffb.explained.models import load_model, smollm2_dir  # noqa: E402
from captum_ffb.long_context.attribution import split_context  # noqa: E402

torch.set_num_threads(2)
loaded = load_model(smollm2_dir(required=True), show_progress=False)
model, tok = loaded.model, loaded.tokenizer
model.set_attn_implementation("eager")
template = chat_template(tok)
data = json.load(open("results/context/questions.json"))
docs = {d["id"]: (i, d) for i, d in enumerate(data["documents"])}
qs = {q["id"]: q for q in data["questions"]}
STATE = {}


def pre(module, args, kwargs):
    b = STATE.get("bias")
    if b is not None and kwargs.get("attention_mask") is not None:
        kwargs["attention_mask"] = kwargs["attention_mask"] + b
    return args, kwargs


for layer in model.model.layers:
    layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True)


def setup_q(r):
    q = qs[r["id"]]
    di, doc = docs[q["doc"]]
    text = doc["text"]
    spans = split_context(text, "sentence")
    prompt = template.replace("{context}", text).replace("{question}", q["question"]) + q["lead"]
    off = prompt.index(text)
    enc = tok(prompt, return_offsets_mapping=True)
    ids = enc.input_ids
    ans = tok(q["answer"], add_special_tokens=False).input_ids
    group = []
    for a, b in enc.offset_mapping:
        m = (a + b) / 2 - off
        g = -1
        for s, (x, y) in enumerate(spans):
            if x <= m < y:
                g = s
                break
        group.append(g)
    group += [-1] * (len(ans) - 1)
    return q, di, spans, ids, ans, torch.tensor(group)


def grad_at(ids, ans, group, S, t):
    n = len(ids) + len(ans) - 1
    seq = torch.tensor([ids + ans[:-1]])
    lt = torch.full((S,), float(np.log(t)), dtype=torch.float32, requires_grad=True)
    key = torch.where(group >= 0, lt[group.clamp(min=0)], torch.zeros(n))
    same = (group[:, None] == group[None, :]) & (group[:, None] >= 0)
    bias = torch.where(same, torch.zeros(n, n), key[None, :].expand(n, n))
    STATE["bias"] = bias[None, None]
    out = model(seq, logits_to_keep=len(ans))
    lp = torch.log_softmax(out.logits[0].float(), -1)[torch.arange(len(ans)), torch.tensor(ans)].sum()
    lp.backward()
    STATE["bias"] = None
    # d g / d t = d g / d log t / t
    return float(lp), (lt.grad / t).numpy().astype(float)


torch.set_num_threads(2)
evaluated = {q["id"] for q in R.select(data["questions"], 12)}
sel = [q for q in data["questions"] if q["kept"] and q["id"] not in evaluated]
print(len(sel), "selection questions", flush=True)
scorer = AnswerScorer(model)
env = dict(tokenizer=tok, template=template, scorer=scorer)
out = {}
for di, doc in enumerate(data["documents"]):
    rows_q = [q for q in sel if q["doc"] == doc["id"]]
    if not rows_q:
        continue
    spans = split_context(doc["text"], "sentence")
    S = len(spans)
    masks = random_masks(S, 32, seed=1000 + di)
    rows = []
    for q in rows_q:
        r = {"id": q["id"]}
        qq, _, _, ids, ans, group = setup_q(r)
        rows.append(dict(q=q, answer_ids=ans, prompt_ids=ids, group=group))
    vals = R.ablation_values(env, doc, spans, rows, masks)
    for row, v in zip(rows, vals):
        q = row["q"]
        t0 = time.time()
        g = {}
        for t in (0.25, 0.5, 0.75, 1.0):
            lp, g[t] = grad_at(row["prompt_ids"], row["answer_ids"], row["group"], S, t)
        var = {
            "grad1": g[1.0],
            "grad.75": g[0.75],
            "grad.5": g[0.5],
            "grad.25": g[0.25],
            "ig2": (g[0.25] + g[0.75]) / 2,
            "recency": np.arange(S, dtype=float),
        }
        res = {}
        for name, sc in var.items():
            drops = {}
            for k in (1, 3, 5):
                keep = top_k_keep(sc, k)
                drops[k] = lp - scorer.log_prob(
                    R.masked_ids(tok, template, doc["text"], spans, keep, q), row["answer_ids"]
                )
            res[name] = dict(lds=lds(sc, masks, v), drops=drops)
        out[q["id"]] = res
        print(
            q["id"],
            q["kind"],
            f"{time.time() - t0:.0f}s",
            " ".join(f"{n}:{x['lds']:.2f}/{x['drops'][5]:.2f}" for n, x in res.items()),
            flush=True,
        )
json.dump(out, open("results/context/selection/selection.json", "w"), default=float)
for n in next(iter(out.values())):
    print(
        n,
        "lds",
        np.nanmean([o[n]["lds"] for o in out.values()]),
        " ".join(f"d@{k} {np.mean([o[n]['drops'][k] for o in out.values()]):.2f}" for k in (1, 3, 5)),
    )
