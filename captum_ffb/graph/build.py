r"""The attribution graph's numbers: nodes in a table and edges as coordinates, built from one
recorded pass (:mod:`captum_ffb.engine.tape`), and circuit-tracer's pruning by influence.

Every writer of the residual stream (an attention sublayer or head, an FF block or neuron)
at every position is a node, as are the players (the tokens), the bias and the output. A
writer ``A``'s **value** is ``T_A = ⟨G_A, o_A⟩``; an **edge** ``A → B`` carries ``⟨G_B, J_B o_A⟩``
with ``J_B`` the frozen map from the stream ``B`` reads to its output; ``A → output`` carries
``A``'s direct effect. Flow is conserved at every node: ``Σ in-edges + bias = T_B = Σ
out-edges (+ direct)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from captum_ffb.core.keys import WriterKind, is_writer_node
from captum_ffb.engine.autograd import sequence_shaped
from captum_ffb.engine.tape import (
    Covectors,
    GraphTape,
    Players,
    part_covectors,
    part_pulled_back,
    pulled_back,
    stream_sums,
    token_values,
)

#: The node kinds of :class:`~captum_ffb.engine.tape.GraphTape` (and of the graph's dict).
NODE_KINDS = ("token", "attention", "head", "ff", "neuron", "cross_attention", "bias", "output", "logit")


# --------------------------------------------------------------------------- the graph
@dataclass
class GraphData:
    """An attribution graph's numbers, before any view: nodes in a table and edges as
    coordinates.

    Attributes:
        kinds (list[str]): each node's kind (:data:`~captum_ffb.core.keys.NODE_KINDS`).
        layers (list[int]): each node's block (−1 for tokens, the bias and the output).
        heads (list[int]): each node's part (head, neuron; −1 for none).
        positions (list[int]): each node's position (−1 for the bias and the output).
        values (Tensor): ``(N,)`` each node's value (the output's: the explained value).
        sources (Tensor): ``(E,)`` long, the edges' source nodes.
        targets (Tensor): ``(E,)`` long, their target nodes.
        weights (Tensor): ``(E,)`` their weights.
        bias (int): the bias node's index; ``output`` the output node's.
        left_out (Tensor, optional): ``(N,)`` per node, what it receives from writer nodes
                    whose edges were not computed (``max_nodes``).
        computed (Tensor, optional): ``(N,)`` bool, the writer nodes whose in-edges were
                    computed (``None``: every one).
    """

    kinds: list[str]
    layers: list[int]
    heads: list[int]
    positions: list[int]
    values: Tensor
    sources: Tensor
    targets: Tensor
    weights: Tensor
    bias: int
    output: int
    left_out: Tensor | None = None
    computed: Tensor | None = None

    def __len__(self) -> int:
        return len(self.kinds)


class _Nodes:
    """The node table, filled writer by writer (values kept on the device)."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.layers: list[int] = []
        self.heads: list[int] = []
        self.positions: list[int] = []
        self.values: list[Tensor] = []

    def __len__(self) -> int:
        return len(self.kinds)

    def add(self, kind: str, layer: int, head: int, positions: Sequence[int], values: Tensor) -> list[int]:
        first = len(self.kinds)
        count = len(positions)
        self.kinds += [kind] * count
        self.layers += [layer] * count
        self.heads += [head] * count
        self.positions += [int(p) for p in positions]
        self.values.append(values.reshape(-1))
        return list(range(first, len(self.kinds)))



@dataclass
class _Layout:
    """Where a recorded pass's nodes are: the players' and the writers' node ids, on the
    pass's device (``-1`` on padding; ``-2`` for a writer node whose edges are not computed)."""

    leaves: list[Tensor]
    reals: list[list[int]]
    offsets: list[int]
    token_ids: list[Tensor]
    ids: list[Tensor]
    part_totals: list[Tensor | None]
    totals: Mapping[str, Tensor]
    device: torch.device
    joined: _Joined | None = None



