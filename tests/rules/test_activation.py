"""Activation rules: closed form against Captum's IntegratedGradients, completeness, gates."""

from __future__ import annotations

import pytest
import torch
from captum.attr import IntegratedGradients
from torch import nn
from transformers.activations import ACT2FN

from captum_ffb import Decomposition
from captum_ffb.rules import GatedIGActivation, IGActivation, activation_coefficients
from captum_ffb.rules.activation import gate_mean_value

ACTIVATIONS = {
    "gelu": ACT2FN["gelu"],
    "gelu_new": ACT2FN["gelu_new"],
    "relu": nn.ReLU(),
    "silu": nn.SiLU(),
    "sigmoid (g(0) != 0)": nn.Sigmoid(),
}


def _pre_activation(dtype=torch.float64) -> Decomposition:
    torch.manual_seed(0)
    return Decomposition(torch.randn(2, 3, 4, 7, dtype=dtype), 0.3 * torch.randn(2, 3, 7, dtype=dtype))


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_closed_form_is_complete(name):
    fn = ACTIVATIONS[name]
    dec = _pre_activation()
    out = IGActivation()(dec, fn)
    torch.testing.assert_close(out.total(), fn(dec.total()))


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_closed_form_equals_captum_integrated_gradients(name):
    fn = ACTIVATIONS[name]
    dec = _pre_activation()
    exact = IGActivation()(dec, fn)
    numeric = IGActivation(route="captum", method="gausslegendre", n_steps=50)(dec, fn)
    scale = exact.terms.abs().max()
    assert float((numeric.terms - exact.terms).abs().max() / scale) < 1e-6
    assert float((numeric.bias - exact.bias).abs().max() / scale) < 1e-6


def test_coefficient_at_zero_is_the_slope():
    s = torch.tensor([0.0, 1e-3, -2.0], dtype=torch.float64)
    coeff, g0 = activation_coefficients(ACT2FN["gelu"], s)
    assert float(g0) == 0.0
    assert float(coeff[0]) == pytest.approx(0.5)
    assert float(coeff[1]) == pytest.approx(float(ACT2FN["gelu"](s[1:2]) / 1e-3))


def test_real_pre_activation_is_used_when_given():
    dec = _pre_activation()
    real = dec.total() + 1e-9
    out = IGActivation()(dec, nn.ReLU(), real)
    coeff, _ = activation_coefficients(nn.ReLU(), real)
    torch.testing.assert_close(out.terms, dec.terms * coeff[:, :, None, :])


def test_unknown_route():
    with pytest.raises(ValueError, match="route"):
        IGActivation(route="simpson")


@pytest.mark.parametrize("name", ["silu", "gelu"])
def test_gated_activation_is_complete_and_equals_captum_ig(name):
    fn = ACTIVATIONS[name]
    torch.manual_seed(2)
    gate = Decomposition(torch.randn(1, 3, 4, 5, dtype=torch.float64), torch.randn(1, 3, 5, dtype=torch.float64))
    up = Decomposition(torch.randn(1, 3, 4, 5, dtype=torch.float64), torch.randn(1, 3, 5, dtype=torch.float64))
    out = GatedIGActivation(n_points=48)(gate, up, fn)
    torch.testing.assert_close(out.total(), fn(gate.total()) * up.total())

    # Captum IG over (a_j, b_j) pairs with zero baseline; one example per output row
    a = torch.cat([gate.terms, gate.bias[:, :, None]], dim=2).reshape(3, 5, 5)
    b = torch.cat([up.terms, up.bias[:, :, None]], dim=2).reshape(3, 5, 5)

    def forward(a_shares, b_shares):
        return (fn(a_shares.sum(1)) * b_shares.sum(1)).sum(-1)

    ig_a, ig_b = IntegratedGradients(forward).attribute((a, b), method="gausslegendre", n_steps=64)
    expected = (ig_a + ig_b).reshape(1, 3, 5, 5)
    torch.testing.assert_close(out.terms, expected[:, :, :4], atol=1e-8, rtol=1e-6)
    torch.testing.assert_close(out.bias, expected[:, :, 4], atol=1e-8, rtol=1e-6)


