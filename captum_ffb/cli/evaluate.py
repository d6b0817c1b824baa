"""``captum-ffb evaluate``: faithfulness of attribution methods side by side, by perturbation."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from captum_ffb.cli._common import UsageError
from captum_ffb.cli._options import (
    add_backend_options,
    add_shared_options,
    backend_options,
    default_out,
    model_placement,
)

DEFAULT_OUT = default_out("evaluate")
DEFAULT_METHODS = "decomposition,attention_last,rollout,input_x_gradient,integrated_gradients,random"

EXAMPLES = f"""\
examples:
  captum-ffb evaluate --task sentiment --n 300
      the bundled all-MiniLM-L6-v2 with its bundled sentiment head, on 300 held-out Rotten
      Tomatoes snippets, every protocol, into ./{DEFAULT_OUT}/
  captum-ffb evaluate --model ./SmolLM2 --task next-token --max-tokens 24 \\
      --methods decomposition,attnlrp,integrated_gradients,random --option integrated_gradients.n_steps=20
  captum-ffb evaluate --model ./SmolLM2 --task sentiment --protocol abpc --backend ray --workers 2
  captum-ffb evaluate --model ./SmolLM2 --task evidence --n 100
      known answers: the annotated evidence of 100 held-out pairs per bundled subset (BLiMP
      agreement and licensing, IOI), ranked by each method next to the position-only controls
  captum-ffb evaluate --model ./SmolLM2 --task next-token --protocol eraser,schemes --keep-first \
      --methods decomposition,recency,previous_token,random
      the removal protocols with the first position never perturbed, under three removal schemes

methods: decomposition (and its rule variants decomposition_*), attention_last,
  attention_mean, rollout, norm_rollout, saliency, input_x_gradient, integrated_gradients,
  feature_ablation, shapley_value_sampling, kernel_shap, lime, attnlrp (Llama family; needs
  an lxt environment: bash <captum_ffb>/evaluation/peers/setup_lxt.sh), random, and the
  position-only controls recency, previous_token, first_token; or all
protocols: decompx (top K % replaced by [MASK], AOPC and accuracy), eraser (comprehensiveness
  and sufficiency, 1/5/10/20/50 % deleted), abpc (embeddings zeroed, area between the
  least- and most-relevant-first curves); all (= these three); schemes (ERASER's scores with
  tokens deleted, zeroed or replaced by unk, and Kendall's tau between the methods' rankings)
task evidence: --data is a CSV with one_prefix_prefix, one_prefix_word_good,
  one_prefix_word_bad, target (default: the bundled subsets); --n counts pairs per subset;
  --split heldout|selection|all; --copy N adds N copy-task sequences per length; scores: MRR,
  top-1 and share of the evidence; no protocol applies

files written to --out: results.csv, results.md, results.json, curves.png, report.html,
skipped.csv (texts left out: blank, longer than --max-tokens or than the model takes) and
run/ (the shards: run the same command again to resume)
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="faithfulness of attribution methods side by side (AOPC, ERASER, ABPC)",
        description="Score attribution methods by perturbation on one task: the protocols of "
                    "DecompX, ERASER/ALTI and AttnLRP, one row per method with its cost.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--task", required=True, choices=("next-token", "sentiment", "evidence"),
                        help="next-token (a causal LM's predicted token), sentiment (a prompt "
                        "for causal LMs, the class of a classifier, the bundled head of MiniLM) "
                        "or evidence (a causal LM's contrast between a good and a bad next word, "
                        "scored against the annotated evidence)")
    parser.add_argument("--data", default=None, metavar="FILE|rotten_tomatoes",
                        help="texts: rotten_tomatoes (labelled held-out snippets, the default), "
                        "or a .txt, .jsonl or .csv file (text[, label]); for --task evidence a "
                        "CSV of annotated pairs or bundled subset names (default: all bundled)")
    parser.add_argument("--split", default="heldout", choices=("heldout", "selection", "all"),
                        help="--task evidence: which rows of the bundled data (default heldout; "
                        "selection is what the defaults were chosen on)")
    parser.add_argument("--copy", type=int, default=0, metavar="N",
                        help="--task evidence: add N copy-task sequences per length (default 0)")
    parser.add_argument("--keep-first", action="store_true",
                        help="never perturb an example's first position (the attention sink)")
    parser.add_argument("--methods", default=DEFAULT_METHODS, metavar="LIST",
                        help=f"comma list of methods, or all (default: {DEFAULT_METHODS})")
    parser.add_argument("--protocol", default="all", metavar="LIST",
                        help="comma list of decompx, eraser, abpc, schemes, or all (default: "
                        "decompx, eraser, abpc)")
    parser.add_argument("--n", type=int, default=None, metavar="N",
                        help="how many texts (default 300; --task evidence: pairs per subset, "
                        "default 100)")
    parser.add_argument("--max-tokens", type=int, default=None, metavar="N",
                        help="skip texts of more than N tokens")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per batch / shard")
    parser.add_argument("--option", action="append", default=[], metavar="METHOD.KEY=VALUE",
                        help="a method's setting, e.g. integrated_gradients.n_steps=20 or "
                        "kernel_shap.n_samples=100 (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seeds random and the sampling methods")
    parser.add_argument("--overwrite", action="store_true",
                        help="discard an earlier run with other settings in --out")
    add_shared_options(parser, "evaluate", "model", "out", "device", "quiet")
    add_backend_options(parser)
    parser.set_defaults(run=run)


