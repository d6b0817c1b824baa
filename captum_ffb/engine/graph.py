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

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.architectures.paths import has_path, resolve
from captum_ffb.architectures.spec import ArchitectureSpec
from captum_ffb.engine.block import watched_modules
from captum_ffb.engine.frozen import FrozenCoefficients
from captum_ffb.engine.head import HeadTarget
from captum_ffb.engine.layers import chain_for
from captum_ffb.engine.linearise import linearise
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.players import token_contributions

#: How finely the graph splits the writers.
GRAPH_GRANULARITIES = ("sublayer", "head", "neuron")
#: The node kinds of :class:`~captum_ffb.engine.graph.GraphTape` (and of the graph's dict).
NODE_KINDS = ("token", "attention", "head", "ff", "neuron", "cross_attention", "bias", "output")


@dataclass
class Writer:
    """One writer of the residual stream in a recorded pass.

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
        writers (list[Writer]): in stream order.
        reads (dict): stream point → ``(the stream there, with its graph; the leaf the writer
                    read instead)``.
        coefficients (FrozenCoefficients): the pass's coefficients (to replay it).
        output (Any): the model's output.
        source_inputs (Tensor, optional): an encoder–decoder's encoder's first input, a leaf.
    """

    value: Tensor
    inputs: Tensor
    writers: list[Writer]
    reads: dict[str, tuple[Tensor, Tensor]]
    coefficients: FrozenCoefficients
    output: Any = None
    source_inputs: Tensor | None = None

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


def _module(block: nn.Module, path: str | None) -> nn.Module | None:
    return resolve(block, path) if path and has_path(block, path) else None


def read_modules(block: nn.Module, spec: ArchitectureSpec, pre_norm: bool) -> dict[str, nn.Module]:
    """Writer → the module whose input is the stream that writer reads (replaced by a leaf of
    its own): a Pre-LN writer's norm, else its first module (a Post-LN attention module, the
    FF's input projection, or the module around a gated FF's two input projections)."""
    found: dict[str, nn.Module] = {}
    attention = _module(block, spec.norm1) if pre_norm else None
    found["attention"] = attention or _module(block, spec.attention)
    ff = _module(block, spec.norm2) if pre_norm else None
    if ff is None:
        if spec.moe is not None and has_path(block, spec.moe.module):
            ff = resolve(block, spec.moe.module)
        elif spec.ff_gate is not None:  # the module around the two input projections
            parent = spec.ff_in.path.rsplit(".", 1)[0] if "." in spec.ff_in.path else ""
            ff = resolve(block, parent) if parent else None
        else:
            ff = _module(block, spec.ff_in.path)
    found["ff"] = ff
    return found


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


