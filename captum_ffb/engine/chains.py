"""The block chains, written once: they wire rules, by role, in the order of one block type.

A chain has two parts. ``mix`` runs the row-mixing steps (attention and everything before
the first element-wise activation) once for all output rows, in compact factored form when
the block's input decomposition is the identity. ``local`` runs the row-local rest for one
chunk of output rows and yields each scope's decomposition as it passes it, so all scopes
come out of one pass and memory is bounded by the chunk.

A chain starts from any decomposition of the block's input (over the tokens, or over any
players, e.g. the first block's tokens when blocks are chained into a whole model); the
identity is the default. Every scope names the real tensors it must reproduce
(``references``), which the attributions use for their convergence delta.

New block types are registered with :func:`captum_ffb.register_chain`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from captum_ffb.architectures.registry import check_chain_names, register_chain
from captum_ffb.architectures.spec import ArchitectureSpec
from captum_ffb.core.decomposition import (
    Decomposition,
    FactoredDecomposition,
    TokenwiseDecomposition,
)
from captum_ffb.engine.block import Block, Source

State = dict[str, Any]
Rows = slice
#: role → rule (see :data:`captum_ffb.rules.ROLES`).
Rules = Mapping[str, Callable]
#: The scope a Pre-LN chain adds on request: the norm that reads the block's output (the
#: next block's first norm, or the model's final norm) applied to it (the paper's
#: "FF, then RES, then LN" comparison for Pre-LN models).
NEXT_NORM_SCOPE = "AtbLnFfResLn"
#: The state entry every built-in ``mix`` keeps the attention sublayer's output in (the
#: attention writer of the residual stream, before the residual connection).
ATTENTION_WRITER = "attention"
#: The state entry where a caller may put an observer of the experts' parts (see ``_moe_rest``).
EXPERT_OBSERVER = "observe_expert"


@dataclass(frozen=True)
class StreamStep:
    """One step of a block's residual stream, in order (for direct effects).

    Attributes:
        kind (str): ``"write"``: a sublayer adds its output to the stream; ``"norm"``: the
                    stream passes through a norm.
        name (str): the writer (``"attention"``, ``"ff"``) or the norm's role (``"norm1"``).
        source (str): for a writer, the state entry of ``mix`` or the scope of ``local`` that
                    holds its decomposition.
    """

    kind: str
    name: str
    source: str = ""


@dataclass(frozen=True)
class Chain:
    """A block type: its scopes in order, their reference tensors, the roles it calls, and
    the two passes.

    Attributes:
        name (str): the chain's name in the registry (``"post_ln"``, ...).
        scopes (tuple[str, ...]): scope names, in the order the chain passes them; the last
                    is the block's output.
        references (dict): scope → the real tensors whose sum it reproduces.
        mix (Callable): ``(block, rules, start) → state``, all rows; ``start`` is the
                    decomposition of the block's input.
        local (Callable): ``(block, state, rows, rules) → iterator of (scope, decomposition)``.
        ff_pair (tuple[str, str]): the scopes just before and just after the FF block.
        roles (Callable): ``spec → set of roles`` the chain calls for that family.
        extra_scopes (tuple[str, ...]): scopes computed only when asked for, after the
                    others (``NEXT_NORM_SCOPE``).
        description (str): one line for the docs.
        stream (tuple[StreamStep, ...]): the block's residual stream: which sublayers write
                    to it and which norms it passes, in order (empty: no direct effects for
                    this block type; see ``NormDecomposition.attribute_components()``).

    Examples::

        >>> from captum_ffb import register_chain
        >>> from captum_ffb.engine import Chain, chains
        >>> def mix(block, rules, start):                 # x + ATTN(x), then LN1
        ...     x = chains.start_of(block, start)
        ...     out = rules["residual"](chains.attention(block, rules, x), x)
        ...     return {"Atb": chains.norm(block, "norm1", rules, out)}
        >>> def local(block, state, rows, rules):
        ...     yield "Atb", state["Atb"].rows(rows).dense()
        >>> register_chain("atb_only", Chain(
        ...     name="atb_only", scopes=("Atb",), references={"Atb": (("norm1", "output"),)},
        ...     mix=mix, local=local, ff_pair=("Atb", "Atb"),
        ...     roles=lambda spec: frozenset({"attention", "residual", "norm"})))
    """

    name: str
    scopes: tuple[str, ...]
    references: dict[str, tuple[Source, ...]]
    mix: Callable[[Block, Rules, Decomposition], State]
    local: Callable[[Block, State, Rows, Rules], Iterator[tuple[str, Decomposition]]]
    ff_pair: tuple[str, str]
    roles: Callable[[ArchitectureSpec], frozenset[str]] = field(default=lambda spec: _roles(spec))
    extra_scopes: tuple[str, ...] = ()
    description: str = ""
    stream: tuple[StreamStep, ...] = ()

    @property
    def all_scopes(self) -> tuple[str, ...]:
        """The scopes, then the extra scopes, in the order the chain yields them."""
        return self.scopes + self.extra_scopes

    @property
    def output_scope(self) -> str:
        """The scope that is the whole block's output."""
        return self.scopes[-1]

    def check_scopes(self, names: Sequence[str]) -> None:
        """A one-line ``ValueError`` naming the first of ``names`` that is none of this chain's
        scopes (:attr:`all_scopes`)."""
        unknown = [name for name in names if name not in self.all_scopes]
        if unknown:
            raise ValueError(
                f"unknown scope {unknown[0]!r} for a {self.name} model; choose from "
                f"{', '.join(self.all_scopes)}"
            )


