"""What a graph explains (:class:`GraphTarget`) and where a node can be patched in a
TransformerLens model (:class:`HookSite`): plain records, read and written by graph files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["GraphTarget", "HookSite"]


@dataclass(frozen=True)
class GraphTarget:
    r"""What a graph explains, resolved.

    Attributes:
        kind (str): ``"token"`` (a language model's logit), ``"class"`` (a classifier's),
                    ``"direction"`` (a direction read from the hidden states) or ``"answer"``
                    (an answer's teacher-forced log-probability: its tokens, each once).
        units (tuple[int, ...]): the token ids or classes read (a contrast: positive, then
                    negative; none for a direction).
        coefficients (tuple[float, ...]): each unit's coefficient (``(1.0, -1.0)`` for a
                    contrast).
        position (int, optional): the position read (``None``: pooled).
        texts (tuple[str, ...], optional): the units as the tokenizer decodes them
                    (``" Paris"``), when a tokenizer was given.
        n_units (int, optional): how many units the head has (the vocabulary's size).
    """

    kind: str
    units: tuple[int, ...]
    coefficients: tuple[float, ...]
    position: int | None = None
    texts: tuple[str, ...] | None = None
    n_units: int | None = None


class HookSite(NamedTuple):
    """Where a graph node can be patched in a TransformerLens model
    (:meth:`~captum_ffb.graph.record.AttributionGraph.hook_name`): ``name`` the hook's name (``blocks.23.attn.hook_z``),
    ``position`` the node's position along the hook's sequence dimension, ``index`` the head
    (``hook_z``), neuron (``mlp.hook_post``) or unit (``unembed.hook_out``) along the next
    dimension (``None``: the whole activation at the position)."""

    name: str
    position: int
    index: int | None = None
