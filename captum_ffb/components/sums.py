r"""Direct effects: what each writer of the residual stream adds to a read-out, per player.

With every rule's coefficients taken from the real forward pass, the read-out is an affine
map of the residual stream at the read position(s), and the stream is a sum of *writers*:
the first block's input (``"embeddings"``), each attention sublayer (or each of its heads)
and each FF sublayer (or each expert), plus the biases of the norms the stream passes
(Post-LN) and of the head. Each writer's output is already decomposed over the players by
the forward route, so

    target = Σ_j Σ_c C[j, c] + Σ_c b[c]

with ``C[j, c] = ⟨g_c, F_c(x_j)⟩``: the writer's term for player ``j`` read through the
*direct path* ``g_c``, the covector of the read-out at the writer's output through the frozen
later norms (their scale and centring fixed from the real pass) and the head, not through
later blocks. The covectors are computed once, before the propagation, by pulling the
head's covector back through the norms of the stream (autograd through the norm rules,
which are linear in the terms).

Per head, the attention rule is run once with its output projection widened by one column
per head and covector direction (``W_O^h q``): the heads' direct effects come out of the
same call as the attention's output, at the cost of a few more output columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from captum_ffb.core.decomposition import Decomposition, stack_rows
from captum_ffb.core.vocabulary import (
    EMBEDDINGS,
    OUTPUT_HEAD,
    block_id,
    norm_id,
    writer_bias_id,
    writer_id,
)
from captum_ffb.engine.block import Block
from captum_ffb.engine.chains import CROSS_WRITER, EXPERT_OBSERVER, Chain, norm
from captum_ffb.engine.head import HeadTarget, ResolvedHead, head_forward
from captum_ffb.engine.layers import row_chunks
from captum_ffb.rules import is_linear_in_players

#: The component of what the final norm and the head add on their own (biases, constants).
HEAD = OUTPUT_HEAD


def check_linear_rules(rules: Mapping[str, Callable]) -> None:
    """Direct effects need every rule linear in the players (fixed coefficients)."""
    odd = [role for role, rule in rules.items() if not is_linear_in_players(rule)]
    if odd:
        raise ValueError(
            f"component attributions need rules linear in the players; the {odd[0]!r} rule "
            f"{rules[odd[0]]!r} is not"
        )


# --------------------------------------------------------------------------- direct paths
def _probe(batch: int, n: int, width: int, like: Tensor) -> tuple[Tensor, Decomposition]:
    """A one-player decomposition whose terms are a leaf to differentiate against."""
    terms = torch.zeros(batch, n, 1, width, dtype=like.dtype, device=like.device, requires_grad=True)
    return terms, Decomposition(terms, torch.zeros(batch, n, width, dtype=like.dtype, device=like.device))


def head_direct_path(head: ResolvedHead, target: HeadTarget, rules: Mapping[str, Callable],
                     real: Mapping[tuple[str, str], Tensor], spec: Any, config: Any,
                     like: Tensor) -> tuple[Tensor, Tensor]:
    """The covector of the read-out at the last block's output ``(B, n, d)`` and the head's
    own constant ``(B,)`` (the final norm's β, the head's biases; owed to no writer).

    Args:
        head, target, rules, real, spec, config: see
                    :func:`~captum_ffb.engine.head.head_forward`.
        like (Tensor): the last block's output ``(B, n, d)`` (shape, precision, device).
    """
    batch, n, width = like.shape
    with torch.enable_grad():
        terms, probe = _probe(batch, n, width, like)
        share, constant = head_forward(probe, head, target, rules, real, spec, config, like.dtype)
        (covector,) = torch.autograd.grad(share.sum(), terms)
    return covector[:, :, 0].detach(), constant.detach()


def pull_back_norm(block: Block, role: str, rules: Mapping[str, Callable], covector: Tensor,
                   ) -> tuple[Tensor, Tensor]:
    """The covector before the norm playing ``role`` (its scale and centring frozen) and
    what its β adds to the read-out ``(B,)``; unchanged and 0 when the block has no such norm."""
    batch, n, width = covector.shape
    if not block.has(role):
        return covector, covector.new_zeros(batch)
    with torch.enable_grad():
        terms, probe = _probe(batch, n, width, covector)
        out = norm(block, role, rules, probe)
        (before,) = torch.autograd.grad((out.terms[:, :, 0] * covector).sum(), terms)
    constant = (out.bias.detach() * covector).sum(dim=(1, 2))
    return before[:, :, 0].detach(), constant


@dataclass
class DirectPaths:
    """The read-out's covectors along the residual stream.

    Attributes:
        writers (dict): ``(block index, writer name)`` → covector ``(B, n, d)`` at the writer's
                    output.
        embeddings (Tensor): the covector at the first block's input.
        constants (dict): component name → what a stream norm's β (or the head) adds ``(B,)``.
    """

    writers: dict[tuple[int, str], Tensor]
    embeddings: Tensor
    constants: dict[str, Tensor] = field(default_factory=dict)


def direct_paths(blocks: Sequence[Block], chain: Chain, rules: Mapping[str, Callable],
                 head_covector: Tensor, head_constant: Tensor,
                 prepare: Callable[[Block], Block] | None = None) -> DirectPaths:
    """Pull the head's covector back along every block's stream (:attr:`Chain.stream`), last
    block first. ``prepare`` makes a light-captured block whole (only called when the stream
    passes a norm, whose real input is then needed)."""
    if not chain.stream:
        raise ValueError(f"the {chain.name!r} block type declares no residual stream (Chain.stream)")
    passes_norms = any(step.kind == "norm" for step in chain.stream)
    if not passes_norms and blocks:
        return plain_direct_paths(len(blocks), chain, blocks[0].spec.residual_scale, blocks[0].config,
                                  head_covector, head_constant)
    covector = head_covector
    writers: dict[tuple[int, str], Tensor] = {}
    constants: dict[str, Tensor] = {HEAD: head_constant}
    for index in reversed(range(len(blocks))):
        block = blocks[index]
        if passes_norms and prepare is not None:
            block = prepare(block)
        for step in reversed(chain.stream):
            if step.kind == "norm":
                covector, constants[norm_id(index, step.name)] = pull_back_norm(block, step.name, rules, covector)
            else:  # a branch scaled as it joins the stream is read through the scaled covector
                scale = block.residual_scale
                writers[(index, step.name)] = covector if scale is None else covector * scale
    return DirectPaths(writers, covector, constants)


def plain_direct_paths(n_blocks: int, chain: Chain, residual_scale: Callable[[Any], float] | None, config: Any,
                       head_covector: Tensor, head_constant: Tensor) -> DirectPaths:
    """:func:`direct_paths` of blocks whose stream passes no norm: every writer is read
    through the head's covector (scaled where its branch is scaled as it joins the stream;
    ``residual_scale`` the spec's, read from ``config``); no block is needed."""
    if not chain.stream:
        raise ValueError(f"the {chain.name!r} block type declares no residual stream (Chain.stream)")
    if any(step.kind == "norm" for step in chain.stream):
        raise ValueError(f"the {chain.name!r} stream passes norms: its direct paths need the blocks")
    scaled = head_covector if residual_scale is None else head_covector * float(residual_scale(config))
    writers = {(index, step.name): scaled for index in range(n_blocks) for step in chain.stream}
    return DirectPaths(writers, head_covector, {HEAD: head_constant})


