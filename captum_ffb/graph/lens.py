r"""What a writer node writes, in tokens: the logit lens of its write.

A writer node's write ``o`` (what an attention sublayer, a head or an FF block adds to the
stream at its position) is read through the model's unembedding as the final norm would see
a direction: centred where the norm is a LayerNorm, scaled by the norm's weight ``γ``, then
``W_U (γ ⊙ o)``. The tokens of largest logit are those the write **promotes**, those of
smallest the ones it **suppresses** (nostalgebraist's logit lens, applied to one write rather
than to the stream). The norm's scale ``1/σ`` is left out: it changes no ranking.

Only a causal language model whose head is its final norm and output layer is read (a head
with layers of its own, a classifier or an encoder–decoder gets no lens), and only nodes of
whole writes (sublayers and heads; a neuron's write is one column of the FF's output
projection scaled, left out here).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from captum_ffb.core.pieces import token_text
from captum_ffb.engine.autograd import sequence_shaped
from captum_ffb.engine.block import norm_parameters
from captum_ffb.engine.tape import GraphTape

__all__ = ["LENS_NODES", "LENS_TOP", "Lens", "decoded_lens", "write_lens"]

#: Tokens kept per node and direction.
LENS_TOP = 5

#: At most this many writer nodes are read, those of largest ``|value|``.
LENS_NODES = 1024

#: Node index → (promoted token ids, suppressed token ids), most first.
Lens = dict[int, tuple[tuple[int, ...], tuple[int, ...]]]


def write_lens(engine: Any, tape: GraphTape, kinds: list[str], layers: list[int], heads: list[int],
               positions: list[int], values: Tensor, top: int = LENS_TOP, max_nodes: int = LENS_NODES,
               chunk: int = 256, computed: Tensor | None = None) -> Lens:
    """The logit lens of the writes of a graph's writer nodes (at most ``max_nodes``, those of
    largest ``|value|``; only those whose edges were computed where ``computed`` is given:
    pruning keeps no other): each node's ``top`` promoted and suppressed token ids.

    Args:
        engine (BoundModel): the bound model (its head and family).
        tape (GraphTape): the graph's recorded pass (its writers' outputs).
        kinds, layers, heads, positions: the node table's columns.
        values (Tensor): ``(N,)`` the nodes' values.
        top (int): tokens kept per node and direction.
        max_nodes (int): writer nodes read at most.
        chunk (int): nodes per product with the unembedding.
        computed (Tensor, optional): ``(N,)`` bool, the nodes whose edges were computed
                    (:class:`~captum_ffb.graph.build.GraphData`'s ``computed``).

    Returns:
        dict: node index → ``(promoted, suppressed)`` token ids; empty where the model has no
        lens (see the module).
    """
    head = engine.head
    if head.task != "causal_lm" or head.output is None or head.steps or tape.source_inputs is not None:
        return {}
    found = _writes(tape, kinds, layers, heads, positions, values, max_nodes, computed)
    if found is None:
        return {}
    nodes, writes = found
    weight = head.output.weight.detach()
    direction = writes.to(weight.dtype)
    if engine.family.norm == "layer_norm":
        direction = direction - direction.mean(-1, keepdim=True)
    if head.final_norm is not None:
        gamma = norm_parameters(head.final_norm, engine.family, engine.config)[0]
        if gamma is not None:
            direction = direction * gamma.detach().to(direction)
    promoted, suppressed = [], []
    k = min(top, weight.shape[0])
    with torch.no_grad():
        for start in range(0, len(nodes), chunk):
            logits = direction[start:start + chunk] @ weight.T
            promoted.append(logits.topk(k, dim=-1).indices.cpu())
            suppressed.append((-logits).topk(k, dim=-1).indices.cpu())
    up, down = torch.cat(promoted).tolist(), torch.cat(suppressed).tolist()
    return {node: (tuple(a), tuple(b)) for node, a, b in zip(nodes, up, down)}


def _writes(tape: GraphTape, kinds: list[str], layers: list[int], heads: list[int], positions: list[int],
            values: Tensor, max_nodes: int, computed: Tensor | None = None) -> tuple[list[int], Tensor] | None:
    """The chosen writer nodes and their writes ``(k, d)`` (``None``: none to read)."""
    index = {(w.kind, w.layer): i for i, w in enumerate(tape.writers)}
    shown = None if computed is None else computed.detach().cpu().tolist()
    readable = [i for i, kind in enumerate(kinds) if kind in ("attention", "cross_attention", "ff", "head")
                and (("attention" if kind == "head" else kind), layers[i]) in index and (shown is None or shown[i])]
    if not readable:
        return None
    strength = values.detach().abs().cpu()[readable]
    chosen = [readable[i] for i in strength.argsort(descending=True)[:max_nodes].tolist()]
    rows = []
    for node in chosen:
        i = index[("attention" if kinds[node] == "head" else kinds[node], layers[node])]
        writer = tape.writers[i]
        p = positions[node] - writer.offset
        if kinds[node] == "head":
            rows.append(tape.part_outputs(i)[p, heads[node]].detach())
        else:
            rows.append(sequence_shaped(writer.output.detach(), writer.n)[0, p])
    return chosen, torch.stack(rows)


def decoded_lens(lens: Lens, tokenizer: Any = None) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
    """``lens`` with its token ids as text: each id decoded alone by ``tokenizer`` (``#<id>``
    without one; a token of white space only quoted, ``'\\n'``, so that it shows; a token of part
    of a character as its bytes, :func:`~captum_ffb.core.pieces.token_text`)."""
    def shown(word: str) -> str:
        return word if word.strip() else repr(word)

    def text(ids: tuple[int, ...]) -> tuple[str, ...]:
        if tokenizer is None:
            return tuple(f"#{i}" for i in ids)
        return tuple(shown(token_text(tokenizer, i)) for i in ids)

    return {node: (text(up), text(down)) for node, (up, down) in lens.items()}