def test_gate_mean_value_matches_a_known_integral():
    # ∫₀¹ relu(tA) dt = A/2 for A > 0, 0 otherwise
    a = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(gate_mean_value(nn.ReLU(), a, n_points=8), torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))


def test_exact_gelu_mean_value_closed_form_matches_quadrature():
    from captum_ffb.rules.activation import mean_value_closed_form

    closed = mean_value_closed_form(ACT2FN["gelu"])
    assert closed is not None and mean_value_closed_form(nn.Tanh()) is None
    a = torch.cat([torch.linspace(-8, 8, 801, dtype=torch.float64), torch.tensor([0.0, 1e-5, -3e-4], dtype=torch.float64)])
    torch.testing.assert_close(closed(a), gate_mean_value(ACT2FN["gelu"], a, n_points=64), atol=1e-12, rtol=1e-10)
    relu = mean_value_closed_form(nn.ReLU())
    torch.testing.assert_close(relu(a), gate_mean_value(nn.ReLU(), a, n_points=2), atol=1e-6, rtol=0)


@pytest.mark.parametrize("fn", [nn.SiLU(), torch.nn.functional.silu, ACT2FN["silu"]])
def test_silu_mean_value_closed_form_matches_quadrature(fn):
    """``(A·softplus(A) + Li₂(−e^A) + π²/12) / A`` against 256-node Gauss–Legendre quadrature, on
    both sides of zero, near zero (the series) and far out (the inversion of Li₂)."""
    from captum_ffb.rules.activation import mean_value_closed_form

    closed = mean_value_closed_form(fn)
    assert closed is not None
    a = torch.cat([torch.linspace(-40, 40, 4001, dtype=torch.float64),
                   torch.tensor([0.0, 1e-9, -1e-5, 3e-3, -0.0099, 0.0101, 87.0, -87.0], dtype=torch.float64)])
    reference = gate_mean_value(torch.nn.functional.silu, a, n_points=256)
    torch.testing.assert_close(closed(a), reference, atol=1e-12, rtol=1e-10)
    assert closed(a.float()).dtype == torch.float32


def test_silu_mean_value_in_float32_is_the_float64_one_to_3e_7(monkeypatch):
    """Float32 takes the series below |A| = 1.5 and the closed form above, never float64: within
    3e-7 of the float64 value (relative), on both sides of the seam, far out and near zero; the
    compiled kernel's branch (both forms everywhere, one picked) gives the same numbers."""
    from captum_ffb.rules import activation

    a = torch.cat([torch.linspace(-90, 90, 200001, dtype=torch.float64),
                   torch.logspace(-12, 1.5, 4001, dtype=torch.float64), -torch.logspace(-12, 1.5, 4001, dtype=torch.float64),
                   torch.tensor([0.0, 1.5, -1.5, 1.4999999, -1.5000001, 3.0, -3.0], dtype=torch.float64)])
    narrow = a.float()
    expected = activation._silu_mean_value_wide(narrow.double())
    found = activation._silu_mean_value(narrow)
    assert found.dtype == torch.float32
    relative = (found.double() - expected).abs() / expected.abs().clamp_min(1e-300)
    assert float(relative.max()) < 3e-7
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.testing.assert_close(activation._silu_mean_value(narrow), found, atol=0, rtol=0)


def test_gated_rule_keeps_tokenwise_inputs_tokenwise():
    from captum_ffb import TokenwiseDecomposition

    torch.manual_seed(3)
    gate = TokenwiseDecomposition(torch.randn(1, 4, 5, dtype=torch.float64), torch.randn(1, 4, 5, dtype=torch.float64))
    up = TokenwiseDecomposition(torch.randn(1, 4, 5, dtype=torch.float64), torch.randn(1, 4, 5, dtype=torch.float64))
    out = GatedIGActivation()(gate, up, nn.SiLU())
    assert isinstance(out, TokenwiseDecomposition)
    dense = GatedIGActivation()(gate.dense(), up.dense(), nn.SiLU())
    torch.testing.assert_close(out.terms, dense.terms)
    torch.testing.assert_close(out.total(), nn.SiLU()(gate.total()) * up.total())
