"""Side-by-side heat maps of several methods' maps of one layer (matplotlib)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import Tensor

from captum_ffb.io.files import save_figure


def load_pyplot():
    """``matplotlib.pyplot`` on the Agg backend; ``ValueError`` with the install hint without it."""
    try:
        import matplotlib
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ValueError("figures need matplotlib: pip install 'captum_ffb[viz]'") from error
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def side_by_side(
    maps: Mapping[str, Tensor],
    tokens: Sequence[str],
    path: str | Path,
    title: str = "",
    columns: int = 5,
    dpi: int = 120,
) -> Path:
    r"""Write one heat map per method, each scaled to its own maximum, to an image file.

    Args:
        maps (Mapping[str, Tensor]): name → ``(n, n)`` map (rows: outputs ``i``, columns:
                    inputs ``j``).
        tokens (Sequence[str]): the ``n`` token labels.
        path (str or Path): the file to write (PNG, PDF, SVG by its suffix).
        title (str): the figure's title.
        columns (int): panels per row.
        dpi (int): resolution.

    Returns:
        the path written.
    """
    if not maps:
        raise ValueError("no maps to draw")
    plt = load_pyplot()
    names = list(maps)
    n = len(tokens)
    cols = max(1, min(columns, len(names)))
    rows = math.ceil(len(names) / cols)
    size = max(2.6, 0.28 * n + 1.0)
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, size * rows + 0.6), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        image = maps[name].detach().float().cpu().numpy()
        peak = float(abs(image).max()) or 1.0
        ax.imshow(image / peak, cmap="Reds", vmin=0.0, vmax=1.0)
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xticklabels(tokens, rotation=90, fontsize=6)
        ax.set_yticklabels(tokens, fontsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = save_figure(fig, path, dpi=dpi)
    plt.close(fig)
    return path


def timing_plot(
    seconds: Mapping[str, Mapping[int, float]], path: str | Path, title: str = "", dpi: int = 120
) -> Path:
    """Seconds against sequence length, one line per method (log scale)."""
    plt = load_pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for method, by_n in seconds.items():
        lengths = sorted(by_n)
        ax.plot(lengths, [max(by_n[n], 1e-4) for n in lengths], marker="o", label=method)
    ax.set_yscale("log")
    ax.set_xlabel("tokens n")
    ax.set_ylabel("seconds (activation of one layer)")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = save_figure(fig, path, dpi=dpi)
    plt.close(fig)
    return path