def _roles(spec: ArchitectureSpec) -> frozenset[str]:
    """The roles a chain of the built-in kind calls for a family: attention, residual,
    linear and norm always; the activation role its FF needs."""
    roles = {"attention", "residual", "linear", "norm"}
    if spec.moe is not None or spec.ff_gate is not None:
        roles.add("gated_activation")
    if spec.ff_in is not None and spec.ff_gate is None:
        roles.add("activation")
    return frozenset(roles)


# --------------------------------------------------------------------------- shared steps
def start_of(block: Block, start: Decomposition | None) -> Decomposition:
    """The decomposition of the block's input: ``start``, or the identity over its tokens."""
    if start is None:
        return Decomposition.identity(block.inputs, block.token_mask)
    if start.n_out != block.inputs.shape[1] or start.dim != block.inputs.shape[2]:
        raise ValueError(
            f"the input decomposition has {start.n_out} rows of width {start.dim}; the block's "
            f"input is {tuple(block.inputs.shape[1:])}"
        )
    return start


def joined(block: Block, rules: Rules, branch: Decomposition, skip: Decomposition) -> Decomposition:
    """The residual stream after ``branch`` joins ``skip``, the branch scaled by the family's
    :attr:`~captum_ffb.architectures.spec.ArchitectureSpec.residual_scale` when it has one."""
    scale = block.residual_scale
    if scale is not None:
        branch = branch.scale_features(branch.bias.new_full((branch.dim,), scale))
    return rules["residual"](branch, skip)


def norm(block: Block, role: str, rules: Rules, decomposition: Decomposition, rows: Rows = slice(None)) -> Decomposition:
    """The norm playing ``role``, scaled by its real input rows; unchanged when the family
    has no norm in that role (OLMo 2 has no pre-norms)."""
    if role != "next_norm" and not block.has(role):
        return decomposition
    weight, bias, eps = block.norm_parameters(role)
    real = block.real(role, "input")[:, rows]
    return rules["norm"](decomposition, real, weight, bias, eps)


def attention(block: Block, rules: Rules, value_input: Decomposition) -> Decomposition:
    """Self-attention, then its post-norm when the family has one. Rules that credit the
    scores (``credits_scores``) also get the query/key path (``scores=``)."""
    rule = rules["attention"]
    if getattr(rule, "credits_scores", False):
        from captum_ffb.engine.score_path import score_path

        out = rule(value_input, block.probs, *block.attention_weights(), scores=score_path(block))
    else:
        out = rule(value_input, block.probs, *block.attention_weights())
    return norm(block, "attention_post_norm", rules, out)


def _compact(decomposition: Decomposition) -> bool:
    return isinstance(decomposition, (TokenwiseDecomposition, FactoredDecomposition))


def ff_projections(block: Block, rules: Rules, ff_input: Decomposition) -> State:
    """The FF input projections, applied now while the decomposition is compact (identity
    start); for a dense input they are applied chunk by chunk in :func:`ff_rest`."""
    if block.is_moe:
        # experts project it chunk by chunk; routing weights are read once for all rows
        return {"ff_input": ff_input, "routing": block.router_weights()}
    if not _compact(ff_input):
        return {"ff_input": ff_input}
    state: State = {"up": rules["linear"](ff_input, *block.projection(block.spec.ff_in))}
    if block.spec.ff_gate is not None:
        state["gate"] = rules["linear"](ff_input, *block.projection(block.spec.ff_gate))
    return state


