r"""Query–key attribution: why a head attends where it does, split exactly over the writers.

With the norm scales frozen, a head's pre-softmax score ``s_ps = q_p · k_s · scale`` is
bilinear in the residual stream at the query position ``p`` and at the key position ``s``
(rotary embeddings are a fixed rotation per position; query/key norms are frozen too, and
biases are constants). Every writer of the stream at ``p`` (a token, an earlier attention
sublayer or head, an FF block or neuron) contributes a query part ``q_A`` and every writer at
``s`` a key part ``k_A'``, so ``s_ps = Σ_{A, A'} q_A · k_A' · scale`` plus the terms of the
parts owed to no writer (``"bias"``), exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.architectures.paths import resolve
from captum_ffb.core.keys import WriterKind
from captum_ffb.core.vocabulary import node_id
from captum_ffb.engine.autograd import batched_vjp
from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.fingerprint import Stamp, check_unchanged, weights_stamp
from captum_ffb.engine.frozen import FrozenCoefficients
from captum_ffb.engine.locking import serialized
from captum_ffb.engine.rows import AttentionRows
from captum_ffb.engine.tape import GraphTape, Players, graph_pass, stream_pulled, token_values
from captum_ffb.rules.attention_scores import allowed_keys

__all__ = ["ScoreSplitter"]


def _index(value: Any, name: str) -> int:
    """An index argument: an integer (a bool, a float or a string is a ``TypeError`` naming it)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    return value


