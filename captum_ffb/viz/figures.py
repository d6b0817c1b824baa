"""Paper-style matplotlib figures: one heatmap per scope plus the FF-amp difference map."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from captum_ffb.texts.text import TextMaps
from captum_ffb.viz._common import (
    cpu_view,
    display_tokens,
    ff_amp_of,
    ff_pair_of,
    layer_maps,
    pick_layers,
    pick_scopes,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

NORMALIZATIONS = ("none", "row", "column", "exclude-special")


@functools.lru_cache(maxsize=1)
def figure_class() -> type:
    """The matplotlib ``Figure`` subclass of the views: it shows as a PNG in notebooks."""
    from matplotlib.figure import Figure

    class MapsFigure(Figure):
        """A matplotlib figure that notebooks show as a PNG even before pyplot is imported."""

        def _repr_png_(self) -> bytes:
            import io

            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=100)
            return buffer.getvalue()

    return MapsFigure


def require_matplotlib() -> None:
    """Raise ``ImportError`` with the install hint when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "figures need matplotlib: pip install 'captum_ffb[viz]'"
        ) from error


def _normalized(matrix: Tensor, how: str) -> Tensor:
    if how in ("none", "exclude-special"):
        return matrix
    dim = -1 if how == "row" else -2
    total = matrix.sum(dim=dim, keepdim=True)
    return matrix / torch.where(total == 0, torch.ones_like(total), total)