def _projected(block: Block, rules: Rules, projected: State, key: str, rows: Rows) -> Decomposition:
    if key in projected:
        return projected[key].rows(rows)
    projection = block.spec.ff_in if key == "up" else block.spec.ff_gate
    return rules["linear"](projected["ff_input"].rows(rows), *block.projection(projection))


def _dense_ff_rest(block: Block, rules: Rules, projected: State, rows: Rows) -> Decomposition:
    spec = block.spec
    fn = block.activation_fn()
    up = _projected(block, rules, projected, "up", rows)
    real_up = block.projection_output("ff_in", spec.ff_in)[:, rows]
    if spec.ff_gate is None:
        hidden = rules["activation"](up, fn, real_up)
    else:
        gate = _projected(block, rules, projected, "gate", rows)
        real_gate = block.projection_output("ff_gate", spec.ff_gate)[:, rows]
        hidden = rules["gated_activation"](gate, up, fn, real_gate, real_up)
    return rules["linear"](hidden, *block.projection(spec.ff_out))


def _gated_mlp(rules: Rules, ff_input: Decomposition, real_input: Tensor, w_gate, w_up, w_down, fn
               ) -> Decomposition:
    gate = rules["linear"](ff_input, w_gate)
    up = rules["linear"](ff_input, w_up)
    real_gate = real_input @ w_gate  # the expert's real pre-activations (whatever the players)
    real_up = real_input @ w_up
    return rules["linear"](rules["gated_activation"](gate, up, fn, real_gate, real_up), w_down)


def _moe_rest(block: Block, rules: Rules, projected: State, rows: Rows) -> Decomposition:
    """Σ_e w_e(i) · expert_e(z)_i with the routing weights ``w`` of the real forward pass.
    A callable in the state under :data:`EXPERT_OBSERVER` sees each expert's part
    ``(name, rows, part)`` (``"expert.<e>"``, ``"shared_expert"``) before they are summed."""
    observe = projected.get(EXPERT_OBSERVER)
    ff_input = projected["ff_input"].rows(rows)
    weights = projected["routing"][:, rows]
    fn = block.expert_activation()
    real_input = block.real("router", "input")[:, rows].to(ff_input.bias.dtype)  # the FF's real input
    out: Decomposition | None = None
    for expert in range(weights.shape[-1]):
        share = weights[..., expert]
        if not bool((share != 0).any()):
            continue
        part = _gated_mlp(rules, ff_input, real_input, *block.expert_weights(expert), fn).scale_rows(share)
        if observe is not None:
            observe(f"expert.{expert}", rows, part)
        out = part if out is None else out + part
    shared = block.shared_expert()
    if shared is not None:
        weights_shared, shared_fn = shared
        part = _gated_mlp(rules, ff_input, real_input, *weights_shared, shared_fn)
        gate = block.real("shared_expert_gate")[:, rows].sigmoid()
        part = part.scale_rows(gate[..., 0])
        if observe is not None:
            observe("shared_expert", rows, part)
        out = part if out is None else out + part
    return out


def ff_rest(block: Block, rules: Rules, projected: State, rows: Rows) -> Decomposition:
    """Activation and output projection of the FF (and its post-norm) for a chunk of rows."""
    rest = _moe_rest if block.is_moe else _dense_ff_rest
    return norm(block, "ff_post_norm", rules, rest(block, rules, projected, rows), rows)


# --------------------------------------------------------------------------- Post-LN
def _post_ln_mix(block: Block, rules: Rules, start: Decomposition | None) -> State:
    x = start_of(block, start)
    attn = attention(block, rules, x)
    atb = norm(block, "norm1", rules, joined(block, rules, attn, x))
    return {"Atb": atb, ATTENTION_WRITER: attn, **ff_projections(block, rules, atb)}


def _post_ln_local(block: Block, state: State, rows: Rows, rules: Rules):
    atb = state["Atb"].rows(rows).dense()
    yield "Atb", atb
    ff = ff_rest(block, rules, state, rows)
    yield "AtbFf", ff
    res = joined(block, rules, ff, atb)
    yield "AtbFfRes", res
    yield "AtbFfResLn", norm(block, "norm2", rules, res, rows)


