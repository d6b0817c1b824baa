"""LayerNorm and RMSNorm rules: scale from the real input, centring on every term."""

from __future__ import annotations

import torch
from torch import nn

from captum_ffb import Decomposition
from captum_ffb.rules import LayerNorm, RMSNorm


def _random_decomposition() -> Decomposition:
    torch.manual_seed(0)
    return Decomposition(torch.randn(2, 4, 4, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64))


def test_layer_norm_total_is_the_real_norm_output():
    dec = _random_decomposition()
    norm = nn.LayerNorm(8, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1, 1)
        real = dec.total()
        out = LayerNorm()(dec, real, norm.weight, norm.bias, norm.eps)
        torch.testing.assert_close(out.total(), norm(real))
    # every term is centred and scaled by the same row factor; β is owed to no token
    centred = dec.terms - dec.terms.mean(-1, keepdim=True)
    s = (real.var(-1, unbiased=False) + 1e-5).rsqrt()
    torch.testing.assert_close(out.terms, centred * s[:, :, None, None] * norm.weight.detach())


def test_layer_norm_without_affine_parameters():
    dec = _random_decomposition()
    norm = nn.LayerNorm(8, elementwise_affine=False).double()
    out = LayerNorm()(dec, dec.total(), None, None, norm.eps)
    torch.testing.assert_close(out.total(), norm(dec.total()))


def test_rms_norm_total_is_the_real_norm_output():
    dec = _random_decomposition()
    gamma = torch.rand(8, dtype=torch.float64) + 0.5
    real = dec.total()
    expected = real * torch.rsqrt(real.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma
    out = RMSNorm()(dec, real, gamma, None, 1e-6)
    torch.testing.assert_close(out.total(), expected)
    torch.testing.assert_close(out.bias, dec.bias * torch.rsqrt(real.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma)


def test_rms_norm_scales_every_term_by_its_rows_real_rms_without_centring():
    dec = _random_decomposition()
    gamma = torch.rand(8, dtype=torch.float64) + 0.5
    real = dec.total() + 0.25  # the real input differs from the total: the rule must use it
    out = RMSNorm()(dec, real, gamma, None, 1e-6)
    rms = real.pow(2).mean(-1).add(1e-6).sqrt()
    for b, i, j in ((0, 0, 0), (1, 2, 3), (0, 3, 1)):
        torch.testing.assert_close(out.terms[b, i, j], dec.terms[b, i, j] / rms[b, i] * gamma)
    assert float((out.terms.mean(-1) - (dec.terms * gamma).mean(-1) / rms[:, :, None]).abs().max()) < 1e-12


def test_norm_scales_are_frozen_from_the_real_input():
    real = torch.randn(2, 4, 8, dtype=torch.float64)
    torch.testing.assert_close(LayerNorm().frozen_scale(real, 1e-5),
                               (real.var(-1, unbiased=False) + 1e-5).rsqrt())
    torch.testing.assert_close(RMSNorm().frozen_scale(real, 1e-6),
                               (real.pow(2).mean(-1) + 1e-6).rsqrt())
