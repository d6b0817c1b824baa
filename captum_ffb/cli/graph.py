"""``captum-ffb graph``: the exact attribution graph of one text's output, as JSON, an offline
HTML page, circuit-tracer's (Neuronpedia's) graph JSON, the graph's own file and a table of
its components, with the top components and nodes printed."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from typing import Any

from captum_ffb.cli._common import UsageError
from captum_ffb.cli._options import (
    add_deprecated_alias,
    add_shared_options,
    default_out,
    model_placement,
)
from captum_ffb.core.keys import is_writer_node
from captum_ffb.core.vocabulary import FEATURE_GRANULARITIES, component_of
from captum_ffb.io.files import check_out_dir, check_out_files, output_set, write_json, write_text

DEFAULT_OUT = default_out("graph")
#: What ``--format`` chooses from.
GRAPH_FORMATS = ("json", "html", "neuronpedia", "npz")
#: The file each format writes.
FILES = {"json": "graph.json", "html": "graph.html", "neuronpedia": "graph_neuronpedia.json", "npz": "graph.npz"}
#: How many components and nodes the summary prints per ranking.
TOP = 5
GRANULARITIES = FEATURE_GRANULARITIES["graph"]
#: The library's parameter names this command's messages show as its flags.
FLAGS = {"corrupted_inputs": "--corrupted", "corrupted": "--corrupted", "class_index": "--class", "node_threshold": "--node-threshold",
         "edge_threshold": "--edge-threshold", "max_nodes": "--max-nodes", "target": "--target"}

EXAMPLES = f"""\
examples:
  captum-ffb graph "When Mary and John went to the store, John gave a drink to" --model ./SmolLM2
      the predicted next token's graph at head granularity, pruned as circuit-tracer prunes,
      into ./{DEFAULT_OUT}/
  captum-ffb graph "When Mary and John went to the store, John gave a drink to" --model ./SmolLM2 \\
      --target " Mary" --corrupted "When Alice and Bob went to the store, Bob gave a drink to"
      every component node also carries its patching estimates from the corrupted prompt;
      the top components and nodes are printed by value and by patch estimate
  captum-ffb graph "The Eiffel Tower is located in the city of" --model ./SmolLM2 --exclude-first
      the first token's writers (an attention sink) set aside from pruning and the rankings
  captum-ffb graph "a charming film" --granularity sublayer --no-prune
      the bundled all-MiniLM-L6-v2 and its sentiment head, every node and every edge
  captum-ffb graph "the cat sat on the mat ||| le chat" --model ./my-marian
      an encoder–decoder: the next target token after the prefix, over [source | target],
      each decoder block's cross-attention a node of its own

