"""Context attribution beside ContextCite (issue 58 item 4), on SmolLM2-135M-Instruct.

Run from the repository root, in an environment where the ``context-cite`` package imports
(``pip install context-cite==0.0.4``: it brings no package that the project does not already
have; see ``README.md`` here for the environment used)::

    python results/context/run.py                             # results.json and SUMMARY.md here
    python results/context/run.py --time-first-several 6      # the package timed on several-token answers too
    python results/context/run.py --report-only               # SUMMARY.md again from results.json

About an hour on two cores at the defaults, and ten minutes more for the second line.

**Questions**: ``questions.json`` (``build_questions.py``): the kept questions, at most
``--per-kind`` of each kind (one-token and several-token answers), taken in turn from each
document in the order written (nothing about the attributions decides which).

**The explained value**: the answer's log-probability after the prompt and the lead (the start
of the reply), teacher-forced, ``Σ_t log p(a_t | prompt, a_<t)``. The prompt is ContextCite's
(``"Context: {context}\\n\\nQuery: {query}"`` as the user's turn of the chat template); the
sources are the context's sentences (``split_context(context, "sentence")``), handed to
ContextCite as its partitioner so that both methods score the same sources; ContextCite is
given the reply (lead and answer) instead of generating one and attributes the answer's span.

**Methods**: ``ours`` (``context_attribution(..., group_by="sentence", target=answer)``: each
sentence's exact contribution to the log-probability, one backward pass); ``ours-presence``
(``method="presence"``) and ``ours-fitted`` (``method="fitted"``: presence refined by a
surrogate on 16 ablated prompts); ``contextcite-64``
(``ContextCiter``, its defaults: 64 ablations keeping each source with p = 0.5, Lasso with
α = 0.01; it fits the logit of the answer's probability, ``log P − log(1 − P)``);
``contextcite-32`` (the package's solver on its first 32 ablations, which are the ablations of
a 32-ablation ContextCiter); ``recency`` (the later the sentence, the higher; a control);
``leave-one-out`` (each sentence removed alone; a reference). The package itself runs, timed,
on each document's first question (``--package-per-document``; with ``--time-first-several``
on its first several-token question too); on the others ContextCite's attributions are made
of the package's own parts, its ablation masks (``_create_mask``, seeds 0, 1, …) and its solver
(``LassoRegression``), the answers' log-probabilities measured once per ablated context for all
of a document's questions (their largest difference from the package's own, where both exist,
is reported).

**Measures** (``metrics.py``): the top-k drop (k = 1, 3, 5: the k top-scored sentences removed,
the answer's log-probability before minus after); the LDS (Spearman's correlation over
``--masks`` random ablations per document, each sentence kept with p = 0.5, seed 1000 + the
document's index, the same masks for every method and question of the document and not
ContextCite's, between the sum of the kept sentences' scores and the real log-probability; also
against ContextCite's own target, the logit); the top-1 sentence in the evidence paragraph;
seconds (wall and CPU, each method timed in this process, one after the other on each
question) and forward passes of the model (counted at the input embedding).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from metrics import (  # noqa: E402
    AnswerScorer,
    ablate,
    chat_template,
    lds,
    logit_of_log_prob,
    mean_se,
    random_masks,
    top_k_keep,
)

KS = (1, 3, 5)
#: Our methods: the row's name and ``context_attribution``'s ``method``.
OURS = {"ours": "decomposition", "ours-presence": "presence", "ours-fitted": "fitted",
        "ours-fitted-greedy": "fitted-greedy", "ours-fitted-no-rounds": "fitted-no-rounds",
        "ours-fitted-every": "fitted-every"}
#: Ours that are a method with other settings than its defaults, each an earlier default:
#: ``fitted-every`` is the fitted surrogate on 16 ablations of every sentence (``focus=None``,
#: before ``focus``), ``fitted-no-rounds`` the focused one without nested prompts (before
#: ``rounds``), ``fitted-greedy`` the focused one with greedy rounds (``rerank=True``, before the
#: nested prompts by the first ranking and 4 ablations).
SETTINGS = {"fitted-every": ("fitted", {"ablations": 16, "focus": None, "rounds": 0}),
            "fitted-no-rounds": ("fitted", {"ablations": 16, "rounds": 0}),
            "fitted-greedy": ("fitted", {"ablations": 16, "rerank": True})}
KINDS = ("one-token", "several-token")
#: Differences this small count as level: the same sentences removed, scored in another process
#: (``--add-ours``), differ by up to 1e-5 nats.
LEVEL = 1e-4


def select(questions: list[dict], per_kind: int) -> list[dict]:
    """At most ``per_kind`` kept questions of each kind, one document after another in turn
    (``per_kind`` 0: all)."""
    chosen = []
    for kind in KINDS:
        by_doc: dict[str, list[dict]] = {}
        for q in questions:
            if q["kept"] and q["kind"] == kind:
                by_doc.setdefault(q["doc"], []).append(q)
        queues, picked = list(by_doc.values()), []
        while any(queues) and (per_kind == 0 or len(picked) < per_kind):
            for queue in queues:
                if queue and (per_kind == 0 or len(picked) < per_kind):
                    picked.append(queue.pop(0))
        chosen += picked
    return chosen


class Counter:
    """Forward passes of a model (the rows its input embedding read) and when each ended."""

    def __init__(self, model: Any) -> None:
        self.calls, self.ends = 0, []
        model.get_input_embeddings().register_forward_hook(self._embedded)
        model.register_forward_hook(self._ended)

    def _embedded(self, _module: Any, args: tuple, *_: Any) -> None:
        self.calls += int(args[0].shape[0]) if args and hasattr(args[0], "shape") and args[0].dim() > 1 else 1

    def _ended(self, *_: Any) -> None:
        self.ends.append((time.perf_counter(), time.process_time()))

    def start(self) -> tuple[float, float]:
        self.calls, self.ends = 0, []
        return time.perf_counter(), time.process_time()


def make_partitioner(context: str, spans: list[tuple[int, int]]) -> Any:
    """ContextCite's partitioner over our sentences (its own splits with NLTK's punkt, whose data
    cannot be downloaded here; the same sources for both methods either way)."""
    from context_cite.context_partitioner import BaseContextPartitioner

    class Sentences(BaseContextPartitioner):
        @property
        def num_sources(self) -> int:
            return len(spans)

        def split_context(self) -> None:
            pass

        def get_source(self, index: int) -> str:
            return context[spans[index][0]:spans[index][1]]

        def get_context(self, mask: Any = None) -> str:
            return ablate(context, spans, np.ones(len(spans), bool) if mask is None else mask)

    return Sentences(context)


def run_ours(nd: Any, tokenizer: Any, q: dict, context: str, template: str, counter: Counter,
             method: str = "decomposition") -> dict:
    """``context_attribution`` by ``method`` of the answer's log-probability (a one-token
    answer's too, not its logit), timed, with its passes."""
    from captum_ffb import context_attribution
    from captum_ffb.explained.readouts import AnswerLogProbability

    called, options = SETTINGS.get(method, (method, {}))
    wall, cpu = counter.start()
    found = context_attribution(nd, tokenizer, context, q["question"], group_by="sentence",
                                target=AnswerLogProbability(q["answer"]), template=template + q["lead"],
                                method=called, **options)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return dict(scores=found.contributions.tolist(), seconds=wall, cpu_seconds=cpu, forwards=counter.calls,
                backwards=1, value=found.value, delta=found.delta, method=method)


