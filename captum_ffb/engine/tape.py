r"""The recorded pass: the stock model run once with every coefficient frozen and every writer
of the residual stream reading the stream through a leaf of its own (:func:`graph_pass`),
and the covectors that follow from it.

With the coefficients frozen the model is linear in every writer: for a writer ``A`` with
output ``o_A`` the gradient of the output at ``o_A`` in this pass is its *direct* covector,
``J_Bᵀ G`` is a vector–Jacobian product from a writer ``B``'s output to its own leaf, and
pulling a covector back from where ``B`` reads the stream to where an earlier writer wrote
it crosses only residual connections and frozen norms; the total covectors ``G_A =
g_A^direct + Σ_B pull-back of J_Bᵀ G_B`` follow from the last writer to the first
(:func:`covectors`). The graph feature (:mod:`captum_ffb.graph`), the patching estimators
and the score splits read their numbers from a :class:`GraphTape`.

The pass's coefficients are recorded (``captum_ffb.engine.frozen``), so an edit of it
(a node removed, one edge cut, an output patched from another run) can be run again in the
same frozen model.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb._private import add_alpha
from captum_ffb.core.vocabulary import check_granularity
from captum_ffb.engine.autograd import batched_vjp, first_input, sequence_shaped, swap_first, vjp
from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.frozen import FrozenCoefficients
from captum_ffb.engine.head import HeadTarget, output_logits, target_value
from captum_ffb.engine.linearise import linearise
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.players import token_contributions
from captum_ffb.engine.points import Writer
from captum_ffb.engine.rows import AttentionRows, RowRoute, row_route

#: :attr:`GraphTape.sums_cache` before :func:`stream_sums` has read the tape.
_UNREAD = object()


@dataclass
class RecordedWriter:
    """One writer of the residual stream as a recorded pass saw it.

    Attributes:
        id (str): its id, the :class:`~captum_ffb.engine.points.Writer`'s: ``"block.<l>.attention"``,
                    ``"block.<l>.cross_attention"``, ``"block.<l>.ff"``.
        layer (int): its block (an encoder–decoder's decoder blocks after the encoder's).
        kind (str): ``"attention"``, ``"cross_attention"`` or ``"ff"``.
        output (Tensor): ``(B, n, d)`` what it adds to the stream (its graph kept).
        read (str): the key of the stream point it reads (:attr:`GraphTape.reads`).
        parts (Tensor, optional): ``(B, n, k, w)`` the input of its output projection split
                    into its parts (the heads of an attention, the neurons of an FF: ``w`` 1),
                    when the graph is finer than sublayers.
        raw (Tensor, optional): the parts as recorded (with their graph).
        segment (int): the players it writes over (0: the tokens, or an encoder–decoder's
                    source; 1: its target).
        n (int): the segment's length; ``offset`` its first position in the layout
                    ``[source | target]``.
    """

    id: str
    layer: int
    kind: str
    output: Tensor
    read: str
    parts: Tensor | None = None
    raw: Tensor | None = None
    segment: int = 0
    n: int = 0
    offset: int = 0

    @property
    def key(self) -> str:
        """Its :attr:`id` (the name before 0.4)."""
        return self.id

    def part_grad(self, outputs: Tensor, cotangents: Tensor, batched: bool = False) -> Tensor:
        """The gradient at the parts (``raw``, the recorded tensor, reshaped as ``parts``)."""
        if batched:
            (found,) = batched_vjp(outputs, [self.raw], cotangents)
            return found.reshape(found.shape[0], *self.parts.shape)
        (found,) = vjp(outputs, [self.raw], cotangents)
        return found.reshape(self.parts.shape)



@dataclass
class GraphTape:
    """What one frozen pass with separate reads recorded.

    Attributes:
        value (Tensor): ``(B,)`` the explained value (with its graph).
        inputs (Tensor): ``(B, n, d)`` the first block's input, a leaf (an encoder–decoder's
                    decoder's).
        writers (list[RecordedWriter]): in stream order.
        reads (dict): stream point → ``(the stream there, with its graph; the leaf the writer
                    read instead)``.
        coefficients (FrozenCoefficients): the pass's coefficients (to replay it).
        output (Any): the model's output (a causal LM's logits at the target's positions only).
        source_inputs (Tensor, optional): an encoder–decoder's encoder's first input, a leaf.
        target (HeadTarget, optional): the explained target as ``output`` holds it.
    """

    value: Tensor
    inputs: Tensor
    writers: list[RecordedWriter]
    reads: dict[str, tuple[Tensor, Tensor]]
    coefficients: FrozenCoefficients
    output: Any = None
    source_inputs: Tensor | None = None
    target: HeadTarget | None = None
    #: writer index → its parts' writes (:meth:`part_outputs`), computed once
    part_cache: dict[int, Tensor] = field(default_factory=dict, repr=False)
    #: :func:`stream_sums` of the tape, read once
    sums_cache: Any = field(default=None, repr=False)
    #: (writer index, from its parts) → its :class:`~captum_ffb.engine.rows.RowRoute` (or ``None``);
    #: under ``None`` the recorded attention calls by their output's autograd node
    routes: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.sums_cache = _UNREAD

    @property
    def leaves(self) -> list[Tensor]:
        """The players' streams: ``[source, target]`` or ``[tokens]``."""
        return [self.inputs] if self.source_inputs is None else [self.source_inputs, self.inputs]

    @property
    def leaf_keys(self) -> list[str]:
        """Their keys in :class:`~captum_ffb.engine.tape.Covectors`."""
        return ["inputs"] if self.source_inputs is None else ["source_inputs", "inputs"]

    def part_outputs(self, index: int) -> Tensor:
        """``(n, p, d)``: what each part of writer ``index`` (a head) adds to the stream at each
        position, ``J part_j`` for the frozen linear map ``J`` from its parts to its output
        (its output projection, and a frozen post-norm), computed once and kept. An edge
        from a part is then a dot product with the covector at the writer's output, not a
        vector–Jacobian product through the projection."""
        if index not in self.part_cache:
            self.part_cache[index] = self.part_writes(index, self.writers[index].parts.detach())
        return self.part_cache[index]

    def part_writes(self, index: int, parts: Tensor) -> Tensor:
        """``(n, p, d)``: ``J v_j`` for parts ``v`` shaped as writer ``index``'s (``(1, n, p, w)``):
        what each part would add to the stream through the writer's frozen linear map ``J``."""
        writer = self.writers[index]
        k = parts.shape[2]
        # J v by the double-vector–Jacobian trick: u ↦ ⟨Jᵀu, v⟩ has the gradient J v
        dummy = torch.zeros_like(writer.output, requires_grad=True)
        (transposed,) = torch.autograd.grad(writer.output, writer.raw, dummy, create_graph=True)
        found = []
        for start in range(0, k, 64):  # the tangents of 64 parts at a time (an FF has thousands)
            chunk = range(start, min(k, start + 64))
            tangents = torch.zeros((len(chunk), *parts.shape), dtype=parts.dtype, device=parts.device)
            for row, j in enumerate(chunk):
                tangents[row, :, :, j] = parts[:, :, j]
            (written,) = batched_vjp(transposed, [dummy], tangents.reshape(len(chunk), *writer.raw.shape))
            found.append(sequence_shaped(written, writer.n, 1)[:, 0].permute(1, 0, 2).detach())
        return torch.cat(found, dim=1)  # (n, p, d)

    def route(self, index: int, parts: bool) -> RowRoute | None:
        """Writer ``index``'s :class:`~captum_ffb.engine.rows.RowRoute` from its output (or its
        ``parts``) to the stream it reads, found once (``None``: its products go through
        autograd)."""
        if (index, parts) not in self.routes:
            writer = self.writers[index]
            if None not in self.routes:  # the recorded attention calls by their output's node, read once
                self.routes[None] = {kept.output.grad_fn: kept for key, kept in self.coefficients.values.items()
                                     if key[0] == "attention" and isinstance(kept, AttentionRows)
                                     and kept.output.grad_fn is not None}
            calls = self.routes[None]
            start = writer.raw if parts else writer.output
            self.routes[(index, parts)] = None if not calls or writer.kind != "attention" else \
                row_route(start, self.reads[writer.read][1], calls)
        return self.routes[(index, parts)]

    def stream_after(self, index: int) -> Tensor:
        """``(B, n, d)``: the stream just after writer ``index`` has written (the stream it
        reads plus its output; in a parallel block, without its sibling's)."""
        writer = self.writers[index]
        stream = self.reads[writer.read][0].detach()
        return sequence_shaped(stream, writer.n) + sequence_shaped(writer.output.detach(), writer.n)


