"""Gradient baselines: theory on a linear layer, both routes, completeness, padding."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import Decomposition
from captum_ffb.baselines import (
    completeness_residual,
    gradient_map,
    gradient_maps,
    gradient_vectors,
)
from captum_ffb.rules import Attention

N, D, HEADS, HEAD_DIM = 4, 6, 2, 3


def _linear_attention_layer():
    """Attention with frozen probabilities: a purely linear layer and its exact decomposition."""
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(HEADS, N, N, generator=generator), dim=-1)
    w_v = torch.randn(D, HEADS * HEAD_DIM, generator=generator)
    b_v = torch.randn(HEADS * HEAD_DIM, generator=generator)
    w_o = torch.randn(HEADS * HEAD_DIM, D, generator=generator)
    b_o = torch.randn(D, generator=generator)
    x = torch.randn(N, D, generator=generator)

    def layer(hidden: torch.Tensor) -> torch.Tensor:
        values = (hidden @ w_v + b_v).reshape(hidden.shape[0], N, HEADS, HEAD_DIM).transpose(1, 2)
        mixed = (probs @ values).transpose(1, 2).reshape(hidden.shape[0], N, -1)
        return mixed @ w_o + b_o

    decomposition = Attention()(Decomposition.identity(x[None]), probs[None], w_v, b_v, w_o, b_o)
    return layer, x, decomposition.terms[0]


@pytest.mark.parametrize("route", ["forward", "captum"])
def test_linear_layer_ig_equals_input_x_gradient_equals_decomposition(route):
    layer, x, terms = _linear_attention_layer()
    ig = gradient_vectors(layer, x, "ig", route=route, n_steps=5)
    ixg = gradient_vectors(layer, x, "ixg", route=route)
    torch.testing.assert_close(ig, ixg, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ig, terms, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        gradient_map(layer, x, "ig", route=route, n_steps=5),
        torch.linalg.vector_norm(terms, dim=-1), atol=1e-5, rtol=1e-5,
    )


def test_linear_layer_saliency_is_the_frobenius_norm_of_the_jacobian_block():
    layer, x, _ = _linear_attention_layer()
    jacobian = torch.autograd.functional.jacobian(lambda h: layer(h[None])[0], x)  # (n, d, n, d)
    expected = jacobian.pow(2).sum(dim=(1, 3)).sqrt()
    for route in ("forward", "captum"):
        torch.testing.assert_close(gradient_map(layer, x, "saliency", route=route), expected)


@pytest.mark.parametrize("method", ["ig", "ixg", "saliency"])
def test_forward_route_equals_captum_route_on_a_block(pair, method):
    context, _ = pair
    fn, x = context.layer_function(0), context.inputs[0]
    fast = gradient_map(fn, x, method, route="forward", n_steps=4)
    slow = gradient_map(fn, x, method, route="captum", n_steps=4, batch_size=32)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)


def test_integrated_gradients_are_complete_on_a_pre_ln_block():
    from tests.baselines.conftest import padded_pair

    context, _ = padded_pair("gpt2")
    fn, x = context.layer_function(0), context.inputs[0]
    vectors = gradient_vectors(fn, x, "ig", n_steps=32)
    with torch.no_grad():
        change = fn(x[None])[0] - fn(torch.zeros_like(x)[None])[0]
    torch.testing.assert_close(vectors.sum(dim=1), change, atol=1e-4, rtol=1e-4)
    assert completeness_residual(fn, x, vectors) < 1e-4
    # InputXGradient is not complete for a nonlinear layer
    assert completeness_residual(fn, x, gradient_vectors(fn, x, "ixg")) > 1e-2


@pytest.mark.parametrize("method", ["ig", "saliency"])
def test_gradient_maps_are_invariant_to_padding(pair, method):
    plain, padded = pair
    n = plain.n_tokens
    a = gradient_maps(plain, method, n_steps=8)
    b = gradient_maps(padded, method, n_steps=8)
    torch.testing.assert_close(b[:, :n, :n], a, atol=1e-5, rtol=1e-4)
    assert b[:, n:].abs().max() == 0 and b[:, :, n:].abs().max() == 0


def test_causal_maps_have_an_empty_upper_triangle():
    from tests.baselines.conftest import padded_pair

    context, _ = padded_pair("gpt2")
    maps = gradient_maps(context, "ig", n_steps=4)[0]
    assert context.causal
    assert maps.triu(1).abs().max() == 0
    lower = torch.ones_like(maps, dtype=torch.bool).tril()
    assert maps[lower].min() > 0


def test_bad_arguments_give_clear_errors():
    layer, x, _ = _linear_attention_layer()
    with pytest.raises(ValueError, match="method must be one of"):
        gradient_map(layer, x, "deeplift")
    with pytest.raises(ValueError, match="route must be one of"):
        gradient_map(layer, x, "ig", route="backward")
    with pytest.raises(ValueError, match=r"\(n, d\)"):
        gradient_map(layer, x[None], "ig")
    with pytest.raises(ValueError, match="no attribution vectors"):
        gradient_vectors(layer, x, "saliency")
