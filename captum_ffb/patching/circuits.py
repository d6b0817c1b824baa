r"""Circuits by the protocol of MIB's circuit-localization track (Mueller et al. 2025, "MIB: A
Mechanistic Interpretability Benchmark", arXiv:2504.13151): a model's *component graph*
(:class:`ComponentGraph`: sources the first block's input, every head or attention sublayer and
every FF block; readers every head or attention sublayer, every FF block and the logits; an edge
from every source to every reader after it), edge scores from any edge estimator
(:func:`edge_scores`: each edge's estimated path-patching effect summed over positions), the
circuits at MIB's edge shares (:func:`circuit_masks`: the top ``⌊share · E⌋`` edges by signed or
absolute score, pruned of dangling edges), each circuit's value with every edge outside it patched from
the counterfactual input (:func:`circuit_values`) and MIB's summaries
(:func:`faithfulness_curve`): ``f(C) = (m(C) − m(∅)) / (m(N) − m(∅))``, CPR the area under
``f`` and CMD the area between ``f`` and 1 (trapezoids over the shares). MIB's leaderboard reads
CPR from the circuits of the top signed scores and CMD from those of the top absolute scores
(:func:`mib_scores`).

**The circuit's forward pass.** Every reader ``B`` reads its own copy of the stream,
``x_B = x − Σ_{A→B ∉ C} (o_A − o_A^c)``: the stream of the circuit's own pass minus, for each
source outside the circuit, what it wrote in that pass less what it wrote on the counterfactual
input (the first block's input included). So ``m(N)`` is the clean model's value and ``m(∅)``
the counterfactual input's. Heads read separately: the pass runs ``H`` rows per circuit (one
per head of the widest attention), row ``h`` carrying head ``h``'s input to every attention,
and each attention's output projection takes head ``h``'s slice from row ``h``.

**Where this differs from MIB.** MIB's heads read their queries, keys and values as three
readers (``a3.h1<q>``, ``<k>``, ``<v>``); here a head reads once (its three inputs are one
edge). MIB's counts and the export (:func:`mib_graph`) give each head edge its three names
with one score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.autograd import first_input, swap_first
from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.head import target_value
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.points import Writer
from captum_ffb.patching.estimators.base import EAP_IG_STEPS
from captum_ffb.patching.estimators.edges import ALL, Link, edge_estimates
from captum_ffb.patching.real import repeat_rows, repeat_target

__all__ = ["DEFAULT_CIRCUIT_ESTIMATOR", "MIB_EDGE_SHARES", "ComponentGraph", "FaithfulnessCurve", "check_ends", "circuit_masks", "circuit_values",
           "MibScores", "edge_scores", "faithfulness_curve", "mib_graph", "mib_scores", "mib_summaries", "task_scores"]

#: MIB's shares of the edges (its ``percentages``).
MIB_EDGE_SHARES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
#: The edge estimator whose scores cut circuits by default: GIM's gradients along EAP-IG's path
#: (EAP-IG's cost), chosen by MIB's CPR (top signed scores) and CMD (top absolute scores) on the
#: selection prompts of six tasks (results/mib). A graph's per-edge path-patching estimates keep
#: :data:`~captum_ffb.patching.patches.DEFAULT_EDGE_ESTIMATOR`: against single edges patched for
#: real, GIM's estimates fail on agreement (results/patching).
DEFAULT_CIRCUIT_ESTIMATOR = "gim-ig"


# --------------------------------------------------------------------------- the graph
@dataclass(frozen=True)
class ComponentGraph:
    """A model's component graph (positions summed), its nodes named as MIB names them.

    Attributes:
        granularity (str): ``"head"`` (heads are nodes) or ``"sublayer"`` (attention sublayers).
        sources (tuple): ``"input"``, then ``"a<l>.h<h>"`` (or ``"a<l>"``) and ``"m<l>"`` in
                    the order they write.
        readers (tuple): the same components in the same order (without the input), then
                    ``"logits"``.
        edges (Tensor): ``(E, 2)`` each edge's source and reader index.
        keys (tuple): each source's and reader's node key ``(kind, layer, part, ALL)``.
    """

    granularity: str
    sources: tuple[str, ...]
    readers: tuple[str, ...]
    edges: Tensor
    source_keys: tuple[tuple[str, int, int, int], ...]
    reader_keys: tuple[tuple[str, int, int, int], ...]

    @classmethod
    def of(cls, engine: BoundModel, granularity: str = "head") -> ComponentGraph:
        """The component graph of ``engine``'s model (a decoder-only stack whose writers read
        the stream through a norm of their own: a Pre-LN model)."""
        if granularity not in ("head", "sublayer"):
            raise ValueError(f"a component graph's granularity is 'head' or 'sublayer', got {granularity!r}")
        writers = circuit_writers(engine)
        if granularity == "head" and engine.spec.attention_post_norm:
            raise ValueError("a head graph needs each head's write to reach the stream as it is (this family norms "
                             "the attention's output): use granularity='sublayer'")
        sources: list[str] = ["input"]
        keys: list[tuple[str, int, int, int]] = [("token", -1, -1, ALL)]
        readers: list[str] = []
        reader_keys: list[tuple[str, int, int, int]] = []
        edges: list[tuple[int, int]] = []
        for writer in writers:
            named = _components(writer, granularity)
            for name, key in named:
                edges += [(s, len(readers)) for s in range(len(sources))]
                readers.append(name)
                reader_keys.append(key)
            sources += [name for name, _ in named]
            keys += [key for _, key in named]
        edges += [(s, len(readers)) for s in range(len(sources))]
        readers.append("logits")
        reader_keys.append(("output", -1, -1, -1))
        return cls(granularity, tuple(sources), tuple(readers), torch.tensor(edges, dtype=torch.long),
                   tuple(keys), tuple(reader_keys))

    @property
    def n_edges(self) -> int:
        return int(self.edges.shape[0])

    def edge_names(self) -> list[str]:
        """``"<source>-><reader>"`` for each edge."""
        return [f"{self.sources[s]}->{self.readers[r]}" for s, r in self.edges.tolist()]

    def links(self) -> list[Link]:
        """Each edge as a position-agnostic :class:`~captum_ffb.patching.estimators.edges.Link`."""
        return [Link(self.source_keys[s], self.reader_keys[r]) for s, r in self.edges.tolist()]


def circuit_writers(engine: BoundModel) -> list[Writer]:
    """The writers a component graph is made of, or a ``ValueError`` for a model the circuit's
    pass cannot patch (an encoder–decoder, a parallel block, a Post-LN model)."""
    points = engine.points
    if len(points.n_blocks) != 1:
        raise ValueError("circuits are for decoder-only models (an encoder–decoder has two stacks)")
    if engine.head.final_norm is None:
        raise ValueError("circuits need the model's final norm (where the logits read the stream)")
    writers = points.read_stack()
    reads = {read.id: read.module for read in points.reads}
    seen: set[str] = set()
    for writer in writers:
        if writer.read in seen:
            raise ValueError("circuits need every writer to read the stream on its own (no parallel blocks)")
        seen.add(writer.read)
        if writer.kind not in ("attention", "ff"):
            raise ValueError(f"circuits do not patch a {writer.kind!r} writer")
        if any(module is reads[writer.read] for module in writer.module.modules()):
            raise ValueError("circuits need Pre-LN blocks (each writer reading the stream through its own norm)")
    return writers


def _components(writer: Writer, granularity: str) -> list[tuple[str, tuple[str, int, int, int]]]:
    if writer.kind == "ff":
        return [(f"m{writer.layer}", ("ff", writer.layer, -1, ALL))]
    if granularity == "head" and writer.parts is not None:
        return [(f"a{writer.layer}.h{h}", ("head", writer.layer, h, ALL)) for h in range(writer.n_heads)]
    return [(f"a{writer.layer}", ("attention", writer.layer, -1, ALL))]


# --------------------------------------------------------------------------- scores and circuits
def edge_scores(engine: BoundModel, request: Request, corrupted: Request, graph: ComponentGraph,
                estimators: Sequence[str], steps: int = EAP_IG_STEPS) -> dict[str, Tensor]:
    """Name → ``(E,)`` each edge's score by each edge estimator: its estimated path-patching
    effect ``m(clean) − m(clean with the reader seeing the source's counterfactual write)``,
    summed over the source's and the reader's positions."""
    return edge_estimates(engine, request, corrupted, graph.granularity, graph.links(), estimators, steps=steps)


def task_scores(engine: BoundModel, pairs: Sequence[tuple[Request, Request]], graph: ComponentGraph,
                estimator: str | None = None, steps: int = EAP_IG_STEPS) -> Tensor:
    """``(E,)`` a task's edge scores: one estimator's (``None``:
    :data:`DEFAULT_CIRCUIT_ESTIMATOR`) summed over the task's prompts ``pairs`` (each a request
    and its counterfactual), what MIB cuts a task's circuits from and what its submission holds."""
    name = DEFAULT_CIRCUIT_ESTIMATOR if estimator is None else estimator
    if not pairs:
        raise ValueError("pairs must hold at least one (request, counterfactual) pair: a task's scores sum over its prompts")
    total = torch.zeros(graph.n_edges, dtype=torch.float64)
    for request, corrupted in pairs:
        total += edge_scores(engine, request, corrupted, graph, (name,), steps)[name]
    return total


