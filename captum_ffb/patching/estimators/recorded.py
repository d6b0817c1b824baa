"""The recorded passes every estimator reads: one pass of the model (the real one, or the
linearised model of some rules) recording every writer's output with its graph
(:func:`record`), what a patch changes at each writer (:func:`differences`), the gradients of
the explained value there (:func:`gradients`, with GradDrop's settings) and the linear
estimates ``⟨G, clean − corrupted⟩`` they give (:func:`linear_estimates`).

Each pass runs through :class:`~captum_ffb.engine.passes.ModelPass`; with ``probe`` a pass
keeps each attention's probabilities, queries, keys and call (AtP*'s QK fix).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.autograd import sequence_shaped, swap_first, vjp
from captum_ffb.engine.block import attention_method, resolve
from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.capture import computes_probabilities_inline
from captum_ffb.engine.frozen import FrozenCoefficients
from captum_ffb.engine.head import target_value
from captum_ffb.engine.linearise import linearise
from captum_ffb.engine.passes import ModelPass, eager_attention, register_attention
from captum_ffb.engine.points import Writer
from captum_ffb.engine.tape import GraphTape, StreamRecorder, recorded_writer, splits_parts
from captum_ffb.rules.attention_scores import allowed_keys

__all__ = ["Differences", "Probe", "Recorded", "differences", "gradients", "linear_estimates", "record"]

PROBING_IMPLEMENTATION = "captum_ffb_probing"
_probed: contextvars.ContextVar[dict[int, dict[str, Any]] | None] = contextvars.ContextVar(
    "captum_ffb_probing", default=None)


class _Gate:
    """GradDrop's switch: the gradient through the writes of block :attr:`dropped` is zeroed."""

    def __init__(self) -> None:
        self.dropped: int | None = None

    def hook(self, layer: int) -> Callable:
        gate = self

        def after(module: nn.Module, args: Any, output: Any) -> Any:
            kept = output[0] if isinstance(output, tuple) else output
            gated = _Dropped.apply(kept, gate, layer)
            return (gated, *output[1:]) if isinstance(output, tuple) else gated

        return after


class _Dropped(torch.autograd.Function):
    """The identity, whose gradient is zero while its gate drops its block."""

    @staticmethod
    def forward(ctx, x: Tensor, gate: _Gate, layer: int) -> Tensor:
        ctx.gate, ctx.layer = gate, layer
        return x.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        if ctx.gate.dropped == ctx.layer:
            return torch.zeros_like(grad), None, None
        return grad, None, None


def _probing_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any,
                       **kwargs: Any) -> Any:
    """Eager attention keeping the probabilities (with their graph), queries, keys and mask."""
    output, weights = eager_attention(module)(module, query, key, value, attention_mask, **kwargs)
    store = _probed.get()
    if store is not None and id(module) in store and "weights" not in store[id(module)]:
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = getattr(module, "scaling", None) or query.shape[-1] ** -0.5
        store[id(module)].update(weights=weights, query=query.detach(), key=key.detach(), mask=attention_mask,
                                 scaling=float(scaling), softcap=kwargs.get("softcap"))
    return output, weights


@dataclass
class Probe:
    """What the QK fix needs of one attention, from the clean pass.

    Attributes:
        index (int): its writer's index in the recorded pass's writers.
        layer (int): its block.
        module (nn.Module): the attention module (called again on other inputs).
        read (nn.Module): the module that reads the stream for it (its norm; the attention
                    itself after a Post-LN block).
        call (tuple): how the attention module was called ``(args, kwargs)``.
        stream (Tensor): ``(1, n, d)`` the stream it read (before its norm).
        weights (Tensor): ``(1, H, n, n)`` its probabilities, with their graph.
        query, key (Tensor): as its attention function read them (after rotary embeddings).
        allowed (Tensor): ``(1, 1 or H, n, n)`` the keys each query may attend to.
        scaling (float): the scores' scale.
        softcap (float, optional): the scores' cap, where the family has one.
        method (str, optional): the family's attention method, where it has one.
    """

    index: int
    layer: int
    module: nn.Module
    read: nn.Module
    call: tuple[tuple[Any, ...], dict[str, Any]]
    stream: Tensor
    weights: Tensor
    query: Tensor
    key: Tensor
    allowed: Tensor
    scaling: float
    softcap: float | None
    method: str | None


@dataclass
class Recorded:
    """One recorded pass (:func:`record`).

    Attributes:
        tape (GraphTape): the writers' outputs and parts (with their graphs), the value, the
                    first block's input (a leaf) and, with ``reads``, each read's leaf.
        probes (list[Probe]): with ``probe``, each attention's (the QK fix).
        gate (object, optional): with ``gate``, GradDrop's switch.
    """

    tape: GraphTape
    probes: list[Probe] = field(default_factory=list)
    gate: _Gate | None = None

    @property
    def value(self) -> Tensor:
        return self.tape.value

    def writer(self, key: str) -> int:
        return next(k for k, w in enumerate(self.tape.writers) if w.id == key)