files written to --out:
  graph.json              nodes (id, kind, layer, head, position, value, influence, patch
                          estimates) and links (source, target, weight) of the kept graph
  graph.html              an offline page: tokens at the bottom, blocks upwards, the output
                          on top; click a node for its edges and a head's query–key pairs
  graph_neuronpedia.json  the same graph in circuit-tracer's schema (metadata, qParams,
                          nodes, links), for its frontend or Neuronpedia's graph viewer
  graph.npz               the whole graph, every computed node and edge and the pruning, for
                          AttributionGraph.load (re-prune, rank, bind to the model)
  components.csv          every component (head, attention, FF) summed over positions: value,
                          kept nodes, patch estimates; largest |value| first
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "graph",
        help="the exact attribution graph of one output: JSON, an offline page, Neuronpedia's JSON",
        description=(
            "Build the exact attribution graph of TEXT's output (the predicted next token or "
            "class by default): tokens, every attention head (or sublayer) and FF block at "
            "every position, the bias and the output, flow conserved at every node; prune it "
            "as circuit-tracer does and write it as JSON, an offline HTML page and "
            "circuit-tracer's graph JSON."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("text", help="the input text (quote it); for an encoder–decoder, 'SOURCE ||| PREFIX' "
                        "(the next target token after the prefix is explained)")
    parser.add_argument("--target", default=None, metavar="TEXT",
                        help="a causal LM's next token to explain, as text (e.g. ' Mary'); an answer of several "
                        "tokens explains its log-probability, teacher-forced; the prediction by default")
    parser.add_argument("--max-n-logits", type=int, default=None, metavar="K",
                        help="several outputs at once: the most probable next tokens (at most K, until "
                             "--desired-logit-prob of the probability), a logit node each (a causal LM; not with --target)")
    parser.add_argument("--desired-logit-prob", type=float, default=0.95, metavar="P",
                        help="the probability mass --max-n-logits tokens reach (default 0.95)")
    parser.add_argument("--class", dest="class_index", type=int, default=None, metavar="K",
                        help="a sequence classifier's class to explain; the predicted one by default")
    parser.add_argument("--granularity", default="head", choices=GRANULARITIES,
                        help="writer nodes: each attention sublayer, each head (default) or each "
                        "FF neuron (heads too), at each position")
    parser.add_argument("--corrupted", default=None, metavar="TEXT",
                        help="a corrupted prompt of the same length in tokens: every component node "
                        "then carries its patching estimates")
    add_deprecated_alias(parser, "--baseline", "--corrupted", dest="corrupted", metavar="TEXT")
    parser.add_argument("--node-threshold", type=float, default=0.8, metavar="SHARE",
                        help="pruning: the share of influence on the output the kept nodes hold "
                        "(default 0.8, circuit-tracer's)")
    parser.add_argument("--edge-threshold", type=float, default=0.98, metavar="SHARE",
                        help="pruning: the share the kept edges hold (default 0.98)")
    parser.add_argument("--no-prune", action="store_true", help="keep every node and every non-zero edge")
    parser.add_argument("--max-nodes", type=int, default=None, metavar="N",
                        help="compute edges for the N writer nodes of largest |value| only (default 256 when "
                        "pruning, every node with --no-prune)")
    parser.add_argument("--exclude-first", action="store_true",
                        help="set the first position's writers (an attention sink) aside from pruning and the "
                        "rankings")
    parser.add_argument("--neuronpedia", action="store_true",
                        help="write graph_neuronpedia.json (also when --format leaves it out)")
    parser.add_argument("--model-name", default=None, metavar="NAME",
                        help="the model's name in graph_neuronpedia.json (Neuronpedia's scan); default: "
                        "the model folder's name (a file never holds the folder's path)")
    parser.add_argument("--format", default=",".join(GRAPH_FORMATS), metavar="LIST",
                        help=f"comma list of {', '.join(GRAPH_FORMATS)} (default: all four; components.csv "
                        "is always written)")
    add_shared_options(parser, "graph", "model", "out", "device", "dtype", "quiet")
    parser.set_defaults(run=run, flags=FLAGS)


def _query_key(graph: Any, formats: list[str], say: Any) -> dict[str, Any] | None:
    """The query–key pairs of the largest heads, computed once for the page and the
    Neuronpedia file (``None`` where neither is written)."""
    if "html" not in formats and "neuronpedia" not in formats:
        return None
    from captum_ffb.viz.neuronpedia import query_key_of

    say("query–key pairs of the largest heads ...")
    return query_key_of(graph)


def model_name(chosen: str | None, model: str | None) -> str:
    """The model's name for a file: the one chosen (``--model-name``), else the model folder's
    name (the bundled model's when none is given); never a path."""
    from pathlib import PurePath

    from captum_ffb.explained.models import DEFAULT_MODEL

    if chosen is not None:
        if not chosen.strip() or "/" in chosen or "\\" in chosen:
            raise UsageError(f"--model-name is a name, not a path, got {chosen!r}")
        return chosen
    if model is None:
        return DEFAULT_MODEL
    return PurePath(str(model).rstrip("/\\")).name or DEFAULT_MODEL


def _formats(value: str, neuronpedia: bool) -> list[str]:
    formats = [f.strip().lower() for f in value.split(",") if f.strip()]
    unknown = [f for f in formats if f not in GRAPH_FORMATS]
    if unknown or not formats:
        raise UsageError(f"unknown format {unknown[0] if unknown else value!r}; choose from {', '.join(GRAPH_FORMATS)}")
    if neuronpedia and "neuronpedia" not in formats:
        formats.append("neuronpedia")
    return list(dict.fromkeys(formats))


def _check_numbers(args: argparse.Namespace) -> None:
    """The thresholds, ``--max-nodes`` and the several outputs' options, before the weights load."""
    for name in ("node_threshold", "edge_threshold"):
        value = getattr(args, name)
        if not 0.0 <= value <= 1.0:
            raise UsageError(f"--{name.replace('_', '-')} must lie between 0 and 1, got {value}")
    if args.max_nodes is not None and args.max_nodes < 1:
        raise UsageError(f"--max-nodes must be at least 1, got {args.max_nodes}")
    if args.max_n_logits is not None and args.target is not None:
        raise UsageError("--max-n-logits explains the most probable next tokens: give it without --target")
    if args.max_n_logits is not None and not 1 <= args.max_n_logits <= 1000:
        raise UsageError(f"--max-n-logits must be from 1 to 1000, got {args.max_n_logits}")
    if not 0.0 < args.desired_logit_prob <= 1.0:
        raise UsageError(f"--desired-logit-prob must lie in (0, 1], got {args.desired_logit_prob}")


def run(args: argparse.Namespace) -> int:
    """Build the graph of ``args.text`` and write the chosen files."""
    from captum_ffb.cli import as_flags
    from captum_ffb.texts.text import check_text

    check_text(args.text)
    if args.corrupted is not None:
        check_text(args.corrupted, name="--corrupted")  # before the weights load
    formats = _formats(args.format, args.neuronpedia)
    scan = model_name(args.model_name, args.model)  # checked before the weights load
    _check_numbers(args)
    placement = model_placement(args)
    out = check_out_dir(args.out)
    check_out_files(out, ["components.csv", *(FILES[f] for f in formats)])
    from captum_ffb.explain import check_request
    from captum_ffb.explained.models import load_model, model_config

    config = model_config(args.model)
    from captum_ffb.architectures import get_architecture

    if get_architecture(config.model_type).decoder is not None:  # 'SOURCE ||| PREFIX', the next target token
        if args.class_index is not None:
            raise UsageError("--class needs a sequence classifier")
        task = "seq2seq_lm"
    else:
        task = check_request(config, args.text, args.target, args.class_index)
    say = (lambda message: None) if args.quiet else (lambda message: print(message, file=sys.stderr, flush=True))
    say(f"loading {args.model or 'the bundled all-MiniLM-L6-v2'} ...")
    loaded = load_model(args.model, show_progress=not args.quiet, config=config, task=task,
                        **placement.load_options())
    from captum_ffb.explain import graph_text

    try:
        graph = graph_text(args.text, loaded, target=args.target, class_index=args.class_index,
                           corrupted=args.corrupted, granularity=args.granularity, prune=not args.no_prune,
                           node_threshold=args.node_threshold, edge_threshold=args.edge_threshold,
                           max_nodes=args.max_nodes, exclude_positions=(0,) if args.exclude_first else (),
                           max_n_logits=args.max_n_logits, desired_logit_prob=args.desired_logit_prob)
    except ValueError as error:
        raise UsageError(as_flags(str(error), FLAGS)) from None
    as_dicts = [f for f in formats if f != "npz"]
    if as_dicts:
        from captum_ffb.graph.record import MAX_DICT_LINKS

        try:
            graph.kept_links(MAX_DICT_LINKS)
        except ValueError as error:
            raise UsageError(f"{error}; with --no-prune, write only --format npz (graph.npz holds every edge), "
                             f"or prune (drop --no-prune) for {', '.join(as_dicts)}") from None
    with output_set(out) as files:
        written = [write_text(files.path("components.csv"), components_csv(graph))]
        if "json" in formats:
            written.append(write_json(files.path(FILES["json"]), graph.to_dict()))
        query_key = _query_key(graph, formats, say)
        if "html" in formats:
            from captum_ffb.viz.graph import save_graph_html

            written.append(save_graph_html(graph, files.path(FILES["html"]), query_key=query_key))
        if "neuronpedia" in formats:
            from captum_ffb.viz.neuronpedia import save_neuronpedia_graph

            written.append(save_neuronpedia_graph(graph, files.path(FILES["neuronpedia"]), args.text,
                                                  scan=scan,
                                                  tokenizer=loaded.tokenizer, query_key=query_key))
        if "npz" in formats:  # last: with the edges' estimates the other files computed
            written.append(graph.save(files.path(FILES["npz"])))
    written = files.final(written)
    if not args.quiet:
        _summary(graph, loaded.name)
        for path in written:
            print(path)
    return 0


def components_csv(graph: Any) -> str:
    """``components.csv``: every component of the graph (its nodes summed over positions,
    excluded positions left out), largest ``|value|`` first: ``component``, ``value``,
    ``kept_nodes`` (how many of its nodes the pruning kept) and one ``patch_<estimator>``
    column per patching estimator."""
    d = graph.data
    values = graph.ranking("value", "component", top=None)
    patches = {name: dict(graph.ranking("patch", "component", top=None, estimator=name))
               for name in graph.patch_estimates}
    kept: dict[str, int] = {}
    for k in graph.node_mask.nonzero()[:, 0].tolist():
        if is_writer_node(d.kinds[k]) and d.positions[k] not in graph.excluded_positions:
            name = component_of(d.kinds[k], d.layers[k], d.heads[k])
            kept[name] = kept.get(name, 0) + 1
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["component", "value", "kept_nodes", *(f"patch_{name}" for name in patches)])
    for name, value in values:
        writer.writerow([name, f"{value:.6g}", kept.get(name, 0),
                         *(f"{patch[name]:.6g}" if name in patch else "" for patch in patches.values())])
    return buffer.getvalue()