def run_contextcite(model: Any, tokenizer: Any, q: dict, context: str, spans: list, counter: Counter,
                    ablations: int, answer_ids: list[int], prompt_ids: list[int]) -> tuple[dict, dict]:
    """ContextCite with ``ablations`` ablations, and its fit on the first half of them."""
    from context_cite import ContextCiter
    from context_cite.utils import aggregate_logit_probs

    began_wall, began_cpu = counter.start()
    citer = ContextCiter(model, tokenizer, context, q["question"], partitioner=make_partitioner(context, spans),
                         num_ablations=ablations)
    _, prompt = citer._get_prompt_ids(return_prompt=True)
    citer._cache["output"] = prompt + q["lead"] + q["answer"]  # our reply, not one it generates
    start, end = len(q["lead"]), len(q["lead"]) + len(q["answer"])
    weights = citer.get_attributions(start_idx=start, end_idx=end, verbose=False)
    wall, cpu = time.perf_counter() - began_wall, time.process_time() - began_cpu
    forwards, ends = counter.calls, list(counter.ends)
    first, last = citer._indices_to_token_indices(start, end)
    response_start = citer._response_start
    ids = citer._output_tokens["input_ids"]
    if ids[response_start + first:response_start + last] != answer_ids or ids[:response_start + first] != prompt_ids:
        raise RuntimeError(f"{q['id']}: ContextCite explains other tokens than ours")
    full = dict(scores=np.asarray(weights).tolist(), seconds=wall, cpu_seconds=cpu, forwards=forwards, backwards=0)
    # its first half of ablations are those of a ContextCiter of half as many (seeds 0, 1, ...):
    # the package's own aggregation and solver on them, timed to the end of their last pass
    half = ablations // 2
    fit_wall, fit_cpu = time.perf_counter(), time.process_time()
    outputs = aggregate_logit_probs(citer._logit_probs[:half, first:last])
    weights_half, _ = citer.solver.fit(citer._masks[:half], outputs, last - first)
    fit_wall, fit_cpu = time.perf_counter() - fit_wall, time.process_time() - fit_cpu
    halved = dict(scores=np.asarray(weights_half).tolist(), forwards=half, backwards=0,
                  seconds=ends[half - 1][0] - began_wall + fit_wall, cpu_seconds=ends[half - 1][1] - began_cpu + fit_cpu)
    return full, halved