def circuit_masks(graph: ComponentGraph, scores: Tensor, shares: Sequence[float] = MIB_EDGE_SHARES,
                  absolute: bool = True, prune: bool = True) -> Tensor:
    """``(S, E)`` the circuit at each share: the top ``⌊share · E⌋`` edges by (absolute) score,
    then (``prune``) without the edges of nodes that lost every way in or out (a node is kept
    while it has a kept edge out and, except the input, a kept edge in; the logits always)."""
    scores = torch.as_tensor(scores, dtype=torch.float64).flatten()
    if scores.shape[0] != graph.n_edges:
        raise ValueError(f"scores must have one value per edge ({graph.n_edges}), got {scores.shape[0]}")
    if not torch.isfinite(scores).all():
        raise ValueError("scores must be finite")
    bad = [s for s in shares if isinstance(s, bool) or not (isinstance(s, (int, float)) and 0 <= s <= 1)]
    if bad:
        raise ValueError(f"shares must lie in [0, 1], got {bad[0]!r}")
    order = torch.argsort(scores.abs() if absolute else scores, descending=True, stable=True)
    masks = torch.zeros((len(shares), graph.n_edges), dtype=torch.bool)
    for row, share in enumerate(shares):
        masks[row, order[:int(share * graph.n_edges)]] = True
        if prune:
            masks[row] = _pruned(graph, masks[row])
    return masks