def _summary(graph: Any, model_name: str) -> None:
    d = graph.data
    writers = {k for k, kind in enumerate(d.kinds) if is_writer_node(kind)}
    computed = "every node" if d.computed is None else \
        f"the {int(d.computed.sum())} writer nodes whose edges were computed ({len(writers) - int(d.computed.sum())} " \
        "left out, their flow counted as left out)"
    print(f"{model_name}: {len(graph.tokens)} tokens; explained “{graph.output_label}”, value {graph.value:.4f}")
    share, absolute = graph.kept_share, graph.kept_abs_share
    print(f"  {len(d)} nodes and {len(d.weights)} edges; kept {int(graph.node_mask.sum())} nodes and "
          f"{int(graph.edge_mask.sum())} edges holding {_percent(share)} of the output ({_percent(absolute)} of its "
          f"edges' |weight|); largest flow residual over {computed}: {graph.flow_residual():.1e}")
    if graph.excluded_positions:
        print(f"  set aside: the writers at position(s) {', '.join(map(str, graph.excluded_positions))}")
    rankings = [("value", "")]
    if graph.patch_estimates:
        rankings.append(("patch", " (patch estimate, every computed component, kept or not)"))
    for by, note in rankings:
        for level in ("component", "node"):
            print(f"  top {level}s by {by}{note}:")
            for name, score in graph.ranking(by, level, top=TOP):
                where = ""
                if level == "node":
                    position = int(name.rsplit("@", 1)[1])
                    where = f" ({graph.tokens[position]})" if 0 <= position < len(graph.tokens) else ""
                print(f"    {name}{where}: {score:+.4f}")


def _percent(share: float) -> str:
    return "–" if share != share else f"{share:.1%}"
