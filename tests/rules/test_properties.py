"""Properties every rule must have, on random decompositions (hypothesis).

* completeness: the output decomposition sums to the module applied to the input's total
  (the linearised rule is the exception, and its gap is exactly ``g(S) − S g'(S)``);
* linearity in the players: with the real tensors fixed, the rule maps ``α F₁ + β F₂`` to
  ``α rule(F₁) + β rule(F₂)`` term by term, so players can be split and summed;
* rules that look at all players together (Shapley values) say so.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from transformers.activations import ACT2FN

from captum_ffb import Decomposition
from captum_ffb.rules import (
    Attention,
    GatedIGActivation,
    IGActivation,
    LayerNorm,
    Linear,
    LinearisedActivation,
    LinearisedGatedActivation,
    NoTokenActivation,
    NoTokenGatedActivation,
    Residual,
    RMSNorm,
    ShapleyActivation,
    is_linear_in_players,
)

ACTIVATIONS = [ACT2FN["gelu"], ACT2FN["gelu_new"], nn.SiLU(), nn.ReLU(), torch.tanh]
PROPERTY = settings(max_examples=20, deadline=None)


@st.composite
def shapes(draw):
    return dict(
        batch=draw(st.integers(1, 2)),
        n_out=draw(st.integers(1, 4)),
        n_in=draw(st.integers(1, 4)),
        d=draw(st.integers(2, 6)),
        seed=draw(st.integers(0, 2**16)),
    )


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _dec(g: torch.Generator, batch: int, n_out: int, n_in: int, d: int, scale: float = 1.0) -> Decomposition:
    terms = scale * torch.randn(batch, n_out, n_in, d, generator=g, dtype=torch.float64)
    bias = scale * torch.randn(batch, n_out, d, generator=g, dtype=torch.float64)
    return Decomposition(terms, bias)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-9) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def _check_linear_in_players(apply, g, batch, n_out, n_in, d, inputs: int = 1):
    """``apply(*decs)`` with the real tensors fixed maps the terms of all its inputs jointly
    and linearly."""
    alpha, beta = 0.7, -1.3
    ones = [_dec(g, batch, n_out, n_in, d) for _ in range(inputs)]
    twos = [_dec(g, batch, n_out, n_in, d) for _ in range(inputs)]
    mixed = [Decomposition(alpha * a.terms + beta * b.terms, alpha * a.bias + beta * b.bias)
             for a, b in zip(ones, twos)]
    _close(apply(*mixed).terms, alpha * apply(*ones).terms + beta * apply(*twos).terms)


@PROPERTY
@given(shapes())
def test_linear(shape):
    g = _generator(shape.pop("seed"))
    dec = _dec(g, **shape)
    w = torch.randn(shape["d"], 3, generator=g, dtype=torch.float64)
    c = torch.randn(3, generator=g, dtype=torch.float64)
    _close(Linear()(dec, w, c).total(), dec.total() @ w + c)
    _check_linear_in_players(lambda x: Linear()(x, w, c), g, **shape)


@PROPERTY
@given(shapes())
def test_residual(shape):
    g = _generator(shape.pop("seed"))
    a, b = _dec(g, **shape), _dec(g, **shape)
    _close(Residual()(a, b).total(), a.total() + b.total())
    _check_linear_in_players(Residual(), g, **shape, inputs=2)


@PROPERTY
@given(shapes(), st.sampled_from([(2, 2), (2, 1), (4, 2)]))
def test_attention(shape, heads):
    g = _generator(shape.pop("seed"))
    n_heads, n_kv = heads
    head_dim = 2
    shape["n_out"] = shape["n_out"]  # keys = rows of the value input
    dec = _dec(g, **shape)
    batch, n = shape["batch"], shape["n_out"]
    probs = torch.softmax(torch.randn(batch, n_heads, n, n, generator=g, dtype=torch.float64), -1)
    w_v = torch.randn(shape["d"], n_kv * head_dim, generator=g, dtype=torch.float64)
    b_v = torch.randn(n_kv * head_dim, generator=g, dtype=torch.float64)
    w_o = torch.randn(n_heads * head_dim, 5, generator=g, dtype=torch.float64)
    b_o = torch.randn(5, generator=g, dtype=torch.float64)

    def reference(z):
        values = (z @ w_v + b_v).reshape(batch, n, n_kv, head_dim).transpose(1, 2)
        values = values.repeat_interleave(n_heads // n_kv, dim=1)
        return (probs @ values).transpose(1, 2).reshape(batch, n, -1) @ w_o + b_o

    rule = Attention()
    _close(rule(dec, probs, w_v, b_v, w_o, b_o).total(), reference(dec.total()))
    _check_linear_in_players(lambda x: rule(x, probs, w_v, b_v, w_o, b_o), g, **shape)


@PROPERTY
@given(shapes())
def test_layer_norm_and_rms_norm(shape):
    g = _generator(shape.pop("seed"))
    dec = _dec(g, **shape)
    d = shape["d"]
    gamma = torch.rand(d, generator=g, dtype=torch.float64) + 0.5
    beta = torch.randn(d, generator=g, dtype=torch.float64)
    real = dec.total()
    _close(LayerNorm()(dec, real, gamma, beta, 1e-5).total(), F.layer_norm(real, (d,), gamma, beta, 1e-5))
    rms = real * torch.rsqrt(real.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma
    _close(RMSNorm()(dec, real, gamma, None, 1e-6).total(), rms)
    for rule, b in ((LayerNorm(), beta), (RMSNorm(), None)):
        _check_linear_in_players(lambda x, r=rule, b=b: r(x, real, gamma, b, 1e-5), g, **shape)


@PROPERTY
@given(shapes(), st.sampled_from(ACTIVATIONS))
def test_element_wise_activation_rules(shape, fn):
    g = _generator(shape.pop("seed"))
    dec = _dec(g, **shape)
    real = dec.total()
    for rule in (IGActivation(), NoTokenActivation()):
        _close(rule(dec, fn, real).total(), fn(real))
        assert is_linear_in_players(rule)
        _check_linear_in_players(lambda x, r=rule: r(x, fn, real), g, **shape)
    assert float(NoTokenActivation()(dec, fn, real).terms.abs().max()) == 0.0

    linearised = LinearisedActivation()
    slope = linearised.slope(fn, real)
    out = linearised(dec, fn, real)
    _close(out.terms, dec.terms * slope[:, :, None, :])
    _close(fn(real) - out.total(), fn(real) - real * slope)  # the gap it leaves, exactly
    _check_linear_in_players(lambda x: linearised(x, fn, real), g, **shape)


@PROPERTY
@given(shapes(), st.sampled_from([nn.SiLU(), ACT2FN["gelu"], ACT2FN["gelu_pytorch_tanh"]]))
def test_gated_activation_rules(shape, fn):
    g = _generator(shape.pop("seed"))
    gate, up = _dec(g, **shape), _dec(g, **shape)
    a, b = gate.total(), up.total()
    for rule in (GatedIGActivation(), NoTokenGatedActivation()):
        _close(rule(gate, up, fn, a, b).total(), fn(a) * b, tol=1e-8)
        _check_linear_in_players(lambda x, y, r=rule: r(x, y, fn, a, b), g, **shape, inputs=2)
    linearised = LinearisedGatedActivation()
    coeff_gate, coeff_up = linearised.slopes(fn, a, b)
    _close(linearised(gate, up, fn, a, b).total(), a * coeff_gate + b * coeff_up)


@settings(max_examples=5, deadline=None)
@given(shapes(), st.sampled_from([ACT2FN["gelu"], nn.SiLU()]))
def test_shapley_activation_is_complete_but_not_linear_in_the_players(shape, fn):
    g = _generator(shape.pop("seed"))
    dec = _dec(g, **shape)
    rule = ShapleyActivation("exact")
    _close(rule(dec, fn).total(), fn(dec.total()), tol=1e-7)
    assert not is_linear_in_players(rule)


def test_the_captum_route_declares_itself_not_linear_in_the_players():
    assert is_linear_in_players(IGActivation())
    assert not is_linear_in_players(IGActivation(route="captum"))
    assert not is_linear_in_players(GatedIGActivation(route="captum"))
    assert not is_linear_in_players(lambda dec, fn, real: dec)  # a callable that says nothing