def _pruned(graph: ComponentGraph, mask: Tensor) -> Tensor:
    source, reader = graph.edges[:, 0], graph.edges[:, 1]
    n_sources = len(graph.sources)
    # source k ≥ 1 is the component of reader k − 1; the input has no reader, the logits no source
    while True:
        out = torch.zeros(n_sources, dtype=torch.bool)
        out[source[mask]] = True
        into = torch.zeros(len(graph.readers), dtype=torch.bool)
        into[reader[mask]] = True
        alive = out & torch.cat([torch.ones(1, dtype=torch.bool), into[:n_sources - 1]])
        reading = torch.cat([alive[1:], torch.ones(1, dtype=torch.bool)])
        kept = mask & alive[source] & reading[reader]
        if torch.equal(kept, mask):
            return kept
        mask = kept


# --------------------------------------------------------------------------- the circuit's pass
class _CircuitPass:
    """The hooks of one pass of circuits (``masks`` ``(S, E)``, with the counterfactual
    input's writes ``reference``), or of a recording pass (``masks`` ``None``: one row,
    nothing patched, every source's write kept in :attr:`writes`)."""

    def __init__(self, engine: BoundModel, graph: ComponentGraph, masks: Tensor | None,
                 reference: list[Tensor] | None = None, heads: int = 1) -> None:
        self.engine, self.graph, self.reference = engine, graph, reference
        self.circuits = 1 if masks is None else masks.shape[0]
        self.views = heads if masks is not None and graph.granularity == "head" else 1
        self.writes: list[Tensor] = []  # recording: each source's write (1, n, d), in the graph's order
        self.count = 0  # the sources written so far
        self.delta: Tensor | None = None  # circuits: (S, sources, n, d) each write less its reference
        self.excluded: dict[int, Tensor] = {}  # reader → (S, k) 1 where the edge from source j < k is outside
        if masks is not None:
            for r in range(len(graph.readers)):
                rows = torch.nonzero(graph.edges[:, 1] == r).flatten()  # its sources 0 … k − 1, in order
                self.excluded[r] = (~masks[:, rows]).to(torch.float64)

    def install(self, run: ModelPass) -> None:
        run.before(self.engine.blocks[0], self._input, with_kwargs=True)
        reads = {read.id: read.module for read in self.engine.points.reads}
        reader = 0
        for writer in circuit_writers(self.engine):
            named = _components(writer, self.graph.granularity)
            run.before(reads[writer.read], self._reading(reader, len(named)), with_kwargs=True)
            if len(named) > 1:
                run.before(writer.parts, self._heads(writer))
            else:
                run.after(writer.module, self._whole)
            reader += len(named)
        run.before(self.engine.head.final_norm, self._reading(reader, 1), with_kwargs=True)

    def _keep(self, write: Tensor) -> None:
        """A source's write ``(S, n, d)`` (or its heads' ``(S, n, H, d)``)."""
        for part in ([write] if write.dim() == 3 else list(write.unbind(2))):
            if self.reference is None:
                self.writes.append(part)
            else:
                if self.delta is None:
                    self.delta = torch.zeros((self.circuits, len(self.graph.sources), *part.shape[1:]),
                                             dtype=torch.float64, device=part.device)
                self.delta[:, self.count] = part.double() - self.reference[self.count].double()
            self.count += 1

    def _rows(self, x: Tensor) -> Tensor:
        """``(S, views, n, d)`` (a stream some families flatten to ``(rows · n, d)`` included)."""
        return x.reshape(self.circuits, self.views, -1, x.shape[-1])

    def _input(self, module: nn.Module, args: Any, kwargs: Any) -> Any:
        self._keep(self._rows(first_input(args, kwargs))[:, 0].detach())
        return None

    def _reading(self, first: int, count: int) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> Any:
            if self.delta is None:
                return None
            x = first_input(args, kwargs)
            if count not in (1, self.views):
                raise ValueError("every attention of a head graph must have the same number of heads")
            excluded = torch.stack([self.excluded[first + j] for j in range(count)], dim=1)  # (S, c, k)
            k = excluded.shape[-1]
            cut = torch.einsum("sck,sknd->scnd", excluded, self.delta[:, :k]).to(x.dtype)
            return swap_first(args, kwargs, (self._rows(x) - cut).reshape(x.shape))
        return hook

    def _heads(self, writer: Writer) -> Any:
        def hook(module: nn.Module, args: Any) -> Any:
            z = args[0]
            n, width = z.shape[-2], z.shape[-1]
            per = z.reshape(self.circuits, self.views, n, writer.n_heads, width // writer.n_heads)
            if self.views > 1:  # head h's slice from the row where head h read its own input
                if self.views != writer.n_heads:
                    raise ValueError("every attention of a head graph must have the same number of heads")
                per = torch.stack([per[:, h, :, h] for h in range(writer.n_heads)], dim=2)
            else:
                per = per[:, 0]
            collapsed = per.reshape(self.circuits, n, width)
            self._keep(_head_writes(module, collapsed, writer.n_heads).detach())
            return (collapsed[:, None].expand(-1, self.views, -1, -1).reshape(z.shape), *args[1:])
        return hook

    def _whole(self, module: nn.Module, args: Any, output: Any) -> None:
        kept = output[0] if isinstance(output, tuple) else output
        self._keep(self._rows(kept)[:, 0].detach())


def _head_writes(projection: nn.Module, z: Tensor, heads: int) -> Tensor:
    """``(S, n, H, d)``: what each head's slice of the output projection's input ``z``
    ``(S, n, H·e)`` adds to the stream (the projection's bias left out)."""
    s, n, width = z.shape
    e = width // heads
    masked = torch.zeros((heads, s, n, heads, e), dtype=z.dtype, device=z.device)
    for h in range(heads):
        masked[h, :, :, h] = z.reshape(s, n, heads, e)[:, :, h]
    out = projection.forward(masked.reshape(heads, s * n, width))
    bias = projection.forward(torch.zeros_like(masked[:1, :1, 0].reshape(1, 1, width)))
    return (out - bias).reshape(heads, s, n, -1).permute(1, 2, 0, 3)


def _run(engine: BoundModel, request: Request, hooks: _CircuitPass) -> Tensor:
    rows = hooks.circuits * hooks.views
    with ModelPass(engine.model) as run:
        hooks.install(run)
        args = tuple(repeat_rows(a, rows) for a in request.args)
        kwargs = {k: repeat_rows(v, rows) for k, v in request.kwargs.items()}
        output = run.run(*args, **kwargs)
        value = target_value(engine.head, output, repeat_target(request.target, rows), dtype=torch.float64)
    return value.detach().reshape(hooks.circuits, hooks.views)[:, 0]


def check_ends(engine: BoundModel, request: Request, corrupted: Request, ends: Tensor, tolerance: float = 1e-4
               ) -> None:
    """A ``ValueError`` unless the circuit of every edge gave the model's own value on
    ``request`` and the empty circuit its value on ``corrupted`` (``ends``): where they differ,
    the model's stream is not the plain sum of its writers that the circuit's pass patches."""
    real = []
    for one in (request, corrupted):
        with ModelPass(engine.model) as run:
            output = run.run(*one.args, **one.kwargs)
            real.append(float(target_value(engine.head, output, request.target, dtype=torch.float64)[0]))
    scale = max(1.0, *(abs(v) for v in real))
    for got, want, name in zip(ends.tolist(), real, ("every edge", "no edge")):
        if abs(got - want) > tolerance * scale:
            raise ValueError(f"the circuit of {name} gave {got:.6g}, the model {want:.6g}: this model's stream is "
                             "not the plain sum of its writers' outputs, so its circuits cannot be patched here")


def circuit_values(engine: BoundModel, request: Request, corrupted: Request, graph: ComponentGraph,
                   masks: Tensor, batch_size: int = 8) -> Tensor:
    """``(S,)`` the explained value of each circuit of ``masks`` ``(S, E)`` on ``request``,
    every edge outside it patched from ``corrupted`` (one pass of ``H`` rows per circuit,
    ``batch_size`` circuits to a pass)."""
    masks = torch.as_tensor(masks, dtype=torch.bool)
    if masks.dim() != 2 or masks.shape[1] != graph.n_edges:
        raise ValueError(f"masks must be (circuits, {graph.n_edges}), got {tuple(masks.shape)}")
    if corrupted.args[0].shape != request.args[0].shape:
        raise ValueError(f"corrupted must have the input's shape {tuple(request.args[0].shape)}, got "
                         f"{tuple(corrupted.args[0].shape)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number of circuits, at least 1, got {batch_size!r}")
    recording = _CircuitPass(engine, graph, None)
    _run(engine, corrupted, recording)
    heads = max((w.n_heads for w in circuit_writers(engine) if w.kind == "attention"), default=1)
    found = []
    for start in range(0, masks.shape[0], batch_size):
        hooks = _CircuitPass(engine, graph, masks[start:start + batch_size], recording.writes, heads)
        found.append(_run(engine, request, hooks))
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.float64)


