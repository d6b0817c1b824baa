"""The picture of docs/ferret.md: ferret's tables for one sentence, with the decomposition
among ferret's explainers: ``python results/ferret/screenshot.py [--out docs/ferret.png]``.

Explains one sentence with the bundled MiniLM + sentiment head for the predicted class,
writes the token table (:func:`~captum_ffb.integrations.ferret.explanation_table`, ferret's
colours) and ferret's evaluation table (``show_evaluation_table``, which works when styled)
into an HTML page next to the PNG, and photographs it with headless Chromium.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
TEXT = "A gorgeous, witty, seductive movie: the plot is thin, but the acting is superb."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ferret.png", help="the PNG")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from ferret import (
        Benchmark,
        GradientExplainer,
        IntegratedGradientExplainer,
        LIMEExplainer,
        SHAPExplainer,
    )

    from captum_ffb.integrations.ferret import (
        NormDecompositionExplainer,
        explanation_table,
        minilm_sentiment_classifier,
    )

    model, tokenizer = minilm_sentiment_classifier()
    bench = Benchmark(model, tokenizer, explainers=[
        NormDecompositionExplainer(model, tokenizer),
        GradientExplainer(model, tokenizer, multiply_by_inputs=True),
        IntegratedGradientExplainer(model, tokenizer, multiply_by_inputs=True),
        SHAPExplainer(model, tokenizer), LIMEExplainer(model, tokenizer)])
    scores = bench.score(TEXT)
    target = int(torch.tensor(list(scores.values())).argmax())
    explanations = bench.explain(TEXT, target=target, show_progress=False)
    evaluations = bench.evaluate_explanations(explanations, target=target, show_progress=False)
    tokens = explanation_table(explanations, style=True).to_html()
    metrics = bench.show_evaluation_table(evaluations).format("{:.3f}").to_html()
    label = model.config.id2label[target]
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>ferret + captum_ffb</title>
<style>body {{font-family: sans-serif; margin: 24px; font-size: 14px}}
table {{border-collapse: collapse; margin: 8px 0 20px}} td, th {{padding: 4px 7px; text-align: center}}
th {{font-weight: 600}} h2 {{font-size: 16px; margin: 18px 0 4px}} p {{margin: 4px 0}}</style></head><body>
<p><b>“{TEXT}”</b></p>
<p>all-MiniLM-L6-v2 + the bundled sentiment head: {label} ({scores[label]:.3f}); every explainer
explains that class, scores L1-normalised (ferret's default).</p>
<h2>Token scores (captum_ffb.integrations.ferret.explanation_table, ferret's colours)</h2>{tokens}
<h2>ferret's faithfulness metrics (Benchmark.show_evaluation_table)</h2>{metrics}
<p>aopc_compr: higher is better; aopc_suff: lower is better; taucorr_loo: higher is better.</p>
</body></html>"""
    html = args.out.with_suffix(".html")
    html.write_text(page, encoding="utf-8")
    subprocess.run([args.chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", "--window-size=1220,490",
                    f"--screenshot={args.out.resolve()}", html.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    html.unlink()
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
