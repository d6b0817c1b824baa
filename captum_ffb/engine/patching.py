r"""Patching: real patched passes, and the estimates of what patching each node, component
or edge would change.

**Activation patching** (:func:`activation_patching`), the field's ground truth: for each
component ``A`` (an attention sublayer or one of its heads, an FF block) one forward pass of
the real model on the clean input with ``A``'s output replaced, at every position, by its
output in the corrupted run; the effect is ``output(clean) − output(clean, A patched)``.
**Path patching** (:func:`path_patching`) does the same for one edge ``A@p → B@q`` of a
graph: only ``B``'s computation at ``q`` sees ``A``'s corrupted write.

**Estimates** (:func:`patch_estimates`) for every node ``A`` of a graph (a component at one
position) with clean output ``o_A`` and corrupted output ``o_A^c``; the linear estimators are
``⟨G_A, o_A − o_A^c⟩`` with a covector ``G_A`` of the explained value:

* ``"frozen"``: the frozen model's gradient (every coefficient of the clean run fixed; exact
  for the frozen model);
* ``"atp"``: the real model's at the clean input (attribution patching, Nanda 2023; Syed et
  al. 2023);
* ``"relp"``: relevance patching's (Rezaei Jafari et al. 2025), the gradient of a pass with
  the LRP rules of its authors (:mod:`captum_ffb.engine.estimators`);
* ``"eap-ig"``: the real gradient averaged over the straight path of input embeddings from
  the corrupted input to the clean one (Hanna et al. 2024);

and, not linear, ``"atp*"`` (Kramár et al. 2024: attribution patching with the attention
softmax recomputed where a patch reaches later queries and keys, and GradDrop). Each linear
estimator ``X`` has a variant ``"X+exact"``: ``X``, except at the nodes whose patch moves the
stream by more than the stream holds, ``κ_A = ‖write_A − write_A^c‖ / ‖stream just after A
writes‖ > exact_above`` (:data:`EXACT_ABOVE`): there a gradient at the clean point says little
(a new massive activation, a saturated norm), and the node is patched for real, one forward
pass each; and a component whose κ exceeds it at some position is patched for real at every
position too, for its total (patching every position at once is not the sum of patching each).

:data:`DEFAULT_ESTIMATOR` names the default, chosen against real activation patching on the
selection prompts of four tasks and reported on held-out ones (``results/patching``;
docs/graphs.md); :data:`DEFAULT_EDGE_ESTIMATOR` the edges' default, chosen against real path
patching. Every run of the model here is a :class:`~captum_ffb.engine.passes.ModelPass`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.estimators import (
    EAP_IG_STEPS,
    Link,
    Recorded,
    _writer_key,
    atp_star,
    differences,
    eap_ig_gradients,
    edge_estimates,
    gradients,
    linear_estimates,
    link_of,
    record,
    relp_rules,
)
from captum_ffb.engine.fingerprint import Stamp, check_unchanged, weights_stamp
from captum_ffb.engine.graph import (
    Covectors,
    GraphData,
    GraphTape,
    StreamRecorder,
    _grad,
    _leaf_input,
    _seq,
    _split,
    part_covectors,
)
from captum_ffb.engine.head import HeadTarget, target_value
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.points import Writer
from captum_ffb.engine.requests import check_count
from captum_ffb.vocabulary import check_granularity, component_of

__all__ = ["ALIASES", "COMPUTED", "DEFAULT_EDGE_ESTIMATOR", "DEFAULT_ESTIMATOR", "EDGE_ESTIMATORS", "ESTIMATORS",
           "EXACT_ABOVE", "EdgePatcher", "Patch", "PatchEstimates", "RealWriters", "activation_patching", "check_estimators",
           "corrupted_like", "patch_estimates", "path_patching", "patched_values", "real_writers"]

#: The linear estimators: ``⟨G, o − o^c⟩`` with the covector each names.
LINEAR = ("frozen", "atp", "relp", "eap-ig")
#: The estimators by name: the linear ones, each with its ``"+exact"`` variant, and AtP*.
ESTIMATORS = (*LINEAR, *(f"{name}+exact" for name in LINEAR), "atp*")
#: What a graph with ``corrupted_inputs`` computes whatever it is asked (two forward passes
#: and one backward pass each, plus the ``"+exact"`` variants' real passes).
COMPUTED = ("frozen", "atp", "atp+exact", "relp", "relp+exact")
#: The default estimator (chosen against activation patching on four tasks: results/patching).
DEFAULT_ESTIMATOR = "atp+exact"
#: The ``"+exact"`` estimators patch a node for real where its κ exceeds this (chosen on the selection rows).
EXACT_ABOVE = 0.5
#: The edge estimators (:func:`~captum_ffb.engine.estimators.edge_estimates`).
EDGE_ESTIMATORS = ("frozen", "atp", "relp", "eap-ig")
#: The edges' default estimator (chosen against real path patching: results/patching).
DEFAULT_EDGE_ESTIMATOR = "atp"


# --------------------------------------------------------------------------- the real model's writers
@dataclass
class RealWriters:
    """The writers' outputs (and parts) in a pass of the real model, with the real gradient of
    the explained value at them where asked.

    Attributes:
        value (Tensor): ``(B,)`` the explained value.
        outputs (dict): writer id → ``(B, n, d)`` its output.
        parts (dict): writer id → ``(B, n, p, w)`` its parts (granularities finer than sublayers).
        gradients (dict): writer id → the real gradient at its output (and ``"<id>.parts"``
                    at its parts), when asked.
    """

    value: Tensor
    outputs: dict[str, Tensor]
    parts: dict[str, Tensor]
    gradients: dict[str, Tensor] = field(default_factory=dict)


def _read_writers(engine: BoundModel) -> list[Writer]:
    """The writers of the stack whose output is read."""
    return engine.points.of_segment(len(engine.points.n_blocks) - 1)


def real_writers(engine: BoundModel, request: Request, target: HeadTarget, granularity: str,
                 gradients: bool = False) -> RealWriters:
    """One pass of the real model recording every writer's output (and parts), and with
    ``gradients`` the real gradient of the explained value at each (what attribution
    patching multiplies; no parameter gradient is formed)."""
    with ModelPass(engine.model, grad=gradients) as run:
        recorder = StreamRecorder(run)
        if gradients:  # the stream needs a graph: the first block reads a leaf
            run.before(engine.blocks[0], _leaf_input, with_kwargs=True)
        writers = _read_writers(engine)
        for writer in writers:
            recorder.write(writer.module, writer.id)
            if _split(writer, granularity):  # the heads (head and neuron graphs), the neurons
                recorder.part(writer.parts, writer.id)
        output = run.run(*request.args, **request.kwargs)
        with torch.set_grad_enabled(gradients):
            value = target_value(engine.head, output, target)
        batch, n = request.read_mask.shape
        parts = {}
        for writer in writers:
            raw = recorder.parts.get(writer.id)
            if raw is not None:
                part = raw.reshape(batch, -1, raw.shape[-1]) if raw.dim() == 2 else raw
                split = writer.n_heads if writer.kind == "attention" else part.shape[-1]
                parts[writer.id] = part.reshape(batch, part.shape[1], split, -1)
        found = RealWriters(value, {k: _seq(v, n) for k, v in recorder.outputs.items()}, parts)
        if gradients:
            names = list(recorder.outputs) + [f"{k}.parts" for k in recorder.parts]
            tensors = list(recorder.outputs.values()) + list(recorder.parts.values())
            grads = _grad(value.sum(), tensors, torch.ones_like(value.sum()))
            for name, g in zip(names, grads):
                g = _seq(g, n) if not name.endswith(".parts") else g.reshape(parts[name[:-6]].shape)
                found.gradients[name] = g.detach()
        found.outputs = {k: v.detach() for k, v in found.outputs.items()}
        found.parts = {k: v.detach() for k, v in found.parts.items()}
        found.value = value.detach()
    return found


# --------------------------------------------------------------------------- patched passes
@dataclass
class Patch:
    """One edit of a patched pass: a module's output (or one part of its input) replaced by
    its value in the corrupted run, at every position or at one.

    Attributes:
        module (nn.Module): the module patched.
        value (Tensor): ``(1, n, w)`` the replacement (its output, or the part's slice).
        part (int): ``-1``: the module's output; ``≥ 0``: that part of its input (a head's
                    slice of the output projection's input, a neuron of the down projection's).
        n_parts (int): how many parts its input splits into.
        position (int, optional): the position patched (``None``: all).
    """

    module: nn.Module
    value: Tensor
    part: int = -1
    n_parts: int = 0
    position: int | None = None


def patched_values(engine: BoundModel, request: Request, target: HeadTarget, patches: Sequence[Patch],
                   batch_size: int = 16, bar: Any = None) -> list[float]:
    """The explained value in one real forward pass per patch, ``batch_size`` patches to a
    batch (each row of the batch the input with its own patch)."""
    n = request.read_mask.shape[1]
    values: list[float] = []
    for start in range(0, len(patches), batch_size):
        chunk = list(patches[start:start + batch_size])
        rows = len(chunk)
        with ModelPass(engine.model) as run:
            _install(run, chunk, rows, n)
            args = tuple(_repeat(a, rows) for a in request.args)
            kwargs = {k: _repeat(v, rows) for k, v in request.kwargs.items()}
            output = run.run(*args, **kwargs)
        values += target_value(engine.head, output, _repeat_target(target, rows)).tolist()
        if bar is not None:
            bar.update(rows)
    return values


def _install(run: ModelPass, chunk: list[Patch], rows: int, n: int) -> None:
    """The patches of one batch, each on its own row, installed on the pass."""
    groups: dict[tuple[int, bool], list[tuple[int, Patch]]] = {}
    for row, patch in enumerate(chunk):
        groups.setdefault((id(patch.module), patch.part >= 0), []).append((row, patch))
    for (_, before), edits in groups.items():
        module = edits[0][1].module
        if before:
            def pre(mod: nn.Module, args: Any, edits: list[tuple[int, Patch]] = edits) -> Any:
                x = args[0].clone(memory_format=torch.contiguous_format)
                view = x.reshape(rows, n, edits[0][1].n_parts, -1)
                for row, patch in edits:
                    where = slice(None) if patch.position is None else patch.position
                    view[row, where, patch.part] = patch.value.reshape(n, -1)[where].to(x.dtype)
                return (x, *args[1:])
            run.before(module, pre)
        else:
            def post(mod: nn.Module, args: Any, output: Any, edits: list[tuple[int, Patch]] = edits) -> Any:
                kept = output[0] if isinstance(output, tuple) else output
                new = kept.clone(memory_format=torch.contiguous_format)
                view = new.reshape(rows, n, -1)
                for row, patch in edits:
                    where = slice(None) if patch.position is None else patch.position
                    view[row, where] = patch.value.reshape(n, -1)[where].to(new.dtype)
                return (new, *output[1:]) if isinstance(output, tuple) else new
            run.after(module, post)


def _repeat(value: Any, rows: int) -> Any:
    if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == 1 and rows > 1:
        return value.expand(rows, *value.shape[1:])
    return value


def _repeat_target(target: HeadTarget, rows: int) -> HeadTarget:
    return replace(target, **{f.name: _repeat(getattr(target, f.name), rows) for f in fields(target)})


def corrupted_like(corrupted_inputs: Any, request: Request, name: str = "corrupted_inputs") -> Tensor:
    """``corrupted_inputs`` as a ``(1, n)`` tensor of the request's inputs' shape (a corrupted
    prompt of the same length), or a ``ValueError`` naming the parameter."""
    device = request.args[0].device
    corrupted = corrupted_inputs if isinstance(corrupted_inputs, Tensor) else \
        torch.as_tensor(corrupted_inputs, device=device)
    corrupted = corrupted[None] if corrupted.dim() == 1 else corrupted
    if tuple(corrupted.shape) != tuple(request.args[0].shape):
        raise ValueError(f"{name} must have the inputs' shape {tuple(request.args[0].shape)} (a corrupted "
                         f"prompt of the same length), got {tuple(corrupted.shape)}")
    return corrupted.to(device)


def _patch(writer: Writer, part: int, base: RealWriters) -> Patch:
    """The patch of one writer (or one of its parts) at every position."""
    if part < 0:
        return Patch(writer.module, base.outputs[writer.id])
    parts = base.parts[writer.id]  # (1, n, p, w)
    return Patch(writer.parts, parts[:, :, part], part, parts.shape[2])


# --------------------------------------------------------------------------- activation patching
def activation_patching(engine: BoundModel, request: Request, corrupted: Request, granularity: str,
                        batch_size: int = 16, bar: Any = None) -> tuple[dict[str, float], float, float]:
    """Every component's output patched from the corrupted run, one real pass each:
    ``({component id: effect}, clean value, corrupted value)``."""
    check_granularity(granularity, "patching")
    target = request.target
    base = real_writers(engine, corrupted, target, granularity)
    names: list[str] = []
    patches: list[Patch] = []
    for writer in _read_writers(engine):
        if writer.kind == "attention" and granularity == "head":
            for head in range(writer.n_heads):
                names.append(writer.part(head))
                patches.append(_patch(writer, head, base))
        elif writer.kind in ("attention", "ff"):
            names.append(writer.id)
            patches.append(_patch(writer, -1, base))
    clean = float(real_writers(engine, request, target, "sublayer").value[0])
    values = patched_values(engine, request, target, patches, batch_size, bar)
    return {name: clean - value for name, value in zip(names, values)}, clean, float(base.value[0])


# --------------------------------------------------------------------------- path patching
def path_patching(engine: BoundModel, request: Request, corrupted: Request, links: Sequence[Link], granularity: str,
                  batch_size: int = 16, clean: Recorded | None = None, corrupted_run: Recorded | None = None,
                  fraction: float = 1.0) -> list[float]:
    r"""Each link's real *path-patching* effect, one forward pass per link: the clean input,
    with only the target node's computation seeing the source node's corrupted write
    (``A@p → B@q``: the stream ``B`` reads gets ``o_A^c[p] − o_A[p]`` added at ``p``; of what
    ``B`` then computes only its output at ``q`` is kept — for a head, only that head's slice
    of the output projection's input — and every other writer reading the same stream keeps
    its clean output; a link into the output adds the difference where the final norm reads
    the stream). ``fraction`` patches that share of the difference (a check of the
    estimates' first order). Returns ``output(clean) − output(path-patched)`` per link."""
    if granularity == "neuron":
        raise ValueError("path patching is for head and sublayer graphs")
    clean = clean if clean is not None else record(engine, request, granularity)
    corrupted_run = corrupted_run if corrupted_run is not None else record(engine, corrupted, granularity, grad=False)
    diff = differences(clean, corrupted_run)
    target = request.target
    n = request.read_mask.shape[1]
    writers = {w.id: w for w in _read_writers(engine)}
    reads = {read.id: read.module for read in engine.points.reads}
    outputs = {w.key: _seq(w.output.detach(), w.n)[0] for w in clean.tape.writers}
    parts = {w.key: w.parts.detach()[0] for w in clean.tape.writers if w.parts is not None}
    final_norm = engine.head.final_norm
    value = float(clean.value.detach()[0])
    found: list[float] = []
    for start in range(0, len(links), batch_size):
        chunk = list(links[start:start + batch_size])
        rows = len(chunk)
        added: dict[int, tuple[nn.Module, list[tuple[int, int, Tensor]]]] = {}
        spliced: dict[int, tuple[nn.Module, bool, list[tuple[int, str, int | None, int | None]]]] = {}
        for row, link in enumerate(chunk):
            s_kind, s_layer, s_part, p = link.source
            if s_kind == "token":
                delta = -diff.inputs[p]
            elif s_kind == "head":
                delta = -diff.writes[_writer_key(s_kind, s_layer)][p, s_part]
            else:
                delta = -diff.outputs[_writer_key(s_kind, s_layer)][p]
            delta = delta * fraction
            kind, layer, part, q = link.target
            if kind == "output":
                if final_norm is None:
                    raise ValueError("path patching into the output needs the model's final norm")
                added.setdefault(id(final_norm), (final_norm, []))[1].append((row, p, delta))
                continue
            writer = writers[_writer_key(kind, layer)]
            read = reads[writer.read]
            added.setdefault(id(read), (read, []))[1].append((row, p, delta))
            for other in writers.values():
                if other.read != writer.read:
                    continue
                if other is not writer:  # a sibling reading the same stream: its clean output
                    spliced.setdefault(id(other.module), (other.module, False, []))[2].append(
                        (row, other.id, None, None))
                elif kind == "head":
                    spliced.setdefault(id(writer.parts), (writer.parts, True, []))[2].append((row, writer.id, q, part))
                else:
                    spliced.setdefault(id(writer.module), (writer.module, False, []))[2].append(
                        (row, writer.id, q, None))
        with ModelPass(engine.model) as run:
            for module, edits in added.values():
                run.before(module, _adding(edits, rows, n), with_kwargs=True)
            for module, on_parts, edits in spliced.values():
                if on_parts:
                    run.before(module, _splicing_parts(edits, rows, n, parts))
                else:
                    run.after(module, _splicing_outputs(edits, rows, n, outputs))
            args = tuple(_repeat(a, rows) for a in request.args)
            kwargs = {k: _repeat(v, rows) for k, v in request.kwargs.items()}
            output = run.run(*args, **kwargs)
        found += [value - v for v in target_value(engine.head, output, _repeat_target(target, rows)).tolist()]
    return found


def _adding(edits: list[tuple[int, int, Tensor]], rows: int, n: int) -> Callable:
    """A pre-hook adding each row's difference at its position of the module's first input."""

    def hook(module: nn.Module, args: Any, kwargs: Any) -> Any:
        x = (args[0] if args else next(iter(kwargs.values()))).clone(memory_format=torch.contiguous_format)
        view = x.reshape(rows, n, -1)
        for row, position, delta in edits:
            view[row, position] += delta.to(x.dtype)
        if args:
            return (x, *args[1:]), kwargs
        return args, {**kwargs, next(iter(kwargs)): x}

    return hook


def _splicing_outputs(edits: list[tuple[int, str, int | None, int | None]], rows: int, n: int,
                      clean: dict[str, Tensor]) -> Callable:
    """A forward hook keeping, per row, the computed output only at its position (``None``:
    nowhere): the clean output elsewhere."""

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        kept = output[0] if isinstance(output, tuple) else output
        new = kept.clone(memory_format=torch.contiguous_format)
        view = new.reshape(rows, n, -1)
        for row, key, position, _ in edits:
            computed = view[row, position].clone() if position is not None else None
            view[row] = clean[key].to(new.dtype)
            if position is not None:
                view[row, position] = computed
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return hook


def _splicing_parts(edits: list[tuple[int, str, int | None, int | None]], rows: int, n: int,
                    clean: dict[str, Tensor]) -> Callable:
    """A pre-hook on an output projection keeping, per row, one head's computed slice at one
    position: the clean input elsewhere."""

    def hook(module: nn.Module, args: Any) -> Any:
        x = args[0].clone(memory_format=torch.contiguous_format)
        for row, key, position, part in edits:
            parts = clean[key]  # (n, p, w)
            view = x.reshape(rows, n, parts.shape[1], -1)
            computed = view[row, position, part].clone()
            view[row] = parts.to(x.dtype)
            view[row, position, part] = computed
        return (x, *args[1:])

    return hook


# --------------------------------------------------------------------------- estimates
@dataclass
class PatchEstimates:
    """Every node's estimated patching effect.

    Attributes:
        estimates (dict): estimator name (those computed, and ``"default"``) → ``(N,)`` each
                    node's estimate (zero for tokens, the bias and the output).
        kappa (Tensor): ``(N,)`` each node's κ.
        components (dict): estimator name → {component id: effect} for the components whose
                    effect is not the sum of their nodes' (the ``"+exact"`` estimators' real
                    passes; ``"atp*"``, computed with every position patched at once).
        seconds (dict): estimator name → the seconds it took (its own passes and the shared
                    corrupted pass).
        passes (dict): estimator name → the passes it ran (forward and backward passes of the
                    whole model; a ``"+exact"`` estimator's real patched passes included).
        edges (EdgePatcher, optional): computes the estimates of the graph's edges (head and
                    sublayer graphs).
    """

    estimates: dict[str, Tensor]
    kappa: Tensor
    components: dict[str, dict[str, float]]
    seconds: dict[str, float] = field(default_factory=dict)
    passes: dict[str, float] = field(default_factory=dict)
    edges: Any = None


def _node_index(data: GraphData) -> dict[tuple[int, str, int, int], int]:
    return {(layer, kind, part, p): k for k, (kind, layer, part, p)
            in enumerate(zip(data.kinds, data.layers, data.heads, data.positions))}


#: Names ``estimators=`` also takes: the default, and AtP*'s query–key fix alone (computed with AtP*).
ALIASES = {"default": DEFAULT_ESTIMATOR, "atp+qk": "atp*"}


def check_estimators(names: str | Sequence[str] | None) -> tuple[str, ...]:
    """The estimators a graph computes: :data:`COMPUTED` and ``names`` (one name, or several;
    those of :data:`ESTIMATORS` and :data:`ALIASES`; a one-line error for others)."""
    if isinstance(names, str):
        names = (names,)
    if names is not None and not (isinstance(names, Sequence) and all(isinstance(n, str) for n in names)):
        raise TypeError(f"estimators must be an estimator's name or a list of names, got {names!r}")
    names = tuple(ALIASES.get(name, name) for name in names or ())
    unknown = [name for name in names if name not in ESTIMATORS]
    if unknown:
        raise ValueError(f"estimators must be among {', '.join((*ESTIMATORS, *ALIASES))}; got "
                         f"{', '.join(map(repr, unknown))}")
    wanted = list(COMPUTED)
    for name in (DEFAULT_ESTIMATOR, *names):
        if name not in wanted:
            wanted.append(name)
    return tuple(wanted)


def patch_estimates(engine: BoundModel, request: Request, corrupted: Request, tape: GraphTape, found: Covectors,
                    data: GraphData, granularity: str, exact_above: float = EXACT_ABOVE,
                    estimators: Sequence[str] | None = None, steps: int = EAP_IG_STEPS,
                    stamp: Stamp | None = None) -> PatchEstimates:
    """Every node's estimated patching effect under :data:`COMPUTED`, ``estimators`` and the
    default (``"default"``), each node's κ, the components the ``"+exact"`` estimators patched
    for real (and AtP*'s whole components), and each estimator's seconds and passes; the edges'
    patcher bound to the weights of ``stamp`` (the model's now, when not given)."""
    wanted = check_estimators(estimators)
    bases = {name.removesuffix("+exact") for name in wanted} - {"atp*"}
    star = "atp*" in wanted
    seconds: dict[str, float] = {}
    passes: dict[str, float] = {}
    tic = time.perf_counter()
    base_run = record(engine, corrupted, granularity, grad=False)
    shared = time.perf_counter() - tic
    tic = time.perf_counter()
    clean = record(engine, request, granularity, probe=star, gate=star)
    diff = differences(clean, base_run)
    (grads,) = gradients(clean)
    per_writer = {"atp": linear_estimates(grads, diff, clean.tape)}
    seconds["atp"], passes["atp"] = shared + time.perf_counter() - tic, 3
    if "frozen" in bases:  # the graph's own frozen pass: its covectors, with the patch
        tic = time.perf_counter()
        per_writer["frozen"] = {}
        for k, recorded in enumerate(tape.writers):
            if recorded.parts is None:
                frozen = _seq(found.total[recorded.key], recorded.n)[0]
                per_writer["frozen"][recorded.key] = (frozen * diff.outputs[recorded.key]).sum(-1)[:, None]
            else:
                frozen = part_covectors(tape, k, found.total[recorded.key])[0]
                per_writer["frozen"][recorded.key] = (frozen * diff.parts[recorded.key]).sum(-1)
        seconds["frozen"], passes["frozen"] = shared + time.perf_counter() - tic, 3
    if "relp" in bases:
        tic = time.perf_counter()
        relp = record(engine, request, granularity, rules=relp_rules(engine))
        (relp_grads,) = gradients(relp)
        per_writer["relp"] = linear_estimates(relp_grads, diff, relp.tape)
        seconds["relp"], passes["relp"] = shared + time.perf_counter() - tic, 3
        del relp
    if "eap-ig" in bases:
        tic = time.perf_counter()
        per_writer["eap-ig"] = linear_estimates(eap_ig_gradients(engine, request, granularity, diff, steps), diff,
                                                clean.tape)
        seconds["eap-ig"], passes["eap-ig"] = shared + time.perf_counter() - tic, 1 + 2 * steps
    starred = None
    if star:
        tic = time.perf_counter()
        starred = atp_star(engine, clean, diff)
        blocks = len({w.layer for w in clean.tape.writers})
        seconds["atp*"] = seconds["atp"] + time.perf_counter() - tic
        passes["atp*"] = 3 + blocks
        seconds["atp+qk"], passes["atp+qk"] = seconds["atp*"], 3  # its backward passes are AtP's
    size = len(data)
    names = [name for name in bases if name in per_writer] + (["atp*", "atp+qk"] if star else [])
    estimates = {name: torch.zeros(size, dtype=data.values.dtype) for name in names}
    kappa = torch.zeros(size, dtype=data.values.dtype)
    index = _node_index(data)
    n = request.read_mask.shape[1]
    writers = {writer.id: writer for writer in _read_writers(engine)}
    base = RealWriters(base_run.value, {w.key: _seq(w.output.detach(), w.n) for w in base_run.tape.writers},
                       {w.key: w.parts.detach() for w in base_run.tape.writers if w.parts is not None})
    patched: list[int | str] = []  # the nodes (by index) and components (by id) patched for real
    patches: list[Patch] = []
    whole: dict[str, dict[str, float]] = {}
    for k, recorded in enumerate(tape.writers):
        after = tape.stream_after(k)[0].norm(dim=-1).clamp(min=1e-30)  # (n,)
        if recorded.parts is None:
            moved = (diff.outputs[recorded.key].norm(dim=-1) / after)[:, None]  # (n, 1)
            kind, parts = recorded.kind, [-1]
        else:
            moved = tape.part_writes(k, diff.parts[recorded.key][None]).norm(dim=-1) / after[:, None]  # (n, p)
            kind = "head" if recorded.kind == "attention" else "neuron"
            parts = list(range(diff.parts[recorded.key].shape[1]))
        moved = moved.detach().cpu()
        per = {name: values[recorded.key].detach().cpu() for name, values in per_writer.items()}
        if starred is not None:  # AtP*, and its QK fix alone ("atp+qk")
            per["atp*"], per["atp+qk"] = starred.nodes[recorded.key].cpu(), starred.qk_nodes[recorded.key].cpu()
        for column, part in enumerate(parts):
            patch = _patch(writers[recorded.key], part, base)
            component = component_of(kind, recorded.layer, part)
            if starred is not None:
                whole.setdefault("atp*", {})[component] = float(starred.components[recorded.key][column])
                whole.setdefault("atp+qk", {})[component] = float(starred.qk_components[recorded.key][column])
            for p in range(n):
                node = index.get((recorded.layer, kind, part, p))
                if node is None:
                    continue
                for name, values in per.items():
                    estimates[name][node] = values[p, column]
                kappa[node] = moved[p, column]
                if float(moved[p, column]) > exact_above:
                    patched.append(node)
                    patches.append(replace(patch, position=p))
            if float(moved[:, column].max()) > exact_above:
                patched.append(component)
                patches.append(patch)
    exact: dict[str, float] = {}
    exact_nodes: dict[int, float] = {}
    tic = time.perf_counter()
    if patches:
        value = float(clean.value.detach()[0])
        for what, patched_value in zip(patched, patched_values(engine, request, request.target, patches)):
            if isinstance(what, str):
                exact[what] = value - patched_value
            else:
                exact_nodes[what] = value - patched_value
    exact_seconds = time.perf_counter() - tic
    for name in wanted:
        if not name.endswith("+exact"):
            continue
        basis = name.removesuffix("+exact")
        estimates[name] = estimates[basis].clone()
        for node, effect in exact_nodes.items():
            estimates[name][node] = effect
        whole[name] = dict(exact)
        seconds[name] = seconds[basis] + exact_seconds
        passes[name] = passes[basis] + len(patches)
    estimates["default"] = estimates[DEFAULT_ESTIMATOR].clone()
    if DEFAULT_ESTIMATOR in whole:
        whole["default"] = dict(whole[DEFAULT_ESTIMATOR])
    seconds["default"], passes["default"] = seconds[DEFAULT_ESTIMATOR], passes[DEFAULT_ESTIMATOR]
    patcher = None if granularity == "neuron" else \
        EdgePatcher(engine, request, corrupted, granularity, steps, stamp=stamp)
    return PatchEstimates({name: value.detach() for name, value in estimates.items()}, kappa, whole, seconds, passes,
                          patcher)


# --------------------------------------------------------------------------- edges
class EdgePatcher:
    """Computes the patching estimates of a graph's edges on demand (bound to the model, the
    input and the corrupted input): :meth:`estimates` for the linear edge estimators
    (:func:`~captum_ffb.engine.estimators.edge_estimates`), :meth:`real` for real path
    patching (one forward pass per edge). Both refuse a model whose weights changed since the
    graph was built (:mod:`~captum_ffb.engine.fingerprint`).

    Args:
        engine, request, corrupted: the model and the two inputs.
        granularity (str): the graph's.
        steps (int): EAP-IG's interpolation steps (a positive integer).
        stamp (Stamp, optional): the weights the graph was built on
                    (:func:`~captum_ffb.engine.fingerprint.weights_stamp`; the model's now when
                    not given).
    """

    def __init__(self, engine: BoundModel, request: Request, corrupted: Request, granularity: str,
                 steps: int = EAP_IG_STEPS, stamp: Stamp | None = None) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        self.engine, self.request, self.corrupted = engine, request, corrupted
        self.granularity, self.steps = granularity, steps
        self.stamp = weights_stamp(engine.model) if stamp is None else stamp

    def links(self, data: GraphData, edges: Tensor) -> list[Link]:
        """The links of the graph's edges ``edges`` (indices into ``data.sources``)."""
        return [link_of(data.kinds, data.layers, data.heads, data.positions, int(data.sources[e]),
                        int(data.targets[e])) for e in edges.tolist()]

    def estimates(self, data: GraphData, edges: Tensor, estimators: Sequence[str] = (DEFAULT_EDGE_ESTIMATOR,)
                  ) -> dict[str, Tensor]:
        """Name → ``(k,)`` the estimates of the edges ``edges`` (indices into the graph's edges);
        edges from the bias have none (``nan``)."""
        check_unchanged(self.engine.model, self.stamp, "edge patch estimates")
        links, rows = [], []
        for row, link in enumerate(self.links(data, edges)):
            if link.source[0] in ("bias",) or link.target[0] in ("bias", "token", "neuron"):
                continue
            links.append(link)
            rows.append(row)
        found = edge_estimates(self.engine, self.request, self.corrupted, self.granularity, links, estimators,
                               steps=self.steps) if links else {name: torch.zeros(0) for name in estimators}
        out = {}
        for name, values in found.items():
            full = torch.full((len(edges),), float("nan"), dtype=torch.float64)
            full[rows] = values
            out[name] = full
        return out

    def real(self, data: GraphData, edges: Tensor, batch_size: int = 16) -> Tensor:
        """``(k,)`` each edge's real path-patching effect (``nan`` for the bias's edges), in
        batches of ``batch_size`` passes."""
        check_count(batch_size, "batch_size")
        check_unchanged(self.engine.model, self.stamp, "path patching")
        links = self.links(data, edges)
        keep = [row for row, link in enumerate(links) if link.source[0] != "bias"]
        found = torch.full((len(links),), float("nan"), dtype=torch.float64)
        if keep:
            found[keep] = torch.tensor(path_patching(self.engine, self.request, self.corrupted,
                                                     [links[row] for row in keep], self.granularity, batch_size),
                                       dtype=torch.float64)
        return found
