"""``captum-ffb compare``: the decomposition's maps next to attention, gradient and Shapley
baselines on the same layer and text, as tables and figures; ``--app-e`` reruns the paper's
IG-against-Shapley study of the FF activation."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captum_ffb.cli._common import UsageError, check_model_options
from captum_ffb.cli._options import (
    add_deprecated_alias,
    add_shared_options,
    default_out,
    model_placement,
    parse_layers,
    parse_scopes,
)
from captum_ffb.io.files import check_out_dir, output_set, write_text

DEFAULT_OUT = default_out("compare")
#: ``--differentiation``'s choices and the ``route`` of ``compare_with_baselines`` each means.
DIFFERENTIATION = {"forward-mode": "forward", "captum": "captum"}
DEFAULT_BASELINES = "attention,norm,ig,shap"
DEFAULT_ACTIVATION_METHODS = "ig,ig_captum,shap_exact,shap_sampling,shap_kernel"

EXAMPLES = f"""\
examples:
  captum-ffb compare "The cat sat on the mat."
      every layer of the bundled all-MiniLM-L6-v2 against {DEFAULT_BASELINES}
  captum-ffb compare "The cat sat on the mat." --layer 2 --baselines all --out cmp
  captum-ffb compare "The quick brown fox jumps over the lazy dog." --app-e --lengths 5,8,10
      App. E: IG against Shapley values for the FF activation of layer 0

baselines (comma list): attention (= attention_mean, attention_sum), norm, norm_bias,
  saliency, ixg, ig, gradients (= the three), shap (exact up to 12 tokens, else permutation
  sampling), shap_exact, shap_permutation, shap_sampling, shap_kernel, captum_shapley,
  all (= all twelve; shap_exact only up to 12 tokens, as it costs 2^n layer runs)

files written to --out:
  compare.csv, compare.md   per layer, each baseline against each scope's map:
                            1 - Spearman rho, Pearson r, top-k overlap
  compare_layerNN.png       the scopes' maps and the baselines' maps side by side
