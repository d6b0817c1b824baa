"""The fused coefficient functions: the same numbers as the formulas they fuse, the compile
switch, the eager fallback, and the one-step frozen element-wise map."""

from __future__ import annotations

import pytest
import torch

from captum_ffb.engine.linearise import frozen_element_wise
from captum_ffb.rules import GatedIGActivation, IGActivation, LayerNorm, RMSNorm
from captum_ffb.rules.activation import gate_mean_value
from captum_ffb.rules.fused import COMPILE_VARIABLE, compile_mode, fused


def _values(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 7, 64, generator=g) * 4
    x[0, 0, :5] = torch.tensor([0.0, 1e-4, -1e-4, 5e-3, -30.0])
    return x


@pytest.mark.parametrize("fn", [torch.nn.SiLU(), torch.nn.GELU(), torch.nn.ReLU()])
def test_gated_slopes_equal_quadrature_and_add_up(fn):
    """The fused closed-form coefficients against 64-node quadrature, and c_A A + c_B B = g(A) B."""
    a, b = _values(0), _values(1)
    coeff_a, m = GatedIGActivation().slopes(fn, a, b)
    reference = gate_mean_value(fn, a.double(), 64)
    torch.testing.assert_close(m.double(), reference, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(coeff_a * a + m * b, fn(a) * b, atol=1e-4, rtol=1e-5)
    assert torch.isfinite(coeff_a).all()


def test_element_wise_coefficients_are_the_secant_slopes():
    s = _values(2)
    slope = IGActivation().slope(torch.nn.GELU(), s)
    expected = torch.where(s == 0, torch.full_like(s, 0.5), torch.nn.functional.gelu(s) / torch.where(s == 0, 1, s))
    torch.testing.assert_close(slope, expected)


def test_norm_scales():
    x = _values(3)
    torch.testing.assert_close(LayerNorm().frozen_scale(x, 1e-5), 1 / torch.sqrt(x.var(-1, unbiased=False) + 1e-5))
    torch.testing.assert_close(RMSNorm().frozen_scale(x, 1e-6), 1 / torch.sqrt((x * x).mean(-1) + 1e-6))


def test_the_compile_switch(monkeypatch):
    monkeypatch.delenv(COMPILE_VARIABLE, raising=False)
    assert compile_mode() == "auto"
    monkeypatch.setenv(COMPILE_VARIABLE, "Never")
    assert compile_mode() == "never"
    monkeypatch.setenv(COMPILE_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match=COMPILE_VARIABLE):
        compile_mode()


def test_a_failed_compilation_falls_back_to_eager_once(monkeypatch):
    """Where torch.compile fails the eager function answers, with one warning, and is not retried."""
    calls = []

    def broken(fn, **kwargs):
        calls.append(fn)
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setenv(COMPILE_VARIABLE, "always")

    @fused
    def double(x):
        return x * 2

    x = torch.arange(4.0)
    with pytest.warns(RuntimeWarning, match="runs eagerly"):
        torch.testing.assert_close(double(x), x * 2)
    torch.testing.assert_close(double(x), x * 2)
    assert len(calls) == 1
    monkeypatch.setenv(COMPILE_VARIABLE, "auto")

    @fused
    def triple(x):
        return x * 3

    torch.testing.assert_close(triple(x), x * 3)  # auto on the cpu: eager, torch.compile not called
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_frozen_element_wise_is_the_value_forward_and_the_coefficients_backward(dtype):
    g = torch.Generator().manual_seed(4)
    a = torch.randn(2, 5, 8, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(2, 5, 8, generator=g, dtype=dtype, requires_grad=True)
    ca, cb = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    value = torch.nn.functional.silu(a) * b
    out = frozen_element_wise(value, (a, ca.to(dtype)), (b, cb.to(dtype)))
    reference = value.detach() + (a - a.detach()) * ca.to(dtype) + (b - b.detach()) * cb.to(dtype)
    torch.testing.assert_close(out, value.detach())
    weights = torch.randn(2, 5, 8, generator=g, dtype=dtype)
    got = torch.autograd.grad((out * weights).sum(), (a, b))
    expected = torch.autograd.grad((reference * weights).sum(), (a, b))
    for x, y in zip(got, expected):
        assert x.dtype == dtype
        torch.testing.assert_close(x, y)
    frozen_b = b.detach()
    only_a = frozen_element_wise(value, (a, ca.to(dtype)), (frozen_b, cb.to(dtype)))
    (grad_a,) = torch.autograd.grad(only_a.sum(), a)
    torch.testing.assert_close(grad_a, ca.to(dtype))
    # a coefficient kept as factors (a norm's row scale and weight), batched cotangents too
    scale, weight = torch.rand(2, 5, 1, generator=g, dtype=dtype), torch.randn(8, generator=g, dtype=dtype)
    factored = frozen_element_wise(value, (a, (scale, weight)), (b, cb.to(dtype)))
    torch.testing.assert_close(factored, value.detach())
    many = torch.randn(3, 2, 5, 8, generator=g, dtype=dtype)
    got = torch.autograd.grad(factored, (a, b), many, is_grads_batched=True)
    torch.testing.assert_close(got[0], many * scale * weight)
    torch.testing.assert_close(got[1], many * cb.to(dtype))