# --------------------------------------------------------------------------- read-outs of writers
def active_rows(covector: Tensor) -> Tensor:
    """The rows where the covector is not zero in some batch element (the read positions)."""
    return covector.abs().amax(dim=(0, 2)).nonzero()[:, 0]


def read(decomposition: Decomposition, covector: Tensor) -> tuple[Tensor, Tensor]:
    """``(⟨g_i, F[i, j]⟩ summed over rows i (B, P), ⟨g_i, b_i⟩ summed (B,))`` for a
    decomposition and a covector with the same rows."""
    rows = active_rows(covector)
    if rows.numel() == 0:
        return covector.new_zeros(decomposition.batch_size, decomposition.n_in), \
            covector.new_zeros(decomposition.batch_size)
    part = decomposition.rows(rows).dense()
    g = covector[:, rows]
    return torch.einsum("bipd,bid->bp", part.terms, g), torch.einsum("bid,bid->b", part.bias, g)


class HeadSplit:
    r"""An attention rule that also gives each head's direct effect, from one call.

    The wrapped rule gets the output projection ``[W_O | W']``: ``W'`` has one column per
    head ``h`` and covector direction ``q_k``, holding ``W_O^h q_k`` in head ``h``'s rows;
    the extra output columns are ``⟨o^h, q_k⟩`` (every rule here is linear in ``W_O``), read
    against the covector ``g_i = Σ_k A[i, k] q_k`` and dropped; the first ``d`` columns are
    the attention's output as before.

    Args:
        rule (Callable): the attention rule.
        covector (Tensor): ``(B, n, d)`` the covector at the rule's output (before any
                    attention post-norm).
    """

    role = "attention"

    def __init__(self, rule: Callable, covector: Tensor) -> None:
        self.rule = rule
        self.credits_scores = getattr(rule, "credits_scores", False)
        self.linear_in_players = is_linear_in_players(rule)
        self.rows = active_rows(covector)
        vectors = covector[:, self.rows]  # (B, a, d)
        batch, a, width = vectors.shape
        flat = vectors.reshape(batch * a, width)
        keep = flat.abs().amax(dim=1) > 0
        if int(keep.sum()) <= 4 or int(keep.sum()) * 4 <= width:
            # one direction per non-zero covector row: exact
            directions = flat[keep]
            coefficients = torch.zeros(batch * a, directions.shape[0], dtype=flat.dtype, device=flat.device)
            coefficients[keep.nonzero()[:, 0], torch.arange(directions.shape[0], device=flat.device)] = 1
        else:
            # many rows (pooled read-outs): an orthonormal basis of the rows they span
            _, values, vh = torch.linalg.svd(flat.double(), full_matrices=False)
            rank = int((values > values[0] * torch.finfo(flat.dtype).eps * 32).sum())
            directions = vh[:rank].to(flat.dtype)
            coefficients = flat @ directions.T
        self.directions = directions  # (r, d)
        self.coefficients = coefficients.reshape(batch, a, directions.shape[0])  # (B, a, r)
        self.contributions: Tensor | None = None  # (B, P, H), after the call
        self.bias: Tensor | None = None  # (B, H)

    def __call__(self, value_input: Decomposition, probs: Tensor, value_weight: Tensor,
                 value_bias: Tensor | None, output_weight: Tensor, output_bias: Tensor | None,
                 **kwargs: Any) -> Decomposition:
        n_heads = probs.shape[1]
        width, d = output_weight.shape
        per_head = output_weight.reshape(n_heads, width // n_heads, d)
        r = self.directions.shape[0]
        folded = torch.einsum("hed,rd->her", per_head, self.directions.to(output_weight.dtype))
        extra = torch.zeros(n_heads, width // n_heads, r, n_heads, dtype=output_weight.dtype,
                            device=output_weight.device)
        heads = torch.arange(n_heads, device=output_weight.device)
        extra[heads, :, :, heads] = folded
        wide = torch.cat([output_weight, extra.reshape(width, r * n_heads)], dim=1)
        wide_bias = None if output_bias is None else torch.cat([output_bias, output_bias.new_zeros(r * n_heads)])
        out = self.rule(value_input, probs, value_weight, value_bias, wide, wide_bias, **kwargs)
        part = out.features(slice(d, None)).rows(self.rows).dense()
        batch, a, players, _ = part.terms.shape
        terms = part.terms.reshape(batch, a, players, r, n_heads)
        coefficients = self.coefficients.to(terms.dtype)
        self.contributions = torch.einsum("bapkh,bak->bph", terms, coefficients)
        self.bias = torch.einsum("bakh,bak->bh", part.bias.reshape(batch, a, r, n_heads), coefficients)
        return out.features(slice(0, d))


def head_read_outs(block: Block, z: Tensor, covector: Tensor, rules: Mapping[str, Callable], spec: Any,
                   n_heads: int) -> list[Tensor]:
    """Each head's direct read-out ``Σ_i ⟨z_h[i] W_O^h, g_i⟩`` (``z`` the output projection's
    input, ``g`` the covector before any attention post-norm), ``(B,)`` each, with its graph
    (the backward route's per-head read-outs)."""
    raw, _ = pull_back_norm(block, "attention_post_norm", rules, covector)
    weight = block.projection(spec.attention_output)[0].to(z.dtype)  # (H·e, d)
    z = z.reshape(raw.shape[0], -1, z.shape[-1]) if z.dim() == 2 else z
    per_head = z.reshape(*z.shape[:2], n_heads, -1)  # (B, n, H, e)
    w_o = weight.reshape(n_heads, -1, weight.shape[-1])  # (H, e, d)
    folded = torch.einsum("hed,bid->bihe", w_o, raw.to(z.dtype))
    return list(torch.einsum("bihe,bihe->hb", per_head, folded).unbind(0))


# --------------------------------------------------------------------------- propagation
@dataclass
class ComponentSums:
    """Direct effects per component, in the order the stream meets them.

    Attributes:
        contributions (dict): component → ``(B, P)`` per player.
        bias (dict): component → ``(B,)`` owed to no player.
    """

    contributions: dict[str, Tensor] = field(default_factory=dict)
    bias: dict[str, Tensor] = field(default_factory=dict)

    def add(self, name: str, contributions: Tensor | None, bias: Tensor) -> None:
        """Add to a component (``contributions=None``: a bias alone)."""
        if name not in self.bias:
            self.bias[name] = torch.zeros_like(bias)
            self.contributions[name] = None  # type: ignore[assignment]
        self.bias[name] = self.bias[name] + bias
        if contributions is not None:
            previous = self.contributions[name]
            self.contributions[name] = contributions if previous is None else previous + contributions

    def add_read(self, name: str, decomposition: Decomposition, covector: Tensor) -> None:
        """Add the direct effect of a writer's rows through their covector rows."""
        contributions, bias = read(decomposition, covector)
        self.add(name, contributions, bias)


def propagate_components(
    blocks: Sequence[Block],
    chain: Chain,
    rules: Mapping[str, Callable],
    start: Decomposition,
    paths: DirectPaths,
    granularity: str,
    budget: int,
    progress: Any = None,
    prepare: Callable[[Block], Block] | None = None,
) -> tuple[ComponentSums, Decomposition]:
    """The forward route from ``start`` through every block, reading each writer through its
    direct path as it passes (``granularity`` checked by the caller). Returns the direct
    effects (in stream order) and the last block's output decomposition."""
    writers = {step.name: step.source for step in chain.stream if step.kind == "write"}
    if not {"attention", "ff"} <= set(writers) <= {"attention", "cross_attention", "ff"}:
        raise ValueError(f"component attributions read an attention, an FF and (decoders of "
                         f"encoder–decoders) a cross-attention writer; the {chain.name!r} stream has "
                         f"{', '.join(writers) or 'none'}")
    sums = ComponentSums()
    sums.add_read(EMBEDDINGS, start, paths.embeddings)
    current = start
    for index, block in enumerate(blocks):
        if prepare is not None:
            block = prepare(block)
        found, current = _read_block(block, index, chain, rules, current, paths, granularity,
                                     budget, writers)
        settle_block(sums, found, index, chain, paths, granularity, block.is_moe)
        if progress is not None:
            progress.update(1)
    sums.add(HEAD, None, paths.constants[HEAD])
    return sums, current


def _read_block(block: Block, index: int, chain: Chain, rules: Mapping[str, Callable],
                start: Decomposition, paths: DirectPaths, granularity: str, budget: int,
                writers: dict[str, str]) -> tuple[ComponentSums, Decomposition]:
    """One block: its writers read through their covectors (``"attention"``, ``"ff"``, a
    decoder's ``"cross_attention"`` and, per head, ``"attention.head.<h>"``,
    ``"cross_attention.head.<h>"``, ``"ff.expert.<e>"``), and its output decomposition."""
    attention_g, ff_g = paths.writers[(index, "attention")], paths.writers[(index, "ff")]
    cross_g = paths.writers.get((index, "cross_attention"))
    found = ComponentSums()
    block_rules = dict(rules)
    splits: dict[str, HeadSplit] = {}
    if granularity == "head":
        raw, _ = pull_back_norm(block, "attention_post_norm", rules, attention_g)
        splits["attention"] = block_rules["attention"] = HeadSplit(rules["attention"], raw)
        if cross_g is not None:
            splits["cross_attention"] = block_rules[CROSS_WRITER] = HeadSplit(rules["attention"], cross_g)
    state = chain.mix(block, block_rules, start)
    for writer, split in splits.items():
        for head in range(split.contributions.shape[-1]):
            found.add(f"{writer}.head.{head}", split.contributions[..., head], split.bias[..., head])
    if granularity == "head" and block.is_moe:
        ff_raw, _ = pull_back_norm(block, "ff_post_norm", rules, ff_g)
        zero = ff_g.new_zeros(ff_g.shape[0])
        for expert in range(block.router_weights().shape[-1]):  # every expert, routed to or not
            found.add(f"ff.expert.{expert}", None, zero)

        def observe(part: str, rows: slice, decomposition: Decomposition) -> None:
            found.add_read(f"ff.{part}", decomposition, ff_raw[:, rows])

        state[EXPERT_OBSERVER] = observe
    parts = []
    for rows in row_chunks(block, None, budget, start.n_in):
        for scope, decomposition in chain.local(block, state, rows, block_rules):
            if scope == writers["ff"]:
                found.add_read("ff", decomposition, ff_g[:, rows])
            if scope == chain.output_scope:
                parts.append(decomposition.dense())
                break
        found.add_read("attention", state[writers["attention"]].rows(rows), attention_g[:, rows])
        if cross_g is not None:
            found.add_read("cross_attention", state[writers["cross_attention"]].rows(rows), cross_g[:, rows])
    return found, stack_rows(parts)


def settle_block(sums: ComponentSums, found: ComponentSums, index: int, chain: Chain,
                  paths: DirectPaths, granularity: str, moe: bool) -> None:
    """A block's direct effects into ``sums`` at the granularity asked, in stream order."""
    block = block_id(index)
    for step in chain.stream:
        if step.kind == "norm":
            name = block if granularity == "block" else norm_id(index, step.name)
            sums.add(name, None, paths.constants[norm_id(index, step.name)])
            continue
        writer = step.name
        contributions, bias = found.contributions[writer], found.bias[writer]
        if granularity == "block":
            sums.add(block, contributions, bias)
            continue
        split = granularity == "head" and (writer in ("attention", "cross_attention") or moe)
        if not split:
            sums.add(writer_id(index, writer), contributions, bias)
            continue
        parts = [key for key in found.bias if key.startswith(writer + ".")]
        for key in parts:
            sums.add(f"{block}.{key}", found.contributions[key], found.bias[key])
        # what the parts leave of the writer's bias: an output bias, a post-norm's β
        sums.add(writer_bias_id(index, writer), None, bias - sum(found.bias[key] for key in parts))


def component_names(sums: ComponentSums) -> list[str]:
    """The components in stream order."""
    return list(sums.bias)


def stacked(sums: ComponentSums, n_players: int, like: Tensor) -> tuple[list[str], Tensor, Tensor]:
    """``(names, contributions (B, P, C), bias (B, C))``; a bias-only component's
    contributions are zeros."""
    names = component_names(sums)
    batch = like.shape[0]
    columns = []
    for key in names:
        value = sums.contributions[key]
        columns.append(like.new_zeros(batch, n_players) if value is None else value)
    return names, torch.stack(columns, dim=-1), torch.stack([sums.bias[k] for k in names], dim=-1)


def iter_groups(players: Sequence[int], size: int) -> Iterator[list[int]]:
    """``players`` in groups of ``size``."""
    for first in range(0, len(players), size):
        yield list(players[first:first + size])
