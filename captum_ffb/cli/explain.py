"""``captum-ffb explain``: which input tokens drove a model's output, exactly."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from captum_ffb.cli._common import UsageError
from captum_ffb.cli._options import (
    ModelPlacement,
    add_backend_options,
    add_shared_options,
    backend_options,
    default_out,
    model_placement,
    parse_formats,
)
from captum_ffb.core.vocabulary import FEATURE_GRANULARITIES
from captum_ffb.engine.requests import check_new_tokens
from captum_ffb.io.files import check_out_dir, output_set, save_figure, write_json, write_text
from captum_ffb.long_context.attribution import (
    DEFAULT_ABLATIONS,
    DEFAULT_FOCUS,
    DEFAULT_ROUNDS,
    DEFAULT_TEMPLATE,
    GROUPINGS,
    METHODS,
)

if TYPE_CHECKING:
    from pathlib import Path

    from captum_ffb.components.table import ComponentAttribution

GRANULARITIES = FEATURE_GRANULARITIES["components"]
DEFAULT_OUT = default_out("explain")
#: The library's parameter names this command's messages show as its flags.
FLAGS = {"contrast": "--contrast", "class_index": "--class", "generate": "--generate", "target": "--target",
         "components": "--components", "max_new_tokens": "--generate", "batch_size": "--batch-size",
         "template": "--template"}
#: How many tokens an encoder–decoder generates when --generate is not given.
DEFAULT_NEW_TOKENS = 20

EXAMPLES = f"""\
examples:
  captum-ffb explain "a charming and often affecting journey."
      the bundled all-MiniLM-L6-v2, offline: the whole-model maps and the contributions of
      every token to the bundled sentiment head's logit, into ./{DEFAULT_OUT}/
  captum-ffb explain "The capital of France is" --model ./SmolLM2 --target " Paris"
  captum-ffb explain "The capital of France is" --model ./SmolLM2 --contrast " Paris" " London"
  captum-ffb explain "Once upon a time" --model ./SmolLM2 --generate 8
  captum-ffb explain "a dull movie" --model ./my-classifier --class 1
  captum-ffb explain "the cat sat ||| le chat" --model ./my-marian
      an encoder–decoder: every target token over the source and the target prefix, with its
      source share (Σ source / logit); without ||| TARGET, --generate N tokens (20 by default)
  captum-ffb explain --audio clip.wav --model ./whisper-base --generate 8
      a speech model: the transcript's tokens over the audio frames and the prefix
  captum-ffb explain "The capital of France is" --model ./SmolLM2 --components head
      also split the next token's logit over tokens x components (here each attention head)
  captum-ffb explain --data reviews.txt --model ./SmolLM2 --backend ray --workers 2
      corpus mode: one explanation per line of reviews.txt (the predicted output), written
      to ./{DEFAULT_OUT}/explanations.jsonl (each with its line's index, from 0); blank lines
      and lines longer than the model takes are listed in ./{DEFAULT_OUT}/skipped.csv;
      resumable from ./{DEFAULT_OUT}/run/

files written to --out:
  explanation.png   tokens coloured by their signed contribution, on the scale of every token
                    and on the scale of the tokens after the first (generation: a heat map of
                    generated tokens x input tokens)
  explanation.html  an offline page: the contributions (with a first-token toggle) and a
                    whole-model tab with the token-to-token maps after every block
  explanation.json  tokens, contributions, bias, value, convergence delta, first-token share
                    and the maps (with --components: the tokens x components table too)
  components.png    with --components: a heat map of the direct effects, input tokens x
                    components (embeddings, attention, FF, each head ...), and a Components
                    tab in explanation.html with the same map and the ten largest entries
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="which input tokens drove a model's output: exact contributions, views and JSON",
        description=(
            "Explain TEXT exactly: the contributions of every input token to a causal LM's next "
            "token (or to every generated token), to a classifier's class, or, for a base model, "
            "its whole-model token-to-token maps."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("text", nargs="?", default=None, help="the input text (quote it)")
    parser.add_argument("--audio", default=None, metavar="WAV",
                        help="speech encoder–decoders (Whisper): the source, a WAV file; TEXT is then "
                        "the forced transcript (prompt tokens included), or left out to --generate")
    parser.add_argument("--data", default=None, metavar="FILE",
                        help="corpus mode: a .txt file (one text per line), .jsonl or .csv "
                        "(a text column); writes explanations.jsonl")
    parser.add_argument("--context", default=None, metavar="FILE",
                        help="causal LMs, context attribution: a long text file (a document, passages, a "
                        "chat history) whose groups (--group-by) are the players; with --question")
    parser.add_argument("--question", default=None, metavar="TEXT",
                        help="with --context: what is asked of it (the prompt is the context, a blank "
                        "line, the question; see --template)")
    parser.add_argument("--group-by", choices=GROUPINGS, default="paragraph",
                        help="with --context: the groups, paragraphs (blank lines; default), sentences or lines")
    parser.add_argument("--template", default=DEFAULT_TEMPLATE, metavar="TEXT",
                        help="with --context: the prompt, with {context} and {question} once each "
                        "(default: '{context}\\n\\n{question}')")
    parser.add_argument("--context-method", choices=METHODS, default="decomposition",
                        help="with --context: each group's exact share of the value in the model's pass "
                        "(decomposition; default) or what removing it does (presence: ablation-aware, two "
                        "gradients by default; fitted: presence refined by a fit on --ablations "
                        "ablated prompts)")
    parser.add_argument("--presence-steps", type=int, default=2, metavar="N",
                        help="with --context-method presence: the path's midpoints (default 2)")
    parser.add_argument("--ablations", type=int, default=DEFAULT_ABLATIONS, metavar="N",
                        help=f"with --context-method fitted: the ablated prompts, one forward pass each "
                        f"(default {DEFAULT_ABLATIONS})")
    parser.add_argument("--focus", type=int, default=DEFAULT_FOCUS, metavar="N",
                        help=f"with --context-method fitted: the ablations remove only among N candidate "
                        f"groups, presence's and the decomposition's top N/2 (default {DEFAULT_FOCUS}; 0: "
                        f"every group)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, metavar="N",
                        help=f"with --context-method fitted: nested prompts without the decomposition's top "
                        f"1, 2, ... N groups, one forward pass each, added to the ablations (default "
                        f"{DEFAULT_ROUNDS}; 0: none)")
    parser.add_argument("--rerank", action="store_true", help="with --context-method fitted: the nested prompts "
                        "by greedy rounds, the decomposition run again after each removal (a backward pass each)")
    parser.add_argument("--batch-size", type=int, default=16, metavar="N",
                        help="corpus mode: texts per batch (default 16)")
    parser.add_argument("--overwrite", action="store_true",
                        help="corpus mode: discard an earlier run with other settings in --out")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--target", default=None, metavar="TEXT",
                       help="causal LMs: the next token to explain (its logit), as text; an answer of "
                       "several tokens explains its log-probability, teacher-forced, token by token; the "
                       "predicted next token by default")
    which.add_argument("--contrast", nargs=2, default=None, metavar=("A", "B"),
                       help="causal LMs: explain logit(A) − logit(B) at the next position (two tokens as "
                       "text, e.g. --contrast \" Paris\" \" London\")")
    which.add_argument("--class", dest="class_index", type=int, default=None, metavar="N",
                       help="sequence classifiers: the class to explain (default: the predicted one)")
    parser.add_argument("--generate", type=int, default=None, metavar="N",
                        help="causal LMs: generate N tokens greedily and explain every one")
    parser.add_argument("--route", choices=("backward", "forward"), default="backward",
                        help="backward (one backward pass, default) or forward (the "
                        "decompositions through every block)")
    parser.add_argument("--components", nargs="?", const="sublayer", default=None,
                        choices=GRANULARITIES, metavar="{block,sublayer,head}",
                        help="also split the explained output over input tokens x components "
                        "(the direct effect of each embedding, attention, FF or head); "
                        "sublayer when given without a value")
    parser.add_argument("--no-maps", action="store_true",
                        help="skip the whole-model maps (computed for base models and inputs of "
                        "up to 256 tokens)")
    add_shared_options(parser, "explain", "model", "out", "format", "device", "dtype", "quiet")
    add_backend_options(parser)
    parser.set_defaults(run=run, flags=FLAGS)


def run(args: argparse.Namespace) -> int:
    from captum_ffb.explain import check_request, explain_text

    if args.context is not None or args.question is not None:
        return _run_context(args)
    if args.audio is not None:
        if args.data is not None or args.model is None:
            raise UsageError("--audio explains one WAV file with a speech encoder–decoder: give --model")
        args.text = args.text or ""
    if (args.text is None) == (args.data is None):
        raise UsageError("give either a TEXT or --data FILE")
    backend, settings = backend_options(args)
    placement = model_placement(args)  # before the model loads
    if args.data is not None:
        if args.contrast is not None:
            raise UsageError("--contrast explains one text: leave out --data")
        return _run_corpus(args, backend, settings, placement)
    if backend != "local":
        raise UsageError("--backend ray is for the corpus mode (--data FILE)")
    formats = parse_formats(args.format)
    if args.generate is not None and args.generate < 1:
        raise UsageError(f"--generate must be at least 1, got {args.generate}")
    out = check_out_dir(args.out)
    from captum_ffb.explained.models import load_model, model_config
    from captum_ffb.texts.text import check_text_request

    config = model_config(args.model)  # the request is checked before the weights load
    check_text_request(args.text, config, args.audio, args.model)
    if _is_encoder_decoder(config):
        if args.contrast is not None:
            raise UsageError("--contrast is for causal LMs (an encoder–decoder explains its target tokens)")
        return _run_seq2seq(args, formats, out, config, placement)
    task = check_request(config, args.text, args.target, args.class_index, args.generate or 0,
                         args.components, contrast=args.contrast)
    if not args.quiet:
        print(f"loading {args.model or 'the bundled all-MiniLM-L6-v2'} ...", file=sys.stderr)
    loaded = load_model(args.model, show_progress=not args.quiet, config=config, task=task,
                        **placement.load_options())
    explanation = explain_text(args.text, loaded, target=args.target, class_index=args.class_index,
                               contrast=None if args.contrast is None else tuple(args.contrast),
                               generate=args.generate or 0, route=args.route,
                               maps=False if args.no_maps else None, components=args.components,
                               show_progress=not args.quiet)
    written = _write_explanation(explanation, formats, out)
    if not args.quiet:
        _print_explanation(explanation, written)
    return 0


def _write_explanation(explanation: Any, formats: list[str], out: Path) -> list[Path]:
    """The explanation's files in ``formats``, written into ``out`` as one output set."""
    with output_set(out) as files:
        written = []
        if "json" in formats:
            written.append(write_json(files.path("explanation.json"), explanation.to_dict()))
        if "html" in formats:
            from captum_ffb.viz.explanation import save_explanation_html

            written.append(save_explanation_html(explanation, files.path("explanation.html")))
        if "png" in formats and explanation.steps:
            from captum_ffb.viz.explanation import plot_contributions

            figure = plot_contributions(explanation)
            written.append(save_figure(figure, files.path("explanation.png"), dpi=150))
        if "png" in formats and explanation.components is not None:
            from captum_ffb.viz.components import plot_components

            figure = plot_components(explanation.components,
                                     title=f'"{explanation.target_labels[0]}": {explanation.explained}')
            written.append(save_figure(figure, files.path("components.png"), dpi=150))
    return files.final(written)


def _print_explanation(explanation: Any, written: list[Path]) -> None:
    """The explanation's summary on stdout: each output's value, its top tokens, the check
    against the forward route, the components, and the files written."""
    print(f"{explanation.model_name}: {len(explanation.tokens)} tokens; explained: "
          f"{explanation.explained}")
    for t, target in enumerate(explanation.target_labels):
        print(f'  "{target}": value {float(explanation.values[t]):.4f} = Σ tokens '
              f"{float(explanation.contributions[t].sum()):.4f} + bias {float(explanation.bias[t]):.4f} "
              f"(token share {_percent(float(explanation.token_share()[t]))}), delta "
              f"{float(explanation.delta[t]):.1e}, first-token share "
              f"{float(explanation.first_token_share()[t]):.0%}")
    for t in range(min(len(explanation.target_labels), TOP_TARGETS)):
        _print_top_tokens(explanation, t)
    if len(explanation.target_labels) > TOP_TARGETS:
        print(f"  (the top tokens of the other {len(explanation.target_labels) - TOP_TARGETS} outputs: "
              "explanation.json)")
    if explanation.target_labels:
        print(LEGEND)
    if explanation.check is not None:
        print(f"  checked against the forward route: its delta "
              f"{explanation.check['forward_route_delta']:.1e}, largest relative difference "
              f"{explanation.check['largest_relative_difference_between_routes']:.1e}")
    if explanation.components is not None:
        _print_components(explanation.components)
    for path in written:
        print(path)


def _run_context(args: argparse.Namespace) -> int:
    """``--context FILE --question TEXT``: the groups of a long context as players."""
    from captum_ffb.explain import check_request
    from captum_ffb.explained.models import load_model, model_config
    from captum_ffb.long_context.attribution import context_attribution
    from captum_ffb.texts.corpus import read_text_file
    from captum_ffb.texts.text import check_text

    if args.context is None or args.question is None:
        raise UsageError("context attribution takes both --context FILE and --question TEXT")
    if args.text is not None or args.data is not None or args.audio is not None:
        raise UsageError("--context explains one context and question: leave out TEXT, --data and --audio")
    for flag, given in (("--class", args.class_index), ("--generate", args.generate), ("--components", args.components),
                        ("--contrast", args.contrast)):
        if given is not None:
            raise UsageError(f"{flag} does not apply to context attribution (--context)")
    if args.presence_steps < 1:
        raise UsageError(f"--presence-steps must be a positive integer, got {args.presence_steps}")
    if args.ablations < 3:
        raise UsageError(f"--ablations must be at least 3, got {args.ablations}")
    if args.focus == 1 or args.focus < 0:
        raise UsageError(f"--focus must be 0 (every group) or at least 2, got {args.focus}")
    if args.rounds < 0:
        raise UsageError(f"--rounds must be 0 or more, got {args.rounds}")
    placement = model_placement(args)
    formats = parse_formats(args.format)
    out = check_out_dir(args.out)
    context = read_text_file(args.context, "--context")
    question = check_text(args.question, name="--question")
    check_text(context, name=f"--context {args.context}")
    config = model_config(args.model)
    task = check_request(config, None, args.target)
    if task != "causal_lm":
        raise UsageError("context attribution explains a causal LM's answer: give --model a causal LM")
    if not args.quiet:
        print(f"loading {args.model or 'the bundled all-MiniLM-L6-v2'} ...", file=sys.stderr)
    loaded = load_model(args.model, show_progress=not args.quiet, config=config, task=task, **placement.load_options())
    from captum_ffb.attr import NormDecomposition

    limit = getattr(config, "max_position_embeddings", None)
    found = context_attribution(NormDecomposition(loaded), loaded.tokenizer, context, question,
                                group_by=args.group_by, target=args.target, template=args.template,
                                max_tokens=limit, method=args.context_method, steps=args.presence_steps,
                                ablations=args.ablations, focus=args.focus or None, rounds=args.rounds,
                                rerank=args.rerank, show_progress=not args.quiet)
    with output_set(out) as files:
        written = []
        if "json" in formats:
            written.append(write_json(files.path("context.json"), found.to_dict()))
            rows = ["index,tokens,contribution,share,text"] + [
                f"{g['index']},{g['tokens']},{g['contribution']!r},{g['share']!r},{_csv_field(g['text'])}"
                for g in found.to_dict()["groups"]]
            written.append(write_text(files.path("context.csv"), "\n".join(rows) + "\n"))
        if "html" in formats:
            from captum_ffb.viz.context import save_context_html

            written.append(save_context_html(found, files.path("context.html")))
        if "png" in formats:
            from captum_ffb.viz.context import plot_context

            written.append(save_figure(plot_context(found), files.path("context.png"), dpi=150))
    written = files.final(written)
    if not args.quiet:
        print(f"{len(found.tokens)} tokens, {len(found.groups)} groups ({args.group_by}, {found.method}); "
              f"explained: {found.target}, {found.equation()}")
        for g, text, value in found.top(5):
            print(f"  #{g:<4} {value:+.4f}  {' '.join(text.split())[:70]}")
        for path in written:
            print(path)
    return 0


def _csv_field(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


#: How many explained outputs get their top tokens printed; how many tokens each.
TOP_TARGETS, TOP_TOKENS = 3, 8
#: What the printed quantities mean, said once below them.
LEGEND = """  what these are:
    value = Σ tokens + bias exactly: each token's contribution is measured from a reference
      input (by default the mean of the inputs, its own share given back to the tokens), and
      the bias holds the model's own bias terms;
      delta = |Σ tokens + bias − value|, the completeness residual (rounding only).
    token share = Σ tokens / value: over 100% when the bias pulls the other way (negative).
    first-token share = |c of the first token| / Σ |c|: how much the first token (often a
      start token that attention rests on) takes."""


def _print_top_tokens(explanation: Any, t: int, count: int = TOP_TOKENS, width: int = 16) -> None:
    """Output ``t``'s ``count`` tokens of largest ``|contribution|``, with a bar of characters:
    to the right of the axis a token raises the value, to the left it lowers it."""
    row = explanation.contributions[t]
    n = row.shape[0]
    labels = explanation.labels or explanation.tokens
    order = row.abs().argsort(descending=True)[:min(count, n)].tolist()
    scale = float(row.abs().max()) or 1.0
    print(f'  top tokens for "{explanation.target_labels[t]}" (█ right of | raises it, left lowers it):')
    for j in order:
        value = float(row[j])
        bar = "█" * max(1, round(width * abs(value) / scale)) if value else ""
        left, right = (bar, "") if value < 0 else ("", bar)
        print(f"    {j:>4} {labels[j]!r:>16} {value:+9.4f} {left:>{width}}|{right}")


def _print_components(table: ComponentAttribution, count: int = 5) -> None:
    """The ``count`` largest entries of :func:`explain_text`'s table (its tokens are set)."""
    tokens = table.tokens[0]
    print(f"  largest direct effects ({table.granularity}), token × component:")
    for j, component, value in table.top(count):
        print(f"    {tokens[j]} × {component}: {value:+.4f}")


def _run_corpus(args: argparse.Namespace, backend: str, settings: dict, placement: ModelPlacement) -> int:
    from captum_ffb.explain import explain_corpus
    from captum_ffb.texts.corpus import read_rows

    for flag, value in (("--target", args.target), ("--class", args.class_index), ("--generate", args.generate),
                        ("--components", args.components)):
        if value is not None:
            raise UsageError(f"{flag} is for one TEXT; the corpus mode explains each text's prediction")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    if not placement.default_dtype:
        raise UsageError(f"--dtype {args.dtype} is for one TEXT: the corpus mode's workers load the "
                         "model in its saved dtype")
    texts, _ = read_rows(args.data)  # blank lines are skipped, listed in skipped.csv
    path = explain_corpus(texts, args.model, args.out, batch_size=args.batch_size, route=args.route,
                          backend=backend, backend_options=settings, overwrite=args.overwrite,
                          show_progress=not args.quiet, device=str(placement.device))
    if not args.quiet:
        explained = len(path.read_text(encoding="utf-8").splitlines())
        skipped = len(texts) - explained
        print(f"{explained} texts explained" + (f"; {skipped} skipped, listed in "
                                                f"{path.with_name('skipped.csv')}" if skipped else ""))
        print(path)
    return 0


def _is_encoder_decoder(config: Any) -> bool:
    from captum_ffb.architectures import get_architecture

    return get_architecture(config.model_type).decoder is not None


def _run_seq2seq(args: argparse.Namespace, formats: list[str], out, config: Any,
                 placement: ModelPlacement) -> int:
    """An encoder–decoder: every token of the target (``SOURCE ||| TARGET``) or of a greedy
    generation (``--generate N``, 20 by default) over the source and the target prefix."""
    from captum_ffb.explain import explain_pair
    from captum_ffb.explained.models import load_model
    from captum_ffb.texts.text import PAIR_SEPARATOR

    for flag, value in (("--class", args.class_index), ("--components", args.components),
                        ("--target", args.target)):
        if value is not None:
            raise UsageError(f"{flag} is not for encoder–decoders: give 'SOURCE {PAIR_SEPARATOR} TARGET' "
                             "or --generate N")
    forced = PAIR_SEPARATOR in args.text or (args.audio is not None and args.text.strip())
    if forced and args.generate is not None:
        raise UsageError(f"give a target ('SOURCE {PAIR_SEPARATOR} TARGET', or a transcript with --audio) or "
                         "--generate N, not both")
    if not forced:
        check_new_tokens(args.generate or DEFAULT_NEW_TOKENS, 1, config, decoder=True, name="--generate")
    loaded = load_model(args.model, show_progress=not args.quiet, task="seq2seq_lm", config=config,
                        **placement.load_options())
    try:
        pair = explain_pair(args.text, loaded, generate=args.generate or 0, route=args.route, audio=args.audio,
                            max_new_tokens=DEFAULT_NEW_TOKENS)
    except ValueError as error:
        raise UsageError(str(error)) from None
    with output_set(out) as files:
        written = []
        title = f"{loaded.name}: {pair.source}"
        views = (pair.result, pair.source_tokens, pair.prefix_tokens, pair.target_tokens)
        if "json" in formats:
            written.append(write_json(files.path("explanation.json"), pair.to_dict()))
        if "html" in formats:
            from captum_ffb.viz.seq2seq import seq2seq_html

            written.append(write_text(files.path("explanation.html"), seq2seq_html(*views, title)))
        if "png" in formats:
            from captum_ffb.viz.seq2seq import plot_seq2seq

            written.append(save_figure(plot_seq2seq(*views, title), files.path("explanation.png"), dpi=150))
    written = files.final(written)
    if not args.quiet:
        print(f"{loaded.name}: {len(pair.source_tokens)} source tokens; {len(pair.target_tokens)} target "
              "tokens explained")
        print(pair.result.table(loaded.tokenizer))
        for path in written:
            print(path)
    return 0


def _percent(share: float) -> str:
    """A token share as a percentage ("–" where the value is 0)."""
    return "–" if share != share else f"{share:.0%}"