@dataclass
class _Joined:
    """The computed writer nodes side by side, where every read stream is a plain sum
    (:func:`stream_sums`): a covector at a stream is the covector at each earlier writer's
    output, so what each earlier node sends along it is a dot product with its write. Only the
    nodes whose edges are computed keep their writes; what the others send (left out) is the
    covector's product with every earlier node's writes summed, less what the kept ones send.

    Attributes:
        writes (Tensor): ``(c, d)`` what each computed node (a sublayer, a head at a position)
                    adds to the stream, writer after writer.
        positions (Tensor): ``(c,)`` their positions; ``columns`` ``(c,)`` their writers' first
                    column, ``ids`` ``(c,)`` their node ids.
        starts (list[int]): writer ``k``'s first column (and the count at the end).
        sums (dict, optional): number of writers ``m`` → ``(n, d)`` every node's write of the
                    first ``m`` writers summed (``None``: every node is computed).
        n (int): the number of positions.
    """

    writes: Tensor
    positions: Tensor
    columns: Tensor
    ids: Tensor
    starts: list[int]
    sums: dict[int, Tensor] | None
    n: int

    #: kept nodes per product (``k × block × d`` numbers at once)
    block: int = 4096

    def send(self, edges: _Edges, at: Tensor, targets: Tensor, m: int) -> None:
        """The edges from every node of the first ``m`` writers into ``targets`` ``(k,)``
        along covectors ``at`` ``(k, n, d)`` at their stream."""
        count = int(torch.searchsorted(self.columns, self.starts[m]))
        sent = at.new_zeros(at.shape[0])
        for first in range(0, count, self.block):
            part = slice(first, min(count, first + self.block))
            w = torch.einsum("kcd,cd->kc", at[:, self.positions[part]], self.writes[part])
            edges.add(self.ids[None, part].expand_as(w), targets[:, None].expand_as(w), w)
            sent += w.sum(1)
        if self.sums is not None:  # the nodes left out: everything sent less the computed ones
            everything = torch.einsum("knd,nd->k", at, self.sums[m].to(at.dtype))
            edges.dropped.index_add_(0, targets, (everything - sent).to(edges.dropped.dtype))

    def send_at(self, edges: _Edges, at: Tensor, positions: Tensor, targets: Tensor, m: int) -> None:
        """As :meth:`send` for targets that each read one position (``positions`` ``(k,)``,
        covectors ``at`` ``(k, d)`` there)."""
        count = int(torch.searchsorted(self.columns, self.starts[m]))
        row = torch.full((self.n,), -1, dtype=torch.long, device=positions.device)
        row[positions] = torch.arange(len(positions), device=positions.device)
        rows = row[self.positions[:count]]
        keep = rows >= 0
        rows = rows[keep]
        w = (at[rows] * self.writes[:count][keep]).sum(-1)
        edges.add(self.ids[:count][keep], targets[rows], w)
        if self.sums is not None:
            sent = at.new_zeros(len(positions)).index_add_(0, rows, w)
            everything = (at * self.sums[m][positions].to(at.dtype)).sum(-1)
            edges.dropped.index_add_(0, targets, (everything - sent).to(edges.dropped.dtype))


