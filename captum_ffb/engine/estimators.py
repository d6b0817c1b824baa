r"""The field's patching estimators beside the library's own: RelP, AtP* and EAP-IG, for the
graph's nodes, for whole components and for the graph's edges.

Every estimator here estimates what activation patching measures,
``effect(A) = output(clean) − output(clean with A's output taken from the corrupted run)``,
from a few passes instead of one patched pass per component. The linear ones are
``⟨G_A, o_A − o_A^c⟩`` with a covector ``G_A`` of the explained value at ``A``'s output:

* **RelP** (relevance patching; Rezaei Jafari, Eberle, Khakzar and Nanda, 2025,
  arXiv:2508.21258): ``G`` is the gradient of a pass run with the layer-wise relevance
  propagation rules of its authors' released code (github.com/FarnoushRJ/RelP, whose
  default rule set is ``['LN-rule', 'Identity-rule', 'Half-rule']``): the norms' scales
  detached (the LN-rule, Ali et al. 2022), every element-wise activation passing relevance
  in proportion, slope ``g(S)/S`` (the identity rule), a gate ``g(A) ⊙ B`` splitting its
  relevance in half between its two factors (the half rule), linear layers by the 0-rule
  (plain gradient × input) and the attention softmax differentiated as it is (their
  optional ``AH-rule``, the probabilities detached, is ``relp_rules(engine, ah_rule=True)``, the same as the
  frozen estimator with the half rule on gates). Two forward passes (clean, corrupted) and
  one backward pass, no real patched pass.
* **EAP-IG** (Hanna, Pezzelle and Belinkov, 2024, "Have Faith in Faithfulness", arXiv:2403.17806):
  ``G`` is the gradient averaged along the straight path of the *input embeddings* (the
  first block's input) from the corrupted input to the clean one,
  ``G = (1/m) Σ_{k=1..m} ∂output/∂o_A (x^c + k/m (x − x^c))``; the paper's formula (its
  code sums ``k = 0 … m − 1``; ``k = m`` is the clean point, so ``m = 1`` is attribution
  patching). ``m`` forward and backward passes and the corrupted forward.
* **AtP*** (Kramár, Lieberum, Shah and Nanda, 2024, arXiv:2403.00745), attribution patching
  with its two fixes of false negatives:

  - the **QK fix**: where a patch reaches the queries and keys of a later attention, the
    attention probabilities are recomputed with the patched queries and keys (a softmax
    saturates, so its gradient says little) and only what follows the probabilities is
    taken to first order, ``⟨∂output/∂α, α(patched q, k) − α⟩``. The paper applies it to
    query and key nodes; a node here is a writer's output (a head, an attention sublayer,
    an FF block), which reaches a later attention's queries and keys through the stream.
    The closest faithful reading, implemented: for every later attention, the first-order
    term of the *direct* path (``A``'s write added to the stream that attention reads,
    through its norm into its queries and keys) is replaced by the probabilities that
    attention computes when ``A``'s patch reaches its queries and keys directly (norm,
    projections, rotary embeddings and softmax recomputed, the rest of the model clean);
    paths through intermediate components stay first order, as in the paper.
  - **GradDrop**: ``L`` more backward passes, pass ``ℓ`` with the gradient through block
    ``ℓ``'s writes to the residual stream zeroed; the estimate is
    ``(1/(L−1)) Σ_ℓ |I_ℓ(A)|`` with ``I_ℓ`` the (QK-fixed) estimate of pass ``ℓ``. GradDrop
    estimates the size of an effect; it is signed here by the QK-fixed estimate (activation
    patching is signed, and so are the library's estimates).

  Cost: the two forward passes, ``1 + L`` backward passes and, per later attention, its
  norm, query/key projections and softmax recomputed once per component (no full pass).

Each pass runs through :class:`~captum_ffb.engine.passes.ModelPass` (:func:`record`); the QK
fix runs an attention's norm and projections again on other inputs, each in a pass of its
own (as the score splits do).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.block import attention_method, resolve
from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.capture import computes_probabilities_inline
from captum_ffb.engine.frozen import FrozenCoefficients
from captum_ffb.engine.graph import (
    Covectors,
    GraphTape,
    StreamRecorder,
    _grad,
    _seq,
    _split,
    _swap_first,
    covectors,
    part_covectors,
    part_pulled_back,
    pulled_back,
    recorded_writer,
)
from captum_ffb.engine.head import target_value
from captum_ffb.engine.linearise import linearise
from captum_ffb.engine.passes import ModelPass, eager_attention, register_attention
from captum_ffb.engine.points import Writer
from captum_ffb.engine.score_path import _expand, _kept, _projecting
from captum_ffb.rules import IGActivation, UniformGatedActivation
from captum_ffb.rules.attention_scores import (
    ScoreCreditingAttention,
    SoftmaxLinearisation,
    _capped,
    allowed_keys,
    masked_softmax,
)

__all__ = ["EAP_IG_STEPS", "Differences", "GradientAttention", "Link", "Probe", "Recorded", "StarEstimates", "atp_star",
           "differences", "eap_ig_gradients", "edge_estimates", "gradients", "linear_estimates", "link_of", "record",
           "relp_rules"]

#: EAP-IG's steps (Hanna et al. use m = 5).
EAP_IG_STEPS = 5
#: Node keys: ``(kind, layer, part, position)`` as in a graph's node table.
NodeKey = tuple[str, int, int, int]
PROBING_IMPLEMENTATION = "captum_ffb_probing"
_probed: contextvars.ContextVar[dict[int, dict[str, Any]] | None] = contextvars.ContextVar(
    "captum_ffb_probing", default=None)


# --------------------------------------------------------------------------- RelP's rules
class GradientAttention(ScoreCreditingAttention):
    r"""The attention's own derivative as a rule by role: the values weighted by the real
    probabilities, and the scores through the softmax's Jacobian at the real scores,
    ``∂/∂q`` and ``∂/∂k`` of ``q·k`` in full (no uniform split). On the one-backward-pass
    route it makes a linearised pass differentiate attention exactly as the real model does
    while its norms, activations and gates follow other rules: RelP without the optional
    AH-rule. (Its forward route is not a decomposition: only ``linearised`` is used.)"""

    def value_coefficients(self, probs: Tensor, allowed: Tensor) -> Tensor:
        return probs

    def softmax_map(self, scores: Tensor, allowed: Tensor, probs: Tensor | None, softcap: float | None,
                    remainder: bool = True) -> tuple[SoftmaxLinearisation, Tensor | None]:
        _, slope = _capped(scores, softcap)
        if probs is None:
            probs = masked_softmax(_capped(scores, softcap)[0], allowed)
        # the rules' backward applies ¼ (half to the values' side, half to queries vs keys): 4 undoes it
        return SoftmaxLinearisation([4.0], [probs * allowed], [slope]), None


def relp_rules(engine: BoundModel, ah_rule: bool = False) -> dict[str, Callable]:
    """RelP's propagation rules by role for ``engine``'s model: the norms' default (scale
    frozen: the LN-rule), the identity rule on element-wise activations
    (:class:`~captum_ffb.rules.IGActivation`'s ``g(S)/S``), the identity and half rules on a
    gate (:class:`~captum_ffb.rules.UniformGatedActivation`) and the attention's own
    derivative (:class:`GradientAttention`), or with ``ah_rule`` the probabilities frozen."""
    rules = dict(engine.rules())
    rules["activation"] = IGActivation()
    rules["gated_activation"] = UniformGatedActivation()
    if not ah_rule:  # with it, the default attention rule: the probabilities frozen
        rules["attention"] = GradientAttention()
    return rules


# --------------------------------------------------------------------------- recorded passes
def _read_writers(engine: BoundModel) -> list[Writer]:
    """The writers of the stack whose output is read."""
    return engine.points.of_segment(len(engine.points.n_blocks) - 1)


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
        return next(k for k, w in enumerate(self.tape.writers) if w.key == key)


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
                    of the inputs' own (EAP-IG's interpolation; real model only).
        reads (bool): every writer reads the stream through a leaf of its own (edges:
                    ``captum_ffb.engine.graph.pulled_back``).
        probe (bool): keep each attention's probabilities, queries, keys and call (the QK fix).
        gate (bool): put GradDrop's switch after every writer.
        grad (bool): ``False``: a forward pass only (the corrupted run).
    """
    if start is not None and rules is not None:
        raise ValueError("an interpolated start runs the real model (rules=None)")
    head = engine.head
    target = request.target
    writers = _read_writers(engine)
    store: dict[int, dict[str, Any]] = {}
    probed: list[tuple[Writer, nn.Module, nn.Module, str | None]] = []
    switch = _Gate() if gate else None
    kept: dict[str, Tensor] = {}
    with ModelPass(engine.model, grad=grad) as run, contextlib.ExitStack() as stack:
        frozen = None
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
            if _split(writer, granularity):
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
        return _swap_first(args, kwargs, new)

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
        outputs[a.key] = (_seq(a.output.detach(), a.n) - _seq(b.output.detach(), b.n))[0]
        if a.parts is not None:
            parts[a.key] = (a.parts.detach() - b.parts.detach())[0]
            if a.kind == "attention":
                writes[a.key] = clean.tape.part_writes(index, parts[a.key][None])
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
        names.append(writer.key)
        tensors.append(writer.output)
        if writer.raw is not None:
            names.append(f"{writer.key}.parts")
            tensors.append(writer.raw)
    for probe in recorded.probes:
        names.append(f"{tape.writers[probe.index].key}.probs")
        tensors.append(probe.weights)
    found = []
    value = tape.value.sum()
    for setting in settings:
        if setting is not None and recorded.gate is None:
            raise ValueError("GradDrop needs a pass recorded with gate=True")
        if recorded.gate is not None:
            recorded.gate.dropped = setting
        try:
            grads = _grad(value, tensors, torch.ones_like(value))
        finally:
            if recorded.gate is not None:
                recorded.gate.dropped = None
        found.append(_shaped(tape, names, grads))
    return found


def _shaped(tape: GraphTape, names: list[str], grads: Sequence[Tensor]) -> dict[str, Tensor]:
    writers = {w.key: w for w in tape.writers}
    out = {}
    for name, g in zip(names, grads):
        if name == "inputs":
            out[name] = g.detach()[0]
        elif name.endswith(".probs"):
            out[name] = g.detach()[0]
        elif name.endswith(".parts"):
            out[name] = g.detach().reshape(writers[name[:-len(".parts")]].parts.shape)[0]
        else:
            out[name] = _seq(g.detach(), writers[name].n)[0]
    return out


def eap_ig_gradients(engine: BoundModel, request: Request, granularity: str, diff: Differences,
                     steps: int = EAP_IG_STEPS) -> dict[str, Tensor]:
    """EAP-IG's covectors: the real gradients at the writers (and parts) averaged over
    ``steps`` passes from ``x^c + k/steps (x − x^c)``, ``k = 1 … steps``."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    total: dict[str, Tensor] = {}
    for k in range(1, steps + 1):
        start = diff.corrupted_inputs + (k / steps) * (diff.clean_inputs - diff.corrupted_inputs)
        (found,) = gradients(record(engine, request, granularity, start=start))
        for name, g in found.items():
            total[name] = total[name] + g if name in total else g.clone()
    return {name: g / steps for name, g in total.items()}


def linear_estimates(grads: Mapping[str, Tensor], diff: Differences, tape: GraphTape
                     ) -> dict[str, Tensor]:
    """Writer id → ``(n, parts)`` the linear estimate ``⟨G, clean − corrupted⟩`` of each of its
    nodes (one column for a whole writer, one per part)."""
    found = {}
    for writer in tape.writers:
        if writer.parts is None:
            found[writer.key] = (grads[writer.key] * diff.outputs[writer.key]).sum(-1)[:, None]
        else:
            found[writer.key] = (grads[f"{writer.key}.parts"] * diff.parts[writer.key]).sum(-1)
    return found


# --------------------------------------------------------------------------- AtP*
@dataclass
class StarEstimates:
    """AtP*'s numbers.

    Attributes:
        nodes (dict): writer id → ``(n, parts)`` each node's AtP* estimate (the patch at that
                    position alone).
        components (dict): writer id → ``(parts,)`` each component's (patched at every
                    position at once).
        qk_nodes, qk_components (dict): the same with the QK fix only (no GradDrop).
    """

    nodes: dict[str, Tensor]
    components: dict[str, Tensor]
    qk_nodes: dict[str, Tensor]
    qk_components: dict[str, Tensor]


def atp_star(engine: BoundModel, clean: Recorded, diff: Differences, chunk: int = 64) -> StarEstimates:
    """AtP* (see the module documentation) from a clean pass recorded with ``probe=True`` and
    ``gate=True``: ``1 + L`` backward passes and the QK fix."""
    tape = clean.tape
    if any(w.parts is not None and w.kind != "attention" for w in tape.writers):
        raise ValueError("AtP* is computed for head and sublayer graphs (not neurons)")
    if not clean.probes or clean.gate is None:
        raise ValueError("AtP* needs a clean pass recorded with probe=True and gate=True")
    blocks = sorted({w.layer for w in tape.writers})
    settings: list[int | None] = [None, *blocks]
    grads = gradients(clean, settings)
    # per setting: the linear estimates, nodes (n, parts) and components (parts,)
    linear = [linear_estimates(g, diff, tape) for g in grads]
    fix_nodes = {w.key: torch.zeros(len(settings), *linear[0][w.key].shape, dtype=torch.float64)
                 for w in tape.writers}
    fix_comps = {w.key: torch.zeros(len(settings), linear[0][w.key].shape[1], dtype=torch.float64)
                 for w in tape.writers}
    for probe in clean.probes:
        upstream = tape.writers[:probe.index]
        if not upstream:
            continue
        deltas, owners = [], []
        for writer in upstream:
            if writer.parts is None or writer.kind != "attention":
                deltas.append(-diff.outputs[writer.key][None])  # corrupted − clean
                owners.append((writer.key, -1))
            else:
                writes = -diff.writes[writer.key].permute(1, 0, 2)  # (p, n, d)
                deltas.append(writes)
                owners += [(writer.key, h) for h in range(writes.shape[0])]
        delta = torch.cat(deltas).to(probe.stream.dtype)  # (C, n, d)
        g_probs = torch.stack([g[f"{tape.writers[probe.index].key}.probs"] for g in grads])  # (S, H, n, n)
        # −⟨∂output/∂α, α(patched) − α − J δ⟩: the effect's sign (clean − patched)
        comp_fix, node_fix = _qk_fix(probe, delta, g_probs, chunk)
        for c, (key, part) in enumerate(owners):
            column = max(part, 0)
            layer = next(w.layer for w in upstream if w.key == key)
            keep = torch.tensor([s != layer for s in settings], dtype=torch.float64)  # GD_ℓ of its own block: 0
            fix_comps[key][:, column] += comp_fix[:, c] * keep
            fix_nodes[key][:, :, column] += node_fix[:, c] * keep[:, None]
    n_drop = max(len(blocks) - 1, 1)
    nodes, comps, qk_nodes, qk_comps = {}, {}, {}, {}
    for writer in tape.writers:
        per_node = torch.stack([lin[writer.key].double() for lin in linear]) + fix_nodes[writer.key]  # (S, n, p)
        per_comp = torch.stack([lin[writer.key].double().sum(0) for lin in linear]) + fix_comps[writer.key]
        qk_nodes[writer.key], qk_comps[writer.key] = per_node[0], per_comp[0]
        nodes[writer.key] = torch.sign(per_node[0]) * per_node[1:].abs().sum(0) / n_drop
        comps[writer.key] = torch.sign(per_comp[0]) * per_comp[1:].abs().sum(0) / n_drop
    return StarEstimates(nodes, comps, qk_nodes, qk_comps)


def _normed(probe: Probe, stream: Tensor) -> Tensor:
    """The attention's input for streams ``(C, n, d)`` (its norm run on them)."""
    if probe.read is probe.module:
        return stream
    with ModelPass(probe.read) as run:
        return run.call(probe.read, stream)


