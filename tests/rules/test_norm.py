"""LayerNorm and RMSNorm rules: scale from the real input, centring on every term."""

from __future__ import annotations

import torch
from torch import nn

from captum_ffb import Decomposition
from captum_ffb.rules import layer_norm, rms_norm


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
        out = layer_norm(dec, real, norm.weight, norm.bias, norm.eps)
        torch.testing.assert_close(out.total(), norm(real))
    # every term is centred and scaled by the same row factor; β is owed to no token
    centred = dec.terms - dec.terms.mean(-1, keepdim=True)
    s = (real.var(-1, unbiased=False) + 1e-5).rsqrt()
    torch.testing.assert_close(out.terms, centred * s[:, :, None, None] * norm.weight.detach())


def test_layer_norm_without_affine_parameters():
    dec = _random_decomposition()
    norm = nn.LayerNorm(8, elementwise_affine=False).double()
    out = layer_norm(dec, dec.total(), None, None, norm.eps)
    torch.testing.assert_close(out.total(), norm(dec.total()))


def test_rms_norm_total_is_the_real_norm_output():
    dec = _random_decomposition()
    gamma = torch.rand(8, dtype=torch.float64) + 0.5
    real = dec.total()
    expected = real * torch.rsqrt(real.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma
    out = rms_norm(dec, real, gamma, 1e-6)
    torch.testing.assert_close(out.total(), expected)
    torch.testing.assert_close(out.bias, dec.bias * torch.rsqrt(real.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma)