# --------------------------------------------------------------------------- MIB's summaries
@dataclass(frozen=True)
class FaithfulnessCurve:
    """The faithfulness of the circuits of one ranking at each share, and MIB's two summaries.

    Attributes:
        shares (tuple): the edge shares.
        faithfulness (tuple): ``f`` at each share.
        edges (tuple): the edges each circuit kept (after pruning).
        cpr (float): the area under ``f`` (higher is better).
        cmd (float): the area between ``f`` and 1 (lower is better).
        clean, counterfactual (float): ``m(N)`` and ``m(∅)`` (means over the prompts).
        absolute (bool): whether the circuits are the top edges by absolute score (else by signed).
    """

    shares: tuple[float, ...]
    faithfulness: tuple[float, ...]
    edges: tuple[int, ...]
    cpr: float
    cmd: float
    clean: float
    counterfactual: float
    absolute: bool = True


@dataclass(frozen=True)
class MibScores:
    """MIB's two scores of one set of edge scores, each read from its own ranking as MIB's
    leaderboard reads them: CPR from the circuits of the top *signed* scores (the edges that
    carry the behaviour), CMD from those of the top *absolute* scores (the edges that matter
    either way).

    Attributes:
        cpr (float): the signed curve's area under ``f`` (higher is better).
        cmd (float): the absolute curve's area between ``f`` and 1 (lower is better).
        signed (FaithfulnessCurve): the circuits of the top signed scores.
        absolute (FaithfulnessCurve): the circuits of the top absolute scores.
    """

    cpr: float
    cmd: float
    signed: FaithfulnessCurve
    absolute: FaithfulnessCurve