def _normed_tangent(probe: Probe, delta: Tensor) -> Tensor:
    """``N'(x) δ``: the norm's derivative at the clean stream along each ``δ`` ``(C, n, d)``."""
    if probe.read is probe.module:
        return delta
    with ModelPass(probe.read, grad=True) as run:
        x = probe.stream.expand(delta.shape[0], *probe.stream.shape[1:]).detach().clone().requires_grad_(True)
        y = run.call(probe.read, x)
        u = torch.zeros_like(y, requires_grad=True)
        (back,) = torch.autograd.grad(y, x, u, create_graph=True)
        (found,) = torch.autograd.grad(back, u, delta.to(back.dtype))
    return found.detach()


def _queries_keys(probe: Probe, hidden: Tensor) -> tuple[Tensor, Tensor]:
    """The queries and keys the attention computes from ``hidden`` ``(C, n, d)`` (its own
    projections and rotary embeddings, with the clean call's other arguments)."""
    args, kwargs = probe.call
    original = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values())))
    copies = hidden.shape[0]

    def swap(value: Any) -> Any:
        return hidden if value is original else _expand(value, 1, copies)

    new_args = tuple(swap(a) for a in args)
    new_kwargs = {k: (None if k in ("attention_mask", "mask") else swap(v)) for k, v in kwargs.items()}
    kept: list = []
    token = _kept.set(kept)
    try:
        with ModelPass(probe.module) as run:
            _projecting(run, probe.module, probe.method)
            run.call(probe.module, *new_args, **new_kwargs)
    finally:
        _kept.reset(token)
    if not kept:
        raise RuntimeError("the attention module did not call its attention function")
    return kept[0]