def record(engine: BoundModel, request: Request, granularity: str, *, rules: Mapping[str, Callable] | None = None,
           start: Tensor | None = None, reads: bool = False, probe: bool = False, gate: bool = False,
           grad: bool = True) -> Recorded:
    r"""One pass of the model recording every writer's output (and parts at ``granularity``)
    with their graphs, the first block's input as a leaf, and the explained value.

    Args:
        rules (Mapping, optional): run the linearised model of these rules
                    (``captum_ffb.engine.linearise.linearise``; values are the real model's,
                    gradients the rules'); ``None``: the real model.
        start (Tensor, optional): ``(1, n, d)`` the first block's input to run from instead
                    of the inputs' own (EAP-IG's interpolation); with ``rules``, the
                    linearised model's coefficients are those of the pass from ``start``.
        reads (bool): every writer reads the stream through a leaf of its own (edges:
                    ``captum_ffb.engine.tape.pulled_back``).
        probe (bool): keep each attention's probabilities, queries, keys and call (the QK fix).
        gate (bool): put GradDrop's switch after every writer.
        grad (bool): ``False``: a forward pass only (the corrupted run).
    """
    head = engine.head
    target = request.target
    writers = engine.points.read_stack()
    store: dict[int, dict[str, Any]] = {}
    probed: list[tuple[Writer, nn.Module, nn.Module, str | None]] = []
    switch = _Gate() if gate else None
    kept: dict[str, Tensor] = {}
    with ModelPass(engine.model, grad=grad) as run, contextlib.ExitStack() as stack:
        frozen = None
        if rules is not None and start is not None:  # before the linearisation's own leaf
            run.before(engine.blocks[0], _start(kept, start, False), with_kwargs=True)
        if rules is not None:
            watch = {} if head.output is None else {"output": head.output}
            frozen = stack.enter_context(linearise(run, engine.stack.spec, engine.stack.blocks, rules,
                                                   head.final_norm, head.linearised_steps(), watch))
        else:
            run.before(engine.blocks[0], _start(kept, start, grad), with_kwargs=True)
        recorder = StreamRecorder(run)
        if reads:
            for read in engine.points.reads:
                recorder.read(read.module, read.id)
        for writer in writers:
            recorder.write(writer.module, writer.id)
            if splits_parts(writer, granularity):
                recorder.part(writer.parts, writer.id)
        if switch is not None:
            for writer in writers:
                run.after(writer.module, switch.hook(writer.layer))
        if probe:
            probed = _install_probes(run, engine, writers, store)
        token = _probed.set(store)
        try:
            output = run.run(*request.args, **request.kwargs)
        finally:
            _probed.reset(token)
        with torch.set_grad_enabled(grad):
            value = engine.linearised_value(output, frozen, target, rules) if frozen is not None \
                else target_value(head, output, target)
        leaf = frozen.inputs if frozen is not None else kept["start"]
    n = request.read_mask.shape[1]
    batch = request.read_mask.shape[0]
    recorded = [recorded_writer(recorder, writer, batch, n=n) for writer in writers]
    tape = GraphTape(value, leaf, recorded, recorder.tape_reads, FrozenCoefficients(), output)
    probes = []
    for writer, module, read, method in probed:
        seen = store[id(module)]
        if "weights" not in seen or "stream" not in seen:
            raise RuntimeError(f"the attention of block {writer.layer} was not seen by the probing pass")
        weights = seen["weights"]
        probes.append(Probe(next(k for k, w in enumerate(writers) if w.id == writer.id), writer.layer, module, read,
                            seen["call"], seen["stream"], weights, seen["query"], seen["key"],
                            allowed_keys(seen["mask"] if isinstance(seen["mask"], Tensor) else None,
                                         tuple(weights.shape), weights.device),
                            seen["scaling"], seen["softcap"], method))
    return Recorded(tape, probes, switch)


def _start(kept: dict[str, Tensor], start: Tensor | None, grad: bool) -> Callable:
    """The first block's input replaced by a leaf (``start``, or its own value)."""

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if "start" in kept:
            return None
        hidden = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values())))
        new = (hidden if start is None else start.to(hidden.dtype)).detach()
        if grad:
            new = new.requires_grad_(True)
        kept["start"] = new
        return swap_first(args, kwargs, new)

    return hook


def _install_probes(run: ModelPass, engine: BoundModel, writers: Sequence[Writer], store: dict[int, dict[str, Any]]
                    ) -> list[tuple[Writer, nn.Module, nn.Module, str | None]]:
    """Record each attention's call, the stream its norm reads, and (through an eager
    attention that keeps them) its probabilities, queries, keys and mask."""
    reads = {read.id: read.module for read in engine.points.reads}
    found = []
    for writer in writers:
        if writer.kind != "attention":
            continue
        block = engine.blocks[writer.layer]
        spec = engine.family.for_block(block)
        module = resolve(block, spec.attention)
        method = attention_method(module, spec)
        if method is not None or computes_probabilities_inline(module, method):
            raise ValueError(f"AtP*'s QK fix recomputes attention through transformers' attention interface; "
                             f"{getattr(engine.config, 'model_type', 'this model')}'s attention does not use it")
        read = reads[writer.read]
        entry = store.setdefault(id(module), {})

        def keep_call(mod: nn.Module, args: Any, kwargs: Any, entry: dict[str, Any] = entry) -> None:
            entry.setdefault("call", (tuple(args), dict(kwargs)))

        def keep_stream(mod: nn.Module, args: Any, kwargs: Any, entry: dict[str, Any] = entry) -> None:
            entry.setdefault("stream", (args[0] if args else next(iter(kwargs.values()))).detach())

        run.before(module, keep_call, with_kwargs=True)
        run.before(read, keep_stream, with_kwargs=True)
        found.append((writer, module, read, method))
    run.attention(register_attention(PROBING_IMPLEMENTATION, _probing_attention))
    return found