def mib_summaries(shares: Sequence[float], faithfulness: Sequence[float]) -> tuple[float, float]:
    """``(CPR, CMD)``: the trapezoid areas under ``f`` and between ``f`` and 1 over ``shares``."""
    if len(shares) != len(faithfulness) or len(shares) < 2:
        raise ValueError("shares and faithfulness need the same length, at least two")
    cpr = cmd = 0.0
    for (x1, f1), (x2, f2) in zip(zip(shares, faithfulness), zip(shares[1:], faithfulness[1:])):
        cpr += (x2 - x1) * (f1 + f2) / 2
        cmd += (x2 - x1) * (abs(1 - f1) + abs(1 - f2)) / 2
    return cpr, cmd


def faithfulness_curve(engine: BoundModel, pairs: Sequence[tuple[Request, Request]], graph: ComponentGraph,
                       scores: Tensor, shares: Sequence[float] = MIB_EDGE_SHARES, batch_size: int = 8,
                       absolute: bool = True) -> FaithfulnessCurve:
    """MIB's faithfulness of the circuits cut from ``scores`` ``(E,)`` at ``shares`` (the top
    edges by absolute score, or by signed score with ``absolute=False``), on the prompts
    ``pairs`` (each a request and its counterfactual): ``f = (m̄(C) − m̄(∅)) / (m̄(N) − m̄(∅))``
    with ``m̄`` the mean over the prompts, and its CPR and CMD."""
    return _curves(engine, pairs, graph, scores, shares, batch_size, (absolute,))[0]