def _scores(probe: Probe, query: Tensor, key: Tensor) -> Tensor:
    groups = query.shape[-3] // key.shape[-3]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=-3)
    return torch.matmul(query, key.transpose(-1, -2)) * probe.scaling


def _qk_fix(probe: Probe, delta: Tensor, g_probs: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    r"""The QK fix of ``C`` patches ``δ`` ``(C, n, d)`` reaching this attention's stream directly,
    for each covector ``g`` ``(S, H, n, n)`` at its probabilities (one per GradDrop setting):
    ``−⟨g, α(patched) − α − J δ⟩`` with every position patched at once ``(S, C)``, and with
    each position ``p`` patched alone ``(S, C, n)``.

    Norms and projections act position by position, so one pass of them over ``x + δ`` gives
    every position's patched query and key. Patching position ``p`` alone changes query row
    ``p`` (recomputed in full) and key column ``p``: in every other row ``t`` one score moves,
    by ``Δ``, and the softmax's change has a closed form, ``⟨g_t, α'_t − α_t⟩ =
    a (e^Δ − 1)(g_tp − ⟨g_t, α_t⟩) / (1 + a (e^Δ − 1))`` with ``a = α_tp``."""
    dtype = torch.float64
    x = probe.stream
    h = _normed(probe, x)
    q0, k0 = (t.to(dtype)[0] for t in _queries_keys(probe, h))  # (H, n, e), (Hkv, n, e)
    groups = q0.shape[0] // k0.shape[0]
    k0r = k0.repeat_interleave(groups, dim=0) if groups > 1 else k0
    allowed = probe.allowed[0]  # (1 or H, n, n)
    scale = probe.scaling
    s0 = torch.matmul(q0, k0r.transpose(-1, -2)) * scale
    c0, slope0 = _capped(s0, probe.softcap)
    alpha = masked_softmax(c0, allowed)
    slope0 = torch.ones_like(s0) if slope0 is None else slope0
    n = s0.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=s0.device)
    g = g_probs.to(dtype)  # (S, H, n, n)
    g_rows = (g * alpha).sum(-1)  # (S, H, T): ⟨g_t, α_t⟩
    weight = alpha * (g - g_rows[..., None]) * ~eye  # (S, H, T, P): a (g_tp − ⟨g_t, α_t⟩), t ≠ p
    comps, nodes = [], []
    for first in range(0, delta.shape[0], chunk):
        d = delta[first:first + chunk]
        c = d.shape[0]
        both = torch.cat([_normed(probe, x + d), h + _normed_tangent(probe, d)])
        q, k = (t.to(dtype) for t in _queries_keys(probe, both.to(h.dtype)))
        qx, ql, kx, kl = q[:c], q[c:], k[:c], k[c:]
        dq, dk = ql - q0, kl - k0  # first-order changes of the queries and keys
        kxr = kx.repeat_interleave(groups, dim=1) if groups > 1 else kx
        dkr = dk.repeat_interleave(groups, dim=1) if groups > 1 else dk
        # every position patched at once
        exact = masked_softmax(_capped(torch.matmul(qx, kxr.transpose(-1, -2)) * scale, probe.softcap)[0], allowed)
        lin = scale * (torch.matmul(dq, k0r.transpose(-1, -2)) + torch.matmul(q0, dkr.transpose(-1, -2)))
        change = exact - alpha - _softmax_tangent(alpha, slope0 * lin)  # (C, H, n, n)
        comps.append(-torch.einsum("chij,shij->sc", change, g))
        # position p alone, its query row: recomputed in full
        row = torch.matmul(qx, k0r.transpose(-1, -2)) * scale  # (C, H, P, J)
        own = (qx * kxr).sum(-1) * scale  # (C, H, P): the new query against the new key
        row = torch.where(eye, own[..., None], row)
        row_exact = masked_softmax(_capped(row, probe.softcap)[0], allowed)
        row_lin = scale * torch.matmul(dq, k0r.transpose(-1, -2)) \
            + torch.where(eye, scale * (q0 * dkr).sum(-1)[..., None], torch.zeros((), dtype=dtype))
        row_change = row_exact - alpha - _softmax_tangent(alpha, slope0 * row_lin)
        on_rows = torch.einsum("shpj,chpj->scp", g, row_change)
        # the other rows t: one score moves (key p), the softmax's change in closed form
        moved = torch.einsum("hte,chpe->chtp", q0, kxr) * scale  # (C, H, T, P)
        jump = (_capped(moved, probe.softcap)[0] - c0).clamp(max=600.0)
        grow = torch.expm1(jump)
        a = alpha
        exact_cols = grow / (1 + a * grow)
        lin_cols = slope0 * torch.einsum("hte,chpe->chtp", q0, dkr) * scale
        on_columns = torch.einsum("shtp,chtp->scp", weight, torch.where(a > 0, exact_cols - lin_cols, 0.0))
        nodes.append(-(on_rows + on_columns))
    return torch.cat(comps, dim=1), torch.cat(nodes, dim=1)