class StreamRecorder:
    """The hooks of :func:`graph_pass` and :func:`~captum_ffb.patching.patches.real_writers`, installed on their pass
    (after the linearisation's own)."""

    def __init__(self, run: ModelPass) -> None:
        self.run = run
        self.tape_reads: dict[str, tuple[Tensor, Tensor]] = {}
        self.outputs: dict[str, Tensor] = {}
        self.parts: dict[str, Tensor] = {}

    def read(self, module: nn.Module, key: str) -> None:
        def hook(mod, args, kwargs):
            if key in self.tape_reads:  # a module shared by two writers (one LN for both)
                return swap_first(args, kwargs, self.tape_reads[key][1])
            stream = first_input(args, kwargs)
            leaf = stream.detach().requires_grad_(True)
            self.tape_reads[key] = (stream, leaf)
            return swap_first(args, kwargs, leaf)

        self.run.before(module, hook, with_kwargs=True)

    def write(self, module: nn.Module, key: str) -> None:
        def hook(mod, args, output):
            kept = output[0] if isinstance(output, tuple) else output
            self.outputs[key] = kept
            copy = kept.clone()  # a block may add to it in place (Falcon): the stream gets a copy
            return (copy, *output[1:]) if isinstance(output, tuple) else copy

        self.run.after(module, hook)

    def part(self, module: nn.Module, key: str) -> None:
        def hook(mod, args):
            self.parts[key] = args[0]

        self.run.before(module, hook)