def mib_scores(engine: BoundModel, pairs: Sequence[tuple[Request, Request]], graph: ComponentGraph,
               scores: Tensor, shares: Sequence[float] = MIB_EDGE_SHARES, batch_size: int = 8) -> MibScores:
    """MIB's CPR and CMD of ``scores`` ``(E,)`` on the prompts ``pairs``: CPR from the curve of
    the top signed scores, CMD from the curve of the top absolute scores (both curves kept; one
    set of passes for both)."""
    signed, absolute = _curves(engine, pairs, graph, scores, shares, batch_size, (False, True))
    return MibScores(signed.cpr, absolute.cmd, signed, absolute)


def _curves(engine: BoundModel, pairs: Sequence[tuple[Request, Request]], graph: ComponentGraph, scores: Tensor,
            shares: Sequence[float], batch_size: int, rankings: tuple[bool, ...]) -> list[FaithfulnessCurve]:
    if not pairs:
        raise ValueError("pairs must hold at least one (request, counterfactual) pair: faithfulness is a mean over prompts")
    sets = [circuit_masks(graph, scores, shares, absolute=a) for a in rankings]
    if len(sets) == 2 and torch.equal(sets[0], sets[1]):
        sets = sets[:1]  # every score of one sign: both rankings cut the same circuits
    ends = torch.stack([torch.ones(graph.n_edges, dtype=torch.bool), torch.zeros(graph.n_edges, dtype=torch.bool)])
    found = []
    for request, corrupted in pairs:
        values = circuit_values(engine, request, corrupted, graph, torch.cat([ends, *sets]), batch_size)
        check_ends(engine, request, corrupted, values[:2])
        found.append(values)
    values = torch.stack(found).mean(dim=0)
    clean, counterfactual = float(values[0]), float(values[1])
    span = clean - counterfactual
    curves = []
    for k, absolute in enumerate(rankings):
        at = min(k, len(sets) - 1)
        masks, row = sets[at], values[2 + at * len(shares):2 + (at + 1) * len(shares)]
        f = [(float(v) - counterfactual) / span if span != 0 else math.nan for v in row]
        cpr, cmd = mib_summaries(list(shares), f)
        curves.append(FaithfulnessCurve(tuple(float(s) for s in shares), tuple(f), tuple(int(m.sum()) for m in masks),
                                        cpr, cmd, clean, counterfactual, absolute))
    return curves