def _softmax_tangent(alpha: Tensor, z: Tensor) -> Tensor:
    """``J_softmax z = α ⊙ (z − ⟨α, z⟩)`` row by row (``α`` zero off the allowed keys)."""
    z = z * (alpha > 0)
    return alpha * (z - (alpha * z).sum(-1, keepdim=True))


# --------------------------------------------------------------------------- edges
@dataclass(frozen=True)
class Link:
    """An edge of a graph: ``source`` writes the stream where ``target`` reads it.

    Attributes:
        source (tuple): ``(kind, layer, part, position)``: a ``"token"``, ``"head"``,
                    ``"attention"`` or ``"ff"`` node.
        target (tuple): a ``"head"``, ``"attention"`` or ``"ff"`` node, or ``("output", -1,
                    -1, -1)``.
    """

    source: NodeKey
    target: NodeKey


def _writer_key(kind: str, layer: int) -> str:
    return f"block.{layer}.{'ff' if kind in ('ff', 'neuron') else 'attention'}"


def edge_estimates(engine: BoundModel, request: Request, corrupted: Request, granularity: str,
                   links: Sequence[Link], estimators: Sequence[str], rules: Mapping[str, Callable] | None = None,
                   steps: int = EAP_IG_STEPS, clean: Recorded | None = None, corrupted_run: Recorded | None = None
                   ) -> dict[str, Tensor]:
    r"""Each link's estimated *path-patching* effect, ``output(clean) − output(clean with only
    the target's input seeing the source's corrupted write)``, under each linear estimator:
    ``⟨J_Bᵀ G_B[q], δ_A[p]⟩`` for a link ``A@p → B@q`` (``J_B`` ``B``'s map from the stream it
    reads to its output at ``q``, ``G_B`` the covector at that output; for ``B`` the output,
    ``A``'s direct covector), with the frozen model's (``"frozen"``, the graph's edge weights
    with the write replaced by the patch), the real model's at the clean input (``"atp"``:
    edge attribution patching, Syed et al. 2023), RelP's (``"relp"``) or EAP-IG's (the real
    ones averaged over ``steps`` interpolated passes, ``"eap-ig"``). Returns name → ``(k,)``."""
    if granularity == "neuron":
        raise ValueError("edge patching estimates are for head and sublayer graphs")
    clean = clean if clean is not None else record(engine, request, granularity)
    corrupted_run = corrupted_run if corrupted_run is not None else record(engine, corrupted, granularity, grad=False)
    diff = differences(clean, corrupted_run)
    found = {}
    for name in estimators:
        if name == "eap-ig":
            total = None
            for k in range(1, steps + 1):
                start = diff.corrupted_inputs + (k / steps) * (diff.clean_inputs - diff.corrupted_inputs)
                tape = record(engine, request, granularity, start=start, reads=True).tape
                values = _edge_values(tape, covectors(tape), diff, links)
                total = values if total is None else total + values
            found[name] = total / steps
            continue
        if name == "frozen":
            tape = record(engine, request, granularity, rules=rules or engine.rules(), reads=True).tape
        elif name == "atp":
            tape = record(engine, request, granularity, reads=True).tape
        elif name == "relp":
            tape = record(engine, request, granularity, rules=relp_rules(engine), reads=True).tape
        else:
            raise ValueError(f"no edge estimator {name!r} (frozen, atp, relp, eap-ig)")
        found[name] = _edge_values(tape, covectors(tape), diff, links)
    return found


