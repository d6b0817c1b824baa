"""``captum-ffb maps``: the maps of one text as PNG figures, an HTML view and JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from captum_ffb.cli._common import UsageError, check_model_options
from captum_ffb.cli._options import (
    add_shared_options,
    default_out,
    model_placement,
    parse_formats,
    parse_layers,
    parse_scopes,
)
from captum_ffb.io.files import check_out_dir, output_set, save_figure, write_json

DEFAULT_OUT = default_out("maps")
#: Resolutions the PNG figures may take.
DPI_RANGE = (10, 1200)

EXAMPLES = f"""\
examples:
  captum-ffb maps "The cat sat on the mat."
      all layers and scopes of the bundled all-MiniLM-L6-v2, offline, into ./{DEFAULT_OUT}/
  captum-ffb maps "Tokyo is the capital of [MASK]." --layer 5 --format png
  captum-ffb maps "She loves math rather than" --model ./my-gpt2 --layer 2 --out gpt2_maps
  captum-ffb maps "Hello world" --scopes Atb AtbFf --format html,json
  captum-ffb maps "the cat sat ||| le chat" --model ./my-marian
      an encoder–decoder: SOURCE ||| TARGET; the decoder layers' maps over [source | target]
      (the cross-attention's own map is scope Cross)

files written to --out:
  maps_layerNN.png  one figure per layer: a panel per scope and the FF-amp difference map
  maps.html         a self-contained interactive view (open it in any browser, offline)
  maps.json         tokens, maps [layer][scope][i][j] = ||F_i(x_j)||, FF-amp maps and the
                    completeness residuals
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "maps",
        help="maps of one text: PNG figures, an interactive HTML view and JSON",
        description=(
            "Decompose every chosen layer of a model on TEXT and write the token-to-token "
            "maps of every scope: paper-style figures, an offline HTML view and a JSON file."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("text", help="the input text (quote it); for an encoder–decoder, "
                        "'SOURCE ||| TARGET'")
    parser.add_argument(
        "--audio", default=None, metavar="WAV",
        help="speech encoder–decoders (Whisper): the source, a WAV file; TEXT is then the target "
        "(prompt tokens included)",
    )
    parser.add_argument(
        "--layer",
        default="all",
        metavar="N|all",
        help="layer index (negative counts from the end), a comma list such as 0,5, or all "
        "(default)",
    )
    parser.add_argument(
        "--normalize", choices=("none", "row", "column", "exclude-special"), default="exclude-special",
        help="the figures' colours: exclude-special (default: raw norms on a scale set without the first "
        "and special tokens, which would saturate it), none (raw norms), row or column (each sums to 1)",
    )
    parser.add_argument(
        "--dpi", type=int, default=150,
        help=f"resolution of the PNG figures, {DPI_RANGE[0]} to {DPI_RANGE[1]} (default 150)",
    )
    add_shared_options(parser, "maps", "model", "scopes", "out", "format", "device", "dtype", "quiet")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Compute the maps of ``args.text`` and write the requested files."""
    from captum_ffb.explained.models import load_model, model_config
    from captum_ffb.texts.text import check_text, check_text_request, text_maps

    check_text(args.text)
    formats = parse_formats(args.format)
    layers = parse_layers(args.layer)
    scopes = parse_scopes(args.scopes)
    if not DPI_RANGE[0] <= args.dpi <= DPI_RANGE[1]:
        raise UsageError(f"--dpi must lie between {DPI_RANGE[0]} and {DPI_RANGE[1]}, got {args.dpi}")
    placement = model_placement(args)
    out = check_out_dir(args.out)
    config = model_config(args.model)  # layers, scopes and the text fail before the weights load
    check_model_options(config, layers, scopes)
    check_text_request(args.text, config, args.audio, args.model)

    def say(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    say(f"loading {args.model or 'the bundled all-MiniLM-L6-v2'} ...")
    from captum_ffb.architectures import get_architecture

    # an encoder–decoder loads with its LM head (its checkpoint's own layout)
    task = "seq2seq_lm" if get_architecture(config.model_type).decoder is not None else None
    loaded = load_model(args.model, show_progress=not args.quiet, config=config, task=task,
                        **placement.load_options())
    try:
        maps = text_maps(args.text, loaded, layers=layers, scopes=scopes, show_progress=not args.quiet,
                         audio=args.audio)
    except ValueError as error:
        raise UsageError(str(error)) from None
    with output_set(out) as files:
        written = []
        if "json" in formats:
            written.append(_write_json(maps, files.path("maps.json")))
        if "html" in formats:
            from captum_ffb.viz.html import save_html

            written.append(save_html(maps, files.path("maps.html")))
        if "png" in formats:
            written += _write_pngs(maps, files.staging, args.dpi, args.quiet, args.normalize)
    written = files.final(written)
    if not args.quiet:
        worst = max(d for per_layer in maps.delta.values() for d in per_layer.values())
        print(
            f"{maps.model_name}: {len(maps.tokens)} tokens, layers "
            f"{', '.join(map(str, maps.layers))}, scopes {', '.join(maps.scopes)}; "
            f"largest completeness residual {worst:.2e}"
        )
        for path in written:
            print(path)
    return 0


def _write_json(maps: Any, path: Path) -> Path:
    from captum_ffb.viz import ff_pair_of

    data = maps.to_dict()
    pair = ff_pair_of(maps.scopes, maps.ff_pair)
    data["ff_amp_pair"] = list(pair) if pair else None
    for layer in maps.layers:
        entry = data["layers"][str(layer)]
        entry["ff_amp"] = maps.ff_amp(layer).tolist() if pair else None
    return write_json(path, data)


def _write_pngs(maps: Any, out: Path, dpi: int, quiet: bool, normalize: str = "exclude-special") -> list[Path]:
    from tqdm.auto import tqdm

    from captum_ffb.viz.figures import plot_maps

    paths = []
    for layer in tqdm(maps.layers, desc="figures", unit="layer", disable=quiet):
        figure = plot_maps(maps, layer=layer, normalize=normalize)
        path = out / f"maps_layer{layer:02d}.png"
        save_figure(figure, path, dpi=dpi)
        paths.append(path)
    return paths
