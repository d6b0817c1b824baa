"""``captum-ffb lit``: our methods in LIT, the Learning Interpretability Tool, next to its own."""

from __future__ import annotations

import argparse
import sys

from captum_ffb.cli._common import UsageError, check_port
from captum_ffb.cli._options import add_deprecated_alias, add_shared_options, model_placement

DEFAULT_PORT = 5432

EXAMPLES = f"""\
examples:
  captum-ffb lit
      the bundled all-MiniLM-L6-v2 with its sentiment head and a few example sentences, at
      http://127.0.0.1:{DEFAULT_PORT}: pick an example (or type one in the Editor tab) and read
      NormDecomposition's contributions next to LIME and LIT's gradient methods
  captum-ffb lit --data rotten_tomatoes --port 8080
      the first 200 held-out Rotten Tomatoes snippets, with their labels
  captum-ffb lit --model ./my-classifier --data reviews.csv
      a sequence classifier and the texts of a file (.txt, .jsonl, .csv or .tsv)
  captum-ffb lit --model ./SmolLM2
      a causal LM: LIT's Sequence Salience module, with NormDecomposition next to its
      gradients (click the target tokens to explain)

views (Salience Maps module, or Sequence Salience for causal LMs):
  NormDecomposition  the exact contribution of every token to the logit of the class chosen
                     in "Class to explain" (the predicted class first); with the bias they
                     add up to the logit; shown in logit units (settings: or as shares)
  Layer maps         one layer's token-to-token map at one scope (settings: layer, scope),
                     one row per token: how that token's vector is made of the input tokens
LIT's page is served with its icon fonts from this package: it asks no other host.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "lit",
        help="a LIT server with NormDecomposition and the layer maps next to LIME and gradients",
        description=(
            "Start LIT (the Learning Interpretability Tool; pip install 'captum_ffb[lit]' && "
            "pip install --no-deps lit-nlp==1.3.1) on a "
            "model and some texts, with our salience methods next to LIT's own."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", default=None, metavar="FILE",
                        help="rotten_tomatoes (the held-out snippets) or a .txt, .jsonl, .csv or "
                        ".tsv file; a few example sentences by default")
    parser.add_argument("--n", type=int, default=200, metavar="N",
                        help="how many texts of --data to show (default 200)")
    add_deprecated_alias(parser, "--examples", "--n", dest="n", type=int)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="N",
                        help=f"the port (default {DEFAULT_PORT}; 0: a free one)")
    parser.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                        help="the address to serve on (default 127.0.0.1, this machine only)")
    add_shared_options(parser, "lit", "model", "device", "quiet")
    parser.set_defaults(run=run)


def _quiet_logs() -> None:
    """LIT's own messages below errors (absl), and no line per request (werkzeug)."""
    import logging

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> int:
    from captum_ffb.explained.models import load_model, model_config, task_from_config
    from captum_ffb.integrations import lit as ffb_lit

    try:
        ffb_lit.require_lit()
    except ImportError as error:
        raise UsageError(str(error)) from None
    if args.n < 1:
        raise UsageError(f"--n must be at least 1, got {args.n}")
    check_port(args.host, args.port)
    if args.data is not None:
        from captum_ffb.texts.corpus import read_texts

        read_texts(args.data, n=1)  # a missing or empty file fails before the weights load
    placement = model_placement(args)  # a device this machine has, before the weights load
    _quiet_logs()
    config = model_config(args.model)
    task = task_from_config(config)
    if task == "base":
        from captum_ffb.explained.readouts import fits_minilm_head

        if not fits_minilm_head(config):
            raise UsageError("a base model has nothing to explain in LIT: give a sequence "
                             "classifier, a causal LM or the bundled all-MiniLM-L6-v2")
    if not args.quiet:
        print(f"loading {args.model or 'the bundled all-MiniLM-L6-v2'} ...", file=sys.stderr)
    loaded = load_model(args.model, show_progress=not args.quiet, config=config, task=task,
                        **placement.load_options())
    app = ffb_lit.build_app(loaded, args.data, args.n)
    ffb_lit.serve(app, args.host, args.port, quiet=args.quiet)
    return 0