@cpu_view
def plot_maps(
    maps: TextMaps | Mapping[str, Tensor],
    layer: int | Sequence[int] | None = None,
    scopes: str | Sequence[str] | None = None,
    tokens: Sequence[str] | None = None,
    ff_amp: bool = True,
    ff_pair: tuple[str, str] | None = None,
    normalize: str = "none",
    cmap: str = "Reds",
    amp_cmap: str = "RdBu_r",
    panel_size: float | None = None,
    ncols: int | None = None,
    title: str | None = None,
) -> Figure:
    r"""Draw the maps of one or more layers as paper-style heatmaps.

    Each row of panels is a layer, each panel a scope (``[i, j] = ‖F_i(x_j)‖``: output
    token ``i`` on the vertical axis, input token ``j`` on the horizontal one), and the last
    panel is the FF-amp matrix (column-normalised map after FF minus before FF) with a
    diverging colormap centred on zero, as in Figs. 4, 9 and 10 of Kobayashi et al. (2024).

    Args:
        maps (TextMaps or dict): from :func:`captum_ffb.texts.text.text_maps`, or a single layer's
                    ``scope → (n, n)`` maps (then ``tokens`` is required).
        layer (int or list[int], optional): computed layer(s) to draw; all by default.
        scopes (str or list[str], optional): scopes to draw; all by default.
        tokens (list[str], optional): token labels; taken from ``maps`` when it is a
                    ``TextMaps``.
        ff_amp (bool): add the FF-amp panel when the scopes before and after FF are present.
        ff_pair (tuple[str, str], optional): the (before, after) FF scopes; found from the
                    scope names by default.
        normalize (str): ``"none"`` (raw norms), ``"row"`` or ``"column"`` (each sums to 1), or
                    ``"exclude-special"``: raw norms on a colour scale set without the first
                    token's and the special tokens' rows and columns (``[CLS]``, ``<s>`` …:
                    where attention rests, their norms can be a hundred times the rest's);
                    those cells go past the scale (the colour bar's arrow).
        cmap (str): colormap of the scope panels.
        amp_cmap (str): diverging colormap of the FF-amp panel.
        panel_size (float, optional): inches per panel; grows with the number of tokens by
                    default.
        ncols (int, optional): panels per row; by default one row per layer, wrapped to 3
                    columns for a single layer of more than 24 tokens.
        title (str, optional): the figure title; the text and model by default.

    Returns:
        matplotlib.figure.Figure
    """
    require_matplotlib()
    Figure = figure_class()
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")
    rows, labels, default_title, scope_names, pair = _rows(maps, layer, scopes, tokens, ff_pair)
    pair = pair if ff_amp else None
    n = len(labels)
    panels: list[tuple[int, str]] = []  # (row of `rows`, scope name or "" for FF-amp)
    for index in range(len(rows)):
        panels += [(index, s) for s in scope_names] + ([(index, "")] if pair else [])
    per_row = len(panels) // len(rows)
    if ncols is None:
        # one layer with many tokens: wrap the panels so that they stay readable
        ncols = per_row if len(rows) > 1 or n <= 24 else min(per_row, 3)
    ncols = max(1, min(int(ncols), len(panels)))
    nrows = -(-len(panels) // ncols)
    size = panel_size or min(7.0, max(3.0, 0.12 * n + 2.0))
    captioned = title is None and normalize != "none"  # a second title line says what the colours are
    fig = Figure(figsize=(ncols * size * 1.15, nrows * size + (0.95 if captioned else 0.6)), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    font = max(3.0, min(9.0, 26.0 * size / max(n, 1)))
    # an encoder–decoder's decoder layers: only the target's rows (the last ones) hold values
    shown = maps.rows if isinstance(maps, TextMaps) else slice(None)
    _draw_panels(fig, axes, panels, rows, labels, shown, font, normalize, cmap, amp_cmap, pair)
    _label_axes(axes, len(panels), ncols)
    fig.suptitle(_heading(title, default_title, normalize), fontsize=11)
    return fig


def _draw_panels(fig: Figure, axes: Sequence[Axes], panels: list[tuple[int, str]],
                 rows: list[tuple[str, Mapping[str, Tensor]]], labels: list[str], shown: Any,
                 font: float, normalize: str, cmap: str, amp_cmap: str, pair: tuple | None) -> None:
    """One heatmap per panel: a scope's (normalised) map, or the FF-amp map (scope ``""``)."""
    for ax, (index, scope) in zip(axes, panels):
        row_label, scope_maps = rows[index]
        if scope:
            matrix = _normalized(scope_maps[scope].detach().float().cpu(), normalize)
            vmax = _scale_without_special(matrix, labels, shown) if normalize == "exclude-special" else None
            _heatmap(fig, ax, matrix[shown], labels, font, cmap, vmin=0.0, vmax=vmax, row_labels=labels[shown])
            ax.set_title(f"{row_label}{scope}", fontsize=10)
        else:
            amp = ff_amp_of(scope_maps, pair).cpu()
            bound = float(amp.abs().max()) or 1.0
            _heatmap(fig, ax, amp[shown], labels, font, amp_cmap, vmin=-bound, vmax=bound,
                     row_labels=labels[shown])
            ax.set_title(f"{row_label}FF-amp ({pair[1]} − {pair[0]})", fontsize=10)


def _label_axes(axes: Sequence[Axes], panels: int, ncols: int) -> None:
    """Axis labels on the first column and the bottom row; the unused axes hidden."""
    for k, ax in enumerate(axes):
        if k >= panels:
            ax.set_visible(False)
            continue
        if k % ncols == 0:
            ax.set_ylabel("output token i")
        if k + ncols >= panels:
            ax.set_xlabel("input token j")


def _heading(title: str | None, default_title: str, normalize: str) -> str:
    """The figure's title: ``title``, or the default one with a line on what the colours are."""
    heading = title if title is not None else default_title
    if normalize == "exclude-special" and title is None:
        heading += "\ncolours: ‖F_i(x_j)‖ on a scale set without the first and special tokens (they go past it)"
    elif normalize in ("row", "column") and title is None:
        heading += f"\ncolours: each {normalize} sums to 1"
    return heading


def special_positions(labels: Sequence[str]) -> list[int]:
    """The first position and those whose token looks special (``[CLS]``, ``<s>``, ``<|…|>``)."""
    found = [0] if labels else []
    for k, label in enumerate(labels):
        text = label.strip()
        if k and len(text) > 2 and ((text[0], text[-1]) in (("[", "]"), ("<", ">"))):
            found.append(k)
    return found


def _scale_without_special(matrix: Tensor, labels: Sequence[str], shown: Any) -> float | None:
    """The largest value of ``matrix``'s shown rows outside the special rows and columns."""
    keep_columns = torch.ones(matrix.shape[1], dtype=torch.bool)
    keep_columns[special_positions(list(labels))] = False
    keep_rows = keep_columns.clone()[shown] if matrix.shape[0] == matrix.shape[1] else torch.ones(
        matrix[shown].shape[0], dtype=torch.bool)
    inner = matrix[shown][keep_rows][:, keep_columns]
    if inner.numel() == 0 or float(inner.max()) <= 0:
        return None
    return float(inner.max())


def _rows(
    maps: TextMaps | Mapping[str, Tensor],
    layer: int | Sequence[int] | None,
    scopes: str | Sequence[str] | None,
    tokens: Sequence[str] | None,
    ff_pair: tuple[str, str] | None,
) -> tuple[list[tuple[str, Mapping[str, Tensor]]], list[str], str, list[str], tuple | None]:
    if isinstance(maps, TextMaps):
        labels = display_tokens(tokens if tokens is not None else maps.tokens)
        names = pick_scopes(maps.scopes, scopes)
        rows = [(f"layer {i}: ", layer_maps(maps, i)) for i in pick_layers(maps, layer)]
        pair = ff_pair_of(maps.scopes, ff_pair or maps.ff_pair)
        short = maps.text if len(maps.text) <= 80 else maps.text[:77] + "..."
        return rows, labels, f"{maps.model_name}: “{short}”", names, pair
    if not isinstance(maps, Mapping) or not maps:
        raise TypeError("maps must be TextMaps or a non-empty dict of scope → (n, n) tensor")
    if tokens is None:
        raise ValueError("tokens are required when maps is a dict")
    if layer is not None:
        raise ValueError("layer applies to TextMaps only; a dict holds one layer")
    names = pick_scopes(list(maps), scopes)
    for name, matrix in maps.items():
        if matrix.dim() != 2 or matrix.shape != (len(tokens), len(tokens)):
            raise ValueError(
                f"map {name!r} has shape {tuple(matrix.shape)}; expected "
                f"({len(tokens)}, {len(tokens)}) for {len(tokens)} tokens"
            )
    return [("", maps)], display_tokens(tokens), "", names, ff_pair_of(list(maps), ff_pair)


def _heatmap(
    fig: Figure,
    ax: Axes,
    matrix: Tensor,
    labels: list[str],
    font: float,
    cmap: str,
    vmin: float,
    vmax: float | None = None,
    row_labels: list[str] | None = None,
) -> None:
    row_labels = labels if row_labels is None else row_labels  # a decoder's target rows only
    rows = matrix.shape[0]
    image = ax.imshow(matrix.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest",
                      aspect="equal" if rows == len(labels) else "auto")
    n = len(labels)
    step = max(1, n // 60)  # past ~60 tokens, label every step-th one
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks, [labels[t] for t in ticks], rotation=90, fontsize=font)
    row_step = max(1, rows // 60)
    row_ticks = list(range(0, rows, row_step))
    ax.set_yticks(row_ticks, [row_labels[t] for t in row_ticks], fontsize=font)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    beyond = vmax is not None and float(matrix.max()) > vmax
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02, extend="max" if beyond else "neither")
    bar.ax.tick_params(labelsize=7)