#: The Post-LN block of BERT and its family, ``y = LN2(z + FF(z))`` with ``z = LN1(x + ATTN(x))``.
POST_LN = Chain(
    name="post_ln",
    scopes=("Atb", "AtbFf", "AtbFfRes", "AtbFfResLn"),
    references={
        "Atb": (("norm1", "output"),),
        "AtbFf": (("ff", "output"),),
        "AtbFfRes": (("norm2", "input"),),
        "AtbFfResLn": (("block", "output"),),
    },
    mix=_post_ln_mix,
    local=_post_ln_local,
    ff_pair=("Atb", "AtbFf"),
    description="y = LN2(z + FF(z)), z = LN1(x + ATTN(x))",
    stream=(StreamStep("write", "attention", ATTENTION_WRITER), StreamStep("norm", "norm1"),
            StreamStep("write", "ff", "AtbFf"), StreamStep("norm", "norm2")),
)


# --------------------------------------------------------------------------- Pre-LN
def _pre_ln_mix(block: Block, rules: Rules, start: Decomposition | None) -> State:
    x = start_of(block, start)
    attn = attention(block, rules, norm(block, "norm1", rules, x))
    atb = joined(block, rules, attn, x)
    ln = norm(block, "norm2", rules, atb)
    return {"Atb": atb, "AtbLn": ln, ATTENTION_WRITER: attn, **ff_projections(block, rules, ln)}


def _pre_ln_local(block: Block, state: State, rows: Rows, rules: Rules):
    atb = state["Atb"].rows(rows).dense()
    yield "Atb", atb
    yield "AtbLn", state["AtbLn"].rows(rows).dense()
    ff = ff_rest(block, rules, state, rows)
    yield "AtbLnFf", ff
    out = joined(block, rules, ff, atb)
    yield "AtbLnFfRes", out
    if block.next_norm is not None:
        yield NEXT_NORM_SCOPE, norm(block, "next_norm", rules, out, rows)


#: The Pre-LN block of GPT-2, Llama and most decoders, ``y = h + FF(LN2(h))`` with ``h = x + ATTN(LN1(x))``.
PRE_LN = Chain(
    name="pre_ln",
    scopes=("Atb", "AtbLn", "AtbLnFf", "AtbLnFfRes"),
    references={
        "Atb": (("norm2", "input"),),
        "AtbLn": (("norm2", "output"),),
        "AtbLnFf": (("ff", "output"),),
        "AtbLnFfRes": (("block", "output"),),
        NEXT_NORM_SCOPE: (("next_norm", "output"),),
    },
    mix=_pre_ln_mix,
    local=_pre_ln_local,
    ff_pair=("AtbLn", "AtbLnFf"),
    extra_scopes=(NEXT_NORM_SCOPE,),
    description="y = h + FF(LN2(h)), h = x + ATTN(LN1(x))",
    stream=(StreamStep("write", "attention", ATTENTION_WRITER), StreamStep("write", "ff", "AtbLnFf")),
)


# --------------------------------------------------------------------------- parallel
def _parallel_mix(block: Block, rules: Rules, start: Decomposition | None) -> State:
    x = start_of(block, start)
    attn = attention(block, rules, norm(block, "norm1", rules, x))
    atb = joined(block, rules, attn, x)
    ff_input = norm(block, "norm2", rules, x)
    if _compact(ff_input):
        # The FF reads LN2(x) token by token: its whole branch stays token-wise (diagonal).
        ff = ff_rest(block, rules, ff_projections(block, rules, ff_input), slice(None))
        return {"Atb": atb, "LnFf": ff, ATTENTION_WRITER: attn}
    return {"Atb": atb, "ff_input": ff_input, ATTENTION_WRITER: attn}


def _parallel_local(block: Block, state: State, rows: Rows, rules: Rules):
    atb = state["Atb"].rows(rows).dense()
    yield "Atb", atb
    ff = state["LnFf"].rows(rows).dense() if "LnFf" in state else ff_rest(block, rules, state, rows)
    yield "LnFf", ff
    yield "AtbLnFfRes", joined(block, rules, ff, atb)