class ScoreSplitter:
    """Splits the scores of one input's heads over pairs of writers: one recorded pass of the
    frozen model (with every head's queries and keys), run at the first call and kept.

    The model is the one the graph was built on: its weights' stamp is taken when the
    splitter is made, and the pass is refused (a ``ValueError``) if they changed before it ran.

    Args:
        engine (BoundModel): the model bound to its family.
        request (Request): the input, checked (its target resolved).
        rules (dict): the rules (frozen attention probabilities).
        granularity (str): the graph's (writers split into heads or neurons or not).
        players (list[Players]): each segment's players, as the graph's token nodes measure
                    them.

    Positions are the layout's (``[source | target]`` for an encoder–decoder, whose decoder
    self-attention's scores split over the decoder's writers).
    """

    def __init__(self, engine: BoundModel, request: Request, rules: Any, granularity: str,
                 players: list[Players], stamp: Stamp | None = None) -> None:
        self.engine, self.request, self.rules = engine, request, rules
        self.granularity, self.players = granularity, players
        #: the weights the graph was built on (:func:`~captum_ffb.engine.fingerprint.weights_stamp`)
        self.stamp = weights_stamp(engine.model) if stamp is None else stamp
        self._tape: GraphTape | None = None
        #: (writer index, "query" | "key", head, position) → a ``_parts`` result: a head's
        #: query parts serve every key it is asked about, a key's every head sharing it
        self._parts_seen: dict[tuple[int, str, int, int], tuple[dict[str, Tensor], Tensor]] = {}

    @property
    def model(self) -> nn.Module:
        """The model (its lock serialises the replays of its frozen pass)."""
        return self.engine.model

    def release(self) -> None:
        """Forget the recorded pass (its memory); the next call runs it again."""
        self._tape = None
        self._parts_seen = {}

    @property
    def tape(self) -> GraphTape:
        if self._tape is None:
            check_unchanged(self.engine.model, self.stamp, "query–key splits")
            self._tape = graph_pass(self.engine, self.request, self.request.target, self.rules, self.granularity,
                                    coefficients=FrozenCoefficients(scores=True))
        return self._tape

    def _attention(self, layer: int) -> tuple[nn.Module, Any]:
        """Block ``layer``'s (self-)attention module and the tape's writer of it."""
        engine = self.engine
        blocks = ([] if engine.source is None else list(engine.source.blocks)) + list(engine.blocks)
        if not 0 <= layer < len(blocks):
            raise ValueError(f"layer {layer} does not exist: the model has {len(blocks)} blocks")
        block = blocks[layer]
        writer = next(w for w in self.tape.writers if w.id == f"block.{layer}.attention")
        return resolve(block, engine.family.for_block(block).attention), writer

    def _position(self, writer: Any, name: str, position: int) -> int:
        """A layout position as a position of the writer's segment (checked)."""
        mask = self.players[writer.segment].mask
        inside = position - writer.offset
        if not 0 <= inside < writer.n or not bool(mask[0, inside]):
            raise ValueError(f"{name} {position} is not a real position of block {writer.layer}'s input "
                             f"({writer.offset} … {writer.offset + writer.n - 1})")
        return inside

    @serialized
    def __call__(self, layer: int, head: int, query_position: int, key_position: int) -> dict[Any, float]:
        for name, value in (("layer", layer), ("head", head), ("query_position", query_position),
                            ("key_position", key_position)):
            _index(value, name)
        engine = self.engine
        attention, writer = self._attention(layer)
        tape = self.tape
        if tape.coefficients.scores is None or id(attention) not in tape.coefficients.scores:
            raise ValueError(f"{engine.model_type}'s attention computes its scores inline: its queries and "
                             "keys cannot be read, so its scores cannot be split")
        query, key, scaling, mask = tape.coefficients.scores[id(attention)]
        heads = query.shape[1]
        if not 0 <= head < heads:
            raise ValueError(f"head {head} does not exist: block {layer} has {heads} heads")
        at_query, at_key = query_position, key_position
        query_position = self._position(writer, "query_position", query_position)
        key_position = self._position(writer, "key_position", key_position)
        allowed = allowed_keys(mask if isinstance(mask, Tensor) else None,
                               (query.shape[0], heads, query.shape[2], key.shape[2]), query.device)
        if not bool(allowed[0, min(head, allowed.shape[1] - 1), query_position, key_position]):
            raise ValueError(f"key_position {at_key} is masked for query_position {at_query} in block {layer} "
                             "(a causal head sees keys up to its query, a windowed one its window): its "
                             "probability is 0 and its score takes no part")
        index = tape.writers.index(writer)
        kv = head // (heads // key.shape[1])
        q_parts, q_bias = self._cached_parts(tape, index, "query", query, head, query_position)
        k_parts, k_bias = self._cached_parts(tape, index, "key", key, kv, key_position)
        # every pair's product at once (one product per pair in Python was most of a split's time)
        queries = torch.stack([*q_parts.values(), q_bias])  # (writers at the query + 1, e)
        keys = torch.stack([*k_parts.values(), k_bias])
        products = (queries @ keys.T).tolist()
        q_ids, k_ids = [*q_parts, "bias"], [*k_parts, "bias"]
        found: dict[Any, float] = {}
        for q_id, row in zip(q_ids[:-1], products):
            for k_id, product in zip(k_ids[:-1], row):
                value = product * scaling
                if value != 0.0:
                    found[(q_id, k_id)] = value
            found[(q_id, "bias")] = row[-1] * scaling
        for k_id, product in zip(k_ids[:-1], products[-1]):
            found[("bias", k_id)] = product * scaling
        found[("bias", "bias")] = products[-1][-1] * scaling
        return found

    @serialized
    def probabilities(self, layer: int, head: int, query_position: int) -> Tensor:
        """``(n,)`` the attention probabilities of head ``head`` of block ``layer`` at query
        position ``query_position`` over the key positions of its input (the clean pass's;
        for an encoder–decoder's decoder, over the target)."""
        for name, value in (("layer", layer), ("head", head), ("query_position", query_position)):
            _index(value, name)
        attention, writer = self._attention(layer)
        kept = self.tape.coefficients.values.get(("attention", id(attention), 0))
        if kept is None:
            raise ValueError(f"{self.engine.model_type}'s attention computes its probabilities inline: they "
                             "were not kept")
        position = self._position(writer, "query_position", query_position)
        if isinstance(kept, AttentionRows):
            if not kept.check():
                raise ValueError(f"{self.engine.model_type}'s eager attention does not give what its recorded call "
                                 "computed: its probabilities cannot be computed again")
            weights = kept.rows(torch.tensor([position], device=kept.query.device))
            position = 0
        else:
            weights = kept
        if not 0 <= head < weights.shape[1]:
            raise ValueError(f"head {head} does not exist: block {layer} has {weights.shape[1]} heads")
        return weights[0, head, position].detach().float()

    def _cached_parts(self, tape: Any, index: int, role: str, tensor: Tensor, head: int, position: int
                      ) -> tuple[dict[str, Tensor], Tensor]:
        """:meth:`_parts`, computed once per writer, role, head and position of the tape."""
        key = (index, role, head, position)
        if key not in self._parts_seen:
            self._parts_seen[key] = self._parts(tape, index, tensor, head, position)
        return self._parts_seen[key]

    def _parts(self, tape: Any, index: int, tensor: Tensor, head: int, position: int
               ) -> tuple[dict[str, Tensor], Tensor]:
        """A query's (or key's) part from each writer at ``position`` (of the reading writer's
        segment) ``{node id: (e,)}`` and what no writer owns ``(e,)``."""
        writer = tape.writers[index]
        leaf = tape.reads[writer.read][1]
        width = tensor.shape[-1]
        cot = torch.zeros((width, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
        rows = torch.arange(width)
        cot[rows, 0, head, position, rows] = 1.0
        (at_leaf,) = batched_vjp(tensor, [leaf], cot)  # (e, B, n, d): each component's covector
        pulled = stream_pulled(tape, index, at_leaf)
        parts: dict[str, Tensor] = {}
        at = position + writer.offset
        for source_index, (source, covector) in enumerate(zip(tape.writers[:index], pulled[:index])):
            if source.segment != writer.segment:
                continue  # another stack's stream (an encoder's, read through cross-attention nodes)
            c = covector.reshape(width, 1, -1, covector.shape[-1])[:, 0, position]  # (e, d) at the output
            if source.parts is None:
                out = source.output.detach()
                out = out.reshape(1, -1, out.shape[-1]) if out.dim() == 2 else out
                parts[node_id(source.kind, source.layer, -1, at)] = (c * out[0, position]).sum(-1)
                continue
            if source.kind == "attention":
                values = c @ tape.part_outputs(source_index)[position].T  # (e, heads)
            else:
                at_parts = source.part_grad(source.output, covector, batched=True)
                values = (at_parts[:, 0, position] * source.parts.detach()[0, position]).sum(-1)  # (e, parts)
            kind = WriterKind(source.kind).part_kind
            for j in range(values.shape[1]):
                parts[node_id(kind, source.layer, j, at)] = values[:, j]
        segment = self.players[writer.segment]
        leaf_x = tape.leaves[writer.segment].detach()
        tokens = token_values(pulled[index + writer.segment], leaf_x, segment.reference, segment.seen,
                              segment.mask)[:, 0]  # (e, n)
        for player in segment.mask[0].nonzero()[:, 0].tolist():
            if bool(tokens[:, player].any()):
                parts[node_id("token", -1, -1, player + writer.offset)] = tokens[:, player]
        real = tensor.detach()[0, head, position]
        owned = sum(parts.values(), torch.zeros_like(real))
        return {k: v.detach() for k, v in parts.items() if bool(v.any())}, (real - owned).detach()
