r"""Patching: real patched passes, and the estimates of what patching each node, component
or edge would change.

**Activation patching** (:func:`activation_patching`), the field's ground truth: for each
component ``A`` (an attention sublayer or one of its heads, an FF block) one forward pass of
the real model on the clean input with ``A``'s output replaced, at every position, by its
output in the corrupted run; the effect is ``output(clean) − output(clean, A patched)``.
**Path patching** (:func:`path_patching`) does the same for one edge ``A@p → B@q`` of a
graph: only ``B``'s computation at ``q`` sees ``A``'s corrupted write.

**Estimates** (:func:`patch_estimates`) for every node ``A`` of a graph (a component at one
position) with clean output ``o_A`` and corrupted output ``o_A^c``, by every registered
estimator asked for (:mod:`captum_ffb.patching.estimators`, one module each); the linear ones
are ``⟨G_A, o_A − o_A^c⟩`` with a covector ``G_A`` of the explained value:

* ``"frozen"``: the frozen model's gradient (every coefficient of the clean run fixed; exact
  for the frozen model);
* ``"atp"``: the real model's at the clean input (attribution patching, Nanda 2023; Syed et
  al. 2023, arXiv:2310.10348);
* ``"relp"``: relevance patching's (Rezaei Jafari et al. 2025, arXiv:2508.21258), the
  gradient of a pass with the LRP rules of its authors;
* ``"gim"``: the gradient with GIM's backward changes (Edin et al. 2025, arXiv:2505.17630):
  norms' statistics detached, the softmax's backward at temperature 2, the queries', keys' and
  values' gradients scaled by ¼, ¼ and ½;
* ``"eap-ig"``: the real gradient averaged over the straight path of input embeddings from
  the corrupted input to the clean one (Hanna et al. 2024, arXiv:2403.17806);

and, not linear, ``"atp*"`` (Kramár et al. 2024, arXiv:2403.00745: attribution patching with
the attention softmax recomputed where a patch reaches later queries and keys, and GradDrop).
Each linear estimator ``X`` has a variant ``"X+exact"``: ``X``, except at the nodes whose patch
moves the stream by more than the stream holds, ``κ_A = ‖write_A − write_A^c‖ / ‖stream just
after A writes‖ > exact_above`` (:data:`EXACT_ABOVE`), patched for real
(:func:`~captum_ffb.patching.estimators.exact_variant`); ``"atp+verify"`` is ``"atp+exact"``
with the ``verify_top`` (:data:`VERIFY_TOP`) components of each kind that AtP's and the frozen
estimates flag most, and the next of largest κ, also patched for real, AtP*'s second stage
(:func:`~captum_ffb.patching.estimators.verified_variant`).

:data:`DEFAULT_ESTIMATOR` names the default, chosen against real activation patching on the
selection prompts of six tasks and reported on held-out ones (``results/patching``;
docs/graphs.md); :data:`DEFAULT_EDGE_ESTIMATOR` the edges' default, chosen against real path
patching of single edges (circuits cut from edge scores have their own default, chosen by MIB's
protocol: :mod:`captum_ffb.patching.circuits`). The real passes are :func:`real_writers` and :func:`patched_values`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.core.keys import NodeId, NodeTable, node_ids
from captum_ffb.core.vocabulary import check_granularity
from captum_ffb.engine.autograd import sequence_shaped
from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.fingerprint import Stamp, check_unchanged, weights_stamp
from captum_ffb.engine.head import target_value
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.requests import check_count
from captum_ffb.engine.tape import Covectors, GraphTape
from captum_ffb.patching.estimators import (
    EAP_IG_STEPS,
    Link,
    Recorded,
    Shared,
    computation_order,
    differences,
    edge_estimates,
    edge_estimator_names,
    estimator_aliases,
    estimator_names,
    get_estimator,
    kappas,
    link_of,
    node_kind,
    record,
    record_shared,
    writer_key,
)
from captum_ffb.patching.real import (
    Patch,
    RealWriters,
    corrupted_like,
    patched_values,
    real_writers,
    repeat_rows,
    repeat_target,
    writer_patch,
)

__all__ = ["ALIASES", "COMPUTED", "DEFAULT_EDGE_ESTIMATOR", "DEFAULT_ESTIMATOR", "EDGE_ESTIMATORS", "ESTIMATORS",
           "EXACT_ABOVE", "LINEAR", "VERIFY_TOP", "EdgePatcher", "Patch", "PatchEstimates", "RealWriters", "activation_patching",
           "check_estimators", "corrupted_like", "patch_estimates", "path_patching", "patched_values", "real_writers"]

#: The linear estimators: ``⟨G, o − o^c⟩`` with the covector each names (the registered ones).
LINEAR = tuple(name for name in estimator_names() if get_estimator(name).linear)
#: The estimators by name, those registered but the ones computed as part of another (the
#: linear ones, each with its ``"+exact"`` variant, and AtP*).
ESTIMATORS = tuple(name for name in estimator_names() if get_estimator(name).part_of is None)
#: What a graph with ``corrupted_inputs`` computes whatever it is asked (two forward passes
#: and one backward pass each, plus the ``"+exact"`` variants' real passes).
COMPUTED = ("frozen", "atp", "atp+exact", "relp", "relp+exact")
#: The default estimator (chosen against activation patching on six tasks: results/patching).
DEFAULT_ESTIMATOR = "atp+verify"
#: The ``"+exact"`` estimators patch a node for real where its κ exceeds this (chosen on the selection rows).
EXACT_ABOVE = 0.5
#: The components of each kind ``"atp+verify"`` patches for real by its estimates, one more by κ
#: (the smallest count within 0.01 of the best estimator on every task and kind of the
#: selection prompts: results/patching).
VERIFY_TOP = 4
#: The edge estimators (the registered ones with ``edges``).
EDGE_ESTIMATORS = edge_estimator_names()
#: The edges' default estimator of a graph's path-patching estimates (chosen against real path
#: patching of single edges: results/patching). Circuits have their own,
#: :data:`captum_ffb.patching.circuits.DEFAULT_CIRCUIT_ESTIMATOR`.
DEFAULT_EDGE_ESTIMATOR = "atp"
#: Names ``estimators=`` also takes: the default, and AtP*'s query–key fix alone (computed with AtP*).
ALIASES = {"default": DEFAULT_ESTIMATOR, **estimator_aliases()}


# --------------------------------------------------------------------------- activation patching
def activation_patching(engine: BoundModel, request: Request, corrupted: Request, granularity: str,
                        batch_size: int = 16, progress: bool = False) -> tuple[dict[str, float], float, float]:
    """Real activation patching of every component of the read stack, one patched pass each
    (a progress bar with ``progress``): ``({component id: effect}, clean value, corrupted
    value)``."""
    check_granularity(granularity, "patching")
    engine.refuse_two_stacks("activation patching")
    target = request.target
    base = real_writers(engine, corrupted, target, granularity)
    names: list[str] = []
    patches: list[Patch] = []
    for writer in engine.points.read_stack():
        if writer.kind == "attention" and granularity == "head":
            for head in range(writer.n_heads):
                names.append(writer.part(head))
                patches.append(writer_patch(writer, head, base))
        elif writer.kind in ("attention", "ff"):
            names.append(writer.id)
            patches.append(writer_patch(writer, -1, base))
    clean = float(real_writers(engine, request, target, "sublayer").value[0])
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(patches), desc="patching", unit="pass")
    try:
        values = patched_values(engine, request, target, patches, batch_size, bar)
    finally:
        if bar is not None:
            bar.close()
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
    writers = {w.id: w for w in engine.points.read_stack()}
    reads = {read.id: read.module for read in engine.points.reads}
    outputs = {w.id: sequence_shaped(w.output.detach(), w.n)[0] for w in clean.tape.writers}
    parts = {w.id: w.parts.detach()[0] for w in clean.tape.writers if w.parts is not None}
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
                delta = -diff.writes[writer_key(s_kind, s_layer)][p, s_part]
            else:
                delta = -diff.outputs[writer_key(s_kind, s_layer)][p]
            delta = delta * fraction
            kind, layer, part, q = link.target
            if kind == "output":
                if final_norm is None:
                    raise ValueError("path patching into the output needs the model's final norm")
                added.setdefault(id(final_norm), (final_norm, []))[1].append((row, p, delta))
                continue
            writer = writers[writer_key(kind, layer)]
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
            args = tuple(repeat_rows(a, rows) for a in request.args)
            kwargs = {k: repeat_rows(v, rows) for k, v in request.kwargs.items()}
            output = run.run(*args, **kwargs)
        found += [value - v for v in target_value(engine.head, output, repeat_target(target, rows)).tolist()]
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


def check_estimators(names: str | Sequence[str] | None) -> tuple[str, ...]:
    """The estimators a graph computes: :data:`COMPUTED`, the default and ``names`` (one name,
    or several; those registered (:data:`ESTIMATORS`) and :data:`ALIASES`; a one-line error for
    others)."""
    if isinstance(names, str):
        names = (names,)
    if names is not None and not (isinstance(names, Sequence) and all(isinstance(n, str) for n in names)):
        raise TypeError(f"estimators must be an estimator's name or a list of names, got {names!r}")
    aliases = {"default": DEFAULT_ESTIMATOR, **estimator_aliases()}
    known = [name for name in estimator_names() if name not in aliases]
    names = tuple(aliases.get(name, name) for name in names or ())
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"estimators must be among {', '.join((*known, *aliases))}; got "
                         f"{', '.join(map(repr, unknown))}")
    wanted = list(COMPUTED)
    for name in (DEFAULT_ESTIMATOR, *names):
        if name not in wanted:
            wanted.append(name)
    return tuple(wanted)


def patch_estimates(engine: BoundModel, request: Request, corrupted: Request, tape: GraphTape, found: Covectors,
                    data: NodeTable, granularity: str, exact_above: float = EXACT_ABOVE,
                    estimators: Sequence[str] | None = None, steps: int = EAP_IG_STEPS,
                    stamp: Stamp | None = None, verify_top: int = VERIFY_TOP) -> PatchEstimates:
    """Every node's estimated patching effect under :data:`COMPUTED`, ``estimators`` and the
    default (``"default"``), each node's κ, the components the ``"+exact"`` estimators patched
    for real (and AtP*'s whole components), and each estimator's seconds and passes; the edges'
    patcher bound to the weights of ``stamp`` (the model's now, when not given). Each
    estimator is the registered one of its name; the clean and corrupted passes are recorded
    once for all."""
    chosen = computation_order(check_estimators(estimators))
    nodes = {node: k for k, node in enumerate(node_ids(data))}
    shared = record_shared(engine, request, corrupted, granularity, chosen, tape=tape, found=found, nodes=nodes,
                           steps=steps, exact_above=exact_above, verify_top=verify_top)
    seconds: dict[str, float] = {}
    passes: dict[str, float] = {}
    for estimator in chosen:
        tic = time.perf_counter()
        shared.results[estimator.name] = estimator.estimate(shared)
        seconds[estimator.name] = estimator.seconds(time.perf_counter() - tic, shared, seconds)
        passes[estimator.name] = estimator.passes(shared)
    layout = _node_layout(shared)
    dtype = data.values.dtype
    estimates = {name: _scattered(result.nodes, layout, len(data), dtype) for name, result in shared.results.items()}
    whole = {name: result.components for name, result in shared.results.items() if result.components is not None}
    estimates["default"] = estimates[DEFAULT_ESTIMATOR].clone()
    if DEFAULT_ESTIMATOR in whole:
        whole["default"] = dict(whole[DEFAULT_ESTIMATOR])
    seconds["default"], passes["default"] = seconds[DEFAULT_ESTIMATOR], passes[DEFAULT_ESTIMATOR]
    patcher = None if granularity == "neuron" else \
        EdgePatcher(engine, request, corrupted, granularity, steps, stamp=stamp)
    return PatchEstimates({name: value.detach() for name, value in estimates.items()},
                          _scattered(kappas(shared), layout, len(data), dtype), whole, seconds, passes, patcher)


def _node_layout(shared: Shared) -> list[tuple[str, Tensor, Tensor, Tensor]]:
    """Per writer: ``(writer id, node indices, positions, columns)`` of its nodes in the graph."""
    layout = []
    for recorded in shared.tape.writers:
        kind = node_kind(recorded.kind, recorded.parts is not None)
        parts = [-1] if recorded.parts is None else list(range(shared.parts(recorded)))
        found = [(node, p, column) for column, part in enumerate(parts) for p in range(shared.positions)
                 if (node := shared.nodes.get(NodeId(kind, recorded.layer, part, p))) is not None]
        node, p, column = (torch.tensor(list(c), dtype=torch.long) for c in zip(*found)) if found else \
            (torch.zeros(0, dtype=torch.long),) * 3
        layout.append((recorded.id, node, p, column))
    return layout


def _scattered(per_writer: dict[str, Tensor], layout: list[tuple[str, Tensor, Tensor, Tensor]], size: int,
               dtype: torch.dtype) -> Tensor:
    """``(size,)`` the nodes' values from writer id → ``(n, parts)`` (zero elsewhere)."""
    out = torch.zeros(size, dtype=dtype)
    for key, node, p, column in layout:
        out[node] = per_writer[key].detach().cpu()[p, column].to(dtype)
    return out


# --------------------------------------------------------------------------- edges
class EdgePatcher:
    """Computes the patching estimates of a graph's edges on demand (bound to the model, the
    input and the corrupted input): :meth:`estimates` for the linear edge estimators
    (:func:`~captum_ffb.patching.estimators.edge_estimates`), :meth:`real` for real path
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

    def links(self, data: NodeTable, edges: Tensor) -> list[Link]:
        """The links of the graph's edges ``edges`` (indices into ``data.sources``)."""
        return [link_of(data.kinds, data.layers, data.heads, data.positions, int(data.sources[e]),
                        int(data.targets[e])) for e in edges.tolist()]

    def estimates(self, data: NodeTable, edges: Tensor, estimators: Sequence[str] = (DEFAULT_EDGE_ESTIMATOR,)
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

    def real(self, data: NodeTable, edges: Tensor, batch_size: int = 16) -> Tensor:
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