#: The parallel block of GPT-J, GPT-NeoX and Phi, ``y = x + ATTN(LN1(x)) + FF(LN2(x))``.
PARALLEL = Chain(
    name="parallel",
    scopes=("Atb", "LnFf", "AtbLnFfRes"),
    references={
        "Atb": (("block", "input"), ("attn_out", "output")),
        "LnFf": (("ff", "output"),),
        "AtbLnFfRes": (("block", "output"),),
    },
    mix=_parallel_mix,
    local=_parallel_local,
    ff_pair=("Atb", "AtbLnFfRes"),
    description="y = x + ATTN(LN1(x)) + FF(LN2(x)); the FF branch does not mix tokens",
    stream=(StreamStep("write", "attention", ATTENTION_WRITER), StreamStep("write", "ff", "LnFf")),
)

# --------------------------------------------------------------------------- cross-attention
#: The state entry where the cross-attention chains keep the cross-attention's output.
CROSS_WRITER = "cross_attention"


def _joined_masks(first: Tensor | None, n_first: int, second: Tensor | None, n_second: int,
                  like: Tensor) -> Tensor | None:
    if first is None and second is None:
        return None
    batch = like.shape[0]
    ones = like.new_ones
    first = ones(batch, n_first) if first is None else first.to(like.dtype)
    second = ones(batch, n_second) if second is None else second.to(like.dtype)
    return torch.cat([first, second], dim=1)


def source_of(block: Block) -> Decomposition:
    """The decomposition of the encoder's output the block's cross-attention reads: the
    block's ``source`` when given, else the identity over the encoder's output vectors."""
    if block.source is not None:
        return block.source
    return Decomposition.identity(block.encoder_output, block.source_mask)


def with_source_players(block: Block, decomposition: Decomposition) -> Decomposition:
    """``decomposition`` (over the block's own players) over the players ``[source | own]``,
    the source players owning nothing of it yet; unchanged (dense) when the block's
    ``source`` is given, whose players are then the block's own (a whole model's)."""
    if block.source is not None:
        return decomposition.dense()
    source = source_of(block)
    dense = decomposition.dense()
    terms = dense.terms
    zeros = terms.new_zeros(*terms.shape[:2], source.n_in, terms.shape[-1])
    players = _joined_masks(source.player_mask, source.n_in, dense.player_mask, dense.n_in, terms)
    return Decomposition(torch.cat([zeros, terms], dim=2), dense.bias, dense.token_mask, players)


def cross_attention(block: Block, rules: Rules, target: Decomposition) -> Decomposition:
    r"""The cross-attention's output over the players ``[source | target]`` (over the
    block's own players when its ``source`` is given).

    With the probabilities frozen, the output at target position ``i`` is
    ``Σ_s α_is (e_s W_V) W_O``: it reads the encoder's output ``e`` only, so its terms sit on
    the source players (``target`` gives the rows, mask and number of target players).
    """
    source = source_of(block)
    rule = rules.get(CROSS_WRITER) or rules["attention"]  # a head split of it (components)
    out = rule(source, block.cross_probs, *block.cross_attention_weights()).dense()
    if block.source is not None:  # the source's players are the target's already
        return Decomposition(out.terms, out.bias, target.token_mask, source.player_mask)
    terms = out.terms
    zeros = terms.new_zeros(*terms.shape[:2], target.n_in, terms.shape[-1])
    players = _joined_masks(source.player_mask, source.n_in, target.player_mask, target.n_in, terms)
    return Decomposition(torch.cat([terms, zeros], dim=2), out.bias, target.token_mask, players)


def _post_ln_cross_mix(block: Block, rules: Rules, start: Decomposition | None) -> State:
    x = start_of(block, start)
    attn = attention(block, rules, x)
    atb = with_source_players(block, norm(block, "norm1", rules, joined(block, rules, attn, x)))
    cross = cross_attention(block, rules, x)
    catb = norm(block, "cross_norm", rules, joined(block, rules, cross, atb))
    return {"Atb": atb, "Cross": cross, "AtbCatb": catb, ATTENTION_WRITER: with_source_players(block, attn),
            CROSS_WRITER: cross, **ff_projections(block, rules, catb)}


def _post_ln_cross_local(block: Block, state: State, rows: Rows, rules: Rules):
    yield "Atb", state["Atb"].rows(rows)
    yield "Cross", state["Cross"].rows(rows)
    catb = state["AtbCatb"].rows(rows)
    yield "AtbCatb", catb
    ff = ff_rest(block, rules, state, rows)
    yield "AtbCatbFf", ff
    res = joined(block, rules, ff, catb)
    yield "AtbCatbFfRes", res
    yield "AtbCatbFfResLn", norm(block, "norm2", rules, res, rows)