def parse_options(items: list[str], methods: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``["integrated_gradients.n_steps=20"]`` → ``{"integrated_gradients": {"n_steps": 20}}``
    (the grammar: :func:`captum_ffb.evaluation.methods.parse_option`); with ``methods``, an
    option of a method that is not run is an error too."""
    from captum_ffb.evaluation.methods import check_option, parse_option

    options: dict[str, dict[str, Any]] = {}
    for item in items:
        try:
            method, key, value = parse_option(item)
            check_option(method, key)
        except ValueError as error:
            raise UsageError(f"--option {item!r}: {error}") from None
        if methods is not None and method not in methods:
            raise UsageError(f"--option {item!r}: {method} is not among --methods "
                             f"({', '.join(methods)})")
        options.setdefault(method, {})[key] = value
    return options


def run(args: argparse.Namespace) -> int:
    from captum_ffb.evaluation.evaluate import evaluate, resolve_protocols
    from captum_ffb.evaluation.methods import resolve_methods

    evidence = args.task == "evidence"
    if evidence and args.methods == DEFAULT_METHODS:
        from captum_ffb.evaluation.evidence import DEFAULT_METHODS as EVIDENCE_METHODS

        args.methods = EVIDENCE_METHODS
    methods = resolve_methods(args.methods)
    protocols = resolve_protocols(args.protocol)
    options = parse_options(args.option, methods)
    n = args.n if args.n is not None else (100 if evidence else 300)
    if n < 1:
        raise UsageError(f"--n must be at least 1, got {n}")
    if args.max_tokens is not None and args.max_tokens < 2:
        raise UsageError(f"--max-tokens must be at least 2, got {args.max_tokens}")
    if args.copy < 0:
        raise UsageError(f"--copy must be 0 or more, got {args.copy}")
    if not evidence and (args.copy or args.split != "heldout"):
        raise UsageError("--copy and --split apply to --task evidence only")
    if evidence and (args.protocol != "all" or args.keep_first or args.max_tokens is not None):
        raise UsageError("--task evidence scores ranks of the evidence: --protocol, --keep-first "
                         "and --max-tokens do not apply")
    device = model_placement(args).device  # before the model loads (evaluate checks --out and --batch-size)
    backend, backend_settings = backend_options(args)
    if evidence:
        return _run_evidence(args, methods, options, n, device, backend, backend_settings)
    summary = evaluate(args.model, args.task, args.data or "rotten_tomatoes", methods, protocols, args.out,
                       n=n, max_tokens=args.max_tokens, batch_size=args.batch_size, options=options,
                       backend=backend, backend_options=backend_settings, overwrite=args.overwrite,
                       show_progress=not args.quiet, seed=args.seed, device=str(device),
                       keep_first=args.keep_first)
    if not args.quiet:
        from captum_ffb.evaluation.report import markdown_table, scheme_text

        print(f"{summary['n']} examples of {args.task} on {summary['model']}"
              + (f"; model accuracy {summary['accuracy']:.3f}" if summary["accuracy"] is not None else ""))
        print(markdown_table(summary) + scheme_text(summary))
        if summary["skipped"]:
            print(f"{len(summary['skipped'])} texts skipped, listed in {args.out}/skipped.csv")
        print(f"written to {args.out}", file=sys.stderr)
    return 0


def _run_evidence(args: argparse.Namespace, methods: list[str], options: dict[str, dict[str, Any]],
                  n: int, device: Any, backend: str, backend_settings: dict[str, Any]) -> int:
    from captum_ffb.evaluation.evidence import evaluate_evidence, evidence_table

    summary = evaluate_evidence(args.model, args.data, methods, args.out, split=args.split, n=n,
                                copy=args.copy, batch_size=args.batch_size, options=options,
                                backend=backend, backend_options=backend_settings, overwrite=args.overwrite,
                                show_progress=not args.quiet, seed=args.seed, device=str(device))
    if not args.quiet:
        skipped = sum(summary["skipped"].values())
        print(f"{summary['n']} evidence pairs on {summary['model']} ({skipped} left out: "
              f"{', '.join(f'{why} {count}' for why, count in summary['skipped'].items()) or 'none'})")
        print(evidence_table(summary))
        print(f"written to {args.out}", file=sys.stderr)
    return 0