def _joined(tape: GraphTape, ids: Sequence[Tensor], everything: bool) -> _Joined | None:
    """:class:`_Joined` for a pass of plain sums whose writers are sublayers or heads (a
    neuron sends through its output projection: the edges then go writer by writer);
    ``everything``: every writer node's edges are computed."""
    sums = stream_sums(tape)
    if sums is None or any(w.parts is not None and w.kind != "attention" for w in tape.writers):
        return None
    starts, writes, positions, columns, kept = [0], [], [], [], []
    needed = set(sums)
    n = tape.writers[0].output.detach()[0].shape[0]
    running = None
    prefix = {0: tape.writers[0].output.new_zeros(tape.writers[0].output.detach()[0].shape)} if 0 in needed else {}
    for k, w in enumerate(tape.writers):
        found = w.output.detach()[0][:, None] if w.parts is None else tape.part_cache.get(k)
        if found is None:
            found = tape.part_writes(k, w.parts.detach())  # (n, p, d), not kept
        starts.append(starts[-1] + found.shape[1])
        real = ids[k] != -1  # (n, p): the nodes at real positions
        chosen = ids[k] >= 0
        where = chosen.nonzero()
        writes.append(found[chosen])
        positions.append(where[:, 0])
        columns.append(torch.full((len(where),), starts[k], dtype=torch.long, device=found.device))
        kept.append(ids[k][chosen])
        if not everything:
            written = (found * real[..., None].to(found.dtype)).sum(1)
            running = written if running is None else running + written
            if k + 1 in needed:
                prefix[k + 1] = running.clone()
    return _Joined(torch.cat(writes), torch.cat(positions), torch.cat(columns), torch.cat(kept), starts,
                   None if everything else prefix, n)


def _real(players: Players) -> list[int]:
    return [int(p) for p in players.mask[0].nonzero()[:, 0].tolist()]


def _token_nodes(table: _Nodes, tape: GraphTape, total: Mapping[str, Tensor], players: Sequence[Players],
                 device: torch.device) -> tuple[list[Tensor], list[list[int]], list[int]]:
    """The players' nodes (their values: each token's contribution), per segment."""
    leaves = [leaf.detach() for leaf in tape.leaves]
    lengths = [leaf.shape[1] for leaf in leaves]
    offsets = [sum(lengths[:k]) for k in range(len(lengths))]
    reals = [_real(segment) for segment in players]
    token_ids = []
    for key, x, segment, real, offset in zip(tape.leaf_keys, leaves, players, reals, offsets):
        found = torch.full((x.shape[1],), -1, dtype=torch.long, device=device)
        values = token_values(total[key], x, segment.reference, segment.seen, segment.mask)[0, real]
        added = table.add("token", -1, -1, [p + offset for p in real], values)
        found[real] = torch.as_tensor(added, dtype=torch.long, device=device)
        token_ids.append(found)
    return token_ids, reals, offsets


def _writer_nodes(table: _Nodes, tape: GraphTape, total: Mapping[str, Tensor], reals: list[list[int]],
                  device: torch.device) -> tuple[list[Tensor], list[Tensor | None]]:
    """Every writer's (or part's) node at each real position, in stream order: node ids
    ``(n, parts)`` and each split writer's covector at its parts."""
    ids: list[Tensor] = []
    part_totals: list[Tensor | None] = []
    for index, writer in enumerate(tape.writers):
        g = total[writer.id]
        real, n = reals[writer.segment], writer.n
        at = [p + writer.offset for p in real]
        if writer.parts is None:
            found = torch.full((n, 1), -1, dtype=torch.long, device=device)
            values = sequence_shaped(g * writer.output.detach(), n).sum(-1)[0]
            added = table.add(writer.kind, writer.layer, -1, at, values[real])
            found[real, 0] = torch.as_tensor(added, dtype=torch.long, device=device)
            part_totals.append(None)
        else:
            gz = part_covectors(tape, index, g)
            part_totals.append(gz)
            values = (gz * writer.parts.detach()).sum(-1)[0]  # (n, parts)
            kind = WriterKind(writer.kind).part_kind
            found = torch.full((n, values.shape[1]), -1, dtype=torch.long, device=device)
            for j in range(values.shape[1]):
                added = table.add(kind, writer.layer, j, at, values[real, j])
                found[real, j] = torch.as_tensor(added, dtype=torch.long, device=device)
        ids.append(found)
    return ids, part_totals