def mib_graph(graph: ComponentGraph, scores: Tensor, config: dict[str, Any], in_graph: Tensor | None = None
              ) -> dict[str, Any]:
    """MIB's submission of one task and model: ``{"cfg", "nodes", "edges"}`` with each edge's
    ``score`` and ``in_graph`` (every head edge under MIB's three names ``<q>``, ``<k>``,
    ``<v>``, one score), as its circuit loader reads them (``config``: ``n_layers``,
    ``n_heads``, ``d_model``, ``parallel_attn_mlp``)."""
    scores = torch.as_tensor(scores, dtype=torch.float64).flatten()
    if scores.shape[0] != graph.n_edges:
        raise ValueError(f"scores must have one value per edge ({graph.n_edges}), got {scores.shape[0]}")
    missing = [key for key in ("n_layers", "n_heads", "d_model", "parallel_attn_mlp") if key not in config]
    if missing:
        raise ValueError(f"config must name {', '.join(missing)} (MIB's loader reads them)")
    kept = torch.ones(graph.n_edges, dtype=torch.bool) if in_graph is None else torch.as_tensor(in_graph)
    if kept.dtype != torch.bool or tuple(kept.shape) != (graph.n_edges,):
        raise ValueError(f"in_graph must be a bool mask of the {graph.n_edges} edges, got {kept.dtype} of shape "
                         f"{tuple(kept.shape)}")
    edges: dict[str, dict[str, Any]] = {}
    used: set[str] = {"logits"}
    for (s, r), score, on in zip(graph.edges.tolist(), scores.tolist(), kept.tolist()):
        source, reader = graph.sources[s], graph.readers[r]
        names = [f"{source}->{reader}<{x}>" for x in "qkv"] if ".h" in reader else [f"{source}->{reader}"]
        for name in names:
            edges[name] = {"score": float(score), "in_graph": bool(on)}
        if on:
            used.update((source, reader))
    nodes = {name: {"in_graph": name in used} for name in (*graph.sources, "logits")}
    return {"cfg": dict(config), "nodes": nodes, "edges": edges}
