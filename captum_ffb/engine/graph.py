r"""Attribution graphs of the stock model: which writer of the residual stream fed which, exactly.

With every coefficient frozen at its value in the real pass, the model is linear in every
writer of the residual stream (METHOD.md, "Attribution graphs"): the players (tokens), each
attention sublayer or head, each FF block or neuron. For a writer ``A`` with output ``o_A``
and frozen gradient ``G_A = ∂output/∂o_A``, its **value** is ``T_A = ⟨G_A, o_A⟩``; an **edge**
``A → B`` carries ``w = ⟨G_B, J_B o_A⟩`` with ``J_B`` the frozen map from the stream ``B``
reads to its output; ``A → output`` carries ``A``'s direct effect. Flow is conserved at
every node: ``Σ in-edges + bias = T_B = Σ out-edges (+ direct)``.

One recorded pass computes it all (:func:`graph_pass`): the frozen model runs with every
writer reading its stream through a leaf of its own, so that

* the gradient of the output at a writer's output, in that pass, is its *direct* covector
  (the stream reaches the output through norms and the head only);
* ``J_Bᵀ G`` is a vector–Jacobian product from ``B``'s output to its own leaf (through ``B``
  alone), and pulling that covector back from where ``B`` reads the stream to where each
  earlier writer wrote it crosses only residual connections and frozen norms;
* the total covectors follow from the last writer to the first (``G_A = g_A^direct + Σ_B
  pull-back of J_Bᵀ G_B``), the edges per position from the same products with one cotangent
  per position.

The coefficients of the pass are recorded (:mod:`captum_ffb.engine.frozen`), so any edit of
it — a node removed, one edge cut, an output patched from another run — can be run again in
the same frozen model (:func:`frozen_value_with`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.frozen import FrozenCoefficients
from captum_ffb.engine.head import HeadTarget, output_logits
from captum_ffb.engine.linearise import linearise
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.players import token_contributions
from captum_ffb.engine.points import Writer
from captum_ffb.vocabulary import check_granularity

#: The node kinds of :class:`~captum_ffb.engine.graph.GraphTape` (and of the graph's dict).
NODE_KINDS = ("token", "attention", "head", "ff", "neuron", "cross_attention", "bias", "output")


@dataclass
class RecordedWriter:
    """One writer of the residual stream as a recorded pass saw it.

    Attributes:
        key (str): ``"block.<l>.attention"``, ``"block.<l>.cross_attention"``, ``"block.<l>.ff"``.
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

    key: str
    layer: int
    kind: str
    output: Tensor
    read: str
    parts: Tensor | None = None
    raw: Tensor | None = None
    segment: int = 0
    n: int = 0
    offset: int = 0

    def part_grad(self, outputs: Tensor, cotangents: Tensor, batched: bool = False) -> Tensor:
        """The gradient at the parts (``raw``, the recorded tensor, reshaped as ``parts``)."""
        if batched:
            (found,) = _batched_grad(outputs, [self.raw], cotangents)
            return found.reshape(found.shape[0], *self.parts.shape)
        (found,) = _grad(outputs, [self.raw], cotangents)
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

    @property
    def leaves(self) -> list[Tensor]:
        """The players' streams: ``[source, target]`` or ``[tokens]``."""
        return [self.inputs] if self.source_inputs is None else [self.source_inputs, self.inputs]

    @property
    def leaf_keys(self) -> list[str]:
        """Their keys in :class:`~captum_ffb.engine.graph.Covectors`."""
        return ["inputs"] if self.source_inputs is None else ["source_inputs", "inputs"]

    def part_outputs(self, index: int) -> Tensor:
        """``(n, p, d)``: what each part of writer ``index`` (a head) adds to the stream at each
        position, ``J part_j`` for the frozen linear map ``J`` from its parts to its output
        (its output projection, and a frozen post-norm), computed once and kept. An edge
        from a part is then a dot product with the covector at the writer's output, not a
        vector–Jacobian product through the projection."""
        cache = self.__dict__.setdefault("_part_outputs", {})
        if index not in cache:
            cache[index] = self.part_writes(index, self.writers[index].parts.detach())
        return cache[index]

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
            (written,) = _batched_grad(transposed, [dummy], tangents.reshape(len(chunk), *writer.raw.shape))
            found.append(_seq(written, writer.n, 1)[:, 0].permute(1, 0, 2).detach())
        return torch.cat(found, dim=1)  # (n, p, d)

    def stream_after(self, index: int) -> Tensor:
        """``(B, n, d)``: the stream just after writer ``index`` has written (the stream it
        reads plus its output; in a parallel block, without its sibling's)."""
        writer = self.writers[index]
        stream = self.reads[writer.read][0].detach()
        return _seq(stream, writer.n) + _seq(writer.output.detach(), writer.n)