def _edge_values(tape: GraphTape, cov: Covectors, diff: Differences, links: Sequence[Link]) -> Tensor:
    """``⟨J_Bᵀ G_B[q], δ_A[p]⟩`` for each link, from one recorded pass with separate reads."""
    index = {w.key: k for k, w in enumerate(tape.writers)}
    values = torch.zeros(len(links), dtype=torch.float64)
    by_target: dict[NodeKey, list[int]] = {}
    for k, link in enumerate(links):
        by_target.setdefault(link.target, []).append(k)
    for target, rows in by_target.items():
        kind, layer, part, q = target
        if kind == "output":
            pulled = {w.key: _seq(cov.direct[w.key].detach(), w.n)[0] for w in tape.writers}
            pulled["inputs"] = cov.direct["inputs"].detach()[0]
        else:
            i = index[_writer_key(kind, layer)]
            writer = tape.writers[i]
            total = cov.total[writer.key]
            if kind == "head":
                gz = part_covectors(tape, i, total)  # (1, n, p, w)
                cot = torch.zeros_like(gz)
                cot[0, q, part] = gz[0, q, part]
                _, back = part_pulled_back(tape, i, cot[None])
            else:
                seq = _seq(total, writer.n)
                cot = torch.zeros_like(seq)
                cot[0, q] = seq[0, q]
                _, back = pulled_back(tape, i, cot.reshape(total.shape)[None])
            pulled = {w.key: _seq(c[0], w.n)[0] for w, c in zip(tape.writers[:i], back[:i])}
            pulled["inputs"] = back[i][0, 0]
        for k in rows:
            s_kind, s_layer, s_part, p = links[k].source
            if s_kind == "token":
                covector, delta = pulled["inputs"][p], diff.inputs[p]
            else:
                key = _writer_key(s_kind, s_layer)
                if key not in pulled:
                    continue  # a source after its target: no edge
                covector = pulled[key][p]
                delta = diff.writes[key][p, s_part] if s_kind == "head" else diff.outputs[key][p]
            values[k] = float((covector.double() * delta.double()).sum())
    return values


def link_of(kinds: Sequence[str], layers: Sequence[int], heads: Sequence[int], positions: Sequence[int],
            source: int, target: int) -> Link:
    """The :class:`Link` of a graph's edge between node indices ``source`` and ``target``."""
    def key(k: int) -> NodeKey:
        return (kinds[k], int(layers[k]), int(heads[k]), int(positions[k]))

    return Link(key(source), key(target))

