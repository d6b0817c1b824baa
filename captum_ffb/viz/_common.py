"""Helpers shared by the figures, the HTML views and the exports; the page skeleton and the
colour scale of :mod:`captum_ffb.io.pages` (a floor down, since the evaluation and analysis
reports use them too), re-exported for the views."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from captum_ffb.io.pages import (  # noqa: F401 (re-exported: the views import them from here)
    COLOUR_JS,
    DIVERGING,
    SEQUENTIAL,
    css,
    diverging,
    escape,
    gradient,
    ink,
    json_block,
    page,
    sequential,
)
from captum_ffb.texts.text import (
    TextMaps,
    display_token,  # noqa: F401 (re-exported: the views import it from here)
    display_tokens,  # noqa: F401
    ff_amplification,
)

View = TypeVar("View", bound=Callable[..., Any])


def _on_cpu(value: Any) -> Any:
    """``value`` with its tensors on the cpu: a tensor, or a dataclass (one level) holding some."""
    if isinstance(value, Tensor):
        return value.detach().cpu()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        moved = {f.name: getattr(value, f.name).detach().cpu() for f in dataclasses.fields(value)
                 if f.init and isinstance(getattr(value, f.name), Tensor) and getattr(value, f.name).device.type != "cpu"}
        return dataclasses.replace(value, **moved) if moved else value
    return value


def cpu_view(view: View) -> View:
    """A view (a figure, a page, an export) made on the cpu, whatever device the numbers it
    draws were computed on: its tensor arguments (and the tensors of a result object) come to
    the cpu, and the tensors it makes are made there."""

    @functools.wraps(view)
    def drawn(*args: Any, **kwargs: Any) -> Any:
        with torch.device("cpu"):
            return view(*(_on_cpu(a) for a in args), **{k: _on_cpu(v) for k, v in kwargs.items()})

    return drawn  # type: ignore[return-value]


#: The scopes just before and after the FF block, per chain (as in ``Chain.ff_pair``).
KNOWN_FF_PAIRS: tuple[tuple[str, str], ...] = (("Atb", "AtbFf"), ("AtbLn", "AtbLnFf"))


def check_text_maps(maps: object) -> TextMaps:
    """``maps`` if it is a :class:`~captum_ffb.texts.text.TextMaps`, else a one-line TypeError."""
    if not isinstance(maps, TextMaps):
        raise TypeError(
            f"expected TextMaps from captum_ffb.texts.text.text_maps, got {type(maps).__name__}"
        )
    return maps


def pick_layers(maps: TextMaps, layer: int | Sequence[int] | None) -> list[int]:
    """The computed layers asked for; ``None`` means all of them, a negative index counts from
    the end of the computed layers."""
    if layer is None:
        return list(maps.layers)
    wanted = [layer] if isinstance(layer, int) else list(layer)
    out = []
    for value in wanted:
        index = _resolve_layer(maps, int(value))
        out.append(index)
    return out


def _resolve_layer(maps: TextMaps, value: int) -> int:
    if value in maps.maps:
        return value
    if -len(maps.layers) <= value < 0:
        return maps.layers[value]
    raise ValueError(
        f"layer {value} was not computed; computed layers: {', '.join(map(str, maps.layers))}"
    )


def pick_scopes(available: Sequence[str], scopes: str | Sequence[str] | None) -> list[str]:
    """The scopes asked for, in the order given; ``None`` means all available ones."""
    if scopes is None:
        return list(available)
    wanted = [scopes] if isinstance(scopes, str) else list(scopes)
    unknown = [s for s in wanted if s not in available]
    if unknown:
        raise ValueError(
            f"unknown scope {unknown[0]!r}; available: {', '.join(available)}"
        )
    if not wanted:
        raise ValueError("no scope chosen")
    return wanted


def ff_pair_of(
    scopes: Sequence[str], ff_pair: tuple[str, str] | None = None
) -> tuple[str, str] | None:
    """The (before FF, after FF) scope pair if both are among ``scopes``, else ``None``."""
    candidates = [tuple(ff_pair)] if ff_pair else list(KNOWN_FF_PAIRS)
    for before, after in candidates:
        if before in scopes and after in scopes:
            return before, after
    return None


def layer_maps(maps: TextMaps, layer: int) -> Mapping[str, Tensor]:
    """``scope → (n, n)`` maps of one computed layer, in chain order."""
    return {s: maps.maps[layer][s] for s in maps.scopes}


def ff_amp_of(maps: Mapping[str, Tensor], pair: tuple[str, str]) -> Tensor:
    """The FF-amp map from a ``scope → map`` mapping and a (before, after) pair."""
    return ff_amplification(maps[pair[0]].float(), maps[pair[1]].float())
