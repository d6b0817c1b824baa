r"""One vocabulary: the names every feature uses for the same things.

**Writers** of the residual stream and their **parts** have one id everywhere (the
component tables, the graphs' nodes, patching, the views, the exports):

==================================  ===========================================
``block.<l>``                       block ``l``'s writers together (block granularity)
``block.<l>.attention``             block ``l``'s attention sublayer
``block.<l>.attention.head.<h>``    its head ``h``
``block.<l>.cross_attention``       a decoder block's cross-attention
``block.<l>.ff``                    block ``l``'s FF block
``block.<l>.ff.neuron.<k>``         its neuron ``k``
``block.<l>.ff.expert.<e>``         a mixture's expert ``e``
``block.<l>.<writer>.bias``         what a writer split into parts adds beyond its parts
                                    (an output bias, a post-norm's shift)
``block.<l>.<norm>``                what a norm on the stream adds on its own (its shift)
``embeddings``                      the first block's input (component tables)
``output_head``                     what the final norm and the output head add on their own
==================================  ===========================================

A graph's node is a writer (or part) at a position, ``<id>@<position>``; the players are
``token@<position>``, then ``bias`` and ``output``.

**Granularities** are one table (:data:`GRANULARITIES`); each feature offers a subset
(:data:`FEATURE_GRANULARITIES`). This module imports nothing heavy: the command line reads
it before torch loads.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["EMBEDDINGS", "FEATURE_GRANULARITIES", "GRANULARITIES", "ID_FORMS", "OUTPUT_HEAD", "block_id",
           "check_granularity", "component_of", "form_of", "node_id", "norm_id", "old_node_id", "part_id",
           "writer_bias_id", "writer_id"]

#: How finely a feature splits the writers: the one table.
GRANULARITIES = {
    "block": "each block's writers together",
    "sublayer": "each attention sublayer, cross-attention and FF block",
    "head": "each attention head (and a mixture's experts), each FF block",
    "neuron": "each attention head and each FF neuron",
}
#: The granularities each feature offers (a subset of :data:`GRANULARITIES`, in its order).
FEATURE_GRANULARITIES = {
    "components": ("block", "sublayer", "head"),
    "graph": ("sublayer", "head", "neuron"),
    "patching": ("sublayer", "head"),
}
#: The component of what the final norm and the output head add on their own.
OUTPUT_HEAD = "output_head"
#: The component of the first block's input (the players).
EMBEDDINGS = "embeddings"
#: Each writer kind's part kind (what its ``.<part>.<k>`` names).
PART_OF = {"attention": "head", "cross_attention": "head", "ff": "neuron"}


def check_granularity(granularity: Any, feature: str) -> str:
    """``granularity`` checked against what ``feature`` (a key of :data:`FEATURE_GRANULARITIES`)
    offers; a one-line ``TypeError`` or ``ValueError`` naming the parameter."""
    offered = FEATURE_GRANULARITIES[feature]
    if not isinstance(granularity, str):
        raise TypeError(f"granularity must be one of {', '.join(offered)}, got {type(granularity).__name__}")
    if granularity not in offered:
        raise ValueError(f"granularity must be one of {', '.join(offered)}, got {granularity!r}")
    return granularity


def writer_id(layer: int, kind: str) -> str:
    """A writer's id: ``block.<l>.attention``, ``block.<l>.cross_attention``, ``block.<l>.ff``."""
    return f"block.{layer}.{kind}"


def block_id(layer: int) -> str:
    """A block's id, its writers together: ``block.<l>``."""
    return f"block.{layer}"


def writer_bias_id(layer: int, kind: str) -> str:
    """What a writer split into parts adds beyond its parts: ``block.<l>.<kind>.bias``."""
    return f"{writer_id(layer, kind)}.bias"


def norm_id(layer: int, norm: str) -> str:
    """What a norm on the stream adds on its own: ``block.<l>.<norm>`` (the norm's role name,
    e.g. ``attention_post_norm``)."""
    return f"{block_id(layer)}.{norm}"


def part_id(layer: int, kind: str, part: int) -> str:
    """A writer's part's id: ``block.<l>.attention.head.<h>``, ``block.<l>.ff.neuron.<k>``."""
    return f"{writer_id(layer, kind)}.{PART_OF[kind]}.{part}"


#: A graph node's kind → the writer kind it belongs to.
_WRITER_OF = {"attention": "attention", "head": "attention", "cross_attention": "cross_attention", "ff": "ff",
              "neuron": "ff"}


def component_of(kind: str, layer: int, part: int = -1) -> str:
    """The component (writer or part) id of a graph node's kind, block and part."""
    writer = _WRITER_OF[kind]
    return part_id(layer, writer, part) if part >= 0 else writer_id(layer, writer)


def node_id(kind: str, layer: int, part: int, position: int) -> str:
    """A graph node's id: its component's id ``@`` its position (``token@<p>``, ``bias``,
    ``output``)."""
    if kind in ("bias", "output"):
        return kind
    if kind == "logit":  # one of several outputs: the unit it reads
        return f"logit.{part}"
    if kind == "token":
        return f"token@{position}"
    return f"{component_of(kind, layer, part)}@{position}"


_OLD_NODE = re.compile(r"^(?:token\.(\d+)|block\.(\d+)\.(attention|cross_attention|ff)\.(\d+)"
                       r"|block\.(\d+)\.(head|neuron)\.(\d+)\.(\d+))$")


def old_node_id(node: str) -> str | None:
    """The id of the node named ``node`` in the ids before 0.4 (``token.5``,
    ``block.3.ff.5``, ``block.3.head.2.5``), or ``None`` when it is not one of those."""
    found = _OLD_NODE.match(node)
    if found is None:
        return None
    token, layer, kind, position, part_layer, part_kind, part, part_position = found.groups()
    if token is not None:
        return node_id("token", -1, -1, int(token))
    if layer is not None:
        return node_id(kind, int(layer), -1, int(position))
    return node_id(part_kind, int(part_layer), int(part), int(part_position))


#: Every form of id a feature emits (the table above), as patterns: form → regular expression.
ID_FORMS = {
    "block": r"block\.\d+",
    "writer": r"block\.\d+\.(?:attention|cross_attention|ff)",
    "part": r"block\.\d+\.(?:(?:attention|cross_attention)\.head|ff\.neuron|ff\.expert)\.\d+",
    "writer_bias": r"block\.\d+\.(?:attention|cross_attention|ff)\.bias",
    "norm": r"block\.\d+\.\w*norm\w*",
    "embeddings": re.escape(EMBEDDINGS),
    "output_head": re.escape(OUTPUT_HEAD),
    "node": r"(?:token|block\.\d+\.[\w.]+)@\d+|bias|output",
}
_FORMS = {form: re.compile(f"^(?:{pattern})$") for form, pattern in ID_FORMS.items()}


def form_of(identifier: str) -> str:
    """The form (a key of :data:`ID_FORMS`) of a component or node id; a ``ValueError`` for an
    id the vocabulary does not list."""
    for form, pattern in _FORMS.items():
        if pattern.match(identifier):
            return form
    raise ValueError(f"{identifier!r} is no id of the vocabulary (captum_ffb.core.vocabulary)")