def masked_ids(tokenizer: Any, template: str, context: str, spans: list, keep: Any, q: dict) -> list[int]:
    """The prompt's token ids with only the kept sentences (the lead included)."""
    text = ablate(context, spans, keep)
    return tokenizer(template.replace("{context}", text).replace("{question}", q["question"]) + q["lead"]).input_ids


def ablation_values(env: dict, doc: dict, spans: list, rows: list[dict], masks: Any) -> list[list[float]]:
    """``values[question][mask]``: each answer's log-probability on each ablation of the
    document (the ablated context's cache shared by the document's questions; the whole
    prompt's up to the first removed sentence)."""
    values = [[] for _ in rows]
    for keep in masks:
        for j, row in enumerate(rows):
            ids = masked_ids(env["tokenizer"], env["template"], doc["text"], spans, keep, row["q"])
            values[j].append(env["scorer"].log_prob(ids, row["answer_ids"], remember=j == 0))
    return values


def contextcite_fits(env: dict, doc: dict, spans: list, rows: list[dict]) -> tuple[list, list]:
    """ContextCite's attributions for every question of the document, from its own ablations
    (``context_cite.utils._create_mask``, seeds 0, 1, …) and its own solver, the answers'
    log-probabilities measured once per ablated context for all the questions: its
    ``ablations``-ablation fits and its fits on the first half of them."""
    from context_cite.solver import LassoRegression
    from context_cite.utils import _create_mask

    n = env["ablations"]
    masks = np.stack([_create_mask(len(spans), 0.5, seed) for seed in range(n)])
    values = ablation_values(env, doc, spans, rows, masks)
    full, half = [], []
    for row, observed in zip(rows, values):
        outputs = np.asarray([logit_of_log_prob(v) for v in observed], dtype=np.float32)  # its target
        tokens = len(row["answer_ids"])
        full.append(LassoRegression().fit(masks, outputs, tokens)[0].tolist())
        half.append(LassoRegression().fit(masks[:n // 2], outputs[:n // 2], tokens)[0].tolist())
    return full, half


def evaluate(env: dict, doc: dict, spans: list, row: dict) -> None:
    """Each method's top-k drops (in place)."""
    seen: dict[bytes, float] = {}
    for result in row["methods"].values():
        result["top_k_drop"], result["top_k_removed"] = {}, {}
        for k in KS:
            keep = top_k_keep(result["scores"], min(k, len(spans)))
            if keep.tobytes() not in seen:
                ids = masked_ids(env["tokenizer"], env["template"], doc["text"], spans, keep, row["q"])
                seen[keep.tobytes()] = env["scorer"].log_prob(ids, row["answer_ids"])
            result["top_k_drop"][str(k)] = row["log_prob"] - seen[keep.tobytes()]
            result["top_k_removed"][str(k)] = [int(i) for i in np.flatnonzero(~keep)]


def evidence_hit(scores: list[float], spans: list, paragraph: tuple[int, int]) -> bool:
    """Whether the top-scored sentence lies in the paragraph that states the answer."""
    top = int(np.argsort(-np.asarray(scores), kind="stable")[0])
    return paragraph[0] <= spans[top][0] and spans[top][1] <= paragraph[1]


def timed_methods(env: dict, doc: dict, spans: list, row: dict, order: int, with_package: bool,
                  names: tuple[str, ...] = tuple(OURS)) -> None:
    """Ours (``names``) on the question, and where ``with_package`` the ContextCite package
    itself, timed one after the other (ours first on even questions, ContextCite first on odd
    ones)."""
    q, methods = row["q"], row["methods"]
    runs = [lambda name=name, method=method: methods.__setitem__(
        name, run_ours(env["nd"], env["tokenizer"], q, doc["text"], env["template"], env["counter"], method))
        for name, method in OURS.items() if name in names]
    if with_package:
        runs.append(lambda: row.__setitem__("package", run_contextcite(
            env["model"], env["tokenizer"], q, doc["text"], spans, env["counter"], env["ablations"],
            row["answer_ids"], row["prompt_ids"])))
    for run in runs if order % 2 == 0 else runs[::-1]:
        run()


def run_document(env: dict, doc: dict, index: int, chosen: list[dict], done: list[dict],
                 names: tuple[str, ...] = tuple(OURS)) -> None:
    """Every method on the document's questions, then the measures."""
    from captum_ffb.long_context.attribution import split_context

    text, tokenizer, scorer = doc["text"], env["tokenizer"], env["scorer"]
    spans, paragraphs = split_context(text, "sentence"), split_context(text, "paragraph")
    rows = []
    for q in chosen:
        prompt_ids = tokenizer(env["template"].replace("{context}", text).replace("{question}", q["question"])
                               + q["lead"]).input_ids
        rows.append(dict(q=q, prompt_ids=prompt_ids, answer_ids=env["nd"].engine.token_ids(tokenizer, q["answer"]),
                         methods={}))
    started = time.perf_counter()
    for j, row in enumerate(rows):
        timed_methods(env, doc, spans, row, len(done) + j, with_package=j < env["package_per_document"], names=names)
        row["log_prob"] = scorer.log_prob(row["prompt_ids"], row["answer_ids"], pin=j == 0)
    full, half = contextcite_fits(env, doc, spans, rows)
    name_full, name_half = f"contextcite-{env['ablations']}", f"contextcite-{env['ablations'] // 2}"
    began, passes = time.perf_counter(), scorer.passes
    removed = ~np.eye(len(spans), dtype=bool)
    loo = ablation_values(env, doc, spans, rows, removed)
    loo_seconds, loo_passes = (time.perf_counter() - began) / len(rows), (scorer.passes - passes) / len(rows)
    for row, w_full, w_half, lost in zip(rows, full, half, loo):
        methods = row["methods"]
        methods[name_full] = dict(scores=w_full, seconds=None, cpu_seconds=None, forwards=env["ablations"])
        methods[name_half] = dict(scores=w_half, seconds=None, cpu_seconds=None, forwards=env["ablations"] // 2)
        if "package" in row:  # the package's own numbers where it ran
            real_full, real_half = row.pop("package")
            row["package_difference"] = float(np.abs(np.asarray(real_full["scores"]) - np.asarray(w_full)).max())
            methods[name_full], methods[name_half] = real_full, real_half
        methods["recency"] = dict(scores=[float(i) for i in range(len(spans))], seconds=0.0, cpu_seconds=0.0,
                                  forwards=0)
        methods["leave-one-out"] = dict(scores=[row["log_prob"] - v for v in lost], seconds=loo_seconds,
                                        cpu_seconds=None, forwards=loo_passes, shared=True)
        evaluate(env, doc, spans, row)
    masks = random_masks(len(spans), env["masks"], seed=1000 + index)
    observed_all = ablation_values(env, doc, spans, rows, masks)
    scorer.unpin()
    for row, observed in zip(rows, observed_all):
        q = row["q"]
        logits = [logit_of_log_prob(v) for v in observed]
        for result in row["methods"].values():
            result["lds"] = lds(result["scores"], masks, observed)
            result["lds_logit"] = lds(result["scores"], masks, logits)
            result["evidence_top1"] = evidence_hit(result["scores"], spans, paragraphs[q["paragraph"]])
        done.append(dict(id=q["id"], kind=q["kind"], doc=q["doc"], question=q["question"], answer=q["answer"],
                         answer_tokens=len(row["answer_ids"]), prompt_tokens=len(row["prompt_ids"]),
                         sources=len(spans), log_prob=row["log_prob"], evidence_paragraph=q["paragraph"],
                         package_difference=row.get("package_difference"), datamodel_log_probs=observed,
                         methods=row["methods"]))
        print(f"{q['id']:24s} " + "  ".join(f"{m} drop@3 {r['top_k_drop']['3']:+.2f} lds {r['lds']:+.2f}"
                                            for m, r in row["methods"].items()), flush=True)
    print(f"{doc['id']}: {time.perf_counter() - started:.0f}s", flush=True)


def retime(env: dict, data: dict, results: dict, documents_timed: int) -> None:
    """Ours and the ContextCite package timed, in turn, on each document's first evaluated
    several-token question; their seconds and passes replace those of the run (the scores stay:
    ours are the same, and the package's are recorded by their largest difference)."""
    from captum_ffb.long_context.attribution import split_context

    documents = {doc["id"]: doc for doc in data["documents"]}
    questions = {q["id"]: q for q in data["questions"]}
    records = [r for r in results["questions"] if r["kind"] == "several-token"]
    firsts = [next(r for r in records if r["doc"] == d) for d in documents if any(r["doc"] == d for r in records)]
    for order, record in enumerate(firsts[:documents_timed]):
        q, doc = questions[record["id"]], documents[record["doc"]]
        spans = split_context(doc["text"], "sentence")
        row = dict(q=q, answer_ids=record["answer_ids"] if "answer_ids" in record else
                   env["nd"].engine.token_ids(env["tokenizer"], q["answer"]), methods={})
        row["prompt_ids"] = env["tokenizer"](env["template"].replace("{context}", doc["text"])
                                             .replace("{question}", q["question"]) + q["lead"]).input_ids
        timed_methods(env, doc, spans, row, order, with_package=True)
        real_full, real_half = row["package"]
        for name in OURS:
            if np.abs(np.asarray(row["methods"][name]["scores"])
                      - np.asarray(record["methods"][name]["scores"])).max() > 1e-4:
                raise RuntimeError(f"{q['id']}: {name} gave other scores than in the run")
        for name, timed in (*((name, row["methods"][name]) for name in OURS),
                            (f"contextcite-{env['ablations']}", real_full),
                            (f"contextcite-{env['ablations'] // 2}", real_half)):
            record["methods"][name].update(seconds=timed["seconds"], cpu_seconds=timed["cpu_seconds"],
                                           forwards=timed["forwards"])
        record["package_difference"] = float(np.abs(np.asarray(real_full["scores"])
                                                    - np.asarray(record["methods"][f"contextcite-{env['ablations']}"]
                                                                 ["scores"])).max())
        print(f"{q['id']}: ours {row['methods']['ours']['seconds']:.1f}s, package {real_full['seconds']:.1f}s",
              flush=True)


def add_ours(env: dict, data: dict, results: dict, names: tuple[str, ...] = tuple(OURS)) -> None:
    """Our methods (``names`` of :data:`OURS`) run again on a finished run's questions, timed,
    and measured as in the run: top-k drops, the LDS against the stored ablations (the same
    masks) and the evidence; their rows replace those of the run."""
    from captum_ffb.long_context.attribution import split_context

    documents = {doc["id"]: (index, doc) for index, doc in enumerate(data["documents"])}
    questions = {q["id"]: q for q in data["questions"]}
    for order, record in enumerate(results["questions"]):
        q, (index, doc) = questions[record["id"]], documents[record["doc"]]
        spans, paragraphs = split_context(doc["text"], "sentence"), split_context(doc["text"], "paragraph")
        prompt_ids = env["tokenizer"](env["template"].replace("{context}", doc["text"])
                                      .replace("{question}", q["question"]) + q["lead"]).input_ids
        row = dict(q=q, prompt_ids=prompt_ids, answer_ids=env["nd"].engine.token_ids(env["tokenizer"], q["answer"]),
                   methods={}, log_prob=record["log_prob"])
        timed_methods(env, doc, spans, row, order, with_package=False, names=names)
        evaluate(env, doc, spans, row)
        masks = random_masks(len(spans), results["settings"]["masks"], seed=1000 + index)
        observed = record["datamodel_log_probs"]
        for name, result in row["methods"].items():
            result["lds"] = lds(result["scores"], masks, observed)
            result["lds_logit"] = lds(result["scores"], masks, [logit_of_log_prob(v) for v in observed])
            result["evidence_top1"] = evidence_hit(result["scores"], spans, paragraphs[q["paragraph"]])
            if name == "ours-presence" and abs(result["value"] - record["log_prob"]) > 1e-3:
                raise RuntimeError(f"{q['id']}: the presence pass explains {result['value']}, the run "
                                   f"measured {record['log_prob']}")
            record["methods"][name] = result
        print(f"{q['id']:24s} " + "  ".join(f"{m} drop@5 {r['top_k_drop']['5']:+.2f} lds {r['lds']:+.2f} "
                                            f"{r['seconds']:.1f}s" for m, r in row["methods"].items()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=Path, default=HERE / "questions.json")
    parser.add_argument("--per-kind", type=int, default=12, help="questions of each kind (0: every kept one)")
    parser.add_argument("--ablations", type=int, default=64, help="ContextCite's ablations (its default 64)")
    parser.add_argument("--masks", type=int, default=32, help="random ablations per document for the LDS")
    parser.add_argument("--package-per-document", type=int, default=1,
                        help="questions of each document on which the ContextCite package itself runs (timed)")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--methods", default=",".join(OURS), metavar="NAMES",
                        help=f"which of ours the run computes (default every one of {', '.join(OURS)})")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--pool-with", type=Path, default=None, metavar="RESULTS_JSON",
                        help="another run's results.json: SUMMARY.md adds both runs' questions together")
    parser.add_argument("--time-first-several", type=int, default=0, metavar="N",
                        help="to a finished run, add the package's timing on each document's first several-token "
                             "question, on the first N documents (the main run times it on each document's first question, a "
                             "one-token one)")
    parser.add_argument("--add-ours", nargs="?", const=",".join(OURS), default=None, metavar="NAMES",
                        help="to a finished run, our methods again (timed, measured on the stored ablations); "
                        f"NAMES: which (default every one of {', '.join(OURS)})")
    args = parser.parse_args()
    from captum_ffb.io.files import write_json, write_text

    other = json.loads(args.pool_with.read_text()) if args.pool_with else None
    if args.report_only:
        write_text(args.out / "SUMMARY.md", report(json.loads((args.out / "results.json").read_text()), other))
        return
    if args.add_ours:
        results = json.loads((args.out / "results.json").read_text())
        names = tuple(n for n in args.add_ours.split(",") if n)
        unknown = [n for n in names if n not in OURS]
        if unknown:
            parser.error(f"--add-ours: unknown {unknown}; ours are {list(OURS)}")
        add_ours(setup(args), json.loads(args.questions.read_text(encoding="utf-8")), results, names)
        again = results["settings"].setdefault("ours_added", {})
        again.update({n: _commit() for n in names})  # the package's version each ran on
        write_json(args.out / "results.json", results)
        write_text(args.out / "SUMMARY.md", report(results, other))
        return
    if args.time_first_several:
        results = json.loads((args.out / "results.json").read_text())
        retime(setup(args), json.loads(args.questions.read_text(encoding="utf-8")), results, args.time_first_several)
        write_json(args.out / "results.json", results)
        write_text(args.out / "SUMMARY.md", report(results, other))
        return
    data = json.loads(args.questions.read_text(encoding="utf-8"))
    methods = tuple(n for n in args.methods.split(",") if n)
    if any(n not in OURS for n in methods):
        parser.error(f"--methods: unknown {[n for n in methods if n not in OURS]}; ours are {list(OURS)}")
    env = setup(args)
    chosen = select(data["questions"], args.per_kind)
    done: list[dict] = []
    started = time.perf_counter()
    results = dict(settings=dict(per_kind=args.per_kind, ablations=args.ablations, masks=args.masks, ks=list(KS),
                                 package_per_document=args.package_per_document, threads=env["threads"],
                                 versions=env["versions"], questions_file=args.questions.name, methods=list(methods),
                                 commit=_commit()), questions=done)
    for index, doc in enumerate(data["documents"]):
        rows = [q for q in chosen if q["doc"] == doc["id"]]
        if rows:
            run_document(env, doc, index, rows, done, methods)
            results["seconds"] = time.perf_counter() - started
            write_json(args.out / "results.json", results)
    write_text(args.out / "SUMMARY.md", report(results, other))
    print(f"done in {time.perf_counter() - started:.0f}s")


def _commit() -> str:
    """The repository's commit, ``+changes`` when the package's files differ from it."""
    import subprocess

    root = HERE.parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "captum_ffb"], cwd=root, capture_output=True,
                                 text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+changes" if changed else "")


def setup(args: argparse.Namespace) -> dict:
    """The model, its tokenizer, the bound attribution, the counters and the versions."""
    import importlib.metadata

    import context_cite  # noqa: F401 (fails here, before any work, where the package is missing)
    import torch

    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir

    loaded = load_model(smollm2_dir(required=True), show_progress=False)
    model, tokenizer = loaded.model, loaded.tokenizer
    env = dict(model=model, tokenizer=tokenizer, nd=NormDecomposition(model), template=chat_template(tokenizer),
               counter=Counter(model), scorer=AnswerScorer(model), ablations=args.ablations, masks=args.masks,
               package_per_document=args.package_per_document, threads=torch.get_num_threads(),
               versions={**{name: importlib.metadata.version(name) for name in
                            ("context-cite", "torch", "transformers", "scikit-learn")}, "captum_ffb": _commit()})
    # the first call of each kind of pass is slower (allocations, lazy set-ups): one of each, untimed
    from captum_ffb import context_attribution

    context_attribution(env["nd"], tokenizer, "A warm-up. Two sentences.", "Why?", group_by="sentence",
                        target=" Because it is", template=env["template"])
    with torch.no_grad():
        model(torch.tensor([tokenizer("A warm-up of the model.").input_ids]))
    return env


def _cell(values: list[float], digits: int = 2, of: int | None = None) -> str:
    """``mean ± standard error`` of the values that are there (``(n = …)`` when fewer than ``of``)."""
    present = [v for v in values if v is not None]
    mean, se, n = mean_se(present)
    if n == 0:
        return "–"
    text = f"{mean:.{digits}f} ± {se:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"
    return text + (f" (n = {n})" if of is not None and n < of else "")


def _zero_if_undefined(value: float) -> float:
    return 0.0 if value != value else value


def _table(records: list[dict], names: list[str]) -> list[str]:
    lines = ["| method | drop@1 | drop@3 | drop@5 | LDS | top-1 sentence in the evidence paragraph | "
             "seconds (wall) | seconds (CPU) | forward passes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        rows = [r["methods"][name] for r in records if name in r["methods"]]
        drops = [_cell([row["top_k_drop"][str(k)] for row in rows]) for k in KS]
        undefined = sum(1 for row in rows if row["lds"] != row["lds"])
        note = f" ({undefined} undefined, as 0)" if undefined else ""
        hits = sum(row["evidence_top1"] for row in rows)
        lines.append(f"| {name} | {' | '.join(drops)} | {_cell([_zero_if_undefined(r['lds']) for r in rows])}{note} "
                     f"| {hits}/{len(rows)} | "
                     f"{_cell([row['seconds'] for row in rows], 1, len(rows))} | "
                     f"{_cell([row['cpu_seconds'] for row in rows], 1, len(rows))} | "
                     f"{_cell([row['forwards'] for row in rows], 1)} |")
    return lines


def _paired(records: list[dict], ours: str, peer: str) -> list[str]:
    """Ours minus the peer on each question: the mean difference, its standard error, and on how
    many questions ours is ahead, level and behind."""
    lines = [f"| measure | {ours} − {peer} | ours ahead / level / behind |", "|---|---|---|"]
    measures = [(f"drop@{k}", lambda r, k=k: r["top_k_drop"][str(k)]) for k in KS]
    measures += [("LDS", lambda r: _zero_if_undefined(r["lds"]))]
    for label, get in measures:
        diffs = [get(r["methods"][ours]) - get(r["methods"][peer]) for r in records]
        ahead = sum(d > LEVEL for d in diffs)
        behind = sum(d < -LEVEL for d in diffs)
        lines.append(f"| {label} | {_cell(diffs)} | {ahead} / {len(diffs) - ahead - behind} / {behind} |")
    return lines


def _cost(records: list[dict], ours: str, full: str, half: str) -> list[str]:
    """``ours`` against the package's own runs, on the questions where it ran."""
    timed = [r for r in records if r["methods"][full].get("seconds") is not None]
    if not timed:
        return []
    lines = []
    for peer in (full, half):
        wall = [r["methods"][ours]["seconds"] / r["methods"][peer]["seconds"] for r in timed]
        cpu = [r["methods"][ours]["cpu_seconds"] / r["methods"][peer]["cpu_seconds"] for r in timed]
        lines.append(f"{ours} costs {np.median(wall):.3f} of {peer}'s wall time (median over the {len(timed)} "
                     f"questions where the package ran; {min(wall):.3f}–{max(wall):.3f}) and {np.median(cpu):.3f} "
                     "of its CPU time.")
    return lines + [""]


def report(results: dict, other: dict | None = None) -> str:
    """``SUMMARY.md``: per answer length, each method's measures (mean ± standard error over the
    questions), ours against ContextCite question by question, and the cost; with ``other`` (a
    second run's results), the same over both runs' questions together."""
    settings, records = results["settings"], results["questions"]
    full, half = f"contextcite-{settings['ablations']}", f"contextcite-{settings['ablations'] // 2}"
    names = [name for name in (*OURS, full, half, "recency", "leave-one-out")
             if any(name in r["methods"] for r in records)]
    differences = [r["package_difference"] for r in records if r.get("package_difference") is not None]
    lines = ["# Context attribution beside ContextCite", "",
             f"SmolLM2-135M-Instruct; {len(records)} questions on {len({r['doc'] for r in records})} public "
             f"documents (`{settings.get('questions_file', 'questions.json')}`, `README.md`); sources: sentences; "
             f"ContextCite {settings['versions']['context-cite']} with "
             f"{settings['ablations']} ablations (and its fit on the first {settings['ablations'] // 2}); LDS over "
             f"{settings['masks']} random ablations per document (p = 0.5, not ContextCite's); torch threads "
             f"{settings['threads']}; the run took {results.get('seconds', 0) / 60:.0f} min. Mean ± standard error "
             "over the questions; drops in nats of the answer's log-probability (larger: the removed sentences "
             "mattered more); seconds per question, each method timed in the same process. The package itself "
             f"ran (timed) on {len(differences)} questions (each document's first evaluated question, and with "
             "`--time-first-several` its first several-token one); elsewhere its attributions come from "
             "the same ablations and solver with the answers' log-probabilities measured once per ablated "
             f"context (largest difference from the package's own: {max(differences, default=float('nan')):.1e}). "
             "Leave-one-out's seconds are its document's passes shared among the document's questions. The LDS "
             "is the same against ContextCite's own target, the logit of the answer's probability (a rank "
             "correlation, and the logit rises with the log-probability; `lds_logit` in `results.json`)."
             + (f" Both of ours were run again after the run (`--add-ours`, at {settings.get('ours_again')}), timed "
                "in that process, on the "
                "log-probability of every answer (the run had given a one-token answer's logit), their drops measured "
                "again and their LDS on the run's stored ablations." if settings.get("ours_again") else "")
             + "".join(f" `{name}` was added after the run (`--add-ours {name}`, at {commit}), timed in that "
                       "process, its drops measured and its LDS on the run's stored ablations."
                       for name, commit in settings.get("ours_added", {}).items())
             + "".join(f" `{name}` holds the `{old}` rows computed at {commit}, renamed when {old}'s "
                       "default changed (same timing and measures)."
                       for name, (old, commit) in settings.get("ours_renamed", {}).items()), ""]
    for kind in KINDS + ("all",):
        subset = [r for r in records if kind == "all" or r["kind"] == kind]
        if not subset:
            continue
        lines += [f"## {kind.capitalize()} answers ({len(subset)} questions, "
                  f"{_cell([r['prompt_tokens'] for r in subset], 0)} prompt tokens, "
                  f"{_cell([r['sources'] for r in subset], 0)} sentences)", ""]
        lines += _compared(subset, names, full, half)
    if other is not None:
        both = records + other["questions"]
        shared = [name for name in names if all(name in r["methods"] for r in both)]
        lines += [f"## Both evaluation sets together ({len(both)} questions: these {len(records)} and the "
                  f"{len(other['questions'])} of `{other['settings'].get('questions_file', 'questions.json')}`; "
                  "the methods both ran)", ""]
        lines += _compared(both, shared, full, half)
    return "\n".join(lines)


def _compared(records: list[dict], names: list[str], full: str, half: str) -> list[str]:
    """The methods' table, then each of ours that every record has against the package."""
    lines = _table(records, names) + [""]
    for ours in OURS:
        if ours in names and all(ours in r["methods"] for r in records):
            lines += _paired(records, ours, full) + [""] + _cost(records, ours, full, half)
    return lines


if __name__ == "__main__":
    main()
