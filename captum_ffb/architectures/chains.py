"""The few block chains, written once: they wire rules in the order of one block type.

A chain has two parts. ``mix`` runs the row-mixing steps (attention and everything before
the first element-wise activation) once for all output rows, in compact factored form.
``local`` runs the row-local rest for one chunk of output rows and yields each scope's
decomposition as it passes it, so all scopes come out of one pass and memory is bounded by
the chunk.

Every scope names the real tensor it must reproduce (``references``), which the
attribution uses for its convergence delta.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from captum_ffb import rules
from captum_ffb.architectures.block import Block
from captum_ffb.decomposition import Decomposition

State = dict[str, Any]
Rows = slice


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
        references (dict): scope → ``(role, "input" | "output")`` of the real tensor it
                    reproduces; the role ``"block"`` means the block's own output.
        mix (Callable): ``(block, options) → state``, all rows.
        local (Callable): ``(block, state, rows, options) → iterator of (scope, decomposition)``.
        ff_pair (tuple[str, str]): the scopes just before and just after the FF block.
        description (str): one line for the docs.
    """

    name: str
    scopes: tuple[str, ...]
    references: dict[str, tuple[str, str]]
    mix: Callable[[Block, ChainOptions], State]
    local: Callable[[Block, State, Rows, ChainOptions], Iterator[tuple[str, Decomposition]]]
    ff_pair: tuple[str, str]
    description: str = ""


# --------------------------------------------------------------------------- shared steps
def _norm(block: Block, role: str, decomposition: Decomposition, rows: Rows = slice(None)) -> Decomposition:
    """The spec's norm (LayerNorm or RMSNorm), scaled by the real input of those rows."""
    weight, bias, eps = block.norm_parameters(role)
    real = block.real(role, "input")[:, rows]
    if block.spec.norm == "rms_norm":
        return rules.rms_norm(decomposition, real, weight, eps)
    return rules.layer_norm(decomposition, real, weight, bias, eps)


def _attention(block: Block, value_input: Decomposition) -> Decomposition:
    return rules.attention(value_input, block.probs, *block.attention_weights())


def _ff_projections(block: Block, ff_input: Decomposition) -> State:
    """The FF input projections, applied while the decomposition is still compact."""
    state: State = {"up": rules.linear(ff_input, *block.projection(block.spec.ff_in))}
    if block.spec.ff_gate is not None:
        state["gate"] = rules.linear(ff_input, *block.projection(block.spec.ff_gate))
    return state


def _ff_rest(block: Block, projected: State, rows: Rows, options: ChainOptions) -> Decomposition:
    """Activation and output projection of the FF for one chunk of rows."""
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
        )
    return rules.linear(hidden, *block.projection(spec.ff_out))


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
        "Atb": ("norm1", "output"),
        "AtbFf": ("ff_out", "output"),
        "AtbFfRes": ("norm2", "input"),
        "AtbFfResLn": ("block", "output"),
    },
    mix=_post_ln_mix,
    local=_post_ln_local,
    ff_pair=("Atb", "AtbFf"),
    description="LN2(x' + FF(x')), x' = LN1(x + ATTN(x)) (BERT)",
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
        "Atb": ("norm2", "input"),
        "AtbLn": ("norm2", "output"),
        "AtbLnFf": ("ff_out", "output"),
        "AtbLnFfRes": ("block", "output"),
    },
    mix=_pre_ln_mix,
    local=_pre_ln_local,
    ff_pair=("AtbLn", "AtbLnFf"),
    description="h + FF(LN2(h)), h = x + ATTN(LN1(x)) (GPT-2, Llama)",
)


CHAINS: dict[str, Chain] = {chain.name: chain for chain in (POST_LN, PRE_LN)}


def get_chain(name: str) -> Chain:
    """The chain called ``name``."""
    if name not in CHAINS:
        raise ValueError(f"unknown chain {name!r}; known: {', '.join(sorted(CHAINS))}")
    return CHAINS[name]