POST_LN_CROSS = Chain(
    name="post_ln_cross",
    scopes=("Atb", "Cross", "AtbCatb", "AtbCatbFf", "AtbCatbFfRes", "AtbCatbFfResLn"),
    references={
        "Atb": (("norm1", "output"),),
        "Cross": (("cross_out", "output"),),
        "AtbCatb": (("cross_norm", "output"),),
        "AtbCatbFf": (("ff", "output"),),
        "AtbCatbFfRes": (("norm2", "input"),),
        "AtbCatbFfResLn": (("block", "output"),),
    },
    mix=_post_ln_cross_mix,
    local=_post_ln_cross_local,
    ff_pair=("AtbCatb", "AtbCatbFf"),
    description="y = LN3(c + FF(c)), c = LN2(z + CROSS(z, e)), z = LN1(x + ATTN(x))",
    stream=(StreamStep("write", "attention", ATTENTION_WRITER), StreamStep("norm", "norm1"),
            StreamStep("write", "cross_attention", CROSS_WRITER), StreamStep("norm", "cross_norm"),
            StreamStep("write", "ff", "AtbCatbFf"), StreamStep("norm", "norm2")),
)


def _pre_ln_cross_mix(block: Block, rules: Rules, start: Decomposition | None) -> State:
    x = start_of(block, start)
    attn = attention(block, rules, norm(block, "norm1", rules, x))
    atb = with_source_players(block, joined(block, rules, attn, x))
    cross = cross_attention(block, rules, x)
    catb = joined(block, rules, cross, atb)
    ln = norm(block, "norm2", rules, catb)
    return {"Atb": atb, "Cross": cross, "AtbCatb": catb, "AtbCatbLn": ln,
            ATTENTION_WRITER: with_source_players(block, attn), CROSS_WRITER: cross,
            **ff_projections(block, rules, ln)}


def _pre_ln_cross_local(block: Block, state: State, rows: Rows, rules: Rules):
    yield "Atb", state["Atb"].rows(rows)
    yield "Cross", state["Cross"].rows(rows)
    catb = state["AtbCatb"].rows(rows)
    yield "AtbCatb", catb
    yield "AtbCatbLn", state["AtbCatbLn"].rows(rows)
    ff = ff_rest(block, rules, state, rows)
    yield "AtbCatbLnFf", ff
    out = joined(block, rules, ff, catb)
    yield "AtbCatbLnFfRes", out
    if block.next_norm is not None:
        yield CROSS_NEXT_NORM_SCOPE, norm(block, "next_norm", rules, out, rows)


#: The Pre-LN cross-attention chain's scope on request: the norm that reads the block's output.
CROSS_NEXT_NORM_SCOPE = "AtbCatbLnFfResLn"

PRE_LN_CROSS = Chain(
    name="pre_ln_cross",
    scopes=("Atb", "Cross", "AtbCatb", "AtbCatbLn", "AtbCatbLnFf", "AtbCatbLnFfRes"),
    references={
        "Atb": (("cross_norm", "input"),),
        "Cross": (("cross_out", "output"),),
        "AtbCatb": (("norm2", "input"),),
        "AtbCatbLn": (("norm2", "output"),),
        "AtbCatbLnFf": (("ff", "output"),),
        "AtbCatbLnFfRes": (("block", "output"),),
        CROSS_NEXT_NORM_SCOPE: (("next_norm", "output"),),
    },
    mix=_pre_ln_cross_mix,
    local=_pre_ln_cross_local,
    ff_pair=("AtbCatbLn", "AtbCatbLnFf"),
    extra_scopes=(CROSS_NEXT_NORM_SCOPE,),
    description="y = c + FF(LN3(c)), c = h + CROSS(LN2(h), e), h = x + ATTN(LN1(x))",
    stream=(StreamStep("write", "attention", ATTENTION_WRITER),
            StreamStep("write", "cross_attention", CROSS_WRITER), StreamStep("write", "ff", "AtbCatbLnFf")),
)

for _chain in (POST_LN, PRE_LN, PARALLEL, POST_LN_CROSS, PRE_LN_CROSS):
    register_chain(_chain.name, _chain)
check_chain_names()  # the families registered before the chains existed