def graph_pass(engine: BoundModel, request: Request, target: HeadTarget, rules: Mapping[str, Callable],
               granularity: str, coefficients: FrozenCoefficients | None = None,
               edit: Callable[[StreamRecorder], list[Any]] | None = None) -> GraphTape:
    """One pass of the frozen model in which every writer reads the stream through a leaf of
    its own, recording its coefficients into ``coefficients`` (a new store by default; with
    ``FrozenCoefficients(scores=True)`` also every head's queries and keys; a store's
    ``replayed()`` runs the recorded frozen model again), ``edit`` adding hooks that change
    the pass (registered last).

    An encoder–decoder's writers are the encoder's blocks' (layers ``0 … L_e − 1``, over the
    source) then the decoder's (layers ``L_e …``, over the target), each decoder block's
    cross-attention a writer of its own that reads the encoder's output (its value
    projection's input: with the probabilities frozen, nothing else of it depends on a
    writer)."""
    check_granularity(granularity, "graph")
    kwargs, (target,) = engine.keep_needed_logits(dict(request.kwargs), [target])  # target: in the kept logits
    head = engine.head
    store = FrozenCoefficients() if coefficients is None else coefficients
    points = engine.points
    source = None if engine.source is None else (engine.source.spec, engine.source.blocks, engine.source.final_norm)
    watch = {} if head.output is None else {"output": head.output}
    with ModelPass(engine.model, grad=True) as run, \
            linearise(run, engine.stack.spec, engine.stack.blocks, rules, head.final_norm, head.linearised_steps(),
                      watch, coefficients=store, source=source) as frozen:
        recorder = StreamRecorder(run)
        for read in points.reads:
            recorder.read(read.module, read.id)
        for writer in points.writers:
            recorder.write(writer.module, writer.id)
            if splits_parts(writer, granularity):
                recorder.part(writer.parts, writer.id)
        if edit is not None:
            edit(recorder)
        output = run.run(*request.args, **kwargs)
        value = engine.linearised_value(output, frozen, target, rules)
        leaves = frozen.leaves
    lengths = [leaf.shape[1] for leaf in leaves]
    offsets = [sum(lengths[:k]) for k in range(len(lengths))]
    batch = request.read_mask.shape[0]
    writers = [recorded_writer(recorder, writer, batch, segment=writer.segment, n=lengths[writer.segment],
                               offset=offsets[writer.segment]) for writer in points.writers]
    return GraphTape(value, leaves[-1], writers, recorder.tape_reads, store, output,
                     source_inputs=leaves[0] if len(leaves) == 2 else None, target=target)


def recorded_writer(recorder: Any, writer: Writer, batch: int, **where: int) -> RecordedWriter:
    """Writer ``writer`` as ``recorder`` saw it: its output, and its parts (``(B, n, p, w)``:
    an attention's heads, an FF's neurons) where they were recorded; ``where``: its
    ``segment``, ``n`` and ``offset``."""
    raw = recorder.parts.get(writer.id)
    part = None
    if raw is not None:
        part = raw.reshape(batch, -1, raw.shape[-1]) if raw.dim() == 2 else raw
        split = writer.n_heads if writer.kind == "attention" else part.shape[-1]
        part = part.reshape(batch, part.shape[1], split, -1)
    return RecordedWriter(writer.id, writer.layer, writer.kind, recorder.outputs[writer.id], writer.read, part, raw,
                          **where)


