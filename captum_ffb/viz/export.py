"""The maps in the XAI tools people already use: bertviz, inseq and Captum."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from captum_ffb.texts.text import TextMaps
from captum_ffb.viz._common import (
    check_text_maps,
    cpu_view,
    display_tokens,
    pick_layers,
    pick_scopes,
)


def _row_normalised(matrix: Tensor) -> Tensor:
    total = matrix.sum(dim=-1, keepdim=True)
    return matrix / torch.where(total == 0, torch.ones_like(total), total)


@cpu_view
def to_bertviz(
    maps: TextMaps,
    layers: int | Sequence[int] | None = None,
    scopes: str | Sequence[str] | None = None,
) -> list[Tensor]:
    r"""The maps as bertviz attention: one ``(1, S, n, n)`` tensor per layer, scopes as heads.

    bertviz draws attention weights, so each row (output token ``i``) is divided by its sum:
    values lie in [0, 1] and every row of a real token sums to 1. Head ``h`` of every layer is
    ``scopes[h]``. Pass the result with ``maps.tokens`` to ``bertviz.head_view`` or
    ``bertviz.model_view`` (or use :func:`bertviz_view`).

    Args:
        maps (TextMaps): from :func:`captum_ffb.texts.text.text_maps`.
        layers (int or list[int], optional): computed layers to export; all by default.
        scopes (str or list[str], optional): scopes to export, in head order; all by default.

    Returns:
        list[Tensor]: one float32 tensor ``(1, len(scopes), n, n)`` per layer.
    """
    maps = check_text_maps(maps)
    names = pick_scopes(maps.scopes, scopes)
    return [
        torch.stack([_row_normalised(maps.maps[i][s].detach().float().cpu()) for s in names])[None]
        for i in pick_layers(maps, layers)
    ]


@cpu_view
def bertviz_view(
    maps: TextMaps,
    view: str = "head",
    layers: int | Sequence[int] | None = None,
    scopes: str | Sequence[str] | None = None,
    html_action: str = "view",
) -> Any:
    r"""Open the maps in bertviz's ``head_view`` or ``model_view`` (scopes stand in for heads).

    Args:
        maps (TextMaps): from :func:`captum_ffb.texts.text.text_maps`.
        view (str): ``"head"`` or ``"model"``.
        layers (int or list[int], optional): computed layers; all by default. bertviz numbers
                    them 0, 1, … in this order.
        scopes (str or list[str], optional): scopes, in head order; all by default.
        html_action (str): bertviz's ``"view"`` (display in a notebook) or ``"return"`` (an
                    ``IPython.display.HTML`` object).

    Returns:
        What bertviz returns (``None`` or ``IPython.display.HTML``).
    """
    if view not in ("head", "model"):
        raise ValueError(f"view must be 'head' or 'model', got {view!r}")
    try:
        import bertviz
    except ImportError as error:
        raise ImportError("bertviz_view needs bertviz: pip install 'captum_ffb[bertviz]'") from error
    attention = to_bertviz(maps, layers=layers, scopes=scopes)
    tokens = display_tokens(maps.tokens)
    draw = bertviz.head_view if view == "head" else bertviz.model_view
    return draw(attention=attention, tokens=tokens, prettify_tokens=False, html_action=html_action)


@cpu_view
def to_inseq(
    maps: TextMaps,
    layer: int,
    scopes: str | Sequence[str] | None = None,
) -> Any:
    r"""The maps of one layer as an inseq ``FeatureAttributionOutput``, one sequence per scope.

    In inseq's layout the attributed (input) tokens ``j`` are the rows and the "generated"
    (output) tokens ``i`` the columns, so each scope's map is stored transposed. Encoders
    fill ``source_attributions``; causal models fill ``target_attributions`` with the
    future positions (``j > i``) set to NaN, as inseq does for decoder-only models.
    ``.show()`` renders one heatmap per scope; ``info["scopes"]`` gives their order.

    Args:
        maps (TextMaps): from :func:`captum_ffb.texts.text.text_maps`.
        layer (int): a computed layer.
        scopes (str or list[str], optional): scopes to export; all by default.

    Returns:
        inseq.FeatureAttributionOutput
    """
    try:
        from inseq import FeatureAttributionOutput
        from inseq.data.attribution import CoarseFeatureAttributionSequenceOutput
        from inseq.utils.typing import TokenWithId
    except ImportError as error:
        raise ImportError("to_inseq needs inseq: pip install 'captum_ffb[inseq]'") from error
    maps = check_text_maps(maps)
    (index,) = pick_layers(maps, layer)
    names = pick_scopes(maps.scopes, scopes)
    tokens = [TokenWithId(t, k) for k, t in enumerate(display_tokens(maps.tokens))]
    causal = maps.causal
    sequences = []
    for name in names:
        grid = maps.maps[index][name].detach().float().cpu().T.contiguous()  # [j, i]
        if causal:
            future = torch.ones_like(grid, dtype=torch.bool).tril(-1)  # j > i
            grid = grid.masked_fill(future, float("nan"))
            seq = CoarseFeatureAttributionSequenceOutput(
                source=[], target=list(tokens), target_attributions=grid
            )
        else:
            seq = CoarseFeatureAttributionSequenceOutput(
                source=list(tokens), target=list(tokens), source_attributions=grid
            )
        sequences.append(seq)
    info = {
        "attribution_method": "captum_ffb.LayerNormDecomposition",
        "model_name": maps.model_name,
        "layer": index,
        "scopes": names,
        "text": maps.text,
        "completeness_residual": {s: maps.delta[index][s] for s in names},
    }
    return FeatureAttributionOutput(sequence_attributions=sequences, info=info)


@cpu_view
def to_captum(maps: TextMaps, layer: int, scope: str | None = None) -> Any:
    r"""The map of one layer and scope as a Captum ``LLMAttributionResult``.

    ``token_attr[i, j] = ‖F_i(x_j)‖`` (output tokens as rows, input tokens as columns) and
    ``seq_attr[j] = Σ_i token_attr[i, j]``, so ``result.plot_token_attr()`` and
    ``result.plot_seq_attr()`` draw them.

    Args:
        maps (TextMaps): from :func:`captum_ffb.texts.text.text_maps`.
        layer (int): a computed layer.
        scope (str, optional): the scope; the last one (the whole layer) by default.

    Returns:
        captum.attr.LLMAttributionResult
    """
    from captum.attr import LLMAttributionResult

    maps = check_text_maps(maps)
    (index,) = pick_layers(maps, layer)
    (name,) = pick_scopes(maps.scopes, scope if scope is not None else maps.scopes[-1])
    matrix = maps.maps[index][name].detach().float().cpu()
    tokens = display_tokens(maps.tokens)
    return LLMAttributionResult(
        input_tokens=list(tokens),
        output_tokens=list(tokens),
        seq_attr=matrix.sum(dim=0),
        token_attr=matrix,
    )

