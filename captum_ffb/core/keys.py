r"""One typed key for every internal table: a writer's kind, a component (a writer or one of
its parts) and a graph node (a component at a position, or a player). Each gives its
vocabulary id (:mod:`captum_ffb.core.vocabulary`) with ``.id`` and is read back from it with
``from_id``; the kinds are ``str`` enums, so a kind compares equal to its name.

This module imports nothing heavy: the command line reads it before torch loads.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch import Tensor

from captum_ffb.core.vocabulary import PART_OF, part_id, writer_id

__all__ = ["ENDS", "NODE_KINDS", "Component", "NodeId", "NodeKind", "NodeTable", "WriterKind", "is_writer_node",
           "node_ids"]


class WriterKind(str, enum.Enum):
    """What writes to the residual stream."""

    ATTENTION = "attention"
    CROSS_ATTENTION = "cross_attention"
    FF = "ff"

    def __str__(self) -> str:
        return self.value

    @property
    def part_kind(self) -> str:
        """What its parts are called (``"head"``, ``"neuron"``)."""
        return PART_OF[self.value]


class NodeKind(str, enum.Enum):
    """A graph node's kind: a player (a token), a writer, a writer's part, the bias, the output,
    or one of several logits the output sums (``logit``: its ``head`` field holds the unit)."""

    TOKEN = "token"
    ATTENTION = "attention"
    HEAD = "head"
    FF = "ff"
    NEURON = "neuron"
    CROSS_ATTENTION = "cross_attention"
    BIAS = "bias"
    OUTPUT = "output"
    LOGIT = "logit"

    def __str__(self) -> str:
        return self.value

    @property
    def writer(self) -> WriterKind | None:
        """The writer kind it belongs to (``None`` for a token, the bias and the output)."""
        return _WRITER_OF.get(self)


_WRITER_OF = {NodeKind.ATTENTION: WriterKind.ATTENTION, NodeKind.HEAD: WriterKind.ATTENTION,
              NodeKind.CROSS_ATTENTION: WriterKind.CROSS_ATTENTION, NodeKind.FF: WriterKind.FF,
              NodeKind.NEURON: WriterKind.FF}
#: The node kinds, in the order files and dicts list them.
NODE_KINDS: tuple[str, ...] = tuple(kind.value for kind in NodeKind)
#: The nodes that are not writers: the players' ends, always kept by pruning.
ENDS: tuple[str, ...] = (NodeKind.TOKEN.value, NodeKind.BIAS.value, NodeKind.OUTPUT.value, NodeKind.LOGIT.value)


def is_writer_node(kind: str) -> bool:
    """Whether a node of ``kind`` is a writer or a writer's part (not a token, the bias or the output)."""
    return kind not in ENDS


@dataclass(frozen=True, order=True)
class Component:
    """A writer of the residual stream, or one of its parts (``part`` ≥ 0: a head, a neuron).

    Attributes:
        kind (WriterKind): what writes.
        layer (int): its block.
        part (int): its part, ``-1`` for the whole writer.
    """

    kind: WriterKind
    layer: int
    part: int = -1

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", WriterKind(self.kind))

    @property
    def id(self) -> str:
        """``block.<l>.<kind>`` or ``block.<l>.<kind>.<head|neuron>.<k>``."""
        kind = self.kind.value
        return part_id(self.layer, kind, self.part) if self.part >= 0 else writer_id(self.layer, kind)

    @property
    def writer(self) -> Component:
        """The whole writer (itself when it is one)."""
        return Component(self.kind, self.layer)

    @classmethod
    def from_id(cls, text: str) -> Component:
        """The component whose id is ``text`` (a one-line ``ValueError`` otherwise)."""
        found = _COMPONENT.match(text)
        if found is None:
            raise ValueError(f"not a component id: {text!r}")
        layer, kind, part_kind, part = found.groups()
        if part is not None and part_kind != PART_OF[kind]:
            raise ValueError(f"not a component id: {text!r} (a {kind}'s parts are {PART_OF[kind]}s)")
        return cls(WriterKind(kind), int(layer), -1 if part is None else int(part))


_COMPONENT = re.compile(r"^block\.(\d+)\.(attention|cross_attention|ff)(?:\.(head|neuron)\.(\d+))?$")


@dataclass(frozen=True, order=True)
class NodeId:
    """A graph node: a component at a position, a token (a player) at a position, the bias or
    the output.

    Attributes:
        kind (NodeKind): the node's kind (a part's kind for a head or a neuron).
        layer (int): its block (``-1`` for a token, the bias and the output).
        part (int): its head or neuron (``-1`` for none).
        position (int): its position (``-1`` for the bias and the output).
    """

    kind: NodeKind
    layer: int = -1
    part: int = -1
    position: int = -1

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", NodeKind(self.kind))

    @property
    def component(self) -> Component | None:
        """Its component (``None`` for a token, the bias and the output)."""
        writer = self.kind.writer
        return None if writer is None else Component(writer, self.layer, self.part)

    @property
    def id(self) -> str:
        """``<component id>@<position>``, ``token@<position>``, ``bias`` or ``output``."""
        if self.kind in (NodeKind.BIAS, NodeKind.OUTPUT):
            return self.kind.value
        if self.kind is NodeKind.TOKEN:
            return f"token@{self.position}"
        return f"{self.component.id}@{self.position}"

    @classmethod
    def from_id(cls, text: str) -> NodeId:
        """The node whose id is ``text`` (a one-line ``ValueError`` otherwise)."""
        if text in (NodeKind.BIAS.value, NodeKind.OUTPUT.value):
            return cls(NodeKind(text))
        name, at, position = text.rpartition("@")
        if not at or not position.isdigit():
            raise ValueError(f"not a node id: {text!r}")
        if name == "token":
            return cls(NodeKind.TOKEN, position=int(position))
        component = Component.from_id(name)
        kind = component.kind.value if component.part < 0 else component.kind.part_kind
        return cls(NodeKind(kind), component.layer, component.part, int(position))


class NodeTable(Protocol):
    """A graph's node table and edges as the features read them (the graph's
    :class:`~captum_ffb.graph.build.GraphData` is one): per node its kind, block, part and
    position; per edge its source and target node."""

    kinds: Sequence[str]
    layers: Sequence[int]
    heads: Sequence[int]
    positions: Sequence[int]
    values: Tensor
    sources: Tensor
    targets: Tensor

    def __len__(self) -> int: ...


def node_ids(table: NodeTable) -> list[NodeId]:
    """Every node of ``table`` as its :class:`NodeId`, in the table's order."""
    return [NodeId(NodeKind(kind), layer, part, position)
            for kind, layer, part, position in zip(table.kinds, table.layers, table.heads, table.positions)]
