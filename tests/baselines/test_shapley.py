"""Shapley values: every method on games whose values theory fixes, layers, padding."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from captum_ffb.baselines import SHAPLEY_METHODS, shapley_maps, shapley_values, shapley_vectors


def _game(p: int = 4, m: int = 3):
    generator = torch.Generator().manual_seed(1)
    weights = torch.randn(p, m, generator=generator, dtype=torch.float64)
    pair = torch.randn(m, generator=generator, dtype=torch.float64)

    def linear(masks):
        return masks.double() @ weights + 0.5

    def nonlinear(masks):
        masks = masks.double()
        return torch.tanh(masks @ weights) + masks[:, :1] * masks[:, 1:2] * pair

    return weights, linear, nonlinear


def _brute_force(value_fn, p: int) -> torch.Tensor:
    """Shapley's formula over all coalitions, written out."""
    phi = None
    for j in range(p):
        others = [k for k in range(p) if k != j]
        total = 0.0
        for size in range(p):
            weight = math.factorial(size) * math.factorial(p - size - 1) / math.factorial(p)
            for coalition in itertools.combinations(others, size):
                without = torch.zeros(1, p, dtype=torch.float64)
                without[0, list(coalition)] = 1
                with_j = without.clone()
                with_j[0, j] = 1
                total = total + weight * (value_fn(with_j) - value_fn(without))[0]
        phi = total[None] if phi is None else torch.cat([phi, total[None]])
    return phi


@pytest.mark.parametrize("method", SHAPLEY_METHODS)
def test_every_method_is_exact_on_an_additive_game(method):
    weights, linear, _ = _game()
    values = shapley_values(linear, 4, method, dtype=torch.float64)
    torch.testing.assert_close(values, weights, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("method", ["exact", "kernel"])
def test_exact_methods_match_the_formula_on_a_nonlinear_game(method):
    # Kernel SHAP with a budget above 2^p enumerates every coalition, which makes it exact.
    _, _, nonlinear = _game()
    values = shapley_values(nonlinear, 4, method, dtype=torch.float64)
    torch.testing.assert_close(values, _brute_force(nonlinear, 4), atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("method", ["permutation", "sampling", "captum"])
def test_sampling_methods_are_complete_and_close(method):
    _, _, nonlinear = _game()
    values = shapley_values(nonlinear, 4, method, n_samples=4000 if method != "captum" else 200)
    exact = _brute_force(nonlinear, 4)
    full = nonlinear(torch.ones(1, 4)) - nonlinear(torch.zeros(1, 4))
    torch.testing.assert_close(values.sum(dim=0), full[0], atol=1e-6, rtol=1e-6)
    assert (values - exact).abs().max() < 0.1 * exact.abs().max()


def test_sampling_is_seeded_and_leaves_the_global_generators_alone():
    _, _, nonlinear = _game()
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    torch_before = torch.random.get_rng_state()
    a = shapley_values(nonlinear, 4, "permutation", n_samples=40, seed=7)
    b = shapley_values(nonlinear, 4, "permutation", n_samples=40, seed=7)
    torch.testing.assert_close(a, b)
    assert (np.random.get_state()[1] == before).all()
    assert torch.equal(torch.random.get_rng_state(), torch_before)


def test_exact_refuses_too_many_players():
    with pytest.raises(ValueError, match="2\\^20 evaluations"):
        shapley_values(lambda masks: masks, 20, "exact")
    with pytest.raises(ValueError, match="method must be one of"):
        shapley_values(lambda masks: masks, 2, "lime")


def test_layer_shapley_vectors_are_complete(pair):
    context, _ = pair
    fn, x = context.layer_function(0), context.inputs[0]
    vectors = shapley_vectors(fn, x, "exact")
    with torch.no_grad():
        change = fn(x[None])[0] - fn(torch.zeros_like(x)[None])[0]
    torch.testing.assert_close(vectors.sum(dim=1), change, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["exact", "permutation"])
def test_shapley_maps_are_invariant_to_padding(pair, method):
    plain, padded = pair
    n = plain.n_tokens
    a = shapley_maps(plain, method, n_samples=60)
    b = shapley_maps(padded, method, n_samples=60)
    torch.testing.assert_close(b[:, :n, :n], a, atol=1e-5, rtol=1e-4)
    assert b[:, n:].abs().max() == 0 and b[:, :, n:].abs().max() == 0
