"""``captum-ffb env``: what this environment holds and can do, to paste into a bug report."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

EXAMPLES = """\
examples:
  captum-ffb env
      versions (Python, torch, transformers, Captum, numpy) against the tested ranges, the
      devices, every optional feature with the line that makes it usable, and whether the
      installed packages break one another's pins
  captum-ffb env --short
      the versions and devices only
  captum-ffb env --json > env.json
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "env",
        help="versions, devices and usable features of this environment (for bug reports)",
        description=(
            "Print the versions of Python and the libraries captum_ffb hooks into against "
            "the ranges it was tested with, the devices, whether each optional feature is "
            "usable (and the one line that fixes it where it is not), and whether the "
            "installed packages are consistent. Paste it into a bug report."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--short", action="store_true", help="the versions and devices only")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from captum_ffb.environment import environment_report

    report = environment_report()
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print(report.format(short=args.short))
    return 0
