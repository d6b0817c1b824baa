r"""AtP* (Kramár, Lieberum, Shah and Nanda, 2024, "AtP*: An efficient and scalable method for
localizing LLM behaviour to components", arXiv:2403.00745): attribution patching with its two
fixes of false negatives.

* The **QK fix**: where a patch reaches the queries and keys of a later attention, the
  attention probabilities are recomputed with the patched queries and keys (a softmax
  saturates, so its gradient says little) and only what follows the probabilities is taken to
  first order, ``⟨∂output/∂α, α(patched q, k) − α⟩``. The paper applies it to query and key
  nodes; a node here is a writer's output (a head, an attention sublayer, an FF block), which
  reaches a later attention's queries and keys through the stream. The closest faithful
  reading, implemented: for every later attention, the first-order term of the *direct* path
  (``A``'s write added to the stream that attention reads, through its norm into its queries
  and keys) is replaced by the probabilities that attention computes when ``A``'s patch
  reaches its queries and keys directly (norm, projections, rotary embeddings and softmax
  recomputed, the rest of the model clean); paths through intermediate components stay first
  order, as in the paper. ``"atp+qk"`` is this fix alone (computed with AtP*).
* **GradDrop**: ``L`` more backward passes, pass ``ℓ`` with the gradient through block ``ℓ``'s
  writes to the residual stream zeroed; the estimate is ``(1/(L−1)) Σ_ℓ |I_ℓ(A)|`` with
  ``I_ℓ`` the (QK-fixed) estimate of pass ``ℓ``. GradDrop estimates the size of an effect; it
  is signed here by the QK-fixed estimate (activation patching is signed, and so are the
  library's estimates).

Cost: the two forward passes, ``1 + L`` backward passes and, per later attention, its norm,
query/key projections and softmax recomputed once per component (no full pass); the QK fix
runs an attention's norm and projections again on other inputs, each in a pass of its own (as
the score splits do). Its components are computed with every position patched at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captum_ffb.core.vocabulary import component_of
from captum_ffb.engine.bound import BoundModel
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.score_path import expand_batch, install_projecting, kept_queries_keys
from captum_ffb.patching.estimators.base import Estimate, Estimator, Shared, register_estimator
from captum_ffb.patching.estimators.exact import node_kind
from captum_ffb.patching.estimators.recorded import (
    Differences,
    Probe,
    Recorded,
    gradients,
    linear_estimates,
)
from captum_ffb.rules.attention_scores import masked_softmax, soft_capped

__all__ = ["AtPStar", "QKFix", "StarEstimates", "atp_star"]


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
    fix_nodes = {w.id: torch.zeros(len(settings), *linear[0][w.id].shape, dtype=torch.float64)
                 for w in tape.writers}
    fix_comps = {w.id: torch.zeros(len(settings), linear[0][w.id].shape[1], dtype=torch.float64)
                 for w in tape.writers}
    for probe in clean.probes:
        upstream = tape.writers[:probe.index]
        if not upstream:
            continue
        deltas, owners = [], []
        for writer in upstream:
            if writer.parts is None or writer.kind != "attention":
                deltas.append(-diff.outputs[writer.id][None])  # corrupted − clean
                owners.append((writer.id, -1))
            else:
                writes = -diff.writes[writer.id].permute(1, 0, 2)  # (p, n, d)
                deltas.append(writes)
                owners += [(writer.id, h) for h in range(writes.shape[0])]
        delta = torch.cat(deltas).to(probe.stream.dtype)  # (C, n, d)
        g_probs = torch.stack([g[f"{tape.writers[probe.index].id}.probs"] for g in grads])  # (S, H, n, n)
        # −⟨∂output/∂α, α(patched) − α − J δ⟩: the effect's sign (clean − patched)
        comp_fix, node_fix = _qk_fix(probe, delta, g_probs, chunk)
        for c, (key, part) in enumerate(owners):
            column = max(part, 0)
            layer = next(w.layer for w in upstream if w.id == key)
            keep = torch.tensor([s != layer for s in settings], dtype=torch.float64)  # GD_ℓ of its own block: 0
            fix_comps[key][:, column] += comp_fix[:, c] * keep
            fix_nodes[key][:, :, column] += node_fix[:, c] * keep[:, None]
    n_drop = max(len(blocks) - 1, 1)
    nodes, comps, qk_nodes, qk_comps = {}, {}, {}, {}
    for writer in tape.writers:
        per_node = torch.stack([lin[writer.id].double() for lin in linear]) + fix_nodes[writer.id]  # (S, n, p)
        per_comp = torch.stack([lin[writer.id].double().sum(0) for lin in linear]) + fix_comps[writer.id]
        qk_nodes[writer.id], qk_comps[writer.id] = per_node[0], per_comp[0]
        nodes[writer.id] = torch.sign(per_node[0]) * per_node[1:].abs().sum(0) / n_drop
        comps[writer.id] = torch.sign(per_comp[0]) * per_comp[1:].abs().sum(0) / n_drop
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
        return hidden if value is original else expand_batch(value, 1, copies)

    new_args = tuple(swap(a) for a in args)
    new_kwargs = {k: (None if k in ("attention_mask", "mask") else swap(v)) for k, v in kwargs.items()}
    kept: list = []
    token = kept_queries_keys.set(kept)
    try:
        with ModelPass(probe.module) as run:
            install_projecting(run, probe.module, probe.method)
            run.call(probe.module, *new_args, **new_kwargs)
    finally:
        kept_queries_keys.reset(token)
    if not kept:
        raise RuntimeError("the attention module did not call its attention function")
    return kept[0]



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
    c0, slope0 = soft_capped(s0, probe.softcap)
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
        exact = masked_softmax(soft_capped(torch.matmul(qx, kxr.transpose(-1, -2)) * scale, probe.softcap)[0], allowed)
        lin = scale * (torch.matmul(dq, k0r.transpose(-1, -2)) + torch.matmul(q0, dkr.transpose(-1, -2)))
        change = exact - alpha - _softmax_tangent(alpha, slope0 * lin)  # (C, H, n, n)
        comps.append(-torch.einsum("chij,shij->sc", change, g))
        # position p alone, its query row: recomputed in full
        row = torch.matmul(qx, k0r.transpose(-1, -2)) * scale  # (C, H, P, J)
        own = (qx * kxr).sum(-1) * scale  # (C, H, P): the new query against the new key
        row = torch.where(eye, own[..., None], row)
        row_exact = masked_softmax(soft_capped(row, probe.softcap)[0], allowed)
        row_lin = scale * torch.matmul(dq, k0r.transpose(-1, -2)) \
            + torch.where(eye, scale * (q0 * dkr).sum(-1)[..., None], torch.zeros((), dtype=dtype))
        row_change = row_exact - alpha - _softmax_tangent(alpha, slope0 * row_lin)
        on_rows = torch.einsum("shpj,chpj->scp", g, row_change)
        # the other rows t: one score moves (key p), the softmax's change in closed form
        moved = torch.einsum("hte,chpe->chtp", q0, kxr) * scale  # (C, H, T, P)
        jump = (soft_capped(moved, probe.softcap)[0] - c0).clamp(max=600.0)
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


# --------------------------------------------------------------------------- the estimators
def _star(shared: Shared) -> StarEstimates:
    return shared.once("atp*", lambda: atp_star(shared.engine, shared.clean, shared.diff))


def _components(shared: Shared, values: Mapping[str, Tensor]) -> dict[str, float]:
    """Component id → its value, from writer id → ``(parts,)``."""
    found = {}
    for recorded in shared.tape.writers:
        kind = node_kind(recorded.kind, recorded.parts is not None)
        parts = [-1] if recorded.parts is None else list(range(shared.parts(recorded)))
        for column, part in enumerate(parts):
            found[component_of(kind, recorded.layer, part)] = float(values[recorded.id][column])
    return found


@register_estimator
class AtPStar(Estimator):
    """AtP with the QK fix and GradDrop (:func:`atp_star`)."""

    name = "atp*"
    citation = ("Kramár, Lieberum, Shah and Nanda 2024, 'AtP*: An efficient and scalable method for "
                "localizing LLM behaviour to components', arXiv:2403.00745")
    cost = "3 + L (AtP's passes, and one backward pass per block for GradDrop; the QK fix's softmaxes)"
    requires = ("atp",)
    clean_pass = {"probe": True, "gate": True}

    def passes(self, shared: Shared) -> float:
        return 3 + shared.blocks

    def seconds(self, own: float, shared: Shared, done: Mapping[str, float]) -> float:
        return done["atp"] + own

    def estimate(self, shared: Shared) -> Estimate:
        star = _star(shared)
        return Estimate({k: v.cpu() for k, v in star.nodes.items()}, _components(shared, star.components))


@register_estimator
class QKFix(Estimator):
    """AtP with the QK fix alone (no GradDrop), computed with AtP*."""

    name = "atp+qk"
    citation = AtPStar.citation
    cost = "3 (AtP's: its backward passes are AtP's; computed with AtP*)"
    requires = ("atp*",)
    part_of = "atp*"

    def passes(self, shared: Shared) -> float:
        return 3

    def seconds(self, own: float, shared: Shared, done: Mapping[str, float]) -> float:
        return done["atp*"]

    def estimate(self, shared: Shared) -> Estimate:
        star = _star(shared)
        return Estimate({k: v.cpu() for k, v in star.qk_nodes.items()}, _components(shared, star.qk_components))
