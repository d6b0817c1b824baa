"""The few block chains, written once: they wire rules in the order of one block type.

A chain has two parts. ``mix`` runs the row-mixing steps (attention and everything before
the first element-wise activation) once for all output rows, in compact factored form.
``local`` runs the row-local rest for one chunk of output rows and yields each scope's
decomposition as it passes it, so all scopes come out of one pass and memory is bounded by
the chunk.

Every scope names the real tensors it must reproduce (``references``), which the
attribution uses for its convergence delta.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from captum_ffb import rules
from captum_ffb.architectures.block import Block, resolve
from captum_ffb.decomposition import Decomposition

State = dict[str, Any]
Rows = slice
#: A real tensor: ``(role, "input" | "output")``; the role ``"block"`` is the block itself,
#: ``"ff"`` the whole FF branch, ``"attn_out"`` the attention output projection.
Source = tuple[str, str]


@dataclass(frozen=True)
class ChainOptions:
    """How the activation is decomposed (see :func:`captum_ffb.rules.activation`)."""

    activation_route: str = "closed_form"
    method: str = "gausslegendre"
    n_steps: int = 50
    gate_points: int = 32


@dataclass(frozen=True)
class Chain:
    """A block type: its scopes in order, their reference tensors, and the two passes.

    Attributes:
        name (str): the chain's name in the registry (``"post_ln"``, ...).
        scopes (tuple[str, ...]): scope names, in the order the chain passes them.
        references (dict): scope → the real tensors whose sum it reproduces.
        mix (Callable): ``(block, options) → state``, all rows.
        local (Callable): ``(block, state, rows, options) → iterator of (scope, decomposition)``.
        ff_pair (tuple[str, str]): the scopes just before and just after the FF block.
        description (str): one line for the docs.
    """

    name: str
    scopes: tuple[str, ...]
    references: dict[str, tuple[Source, ...]]
    mix: Callable[[Block, ChainOptions], State]
    local: Callable[[Block, State, Rows, ChainOptions], Iterator[tuple[str, Decomposition]]]
    ff_pair: tuple[str, str]
    description: str = ""


# --------------------------------------------------------------------------- shared steps
def _norm(block: Block, role: str, decomposition: Decomposition, rows: Rows = slice(None)) -> Decomposition:
    """The norm playing ``role`` (LayerNorm or RMSNorm), scaled by its real input rows."""
    weight, bias, eps = block.norm_parameters(role)
    real = block.real(role, "input")[:, rows]
    if block.spec.norm == "rms_norm":
        return rules.rms_norm(decomposition, real, weight, eps)
    return rules.layer_norm(decomposition, real, weight, bias, eps)


def _post_norm(block: Block, role: str, decomposition: Decomposition, rows: Rows = slice(None)) -> Decomposition:
    """An optional norm of the spec (``attention_post_norm``, ``ff_post_norm``)."""
    if getattr(block.spec, role) is None:
        return decomposition
    return _norm(block, role, decomposition, rows)


def _attention(block: Block, value_input: Decomposition) -> Decomposition:
    out = rules.attention(value_input, block.probs, *block.attention_weights())
    return _post_norm(block, "attention_post_norm", out)


def _ff_projections(block: Block, ff_input: Decomposition) -> State:
    """The FF input projections, applied while the decomposition is still compact."""
    if block.is_moe:
        # experts project it chunk by chunk; routing weights are read once for all rows
        return {"ff_input": ff_input, "routing": block.router_weights()}
    state: State = {"up": rules.linear(ff_input, *block.projection(block.spec.ff_in))}
    if block.spec.ff_gate is not None:
        state["gate"] = rules.linear(ff_input, *block.projection(block.spec.ff_gate))
    return state


def _dense_ff_rest(block: Block, projected: State, rows: Rows, options: ChainOptions) -> Decomposition:
    spec = block.spec
    fn = block.activation_fn()
    up = projected["up"].rows(rows)
    if spec.ff_gate is None:
        hidden = rules.activation(
            up,
            fn,
            pre_activation=block.real("ff_in")[:, rows],
            route=options.activation_route,
            method=options.method,
            n_steps=options.n_steps,
        )
    else:
        hidden = rules.gated_activation(
            projected["gate"].rows(rows),
            up,
            fn,
            real_gate=block.real("ff_gate")[:, rows],
            real_up=block.real("ff_in")[:, rows],
            n_points=options.gate_points,
            route=options.activation_route,
            method=options.method,
            n_steps=options.n_steps,
        )
    return rules.linear(hidden, *block.projection(spec.ff_out))


def _gated_mlp(ff_input: Decomposition, w_gate, w_up, w_down, fn, options: ChainOptions) -> Decomposition:
    hidden = rules.gated_activation(
        rules.linear(ff_input, w_gate),
        rules.linear(ff_input, w_up),
        fn,
        n_points=options.gate_points,
        route=options.activation_route,
        method=options.method,
        n_steps=options.n_steps,
    )
    return rules.linear(hidden, w_down)


def _moe_rest(block: Block, projected: State, rows: Rows, options: ChainOptions) -> Decomposition:
    """Σ_e w_e(i) · expert_e(z)_i with the routing weights ``w`` of the real forward pass."""
    moe = block.spec.moe
    ff_input = projected["ff_input"].rows(rows)
    weights = projected["routing"][:, rows]
    fn = block.expert_activation()
    out: Decomposition | None = None
    for expert in range(weights.shape[-1]):
        share = weights[..., expert]
        if not bool((share != 0).any()):
            continue
        w_gate, w_up, w_down = block.expert_weights(expert)
        part = _gated_mlp(ff_input, w_gate, w_up, w_down, fn, options).scale_rows(share)
        out = part if out is None else out + part
    if moe.shared_expert is not None:
        shared = resolve(block.module, moe.shared_expert)
        w = [block.cast(getattr(shared, name).weight.t()) for name in ("gate_proj", "up_proj", "down_proj")]
        part = _gated_mlp(ff_input, *w, shared.act_fn, options)
        gate = block.real("shared_expert_gate")[:, rows].sigmoid()
        part = part.scale_rows(gate[..., 0])
        out = part if out is None else out + part
    return out


def _ff_rest(block: Block, projected: State, rows: Rows, options: ChainOptions) -> Decomposition:
    """Activation and output projection of the FF (and its post-norm) for a chunk of rows."""
    rest = _moe_rest if block.is_moe else _dense_ff_rest
    return _post_norm(block, "ff_post_norm", rest(block, projected, rows, options), rows)


# --------------------------------------------------------------------------- Post-LN
def _post_ln_mix(block: Block, options: ChainOptions) -> State:
    x = Decomposition.identity(block.inputs, block.token_mask)
    atb = _norm(block, "norm1", rules.residual(_attention(block, x), x))
    return {"Atb": atb, **_ff_projections(block, atb)}


def _post_ln_local(block: Block, state: State, rows: Rows, options: ChainOptions):
    atb = state["Atb"].rows(rows).dense()
    yield "Atb", atb
    ff = _ff_rest(block, state, rows, options)
    yield "AtbFf", ff
    res = rules.residual(ff, atb)
    yield "AtbFfRes", res
    yield "AtbFfResLn", _norm(block, "norm2", res, rows)


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
)


# --------------------------------------------------------------------------- Pre-LN
def _pre_ln_mix(block: Block, options: ChainOptions) -> State:
    x = Decomposition.identity(block.inputs, block.token_mask)
    atb = rules.residual(_attention(block, _norm(block, "norm1", x)), x)
    ln = _norm(block, "norm2", atb)
    return {"Atb": atb, "AtbLn": ln, **_ff_projections(block, ln)}


def _pre_ln_local(block: Block, state: State, rows: Rows, options: ChainOptions):
    atb = state["Atb"].rows(rows).dense()
    yield "Atb", atb
    yield "AtbLn", state["AtbLn"].rows(rows).dense()
    ff = _ff_rest(block, state, rows, options)
    yield "AtbLnFf", ff
    yield "AtbLnFfRes", rules.residual(ff, atb)


PRE_LN = Chain(
    name="pre_ln",
    scopes=("Atb", "AtbLn", "AtbLnFf", "AtbLnFfRes"),
    references={
        "Atb": (("norm2", "input"),),
        "AtbLn": (("norm2", "output"),),
        "AtbLnFf": (("ff", "output"),),
        "AtbLnFfRes": (("block", "output"),),
    },
    mix=_pre_ln_mix,
    local=_pre_ln_local,
    ff_pair=("AtbLn", "AtbLnFf"),
    description="y = h + FF(LN2(h)), h = x + ATTN(LN1(x))",
)


# --------------------------------------------------------------------------- parallel
def _parallel_mix(block: Block, options: ChainOptions) -> State:
    x = Decomposition.identity(block.inputs, block.token_mask)
    atb = rules.residual(_attention(block, _norm(block, "norm1", x)), x)
    # The FF reads LN2(x) token by token: its whole branch stays token-wise (diagonal).
    ff = _ff_rest(block, _ff_projections(block, _norm(block, "norm2", x)), slice(None), options)
    return {"Atb": atb, "LnFf": ff}


def _parallel_local(block: Block, state: State, rows: Rows, options: ChainOptions):
    atb = state["Atb"].rows(rows).dense()
    yield "Atb", atb
    ff = state["LnFf"].rows(rows).dense()
    yield "LnFf", ff
    yield "AtbLnFfRes", rules.residual(ff, atb)


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
)


CHAINS: dict[str, Chain] = {chain.name: chain for chain in (POST_LN, PRE_LN, PARALLEL)}


def get_chain(name: str) -> Chain:
    """The chain called ``name``."""
    if name not in CHAINS:
        raise ValueError(f"unknown chain {name!r}; known: {', '.join(sorted(CHAINS))}")
    return CHAINS[name]