class _Recorder:
    """The hooks of :func:`graph_pass` and :func:`real_writers`, installed on their pass
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


def graph_pass(engine: Any, request: Any, target: HeadTarget, rules: Mapping[str, Callable],
               granularity: str, coefficients: FrozenCoefficients | None = None,
               edit: Callable[[_Recorder], list[Any]] | None = None) -> GraphTape:
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
    if granularity not in GRAPH_GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRAPH_GRANULARITIES)}, got {granularity!r}")
    model, head = engine.model, engine.head
    store = FrozenCoefficients() if coefficients is None else coefficients
    kwargs = dict(request.kwargs)
    stacks = ([] if engine.source is None else [engine.source]) + [engine.stack]
    plan: list[_Planned] = []
    reads: list[tuple[nn.Module, str]] = []
    first = 0
    for segment, stack in enumerate(stacks):
        pre_norm = chain_for(stack.spec, engine.config).name in ("pre_ln", "parallel")
        heads = _heads(engine.config, decoder=segment == 1)
        for offset, block in enumerate(stack.blocks):
            index = first + offset
            spec = engine.family.for_block(block)
            roles = watched_modules(block, spec)
            found = read_modules(block, spec, pre_norm)
            for name, module in found.items():
                if module is not None:
                    reads.append((module, _read_key(index, found, name)))
            attention_out = roles.get("attention_post_norm") or roles["attn_out"]
            plan.append(_Planned(f"block.{index}.attention", index, "attention", attention_out,
                                 _read_key(index, found, "attention"),
                                 roles["attn_out"] if granularity != "sublayer" else None, segment, heads))
            if segment == 1 and engine.source is not None:
                key = f"block.{index}.read.cross"
                reads.append((roles["cross_value"], key))
                plan.append(_Planned(f"block.{index}.cross_attention", index, "cross_attention", roles["cross_out"],
                                     key, None, segment, heads))
            neuron = roles.get("ff_out") if granularity == "neuron" and roles.get("router") is None else None
            plan.append(_Planned(f"block.{index}.ff", index, "ff", roles["ff"], _read_key(index, found, "ff"), neuron,
                                 segment, heads))
        first += len(stack.blocks)
    source = None if engine.source is None else (engine.source.spec, engine.source.blocks, engine.source.final_norm)
    watch = {} if head.output is None else {"output": head.output}
    with ModelPass(model, grad=True) as run, \
            linearise(run, engine.stack.spec, engine.stack.blocks, rules, head.final_norm, head.linearised_steps(),
                      watch, coefficients=store, source=source) as frozen:
        recorder = _Recorder(run)
        for module, key in reads:
            recorder.read(module, key)
        for step in plan:
            recorder.write(step.module, step.key)
            if step.parts is not None:
                recorder.part(step.parts, step.key)
        if edit is not None:
            edit(recorder)
        output = run.run(*request.args, **kwargs)
        value = engine._linearised_value(output, frozen, target, rules)
        leaves = frozen.leaves
    lengths = [leaf.shape[1] for leaf in leaves]
    offsets = [sum(lengths[:k]) for k in range(len(lengths))]
    writers = []
    batch = request.read_mask.shape[0]
    for step in plan:
        raw = recorder.parts.get(step.key)
        part = None
        if raw is not None:
            part = raw.reshape(batch, -1, raw.shape[-1]) if raw.dim() == 2 else raw
            split = step.heads if step.kind == "attention" else part.shape[-1]
            part = part.reshape(batch, part.shape[1], split, -1)
        writers.append(Writer(step.key, step.layer, step.kind, recorder.outputs[step.key], step.read, part, raw,
                              segment=step.segment, n=lengths[step.segment], offset=offsets[step.segment]))
    return GraphTape(value, leaves[-1], writers, recorder.tape_reads, store, output,
                     source_inputs=leaves[0] if len(leaves) == 2 else None)


@dataclass
class _Planned:
    """A writer of :func:`graph_pass`, before the pass."""

    key: str
    layer: int
    kind: str
    module: nn.Module
    read: str
    parts: nn.Module | None
    segment: int
    heads: int


def _heads(config: Any, decoder: bool) -> int:
    """The attention heads of a stack's blocks (an encoder–decoder's decoder may differ)."""
    if decoder:
        found = getattr(config, "decoder_attention_heads", None)
        if found:
            return int(found)
    return int(getattr(config, "num_attention_heads", 1) or 1)


def _read_key(index: int, reads: dict[str, nn.Module | None], name: str) -> str:
    """The stream point a writer reads (one key for two writers that share a module)."""
    module = reads[name]
    shared = [other for other, m in reads.items() if m is module]
    return f"block.{index}.read.{shared[0]}"


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


def earlier(tape: GraphTape, index: int) -> list[Writer]:
    """The writers before ``tape.writers[index]``."""
    return tape.writers[:index]


def covectors(tape: GraphTape) -> Covectors:
    """Direct and total covectors of every writer (and of the players' streams, ``"inputs"``
    and an encoder–decoder's ``"source_inputs"``): the direct ones from the output's gradient
    in the pass, the totals from the last writer to the first, each writer's ``J_Bᵀ G_B``
    pulled back to the earlier ones."""
    outputs = [w.output for w in tape.writers] + tape.leaves
    keys = [w.key for w in tape.writers] + tape.leaf_keys
    direct = dict(zip(keys, _grad(tape.value.sum(), outputs, torch.ones_like(tape.value.sum()))))
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


def pulled_back(tape: GraphTape, index: int, cotangents: Tensor) -> tuple[Tensor, list[Tensor]]:
    """For ``k`` cotangents at writer ``index``'s output ``(k, B, n, d)``: its own
    ``J_Bᵀ`` products ``(k, B, n, d)`` at the stream it reads, and those pulled back to every
    earlier writer's output and to the players' streams (the list: the ``index`` earlier
    writers, then :attr:`GraphTape.leaves`)."""
    writer = tape.writers[index]
    stream, leaf = tape.reads[writer.read]
    (back,) = _batched_grad(writer.output, [leaf], cotangents)
    sources = [w.output for w in earlier(tape, index)] + tape.leaves
    return back, _batched_grad(stream, sources, back)


def part_pulled_back(tape: GraphTape, index: int, cotangents: Tensor) -> tuple[Tensor, list[Tensor]]:
    """As :func:`pulled_back`, for cotangents at writer ``index``'s parts (its output
    projection's input, ``(k, B, n, p, w)``)."""
    writer = tape.writers[index]
    stream, leaf = tape.reads[writer.read]
    flat = cotangents.reshape(cotangents.shape[0], *writer.raw.shape)
    (back,) = _batched_grad(writer.raw, [leaf], flat)
    sources = [w.output for w in earlier(tape, index)] + tape.leaves
    return back, _batched_grad(stream, sources, back)


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


def node_id(kind: str, layer: int, part: int, position: int) -> str:
    """A node's id in the graph's dict: ``token.<p>``, ``block.<l>.attention.<p>``,
    ``block.<l>.head.<h>.<p>``, ``block.<l>.ff.<p>``, ``block.<l>.neuron.<k>.<p>``, ``bias``,
    ``output``."""
    if kind in ("bias", "output"):
        return kind
    if kind == "token":
        return f"token.{position}"
    if part >= 0:
        return f"block.{layer}.{kind}.{part}.{position}"
    return f"block.{layer}.{kind}.{position}"


class _Nodes:
    """The node table, filled writer by writer."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.layers: list[int] = []
        self.heads: list[int] = []
        self.positions: list[int] = []
        self.values: list[Tensor] = []

    def add(self, kind: str, layer: int, head: int, positions: Sequence[int], values: Tensor) -> list[int]:
        first = len(self.kinds)
        for p in positions:
            self.kinds.append(kind)
            self.layers.append(layer)
            self.heads.append(head)
            self.positions.append(int(p))
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


def build_graph(tape: GraphTape, covectors_: Covectors, players: Sequence[Players], chunk: int = 16,
                max_nodes: int | None = None) -> GraphData:
    """Every node and every non-zero edge of one recorded pass (batch of one).

    Args:
        tape (GraphTape): the pass (:func:`graph_pass`).
        covectors_ (Covectors): its covectors (:func:`~captum_ffb.engine.graph.covectors`).
        players (list[Players]): per segment of :attr:`GraphTape.leaves`, its players.
        chunk (int): target nodes per batched vector–Jacobian product.
        max_nodes (int, optional): compute the edges into (and out of) only this many writer
                    nodes, those of largest ``|value|`` (the others keep their values; the
                    output's direct edges are always computed).

    Positions are the layout's: ``[source | target]`` for an encoder–decoder.
    """
    leaves = [leaf.detach() for leaf in tape.leaves]
    lengths = [leaf.shape[1] for leaf in leaves]
    offsets = [sum(lengths[:k]) for k in range(len(lengths))]
    reals = [[int(p) for p in segment.mask[0].nonzero()[:, 0]] for segment in players]
    table = _Nodes()
    total, direct = covectors_.total, covectors_.direct
    token_ids = []
    for key, x, segment, real, offset in zip(tape.leaf_keys, leaves, players, reals, offsets):
        found = torch.full((x.shape[1],), -1, dtype=torch.long)
        values = token_values(total[key], x, segment.reference, segment.seen, segment.mask)[0, real]
        found[real] = torch.tensor(table.add("token", -1, -1, [p + offset for p in real], values), dtype=torch.long)
        token_ids.append(found)
    # writers (or their parts) in stream order: node ids (n, parts), -1 on padding
    ids: list[Tensor] = []
    part_totals: list[Tensor | None] = []
    for index, writer in enumerate(tape.writers):
        g = total[writer.key]
        real, n = reals[writer.segment], writer.n
        at = [p + writer.offset for p in real]
        if writer.parts is None:
            found = torch.full((n, 1), -1, dtype=torch.long)
            values = _seq(g * writer.output.detach(), n).sum(-1)[0]
            found[real, 0] = torch.tensor(table.add(writer.kind, writer.layer, -1, at, values[real]), dtype=torch.long)
            part_totals.append(None)
        else:
            gz = part_covectors(tape, index, g)
            part_totals.append(gz)
            values = (gz * writer.parts.detach()).sum(-1)[0]  # (n, parts)
            kind = "head" if writer.kind == "attention" else "neuron"
            found = torch.full((n, values.shape[1]), -1, dtype=torch.long)
            for j in range(values.shape[1]):
                found[real, j] = torch.tensor(table.add(kind, writer.layer, j, at, values[real, j]), dtype=torch.long)
        ids.append(found)
    dtype = leaves[-1].dtype
    bias = table.add("bias", -1, -1, [-1], torch.zeros(1, dtype=dtype))[0]
    output = table.add("output", -1, -1, [-1], tape.value.detach().to(dtype).reshape(1))[0]
    values = torch.cat([v.detach().to(dtype) for v in table.values])
    edges = _Edges(len(values), dtype)
    chosen = None  # the writer nodes whose edges are computed (None: every one)
    writer_all = torch.cat([i.reshape(-1) for i in ids])
    writer_all = writer_all[writer_all >= 0]
    if max_nodes is not None and len(writer_all) > max_nodes:
        order = values[writer_all].abs().argsort(descending=True)
        chosen = torch.zeros(len(values), dtype=torch.bool)
        chosen[writer_all[order[:max_nodes]]] = True
        ids = [torch.where(chosen[i.clamp_min(0)] & (i >= 0), i, torch.full_like(i, -2)) for i in ids]
    n_leaves = len(leaves)
    # edges into every writer node, a chunk of target nodes at a time
    for index, writer in enumerate(tape.writers):
        g = total[writer.key] if writer.parts is None else part_totals[index]
        wanted = [(p, j) for j in range(ids[index].shape[1]) for p in reals[writer.segment] if ids[index][p, j] >= 0]
        for first in range(0, len(wanted), chunk):
            group = wanted[first:first + chunk]
            seq = _seq(g, writer.n)  # a flattened (B·n, d) write as (B, n, d)
            cot = torch.zeros((len(group), *seq.shape), dtype=g.dtype, device=g.device)
            for k, (p, j) in enumerate(group):
                if writer.parts is None:
                    cot[k, :, p] = seq[:, p]
                else:
                    cot[k, :, p, j] = seq[:, p, j]
            cot = cot.reshape(len(group), *g.shape)
            _, pulled = (pulled_back if writer.parts is None else part_pulled_back)(tape, index, cot)
            dst = torch.tensor([int(ids[index][p, max(j, 0)]) for p, j in group])
            for source_index, covector in enumerate(pulled[:index]):
                source = tape.writers[source_index]
                at_output = _seq(covector, source.n, 1)[:, 0]  # (k, n, d)
                if source.parts is None:
                    w = (at_output * _seq(source.output.detach(), source.n)[0]).sum(-1)
                elif source.kind == "attention":  # heads: dot products with what each head writes
                    w = torch.einsum("knd,npd->knp", at_output, tape.part_outputs(source_index))
                else:  # neurons: through the output projection (a head's way would hold n·d_ff·d)
                    at_parts = source.part_grad(source.output, covector, batched=True)
                    w = (at_parts[:, 0] * source.parts.detach()[0]).sum(-1)  # (k, n, parts)
                w = w.reshape(len(group), source.n, -1)
                edges.add(ids[source_index][None].expand_as(w), dst[:, None, None].expand_as(w), w)
            for s_ in range(n_leaves):
                segment = players[s_]
                tokens = token_values(pulled[index + s_], leaves[s_], segment.reference, segment.seen,
                                      segment.mask)[:, 0]  # (k, n)
                edges.add(token_ids[s_][None].expand_as(tokens), dst[:, None].expand_as(tokens), tokens)
    # the bias: what each writer node receives beyond the nodes' edges (its own constants and
    # the stream's); into the output: every node's direct effect, then the head's constants
    writer_nodes = torch.cat([i.reshape(-1) for i in ids])
    writer_nodes = writer_nodes[writer_nodes >= 0]
    edges.add(torch.full_like(writer_nodes, bias), writer_nodes,
              values[writer_nodes] - edges.inflow[writer_nodes] - edges.dropped[writer_nodes])
    for index, writer in enumerate(tape.writers):
        d = direct[writer.key]
        w = _seq(d * writer.output.detach(), writer.n).sum(-1)[0][:, None] if writer.parts is None else \
            (part_covectors(tape, index, d) * writer.parts.detach()).sum(-1)[0]
        edges.add(ids[index], torch.full_like(ids[index], output), w)
    for key, x, segment, found in zip(tape.leaf_keys, leaves, players, token_ids):
        direct_tokens = token_values(direct[key], x, segment.reference, segment.seen, segment.mask)[0]
        edges.add(found, torch.full_like(found, output), direct_tokens)
    edges.add(torch.tensor([bias]), torch.tensor([output]),
              (values[output] - edges.inflow[output] - edges.dropped[output]).reshape(1))
    values[bias] = edges.outflow(bias)
    return GraphData(table.kinds, table.layers, table.heads, table.positions, values,
                     *edges.stacked(), bias, output, None if chosen is None else edges.dropped, chosen)


def _seq(t: Tensor, n: int, leading: int = 0) -> Tensor:
    """A writer's tensor ``(…, B·n, d)`` (some families flatten the batch before the FF) as
    ``(…, B, n, d)``; ``leading`` dimensions kept in front."""
    if t.dim() - leading == 2:
        return t.reshape(*t.shape[:leading], -1, n, t.shape[-1])
    return t


class _Edges:
    """Edges as coordinates, kept where their weight is not zero (or the source is padding)."""

    def __init__(self, size: int, dtype: torch.dtype) -> None:
        self.sources: list[Tensor] = []
        self.targets: list[Tensor] = []
        self.weights: list[Tensor] = []
        self.inflow = torch.zeros(size, dtype=dtype)
        #: per node, what it receives from nodes left out (``max_nodes``)
        self.dropped = torch.zeros(size, dtype=dtype)

    def add(self, source: Tensor, target: Tensor, weight: Tensor) -> None:
        source, target, weight = source.reshape(-1), target.reshape(-1), weight.detach().reshape(-1).cpu()
        left_out = (source == -2) & (target >= 0)  # from a node whose edges are not kept
        self.dropped.index_add_(0, target[left_out], weight[left_out].to(self.dropped.dtype))
        keep = (source >= 0) & (target >= 0) & (weight != 0)
        source, target, weight = source[keep], target[keep], weight[keep].to(self.inflow.dtype)
        self.sources.append(source)
        self.targets.append(target)
        self.weights.append(weight)
        self.inflow.index_add_(0, target, weight)

    def outflow(self, node: int) -> Tensor:
        return sum((w[s == node].sum() for s, w in zip(self.sources, self.weights)), torch.zeros(()))

    def stacked(self) -> tuple[Tensor, Tensor, Tensor]:
        return torch.cat(self.sources), torch.cat(self.targets), torch.cat(self.weights)


# --------------------------------------------------------------------------- the real model's writers
@dataclass
class RealWriters:
    """The writers' outputs (and parts) in a pass of the real model, with the real gradient of
    the explained value at them where asked.

    Attributes:
        value (Tensor): ``(B,)`` the explained value.
        outputs (dict): writer key → ``(B, n, d)`` its output.
        parts (dict): writer key → ``(B, n, p, w)`` its parts (granularities finer than sublayers).
        gradients (dict): writer key → the real gradient at its output (and ``"<key>.parts"``
                    at its parts), when asked.
    """

    value: Tensor
    outputs: dict[str, Tensor]
    parts: dict[str, Tensor]
    gradients: dict[str, Tensor] = field(default_factory=dict)


def real_writers(engine: Any, request: Any, target: HeadTarget, granularity: str, gradients: bool = False
                 ) -> RealWriters:
    """One pass of the real model recording every writer's output (and parts), and with
    ``gradients`` the real gradient of the explained value at each (what attribution
    patching multiplies)."""
    from captum_ffb.engine.head import target_value

    n_heads = int(getattr(engine.config, "num_attention_heads", 1) or 1)
    with ModelPass(engine.model, grad=gradients) as run:
        recorder = _Recorder(run)
        if gradients:  # the stream needs a graph: the first block reads a leaf (no parameter gradients)
            run.before(engine.blocks[0], _leaf_input, with_kwargs=True)
        keys = []
        for index, block in enumerate(engine.blocks):
            spec = engine.family.for_block(block)
            roles = watched_modules(block, spec)
            for kind, module in (("attention", roles.get("attention_post_norm") or roles["attn_out"]),
                                 ("ff", roles["ff"])):
                key = f"block.{index}.{kind}"
                keys.append((key, kind))
                recorder.write(module, key)
                if granularity != "sublayer" and kind == "attention":  # the heads, in head and neuron graphs
                    recorder.part(roles["attn_out"], key)
                if granularity == "neuron" and kind == "ff" and roles.get("ff_out") is not None \
                        and roles.get("router") is None:
                    recorder.part(roles["ff_out"], key)
        output = run.run(*request.args, **request.kwargs)
        with torch.set_grad_enabled(gradients):
            value = target_value(engine.head, output, target)
        batch = request.read_mask.shape[0]
        parts = {}
        for key, kind in keys:
            raw = recorder.parts.get(key)
            if raw is not None:
                part = raw.reshape(batch, -1, raw.shape[-1]) if raw.dim() == 2 else raw
                split = n_heads if kind == "attention" else part.shape[-1]
                parts[key] = part.reshape(batch, part.shape[1], split, -1)
        found = RealWriters(value, {k: _seq(v, request.read_mask.shape[1]) for k, v in recorder.outputs.items()},
                            parts)
        if gradients:
            names = list(recorder.outputs) + [f"{k}.parts" for k in recorder.parts]
            tensors = list(recorder.outputs.values()) + list(recorder.parts.values())
            grads = _grad(value.sum(), tensors, torch.ones_like(value.sum()))
            for name, g in zip(names, grads):
                g = _seq(g, request.read_mask.shape[1]) if not name.endswith(".parts") else \
                    g.reshape(parts[name[:-6]].shape)
                found.gradients[name] = g.detach()
        found.outputs = {k: v.detach() for k, v in found.outputs.items()}
        found.parts = {k: v.detach() for k, v in found.parts.items()}
        found.value = value.detach()
    return found