def splits_parts(writer: Writer, granularity: str) -> bool:
    """Whether the graph splits ``writer`` into its parts: an attention into heads (head and
    neuron graphs), a dense FF into neurons (neuron graphs)."""
    if writer.parts is None:
        return False
    if writer.kind == "attention":
        return granularity != "sublayer"
    return writer.kind == "ff" and granularity == "neuron"



@dataclass
class Covectors:
    """The frozen gradients of a recorded pass.

    Attributes:
        direct (dict): writer key → ``(B, n, d)`` its direct covector (to the output through
                    later norms and the head only); ``"inputs"`` the players' stream.
        total (dict): writer key → ``(B, n, d)`` its total covector ``G`` (all paths).
    """

    direct: dict[str, Tensor]
    total: dict[str, Tensor]


def earlier(tape: GraphTape, index: int) -> list[RecordedWriter]:
    """The writers before ``tape.writers[index]``."""
    return tape.writers[:index]


#: Autograd nodes through which a gradient passes unchanged (an addition with ``alpha`` 1, a copy).
_PLAIN = ("AddBackward0", "CloneBackward0")


def stream_sums(tape: GraphTape) -> list[int] | None:
    """Per writer ``i``, the ``m`` such that the stream it reads is exactly the players' stream
    plus the outputs of writers ``0 … m − 1``, each added once (its gradient then reaches each
    of them, and the players, unchanged); ``None`` where some stream is not such a sum (a
    Post-LN norm, a scaled residual, two stacks): read from the pass's own autograd graph,
    once per tape."""
    if tape.sums_cache is _UNREAD:
        tape.sums_cache = _stream_sums(tape)
    return tape.sums_cache


def _stream_sums(tape: GraphTape) -> list[int] | None:
    if len(tape.leaves) != 1:
        return None
    leaf = tape.leaves[0]
    outputs = {w.output.grad_fn: k for k, w in enumerate(tape.writers)
               if w.output.grad_fn is not None and w.output.shape == leaf.shape}
    if len(outputs) != len(tape.writers):
        return None
    known: dict[Any, collections.Counter] = {}  # a read stream's node → what it sums
    sums = []
    for writer in tape.writers:
        stream = tape.reads[writer.read][0]
        if stream is leaf:
            counts = collections.Counter({-1: 1})
        elif stream.grad_fn in known:
            counts = known[stream.grad_fn]
        else:
            counts = _summands(stream.grad_fn, outputs, leaf, known)
            if counts is None:
                return None
            known[stream.grad_fn] = counts
        m = len(counts) - 1
        if counts != collections.Counter({k: 1 for k in range(-1, m)}):
            return None  # not the players and a prefix of the writers, each once
        sums.append(m)
    return sums


def _summands(node: Any, outputs: Mapping[Any, int], leaf: Tensor, known: Mapping[Any, collections.Counter]
              ) -> collections.Counter | None:
    """What the stream at ``node`` sums (writer index → times, ``-1`` the players' stream), or
    ``None`` where anything but plain additions and copies lies between."""
    counts: collections.Counter = collections.Counter()
    stack = [node]
    while stack:
        node = stack.pop()
        if node is None:
            continue  # a constant
        if node in outputs:
            counts[outputs[node]] += 1
        elif node in known:
            counts.update(known[node])
        elif type(node).__name__ == "AccumulateGrad":
            if node.variable is not leaf:
                return None
            counts[-1] += 1
        elif type(node).__name__ in _PLAIN and add_alpha(node) == 1:
            stack.extend(f for f, _ in node.next_functions)
        else:
            return None
    return counts


def stream_pulled(tape: GraphTape, index: int, cotangents: Tensor) -> list[Tensor]:
    """``k`` cotangents ``(k, B, n, d)`` at the stream writer ``index`` reads, pulled back to
    every earlier writer's output and to the players' streams (:attr:`GraphTape.leaves`): where
    that stream is a plain sum (:func:`stream_sums`) the cotangents themselves (zero for the
    writers it does not hold), else one vector–Jacobian product."""
    sums = stream_sums(tape)
    if sums is None:
        stream = tape.reads[tape.writers[index].read][0]
        return batched_vjp(stream, [w.output for w in earlier(tape, index)] + tape.leaves, cotangents)
    m = sums[index]
    zero = cotangents.new_zeros(()).expand_as(cotangents)
    return [cotangents if k < m else zero for k in range(index)] + [cotangents]