def _chosen_nodes(values: Tensor, ids: list[Tensor], max_nodes: int | None, set_aside: Tensor | None = None
                  ) -> tuple[Tensor | None, list[Tensor]]:
    """With ``max_nodes``, the writer nodes whose edges are computed (those of largest
    ``|value|``, the nodes ``set_aside`` marks last; the others' ids become ``-2``); ``None``
    when every node's are."""
    writer_all = torch.cat([i.reshape(-1) for i in ids])
    writer_all = writer_all[writer_all >= 0]
    if max_nodes is None or len(writer_all) <= max_nodes:
        return None, ids
    score = values.abs() if set_aside is None else torch.where(set_aside, -1.0, values.abs())
    order = score[writer_all].argsort(descending=True)
    chosen = torch.zeros(len(values), dtype=torch.bool, device=values.device)
    chosen[writer_all[order[:max_nodes]]] = True
    ids = [torch.where(chosen[i.clamp_min(0)] & (i >= 0), i, torch.full_like(i, -2)) for i in ids]
    return chosen, ids


def _edges_into(edges: _Edges, tape: GraphTape, index: int, layout: _Layout, players: Sequence[Players],
                chunk: int) -> None:
    """The edges into writer ``index``'s nodes, ``chunk`` target nodes per batched
    vector–Jacobian product: from every earlier writer (or part) and from the players."""
    writer = tape.writers[index]
    g = layout.totals[writer.id] if writer.parts is None else layout.part_totals[index]
    ids = layout.ids[index]
    wanted = (ids.T >= 0).nonzero()[:, [1, 0]]  # (k, 2): position, part (part by part)
    seq = sequence_shaped(g, writer.n)  # a flattened (B·n, d) write as (B, n, d)
    if _position_wise(tape, index):
        _position_wise_edges_into(edges, tape, index, layout, players, wanted[:, 0], seq)
        return
    for first in range(0, len(wanted), chunk):
        group = wanted[first:first + chunk]
        rows = torch.arange(len(group), device=g.device)
        cot = torch.zeros((len(group), *seq.shape), dtype=g.dtype, device=g.device)
        if writer.parts is None:
            cot[rows, :, group[:, 0]] = seq[:, group[:, 0]].transpose(0, 1)
        else:
            cot[rows, :, group[:, 0], group[:, 1]] = seq[:, group[:, 0], group[:, 1]].transpose(0, 1)
        cot = cot.reshape(len(group), *g.shape)
        _, pulled = (pulled_back if writer.parts is None else part_pulled_back)(tape, index, cot)
        targets = ids[group[:, 0], group[:, 1]]
        if layout.joined is not None:  # every earlier node in one product
            layout.joined.send(edges, pulled[index][:, 0], targets, stream_sums(tape)[index])
        for source_index, covector in enumerate(pulled[:index] if layout.joined is None else ()):
            w = _edge_weights(tape, source_index, covector).reshape(len(group), tape.writers[source_index].n, -1)
            edges.add(layout.ids[source_index][None].expand_as(w), targets[:, None, None].expand_as(w), w)
        for segment, found in enumerate(layout.token_ids):
            who = players[segment]
            tokens = token_values(pulled[index + segment], layout.leaves[segment], who.reference, who.seen,
                                  who.mask)[:, 0]  # (k, n)
            edges.add(found[None].expand_as(tokens), targets[:, None].expand_as(tokens), tokens)


def _position_wise(tape: GraphTape, index: int) -> bool:
    """Whether writer ``index``'s edges can be computed from one vector–Jacobian product: an
    FF block not split into parts (it and the norm before it act on each position alone, and
    the stream reaches the earlier writers and the players through position-wise additions
    and norms only), in a single stack (every writer and player stream of one length)."""
    writer = tape.writers[index]
    return writer.kind == "ff" and writer.parts is None and len(tape.leaves) == 1 and \
        all(w.n == writer.n for w in tape.writers[:index]) and sequence_shaped(tape.leaves[0], writer.n).shape[1] == writer.n