with --app-e:
  app_e_agreement.csv/.md   each activation method against IG, per length and scope
  app_e_change.csv/.md      contextualization change (1 - rho) by FF, RES, LN per method
  app_e_timing.csv/.md/.png seconds to decompose one layer's activation, per method and length
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare the maps with attention, gradient and Shapley baselines",
        description=(
            "Put the decomposition's maps of TEXT next to baselines computed on the same "
            "layer and input (attention weights, attention norms, Captum's gradient methods, "
            "Shapley values over the layer's input tokens) and write agreement tables and "
            "figures. With --app-e, compare IG with Shapley values for the FF activation."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("text", help="the input text (quote it)")
    parser.add_argument(
        "--layer", default=None, metavar="N|all",
        help="layer index, comma list or all (default: all; 0 with --app-e)",
    )
    parser.add_argument(
        "--baselines", default=DEFAULT_BASELINES, metavar="LIST",
        help=f"comma list of baselines (default {DEFAULT_BASELINES})",
    )
    parser.add_argument("-k", "--top-k", type=int, default=3, dest="k",
                        help="size of the top-k sets of the overlap score (default 3)")
    parser.add_argument("--n-steps", type=int, default=50, help="IG integration steps (default 50)")
    parser.add_argument("--n-samples", type=int, default=None,
                        help="budget of the sampling Shapley methods (their defaults if unset)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling methods")
    parser.add_argument("--differentiation", choices=tuple(DIFFERENTIATION), default="forward-mode",
                        help="how the gradient baselines (saliency, ixg, ig) are differentiated: "
                        "forward-mode (Jacobian-vector products, n passes per step; default) or "
                        "captum (Captum's own methods, a backward pass per output element); the "
                        "same numbers")
    add_deprecated_alias(parser, "--route", "--differentiation forward-mode|captum",
                         dest="differentiation", choices=tuple(DIFFERENTIATION.values()),
                         convert={route: name for name, route in DIFFERENTIATION.items()}.get,
                         note=" (--route is explain's whole-model route)")
    parser.add_argument("--no-figures", action="store_true", help="write no figures")
    add_deprecated_alias(parser, "--no-figure", "--no-figures", dest="no_figures", flag=True)
    parser.add_argument("--app-e", action="store_true",
                        help="run the App. E study (IG against Shapley for the FF activation)")
    parser.add_argument("--lengths", default=None, metavar="LIST",
                        help="with --app-e: comma list of sequence lengths (the text is cut; "
                        "default: its full length)")
    parser.add_argument("--methods", default=DEFAULT_ACTIVATION_METHODS, metavar="LIST",
                        help=f"with --app-e: activation methods (default {DEFAULT_ACTIVATION_METHODS})")
    add_shared_options(parser, "compare", "model", "scopes", "out", "device", "dtype", "quiet")
    parser.set_defaults(run=run)


def _int_list(value: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option} takes a comma list of integers, got {value!r}") from None
    if not values:
        raise UsageError(f"{option} is empty")
    return values


def _names(value: str | None, option: str) -> list[str] | None:
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise UsageError(f"{option} is empty")
    return names


def run(args: argparse.Namespace) -> int:
    from captum_ffb.explained.models import load_model, model_config
    from captum_ffb.texts.text import check_text

    check_text(args.text)
    if args.k < 1:
        raise UsageError("--top-k must be positive")
    if args.n_steps < 1:
        raise UsageError("--n-steps must be positive")
    if args.n_samples is not None and args.n_samples < 1:
        raise UsageError("--n-samples must be positive")
    placement = model_placement(args)
    out = check_out_dir(args.out)
    if not args.no_figures:
        from captum_ffb.baselines.figure import load_pyplot

        load_pyplot()
    from captum_ffb.baselines import ACTIVATION_METHODS, resolve_baselines

    if args.app_e:
        methods = _names(args.methods, "--methods") or []
        unknown = [m for m in methods if m not in ACTIVATION_METHODS]
        if unknown:
            raise UsageError(
                f"unknown activation method {unknown[0]!r}; choose from {', '.join(ACTIVATION_METHODS)}"
            )
        if args.lengths:
            _int_list(args.lengths, "--lengths")
    else:
        resolve_baselines(args.baselines, 0)  # unknown names fail before the model loads
    # layers and scopes fail before the weights load too
    layers = parse_layers(args.layer or ("0" if args.app_e else "all"))
    scopes = parse_scopes(args.scopes)
    config = model_config(args.model)
    check_model_options(config, layers, None if args.app_e else scopes)

    if not args.quiet:
        print(f"loading {args.model or 'the bundled all-MiniLM-L6-v2'} ...", file=sys.stderr, flush=True)
    loaded = load_model(args.model, show_progress=not args.quiet, config=config,
                        **placement.load_options())
    if args.app_e:
        return _run_app_e(args, loaded, out, layers)
    return _run_compare(args, loaded, out, layers, scopes)


def _run_compare(args: argparse.Namespace, loaded: Any, out: Path, layers: Sequence[int] | str,
                 scopes: list[str] | None) -> int:
    from captum_ffb.baselines import compare_with_baselines

    result = compare_with_baselines(
        args.text, loaded, layers=layers, baselines=args.baselines, scopes=scopes, k=args.k,
        route=DIFFERENTIATION[args.differentiation], n_steps=args.n_steps,
        n_samples=args.n_samples, seed=args.seed, show_progress=not args.quiet,
    )
    with output_set(out) as files:
        figures = []
        if not args.no_figures:
            from captum_ffb.baselines.figure import side_by_side

            for layer in result.layers:
                figures.append(side_by_side(
                    {name: value[0] for name, value in result.maps[layer].items()}, result.tokens,
                    files.path(f"compare_layer{layer:02d}.png"),
                    title=f"{loaded.name}, layer {layer}: decomposition scopes and baselines",
                ))
        written = _write_table(result.table, files.path("compare"))
    written, figures = files.final(written), files.final(figures)
    if not args.quiet:
        print(result.table.to_markdown())
        for path in [*written, *figures]:
            print(path)
    return 0


def _write_table(table: Any, stem: Path) -> list[Path]:
    csv_path = stem.with_suffix(".csv")
    md_path = stem.with_suffix(".md")
    write_text(csv_path, table.to_csv())
    write_text(md_path, table.to_markdown())
    return [csv_path, md_path]


def _run_app_e(args: argparse.Namespace, loaded: Any, out: Path, layers: Sequence[int] | str) -> int:
    from captum_ffb.baselines import activation_study_by_length, text_lengths

    lengths = None
    if args.lengths:
        lengths = text_lengths(args.text, loaded, _int_list(args.lengths, "--lengths"), "--lengths")
    study = activation_study_by_length(
        args.text, loaded, layers=layers, lengths=lengths, methods=_names(args.methods, "--methods"),
        n_samples=args.n_samples, seed=args.seed, n_steps=args.n_steps, k=args.k,
        show_progress=not args.quiet,
    )
    with output_set(out) as files:
        written = _write_table(study.agreement, files.path("app_e_agreement"))
        written += _write_table(study.contextualization, files.path("app_e_change"))
        written += _write_table(study.timing, files.path("app_e_timing"))
        if not args.no_figures:
            from captum_ffb.baselines.figure import timing_plot

            written.append(timing_plot(
                study.seconds, files.path("app_e_timing.png"),
                title=f"{loaded.name}, layer {study.layers[0]}: activation decomposition time",
            ))
    written = files.final(written)
    if not args.quiet:
        print(study.timing.to_markdown())
        print(study.agreement.to_markdown())
        print(study.contextualization.to_markdown())
        for path in written:
            print(path)
    return 0