# --------------------------------------------------------------------------- what a patch changes
@dataclass
class Differences:
    """``clean − corrupted`` at every writer (the sign of the estimates).

    Attributes:
        outputs (dict): writer id → ``(n, d)`` ``o_A − o_A^c``.
        parts (dict): writer id → ``(n, p, w)`` the parts' ``clean − corrupted``.
        writes (dict): writer id → ``(n, p, d)`` what each part's difference writes to the
                    stream (a head's, through the output projection; only for heads).
        inputs (Tensor): ``(n, d)`` the first block's input ``x − x^c``.
        clean_inputs, corrupted_inputs (Tensor): ``(1, n, d)`` the two first-block inputs.
    """

    outputs: dict[str, Tensor]
    parts: dict[str, Tensor]
    writes: dict[str, Tensor]
    inputs: Tensor
    clean_inputs: Tensor
    corrupted_inputs: Tensor


def differences(clean: Recorded, corrupted: Recorded) -> Differences:
    """Each writer's (and part's) ``clean − corrupted``, and what each head's difference
    writes (through the clean pass's output projection, a linear map)."""
    outputs, parts, writes = {}, {}, {}
    for index, (a, b) in enumerate(zip(clean.tape.writers, corrupted.tape.writers)):
        outputs[a.id] = (sequence_shaped(a.output.detach(), a.n) - sequence_shaped(b.output.detach(), b.n))[0]
        if a.parts is not None:
            parts[a.id] = (a.parts.detach() - b.parts.detach())[0]
            if a.kind == "attention":
                writes[a.id] = clean.tape.part_writes(index, parts[a.id][None])
    x, xc = clean.tape.inputs.detach(), corrupted.tape.inputs.detach()
    return Differences(outputs, parts, writes, (x - xc)[0], x, xc)


def gradients(recorded: Recorded, settings: Sequence[int | None] = (None,)) -> list[dict[str, Tensor]]:
    r"""The gradient of the explained value at every writer's output (``(n, d)``), parts
    (``"<id>.parts"``, ``(n, p, w)``), probed attention's probabilities (``"<id>.probs"``,
    ``(H, n, n)``) and the first block's input (``"inputs"``, ``(n, d)``; on the real model
    only), for each GradDrop setting (``None``: nothing dropped; ``ℓ``: block ``ℓ``'s writes
    dropped), one backward pass each."""
    tape = recorded.tape
    names, tensors = ["inputs"], [tape.inputs]
    for writer in tape.writers:
        names.append(writer.id)
        tensors.append(writer.output)
        if writer.raw is not None:
            names.append(f"{writer.id}.parts")
            tensors.append(writer.raw)
    for probe in recorded.probes:
        names.append(f"{tape.writers[probe.index].id}.probs")
        tensors.append(probe.weights)
    found = []
    value = tape.value.sum()
    for setting in settings:
        if setting is not None and recorded.gate is None:
            raise ValueError("GradDrop needs a pass recorded with gate=True")
        if recorded.gate is not None:
            recorded.gate.dropped = setting
        try:
            grads = vjp(value, tensors, torch.ones_like(value))
        finally:
            if recorded.gate is not None:
                recorded.gate.dropped = None
        found.append(_shaped(tape, names, grads))
    return found


def _shaped(tape: GraphTape, names: list[str], grads: Sequence[Tensor]) -> dict[str, Tensor]:
    writers = {w.id: w for w in tape.writers}
    out = {}
    for name, g in zip(names, grads):
        if name == "inputs":
            out[name] = g.detach()[0]
        elif name.endswith(".probs"):
            out[name] = g.detach()[0]
        elif name.endswith(".parts"):
            out[name] = g.detach().reshape(writers[name[:-len(".parts")]].parts.shape)[0]
        else:
            out[name] = sequence_shaped(g.detach(), writers[name].n)[0]
    return out


def linear_estimates(grads: Mapping[str, Tensor], diff: Differences, tape: GraphTape
                     ) -> dict[str, Tensor]:
    """Writer id → ``(n, parts)`` the linear estimate ``⟨G, clean − corrupted⟩`` of each of its
    nodes (one column for a whole writer, one per part)."""
    found = {}
    for writer in tape.writers:
        if writer.parts is None:
            found[writer.id] = (grads[writer.id] * diff.outputs[writer.id]).sum(-1)[:, None]
        else:
            found[writer.id] = (grads[f"{writer.id}.parts"] * diff.parts[writer.id]).sum(-1)
    return found