def _position_wise_edges_into(edges: _Edges, tape: GraphTape, index: int, layout: _Layout,
                              players: Sequence[Players], positions: Tensor, seq: Tensor) -> None:
    """The edges into a position-wise writer's nodes (:func:`_position_wise`): the node at
    position ``p`` receives only from the writer nodes at ``p`` (and from the tokens through
    its covector at ``p``), so its covectors at every kept position go back in one product,
    each position's share read where it lands."""
    if not len(positions):
        return
    writer = tape.writers[index]
    ids = layout.ids[index]
    cot = torch.zeros((1, *seq.shape), dtype=seq.dtype, device=seq.device)
    cot[0, :, positions] = seq[:, positions]
    _, pulled = pulled_back(tape, index, cot.reshape(1, *layout.totals[writer.id].shape))
    targets = ids[positions, 0]
    if layout.joined is not None:  # every earlier node in one product
        layout.joined.send_at(edges, pulled[index][0, 0, positions], positions, targets, stream_sums(tape)[index])
    for source_index, covector in enumerate(pulled[:index] if layout.joined is None else ()):
        w = _edge_weights(tape, source_index, covector).reshape(tape.writers[source_index].n, -1)[positions]
        sources = layout.ids[source_index][positions]  # (k, parts)
        edges.add(sources, targets[:, None].expand_as(w), w)
    # the tokens: each node's covector at the players' stream alone (a reference shares a
    # token's start over every position)
    at_players = pulled[index][0]  # (B, n, d)
    rows = torch.arange(len(positions), device=positions.device)
    each = torch.zeros((len(positions), *at_players.shape), dtype=at_players.dtype, device=at_players.device)
    each[rows, :, positions] = at_players[:, positions].transpose(0, 1)
    who = players[0]
    tokens = token_values(each, layout.leaves[0], who.reference, who.seen, who.mask)[:, 0]  # (k, n)
    found = layout.token_ids[0]
    edges.add(found[None].expand_as(tokens), targets[:, None].expand_as(tokens), tokens)


def _edge_weights(tape: GraphTape, source_index: int, covector: Tensor) -> Tensor:
    """``(k, n, parts)``: what writer ``source_index``'s nodes send along covectors at its
    output ``(k, B, n, d)`` (a dot product with its write; for heads with what each head
    writes; for neurons through its output projection)."""
    source = tape.writers[source_index]
    at_output = sequence_shaped(covector, source.n, 1)[:, 0]  # (k, n, d)
    if source.parts is None:
        return (at_output * sequence_shaped(source.output.detach(), source.n)[0]).sum(-1)
    if source.kind == "attention":  # heads: dot products with what each head writes
        return torch.einsum("knd,npd->knp", at_output, tape.part_outputs(source_index))
    # neurons: through the output projection (a head's way would hold n·d_ff·d)
    at_parts = source.part_grad(source.output, covector, batched=True)
    return (at_parts[:, 0] * source.parts.detach()[0]).sum(-1)  # (k, n, parts)