def _leaf_input(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A block's input hidden states replaced by a leaf that requires grad."""
    return _swap_first(args, kwargs, _first(args, kwargs).detach().requires_grad_(True))


def _swap_first(args: tuple[Any, ...], kwargs: dict[str, Any], new: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args:
        return (new, *args[1:]), kwargs
    key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
    return args, {**kwargs, key: new}


def _first(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    if args:
        return args[0]
    return kwargs["hidden_states"] if "hidden_states" in kwargs else next(iter(kwargs.values()))


class StreamRecorder:
    """The hooks of :func:`graph_pass` and :func:`~captum_ffb.engine.patching.real_writers`, installed on their pass
    (after the linearisation's own)."""

    def __init__(self, run: ModelPass) -> None:
        self.run = run
        self.tape_reads: dict[str, tuple[Tensor, Tensor]] = {}
        self.outputs: dict[str, Tensor] = {}
        self.parts: dict[str, Tensor] = {}

    def read(self, module: nn.Module, key: str) -> None:
        def hook(mod, args, kwargs):
            if key in self.tape_reads:  # a module shared by two writers (one LN for both)
                return _swap_first(args, kwargs, self.tape_reads[key][1])
            stream = _first(args, kwargs)
            leaf = stream.detach().requires_grad_(True)
            self.tape_reads[key] = (stream, leaf)
            return _swap_first(args, kwargs, leaf)

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
            if _split(writer, granularity):
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


def _split(writer: Writer, granularity: str) -> bool:
    """Whether the graph splits ``writer`` into its parts: an attention into heads (head and
    neuron graphs), a dense FF into neurons (neuron graphs)."""
    if writer.parts is None:
        return False
    if writer.kind == "attention":
        return granularity != "sublayer"
    return writer.kind == "ff" and granularity == "neuron"


# --------------------------------------------------------------------------- covectors
def _grad(outputs: Tensor, inputs: Sequence[Tensor], cotangent: Tensor) -> list[Tensor]:
    found = torch.autograd.grad(outputs, list(inputs), grad_outputs=cotangent, retain_graph=True,
                                allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(found, inputs)]


def _batched_grad(outputs: Tensor, inputs: Sequence[Tensor], cotangents: Tensor) -> list[Tensor]:
    """``[(k, *x.shape)]``: one gradient per cotangent ``(k, *outputs.shape)``."""
    if cotangents.shape[0] == 1:
        return [g[None] for g in _grad(outputs, inputs, cotangents[0])]
    try:
        found = torch.autograd.grad(outputs, list(inputs), grad_outputs=cotangents, retain_graph=True,
                                    allow_unused=True, is_grads_batched=True)
        return [torch.zeros((cotangents.shape[0], *x.shape), dtype=x.dtype, device=x.device) if g is None else g
                for g, x in zip(found, inputs)]
    except RuntimeError:  # an operation vmap cannot batch: one cotangent at a time
        per = [_grad(outputs, inputs, c) for c in cotangents]
        return [torch.stack([p[k] for p in per]) for k in range(len(inputs))]


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
    if "_stream_sums" not in tape.__dict__:
        tape.__dict__["_stream_sums"] = _stream_sums(tape)
    return tape.__dict__["_stream_sums"]


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
        elif type(node).__name__ in _PLAIN and getattr(node, "_saved_alpha", 1) == 1:
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
        return _batched_grad(stream, [w.output for w in earlier(tape, index)] + tape.leaves, cotangents)
    m = sums[index]
    zero = cotangents.new_zeros(()).expand_as(cotangents)
    return [cotangents if k < m else zero for k in range(index)] + [cotangents]


def covectors(tape: GraphTape) -> Covectors:
    """Direct and total covectors of every writer (and of the players' streams, ``"inputs"``
    and an encoder–decoder's ``"source_inputs"``): the direct ones from the output's gradient
    in the pass, the totals from the last writer to the first, each writer's ``J_Bᵀ G_B``
    pulled back to the earlier ones."""
    outputs = [w.output for w in tape.writers] + tape.leaves
    keys = [w.key for w in tape.writers] + tape.leaf_keys
    direct = dict(zip(keys, _grad(tape.value.sum(), outputs, torch.ones_like(tape.value.sum()))))
    sums = stream_sums(tape)
    if sums is not None:
        return Covectors(direct, _summed_totals(tape, direct, sums))
    total = {key: g.clone() for key, g in direct.items()}
    for index in range(len(tape.writers) - 1, -1, -1):
        writer = tape.writers[index]
        stream, leaf = tape.reads[writer.read]
        (back,) = _grad(writer.output, [leaf], total[writer.key])
        sources = earlier(tape, index)
        pulled = _grad(stream, [w.output for w in sources] + tape.leaves, back)
        for source, g in zip([w.key for w in sources] + tape.leaf_keys, pulled):
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
        g = direct[writer.key] if running is None else direct[writer.key] + running
        total[writer.key] = g
        (back,) = _grad(writer.output, [tape.reads[writer.read][1]], g)
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
    (back,) = _batched_grad(writer.output, [tape.reads[writer.read][1]], cotangents)
    return back, stream_pulled(tape, index, back)


def part_pulled_back(tape: GraphTape, index: int, cotangents: Tensor) -> tuple[Tensor, list[Tensor]]:
    """As :func:`pulled_back`, for cotangents at writer ``index``'s parts (its output
    projection's input, ``(k, B, n, p, w)``)."""
    writer = tape.writers[index]
    flat = cotangents.reshape(cotangents.shape[0], *writer.raw.shape)
    (back,) = _batched_grad(writer.raw, [tape.reads[writer.read][1]], flat)
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
    (its start measured from the reference, as :func:`~captum_ffb.engine.players.token_contributions`)."""
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


# --------------------------------------------------------------------------- the graph
@dataclass
class GraphData:
    """An attribution graph's numbers, before any view: nodes in a table and edges as
    coordinates.

    Attributes:
        kinds (list[str]): each node's kind (:data:`~captum_ffb.engine.graph.NODE_KINDS`).
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
    """Every writer's nodes side by side, where every read stream is a plain sum
    (:func:`stream_sums`): a covector at a stream is the covector at each earlier writer's
    output, so what every earlier node sends along it is one product with ``writes``.

    Attributes:
        writes (Tensor): ``(n, C, d)`` what each node (a sublayer, a head) adds to the stream
                    at each position, writer after writer.
        ids (Tensor): ``(n, C)`` their node ids.
        columns (list[int]): writer ``k``'s first column (and the count at the end).
    """

    writes: Tensor
    ids: Tensor
    columns: list[int]


def _joined(tape: GraphTape, ids: Sequence[Tensor]) -> _Joined | None:
    """:class:`_Joined` for a pass of plain sums whose writers are sublayers or heads (a
    neuron sends through its output projection: the edges then go writer by writer); the
    heads' cached writes become views of it."""
    if stream_sums(tape) is None or any(w.parts is not None and w.kind != "attention" for w in tape.writers):
        return None
    columns = [0]
    for w in tape.writers:
        columns.append(columns[-1] + (1 if w.parts is None else w.parts.shape[2]))
    output = tape.writers[0].output
    writes = output.new_empty((output.shape[1], columns[-1], output.shape[-1]))
    cache = tape.__dict__.setdefault("_part_outputs", {})
    for k, w in enumerate(tape.writers):  # written in place: no second copy of the heads' writes
        at = writes[:, columns[k]:columns[k + 1]]
        if w.parts is None:
            at.copy_(w.output.detach()[0][:, None])
            continue
        at.copy_(cache[k] if k in cache else tape.part_writes(k, w.parts.detach()))
        cache[k] = at
    return _Joined(writes, torch.cat(list(ids), dim=1), columns)


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
        g = total[writer.key]
        real, n = reals[writer.segment], writer.n
        at = [p + writer.offset for p in real]
        if writer.parts is None:
            found = torch.full((n, 1), -1, dtype=torch.long, device=device)
            values = _seq(g * writer.output.detach(), n).sum(-1)[0]
            added = table.add(writer.kind, writer.layer, -1, at, values[real])
            found[real, 0] = torch.as_tensor(added, dtype=torch.long, device=device)
            part_totals.append(None)
        else:
            gz = part_covectors(tape, index, g)
            part_totals.append(gz)
            values = (gz * writer.parts.detach()).sum(-1)[0]  # (n, parts)
            kind = "head" if writer.kind == "attention" else "neuron"
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
    g = layout.totals[writer.key] if writer.parts is None else layout.part_totals[index]
    ids = layout.ids[index]
    wanted = (ids.T >= 0).nonzero()[:, [1, 0]]  # (k, 2): position, part (part by part)
    seq = _seq(g, writer.n)  # a flattened (B·n, d) write as (B, n, d)
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
            end = layout.joined.columns[stream_sums(tape)[index]]
            w = torch.einsum("knd,ncd->knc", pulled[index][:, 0], layout.joined.writes[:, :end])
            edges.add(layout.joined.ids[None, :, :end].expand_as(w), targets[:, None, None].expand_as(w), w)
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
        all(w.n == writer.n for w in tape.writers[:index]) and _seq(tape.leaves[0], writer.n).shape[1] == writer.n


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
    _, pulled = pulled_back(tape, index, cot.reshape(1, *layout.totals[writer.key].shape))
    targets = ids[positions, 0]
    if layout.joined is not None:  # every earlier node in one product
        end = layout.joined.columns[stream_sums(tape)[index]]
        w = torch.einsum("kd,kcd->kc", pulled[index][0, 0, positions], layout.joined.writes[positions, :end])
        edges.add(layout.joined.ids[positions, :end], targets[:, None].expand_as(w), w)
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
    at_output = _seq(covector, source.n, 1)[:, 0]  # (k, n, d)
    if source.parts is None:
        return (at_output * _seq(source.output.detach(), source.n)[0]).sum(-1)
    if source.kind == "attention":  # heads: dot products with what each head writes
        return torch.einsum("knd,npd->knp", at_output, tape.part_outputs(source_index))
    # neurons: through the output projection (a head's way would hold n·d_ff·d)
    at_parts = source.part_grad(source.output, covector, batched=True)
    return (at_parts[:, 0] * source.parts.detach()[0]).sum(-1)  # (k, n, parts)


def _bias_and_direct_edges(edges: _Edges, tape: GraphTape, direct: Mapping[str, Tensor], layout: _Layout,
                           players: Sequence[Players], values: Tensor, bias: int, output: int) -> None:
    """The bias node's edges (what each writer node receives beyond the nodes' edges: its
    own constants and the stream's) and every node's direct edge into the output, then the
    output's bias edge (the head's constants)."""
    device = layout.device
    writer_nodes = torch.cat([i.reshape(-1) for i in layout.ids])
    writer_nodes = writer_nodes[writer_nodes >= 0]
    edges.add(torch.full_like(writer_nodes, bias), writer_nodes,
              values[writer_nodes] - edges.inflow[writer_nodes] - edges.dropped[writer_nodes])
    for index, writer in enumerate(tape.writers):
        d = direct[writer.key]
        w = _seq(d * writer.output.detach(), writer.n).sum(-1)[0][:, None] if writer.parts is None else \
            (part_covectors(tape, index, d) * writer.parts.detach()).sum(-1)[0]
        edges.add(layout.ids[index], torch.full_like(layout.ids[index], output), w)
    for key, x, segment, found in zip(tape.leaf_keys, layout.leaves, players, layout.token_ids):
        direct_tokens = token_values(direct[key], x, segment.reference, segment.seen, segment.mask)[0]
        edges.add(found, torch.full_like(found, output), direct_tokens)
    edges.add(torch.tensor([bias], device=device), torch.tensor([output], device=device),
              (values[output] - edges.inflow[output] - edges.dropped[output]).reshape(1))


def build_graph(tape: GraphTape, covectors_: Covectors, players: Sequence[Players], chunk: int = 16,
                max_nodes: int | None = None, exclude_positions: Sequence[int] = ()) -> GraphData:
    """Every node and every non-zero edge of one recorded pass (batch of one), computed on
    the pass's device and handed back on the CPU.

    Args:
        tape (GraphTape): the pass (:func:`graph_pass`).
        covectors_ (Covectors): its covectors (:func:`~captum_ffb.engine.graph.covectors`).
        players (list[Players]): per segment of :attr:`GraphTape.leaves`, its players.
        chunk (int): target nodes per batched vector–Jacobian product.
        max_nodes (int, optional): compute the edges into (and out of) only this many writer
                    nodes, those of largest ``|value|`` (the others keep their values; the
                    output's direct edges are always computed).
        exclude_positions (list[int]): positions whose writer nodes ``max_nodes`` chooses
                    last (an attention sink's: their edges are then rarely computed).

    Positions are the layout's: ``[source | target]`` for an encoder–decoder.
    """
    device = tape.inputs.device
    table = _Nodes()
    total, direct = covectors_.total, covectors_.direct
    token_ids, reals, offsets = _token_nodes(table, tape, total, players, device)
    ids, part_totals = _writer_nodes(table, tape, total, reals, device)
    dtype = tape.leaves[-1].dtype
    bias = table.add("bias", -1, -1, [-1], torch.zeros(1, dtype=dtype, device=device))[0]
    output = table.add("output", -1, -1, [-1], tape.value.detach().to(dtype).reshape(1))[0]
    values = torch.cat([v.detach().to(dtype) for v in table.values])
    set_aside = None
    if exclude_positions:
        set_aside = torch.tensor([k not in ("token", "bias", "output") and p in set(exclude_positions)
                                  for k, p in zip(table.kinds, table.positions)], device=device)
    chosen, ids = _chosen_nodes(values, ids, max_nodes, set_aside)
    layout = _Layout([leaf.detach() for leaf in tape.leaves], reals, offsets, token_ids, ids, part_totals, total,
                     device, _joined(tape, ids))
    edges = _Edges(len(values), dtype, device)
    for index in range(len(tape.writers)):
        _edges_into(edges, tape, index, layout, players, chunk)
    _bias_and_direct_edges(edges, tape, direct, layout, players, values, bias, output)
    values[bias] = edges.outflow(bias)
    sources, targets, weights = edges.stacked()
    return GraphData(table.kinds, table.layers, table.heads, table.positions, values.cpu(), sources.cpu(),
                     targets.cpu(), weights.cpu(), bias, output, None if chosen is None else edges.dropped.cpu(),
                     None if chosen is None else chosen.cpu())


def _seq(t: Tensor, n: int, leading: int = 0) -> Tensor:
    """A writer's tensor ``(…, B·n, d)`` (some families flatten the batch before the FF) as
    ``(…, B, n, d)``; ``leading`` dimensions kept in front."""
    if t.dim() - leading == 2:
        return t.reshape(*t.shape[:leading], -1, n, t.shape[-1])
    return t


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


def target_probability(output: Any, target: HeadTarget) -> float | None:
    """The model's probability of the one unit ``target`` reads (``None`` for a contrast or a
    direction, or a model without logits)."""
    if target.indices is None or target.indices.shape[1] != 1:
        return None
    try:
        logits = output_logits(output)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    logits = logits.detach().float()
    logits = logits[0, int(target.positions.reshape(-1)[0])] if logits.dim() == 3 else logits[0]
    return float(logits.softmax(-1)[int(target.indices[0, 0])])


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
    always = torch.tensor([d.kinds[int(i)] in ("token", "bias", "output") for i in keep])
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
