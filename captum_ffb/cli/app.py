"""``captum-ffb app``: a local Gradio app to explain texts in the browser."""

from __future__ import annotations

import argparse
import sys

from captum_ffb.cli._common import UsageError, check_model_options, check_port
from captum_ffb.cli._options import add_shared_options, model_placement

EXAMPLES = """\
examples:
  captum-ffb app
      the bundled all-MiniLM-L6-v2 (its sentiment head), offline, at http://127.0.0.1:7860
      (or the next free port); type a text and press Explain
  captum-ffb app --model ./SmolLM2 --port 8080
      a causal LM: the next token or N generated tokens explained
  python -m captum_ffb.app --model ./my-classifier
      the same command line

the page's tabs:
  Contributions  every token's contribution to the output (a figure and a table), the value,
                 bias, convergence delta and first-token share, and the interactive page of
                 `captum-ffb explain` (first-token toggle, whole-model maps)
  Layer maps     the token-to-token maps of a layer per scope with the FF-amp panel, and the
                 interactive view (scope picker, FF-amp overlay, hover)
  Components     the output split over tokens x components (block, sublayer or head)

It listens on 127.0.0.1 (this machine only) unless --host says otherwise, sends no telemetry
and needs no network. Stop it with Ctrl+C. Needs gradio: pip install 'captum_ffb[app]'.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "app",
        help="a local Gradio app: type a text, see which tokens drove the output",
        description=(
            "Serve a local web app (Gradio) on one model: type a text and see the exact "
            "contribution of every token to the output, the maps of every layer and scope, "
            "and the output split over components."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=None, metavar="N",
                        help="the port (default: the first free one from 7860)")
    parser.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                        help="the address to listen on (default 127.0.0.1: this machine only; "
                        "0.0.0.0 opens the app to the network)")
    add_shared_options(parser, "app", "model", "device", "quiet")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from captum_ffb.explained.models import load_model, model_config
    from captum_ffb.integrations.gradio_app import import_gradio, launch

    try:
        import_gradio()
    except ImportError as error:
        raise UsageError(str(error)) from None
    check_port(args.host, args.port)
    if args.port == 0:
        args.port = None  # Gradio's first free port
    placement = model_placement(args)  # a device this machine has, before the weights load
    config = model_config(args.model)
    check_model_options(config)
    if not args.quiet:
        print(f"loading {args.model or 'the bundled all-MiniLM-L6-v2'} ...", file=sys.stderr)
    loaded = load_model(args.model, show_progress=not args.quiet, config=config, task="auto",
                        **placement.load_options())
    launch(loaded, host=args.host, port=args.port, quiet=args.quiet)
    return 0