def _bias_and_direct_edges(edges: _Edges, tape: GraphTape, direct: Mapping[str, Tensor], layout: _Layout,
                           players: Sequence[Players], values: Tensor, bias: int, output: int,
                           logits: Sequence[tuple[int, Mapping[str, Tensor]]] = ()) -> None:
    """The bias node's edges (what each writer node receives beyond the nodes' edges: its
    own constants and the stream's) and every node's direct edge into the output, then the
    output's bias edge (the head's constants). With ``logits`` (node, its unit's direct
    covectors) the direct edges go into each logit node instead, each logit node's bias edge
    holds its unit's constants, and each logit node sends its value on to the output."""
    device = layout.device
    writer_nodes = torch.cat([i.reshape(-1) for i in layout.ids])
    writer_nodes = writer_nodes[writer_nodes >= 0]
    edges.add(torch.full_like(writer_nodes, bias), writer_nodes,
              values[writer_nodes] - edges.inflow[writer_nodes] - edges.dropped[writer_nodes])
    for sink, covectors_ in logits:
        _direct_edges(edges, tape, covectors_, layout, players, sink)
        ends = torch.tensor([sink], device=device)
        edges.add(torch.tensor([bias], device=device), ends,
                  (values[sink] - edges.inflow[sink] - edges.dropped[sink]).reshape(1))
        edges.add(ends, torch.tensor([output], device=device), values[sink].reshape(1))
    if not logits:
        _direct_edges(edges, tape, direct, layout, players, output)
    edges.add(torch.tensor([bias], device=device), torch.tensor([output], device=device),
              (values[output] - edges.inflow[output] - edges.dropped[output]).reshape(1))


def _direct_edges(edges: _Edges, tape: GraphTape, direct: Mapping[str, Tensor], layout: _Layout,
                  players: Sequence[Players], output: int) -> None:
    """Every writer node's and token's direct edge into ``output`` along the covectors ``direct``."""
    for index, writer in enumerate(tape.writers):
        d = direct[writer.id]
        w = sequence_shaped(d * writer.output.detach(), writer.n).sum(-1)[0][:, None] if writer.parts is None else \
            (part_covectors(tape, index, d) * writer.parts.detach()).sum(-1)[0]
        edges.add(layout.ids[index], torch.full_like(layout.ids[index], output), w)
    for key, x, segment, found in zip(tape.leaf_keys, layout.leaves, players, layout.token_ids):
        direct_tokens = token_values(direct[key], x, segment.reference, segment.seen, segment.mask)[0]
        edges.add(found, torch.full_like(found, output), direct_tokens)


