"""``python -m captum_ffb.app [--model DIR] [--port N] [--host ADDR]``: the local Gradio app,
the same as ``captum-ffb app`` (see :mod:`captum_ffb.integrations.gradio_app`)."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from captum_ffb.cli import main

    sys.exit(main(["app", *sys.argv[1:]]))