def unit_terms(engine: BoundModel, tape: GraphTape) -> list[Tensor]:
    """The explained value's terms ``coef_k · logit_k`` (each ``(B,)``, with the pass's graph), read
    from the model's own output one unit at a time: they sum to the explained value less the
    read-out's offset."""
    target = tape.target
    terms = []
    for k in range(target.coefficients.shape[1]):
        one = replace(target, weights=target.weights[:, k:k + 1], biases=target.biases[:, k:k + 1],
                      coefficients=target.coefficients[:, k:k + 1], indices=target.indices[:, k:k + 1], offset=0.0)
        terms.append(target_value(engine.head, tape.output, one))
    return terms


def unit_covectors(engine: BoundModel, tape: GraphTape) -> list[tuple[Tensor, dict[str, Tensor]]]:
    """Per term of :func:`unit_terms`, the term and every writer's (and the players' streams')
    direct covector of it: the direct ones of :func:`covectors` split by the unit read (they
    sum to them)."""
    outputs = [w.output for w in tape.writers] + tape.leaves
    keys = [w.id for w in tape.writers] + tape.leaf_keys
    return [(term, dict(zip(keys, vjp(term.sum(), outputs, torch.ones_like(term.sum())))))
            for term in unit_terms(engine, tape)]


def covectors(tape: GraphTape) -> Covectors:
    """Direct and total covectors of every writer (and of the players' streams, ``"inputs"``
    and an encoder–decoder's ``"source_inputs"``): the direct ones from the output's gradient
    in the pass, the totals from the last writer to the first, each writer's ``J_Bᵀ G_B``
    pulled back to the earlier ones."""
    outputs = [w.output for w in tape.writers] + tape.leaves
    keys = [w.id for w in tape.writers] + tape.leaf_keys
    direct = dict(zip(keys, vjp(tape.value.sum(), outputs, torch.ones_like(tape.value.sum()))))
    sums = stream_sums(tape)
    if sums is not None:
        return Covectors(direct, _summed_totals(tape, direct, sums))
    total = {key: g.clone() for key, g in direct.items()}
    for index in range(len(tape.writers) - 1, -1, -1):
        writer = tape.writers[index]
        stream, leaf = tape.reads[writer.read]
        (back,) = vjp(writer.output, [leaf], total[writer.id])
        sources = earlier(tape, index)
        pulled = vjp(stream, [w.output for w in sources] + tape.leaves, back)
        for source, g in zip([w.id for w in sources] + tape.leaf_keys, pulled):
            total[source] = total[source] + g
    return Covectors(direct, total)


def _summed_totals(tape: GraphTape, direct: Mapping[str, Tensor], sums: Sequence[int]) -> dict[str, Tensor]:
    """The total covectors where every read stream is a plain sum (:func:`stream_sums`):
    writer ``k``'s is its direct one plus ``J_Bᵀ G_B`` of every later writer ``B`` whose
    stream holds ``k``'s output, summed from the top down in one running sum."""
    count = len(tape.writers)
    waiting: list[Tensor | None] = [None] * (count + 1)  # by the number of writers a stream holds
    running = None
    total: dict[str, Tensor] = {}
    for index in range(count - 1, -1, -1):
        if waiting[index + 1] is not None:
            running = waiting[index + 1] if running is None else running + waiting[index + 1]
        writer = tape.writers[index]
        g = direct[writer.id] if running is None else direct[writer.id] + running
        total[writer.id] = g
        (back,) = vjp(writer.output, [tape.reads[writer.read][1]], g)
        m = sums[index]
        waiting[m] = back if waiting[m] is None else waiting[m] + back
    everything = [w for w in waiting if w is not None]  # every stream holds the players'
    key = tape.leaf_keys[0]
    total[key] = direct[key] + sum(everything) if everything else direct[key].clone()
    return total


def pulled_back(tape: GraphTape, index: int, cotangents: Tensor) -> tuple[Tensor, list[Tensor]]:
    """For ``k`` cotangents at writer ``index``'s output ``(k, B, n, d)``: its own
    ``J_Bᵀ`` products ``(k, B, n, d)`` at the stream it reads, and those pulled back to every
    earlier writer's output and to the players' streams (the list: the ``index`` earlier
    writers, then :attr:`GraphTape.leaves`)."""
    writer = tape.writers[index]
    route = tape.route(index, parts=False)
    if route is not None:
        back = route.pull(cotangents)
    else:
        (back,) = batched_vjp(writer.output, [tape.reads[writer.read][1]], cotangents)
    return back, stream_pulled(tape, index, back)