def edge_chunk(tape: GraphTape, memory_budget: int | None) -> int:
    """Target nodes per batched vector–Jacobian product: as many as ``memory_budget`` bytes
    hold, at about eight tensors of the stream's size per target (its cotangents, their
    products at the stream and at the values, the edges' weights), from 1 to 64; 16 without
    a budget."""
    if memory_budget is None:
        return 16
    leaf = tape.leaves[-1]
    per_target = 8 * sum(x.shape[1] for x in tape.leaves) * leaf.shape[-1] * leaf.element_size()
    return max(1, min(64, int(memory_budget) // per_target))


def build_graph(tape: GraphTape, covectors_: Covectors, players: Sequence[Players], chunk: int | None = None,
                max_nodes: int | None = None, exclude_positions: Sequence[int] = (),
                memory_budget: int | None = None, logits: Sequence[tuple[int, int, Tensor, Mapping[str, Tensor]]] = ()
                ) -> GraphData:
    """Every node and every non-zero edge of one recorded pass (batch of one), computed on
    the pass's device and handed back on the CPU.

    Args:
        tape (GraphTape): the pass (:func:`~captum_ffb.engine.tape.graph_pass`).
        covectors_ (Covectors): its covectors (:func:`~captum_ffb.engine.tape.covectors`).
        players (list[Players]): per segment of :attr:`~captum_ffb.engine.tape.GraphTape.leaves`, its players.
        chunk (int, optional): target nodes per batched vector–Jacobian product (default:
                    :func:`edge_chunk` of ``memory_budget``).
        max_nodes (int, optional): compute the edges into (and out of) only this many writer
                    nodes, those of largest ``|value|`` (the others keep their values; the
                    output's direct edges are always computed).
        exclude_positions (list[int]): positions whose writer nodes ``max_nodes`` chooses
                    last (an attention sink's: their edges are then rarely computed).

        memory_budget (int, optional): bytes each batched product may take (sizes ``chunk``).
        logits (list, optional): for an output that sums several logits, per logit ``(unit,
                    position, its term's value (1,), its direct covectors)``: a ``logit`` node
                    each, between the writers' direct edges and the output.

    Positions are the layout's: ``[source | target]`` for an encoder–decoder.
    """
    chunk = edge_chunk(tape, memory_budget) if chunk is None else chunk
    device = tape.inputs.device
    table = _Nodes()
    total, direct = covectors_.total, covectors_.direct
    token_ids, reals, offsets = _token_nodes(table, tape, total, players, device)
    ids, part_totals = _writer_nodes(table, tape, total, reals, device)
    dtype = tape.leaves[-1].dtype
    bias = table.add("bias", -1, -1, [-1], torch.zeros(1, dtype=dtype, device=device))[0]
    output = table.add("output", -1, -1, [-1], tape.value.detach().to(dtype).reshape(1))[0]
    sinks = [(table.add("logit", -1, unit, [position], term.detach().to(dtype).reshape(1))[0], found)
             for unit, position, term, found in logits]
    values = torch.cat([v.detach().to(dtype) for v in table.values])
    set_aside = None
    if exclude_positions:
        set_aside = torch.tensor([is_writer_node(k) and p in set(exclude_positions)
                                  for k, p in zip(table.kinds, table.positions)], device=device)
    chosen, ids = _chosen_nodes(values, ids, max_nodes, set_aside)
    layout = _Layout([leaf.detach() for leaf in tape.leaves], reals, offsets, token_ids, ids, part_totals, total,
                     device, _joined(tape, ids, chosen is None))
    edges = _Edges(len(values), dtype, device)
    for index in range(len(tape.writers)):
        _edges_into(edges, tape, index, layout, players, chunk)
    _bias_and_direct_edges(edges, tape, direct, layout, players, values, bias, output, sinks)
    values[bias] = edges.outflow(bias)
    sources, targets, weights = edges.stacked()
    return GraphData(table.kinds, table.layers, table.heads, table.positions, values.cpu(), sources.cpu(),
                     targets.cpu(), weights.cpu(), bias, output, None if chosen is None else edges.dropped.cpu(),
                     None if chosen is None else chosen.cpu())


class _Edges:
    """Edges as coordinates on the device, kept where their weight is not zero (or the source
    is a node whose edges are not computed: what it sends is counted as left out)."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.sources: list[Tensor] = []
        self.targets: list[Tensor] = []
        self.weights: list[Tensor] = []
        self.inflow = torch.zeros(size, dtype=dtype, device=device)
        #: per node, what it receives from nodes left out (``max_nodes``)
        self.dropped = torch.zeros(size, dtype=dtype, device=device)

    def add(self, source: Tensor, target: Tensor, weight: Tensor) -> None:
        source, target = source.reshape(-1), target.reshape(-1)
        weight = weight.detach().reshape(-1).to(self.inflow.dtype)
        left_out = (source == -2) & (target >= 0)  # from a node whose edges are not kept
        self.dropped.index_add_(0, target[left_out], weight[left_out])
        keep = (source >= 0) & (target >= 0) & (weight != 0)
        source, target, weight = source[keep], target[keep], weight[keep]
        self.sources.append(source)
        self.targets.append(target)
        self.weights.append(weight)
        self.inflow.index_add_(0, target, weight)

    def outflow(self, node: int) -> Tensor:
        return sum((w[s == node].sum() for s, w in zip(self.sources, self.weights)),
                   torch.zeros((), dtype=self.inflow.dtype, device=self.inflow.device))

    def stacked(self) -> tuple[Tensor, Tensor, Tensor]:
        return torch.cat(self.sources), torch.cat(self.targets), torch.cat(self.weights)


# --------------------------------------------------------------------------- pruning
def prune_masks(d: GraphData, node_mask: Tensor, edge_mask: Tensor, node_threshold: float, edge_threshold: float
                ) -> tuple[Tensor, Tensor, Tensor]:
    """circuit-tracer's pruning of a graph's shown nodes and edges: nodes by their influence
    on the output (absolute edge weights, each node's in-edges normalised, influence summed
    over paths) until ``node_threshold`` of it is kept, then edges by their influence until
    ``edge_threshold``; tokens, the bias and the output always stay; writers left without an
    in-edge or an out-edge go. Returns ``(node mask, edge mask, each node's influence)``, on the
    graph's device."""
    with torch.device(d.values.device):
        return _pruned(d, node_mask, edge_mask, node_threshold, edge_threshold)


def _pruned(d: GraphData, node_mask: Tensor, edge_mask: Tensor, node_threshold: float, edge_threshold: float
            ) -> tuple[Tensor, Tensor, Tensor]:
    keep = node_mask.nonzero()[:, 0]
    position = torch.full((len(d),), -1, dtype=torch.long)
    position[keep] = torch.arange(len(keep))
    edges = edge_mask & (position[d.sources] >= 0) & (position[d.targets] >= 0)
    size = len(keep)
    adjacency = torch.zeros(size, size, dtype=torch.float64)
    adjacency.index_put_((position[d.targets[edges]], position[d.sources[edges]]),
                         d.weights[edges].double(), accumulate=True)
    weights = torch.zeros(size, dtype=torch.float64)
    weights[position[d.output]] = 1.0
    influence = _influence(_normalised(adjacency), weights)
    always = torch.tensor([not is_writer_node(d.kinds[int(i)]) for i in keep])
    chosen = (influence >= _threshold(influence, node_threshold)) | always
    pruned = adjacency.clone()
    pruned[~chosen] = 0
    pruned[:, ~chosen] = 0
    normalised = _normalised(pruned)
    scores = normalised * (_influence(normalised, weights) + weights)[:, None]
    edge_keep = scores >= _threshold(scores[scores > 0].flatten(), edge_threshold)
    edge_keep &= pruned != 0
    for _ in range(size):  # nodes without an in-edge (writers) or an out-edge go, until none does
        before = chosen.clone()
        has_out = edge_keep.any(0)
        has_in = edge_keep.any(1)
        writer = ~always
        chosen &= ~writer | (has_out & has_in)
        edge_keep &= chosen[:, None] & chosen[None, :]
        if torch.equal(before, chosen):
            break
    kept_nodes = torch.zeros(len(d), dtype=torch.bool)
    kept_nodes[keep[chosen]] = True
    kept_edges = edges.clone()
    kept_edges[edges] = edge_keep[position[d.targets[edges]], position[d.sources[edges]]]
    full_influence = torch.zeros(len(d), dtype=torch.float64)
    full_influence[keep] = influence
    return kept_nodes, kept_edges, full_influence


def _normalised(matrix: Tensor) -> Tensor:
    """Absolute weights, each row (a node's in-edges) summing to 1."""
    found = matrix.abs()
    return found / found.sum(dim=1, keepdim=True).clamp(min=1e-30)


def _influence(adjacency: Tensor, weights: Tensor, steps: int = 10_000) -> Tensor:
    """``w A + w A² + …``: each node's influence on the nodes ``weights`` weighs (the graph is
    acyclic, so the sum ends)."""
    current = weights @ adjacency
    total = current.clone()
    for _ in range(steps):
        if not bool(current.any()):
            return total
        current = current @ adjacency
        total += current
    raise RuntimeError("the influence did not converge: the graph has a cycle")


def _threshold(scores: Tensor, share: float) -> Tensor:
    """The score above which ``share`` of the scores' total lies."""
    if scores.numel() == 0:
        return torch.tensor(float("inf"))
    ordered = scores.sort(descending=True).values
    cumulative = ordered.cumsum(0) / ordered.sum().clamp(min=1e-30)
    index = min(int(torch.searchsorted(cumulative, torch.tensor(share, dtype=cumulative.dtype))), len(ordered) - 1)
    return ordered[index]