def part_pulled_back(tape: GraphTape, index: int, cotangents: Tensor) -> tuple[Tensor, list[Tensor]]:
    """As :func:`pulled_back`, for cotangents at writer ``index``'s parts (its output
    projection's input, ``(k, B, n, p, w)``)."""
    writer = tape.writers[index]
    flat = cotangents.reshape(cotangents.shape[0], *writer.raw.shape)
    route = tape.route(index, parts=True)
    if route is not None:
        back = route.pull(flat)
    else:
        (back,) = batched_vjp(writer.raw, [tape.reads[writer.read][1]], flat)
    return back, stream_pulled(tape, index, back)


def part_covectors(tape: GraphTape, index: int, total: Tensor) -> Tensor:
    """A writer's covector at its parts ``(B, n, p, w)`` from its total covector at its output."""
    return tape.writers[index].part_grad(tape.writers[index].output, total)


def source_covectors(tape: GraphTape, index: int, pulled: list[Tensor]) -> list[Tensor]:
    """The covectors at the earlier writers' *parts* (``(k, B, n, p, w)``), from those at
    their outputs (``pulled``: the ``index`` earlier writers' first), for writers split into
    parts (the others, and the players' streams after them, unchanged)."""
    out = []
    for writer, covector in zip(earlier(tape, index), pulled):
        if writer.parts is None:
            out.append(covector)
            continue
        out.append(writer.part_grad(writer.output, covector, batched=True))
    return out + pulled[len(out):]


def token_values(covector: Tensor, inputs: Tensor, reference: Tensor | None, seen: Tensor | None,
                 mask: Tensor) -> Tensor:
    """``(…, B, n)`` each player's value for covectors at the players' stream ``(…, B, n, d)``
    (its start measured from the reference, as ``token_contributions``)."""
    shape = covector.shape[:-2]
    flat = covector.reshape(-1, *covector.shape[-2:])
    b = inputs.shape[0]
    found = []
    for c in flat.reshape(-1, b, *flat.shape[-2:]):
        found.append(token_contributions(c, inputs, reference, seen) * mask.to(c.dtype))
    return torch.stack(found).reshape(*shape[:-1], b, -1) if shape else found[0]


def iter_positions(n: int, chunk: int) -> Iterator[slice]:
    for first in range(0, n, chunk):
        yield slice(first, min(n, first + chunk))



@dataclass
class Players:
    """One segment's players as the graph measures them: its real positions ``mask``
    ``(1, n)``, its reference ``(1, n, d)`` (``None``: zero) and, for the centred reference,
    the positions ``seen`` ``(1, n)`` whose mean the players are measured from."""

    mask: Tensor
    reference: Tensor | None = None
    seen: Tensor | None = None


def players_of(engine: BoundModel, request: Request, tape: GraphTape) -> list[Players]:
    """Each segment's players as ``attribute`` measures them: the request's reference, or for
    the centred one the positions the explained output sees (all of an encoder–decoder's
    source)."""
    leaves = [leaf.detach() for leaf in tape.leaves]
    masks = engine.masks(request, [x.shape[:2] for x in leaves])
    seen = engine.shared_positions(request.reference, request.read_mask, request.target)
    found = []
    for k, (x, mask) in enumerate(zip(leaves, masks)):
        if seen is not None:
            found.append(Players(mask, None, (seen if k == len(leaves) - 1 else mask).to(x.device)))
        else:
            found.append(Players(mask, engine.reference_of(request.reference, x, mask, request.args, request.kwargs)))
    return found


def target_probability(output: Any, target: HeadTarget) -> float | None:
    """The model's probability of the one unit ``target`` reads (``None`` for a contrast or a
    direction, or a model without logits)."""
    if target.indices is None or target.indices.shape[1] != 1 or (target.positions is not None
                                                                   and target.positions.dim() == 2):
        return None
    try:
        logits = output_logits(output)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    logits = logits.detach().float()
    logits = logits[0, int(target.positions.reshape(-1)[0])] if logits.dim() == 3 else logits[0]
    return float(logits.softmax(-1)[int(target.indices[0, 0])])
