"""The decomposition type and its three storage forms."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import Decomposition, FactoredDecomposition, TokenwiseDecomposition

torch.manual_seed(0)
B, N, D, K = 2, 5, 6, 3


def _forms() -> list[Decomposition]:
    """The same kind of object in all three forms (different contents)."""
    tokenwise = TokenwiseDecomposition(torch.randn(B, N, D, dtype=torch.float64), torch.randn(B, N, D, dtype=torch.float64))
    factored = FactoredDecomposition(
        torch.rand(B, K, N, N, dtype=torch.float64), torch.randn(B, K, N, D, dtype=torch.float64), torch.randn(B, N, D, dtype=torch.float64)
    )
    dense = Decomposition(torch.randn(B, N, N, D, dtype=torch.float64), torch.randn(B, N, D, dtype=torch.float64))
    low_rank = FactoredDecomposition(
        torch.rand(B, K, N, N, dtype=torch.float64), torch.randn(B, K, N, 2, dtype=torch.float64),
        torch.randn(B, N, D, dtype=torch.float64), proj=torch.randn(K, 2, D, dtype=torch.float64),
    )
    mixed_groups = low_rank + tokenwise  # two component groups of different ranks
    return [tokenwise, factored, dense, low_rank, mixed_groups]


def test_identity_is_diagonal_and_complete():
    x = torch.randn(B, N, D)
    ident = Decomposition.identity(x)
    assert ident.terms.shape == (B, N, N, D)
    torch.testing.assert_close(ident.total(), x)
    eye = torch.eye(N, dtype=torch.bool)
    assert torch.all(ident.terms[:, ~eye] == 0)
    torch.testing.assert_close(ident.maps(), torch.diag_embed(x.norm(dim=-1)))


@pytest.mark.parametrize("form", range(5))
def test_compact_forms_agree_with_their_dense_terms(form):
    dec = _forms()[form]
    dense = Decomposition(dec.terms.clone(), dec.bias.clone())
    w, c = torch.randn(D, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    gamma, beta = torch.randn(D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    scale = torch.rand(B, N, dtype=torch.float64) + 0.5
    pairs = [
        (dec.linear(w, c), dense.linear(w, c)),
        (dec.center(), dense.center()),
        (dec.scale_rows(scale), dense.scale_rows(scale)),
        (dec.scale_features(gamma), dense.scale_features(gamma)),
        (dec.scale(scale, gamma), dense.scale_rows(scale).scale_features(gamma)),
        (dec.scale(scale), dense.scale_rows(scale)),
        (dec.add_bias(beta), dense.add_bias(beta)),
        (dec.rows(slice(1, 3)), dense.rows(slice(1, 3))),
    ]
    for got, want in pairs:
        torch.testing.assert_close(got.terms, want.terms)
        torch.testing.assert_close(got.bias, want.bias)
        torch.testing.assert_close(got.total(), want.total())
        torch.testing.assert_close(got.maps(), want.maps())


def test_sums_of_every_pair_of_forms():
    forms = _forms()
    for a in forms:
        for b in forms:
            got = a + b
            torch.testing.assert_close(got.terms, a.terms + b.terms)
            torch.testing.assert_close(got.total(), a.total() + b.total())


def test_compact_forms_stay_compact():
    tokenwise, factored, _, low_rank, mixed = _forms()
    assert isinstance(low_rank.linear(torch.randn(D, 3, dtype=torch.float64)), FactoredDecomposition)
    assert len(mixed.groups) == 2 and mixed.n_components == K + 1
    assert isinstance(tokenwise + tokenwise, TokenwiseDecomposition)
    assert isinstance(tokenwise + factored, FactoredDecomposition)
    assert isinstance(factored.linear(torch.randn(D, 2, dtype=torch.float64)), FactoredDecomposition)
    assert isinstance(factored.scale_rows(torch.rand(B, N, dtype=torch.float64)), FactoredDecomposition)


def test_maps_zero_padding_rows_and_columns():
    dec = _forms()[2]
    mask = torch.ones(B, N, dtype=torch.long)
    mask[0, 3:] = 0
    masked = Decomposition(dec.terms, dec.bias, token_mask=mask)
    maps = masked.maps()
    assert torch.all(maps[0, 3:] == 0) and torch.all(maps[0, :, 3:] == 0)
    torch.testing.assert_close(maps[1], dec.maps()[1])
    torch.testing.assert_close(masked.rows(slice(2, 5)).maps(row_offset=2), maps[:, 2:5])


def test_completeness_residual_absolute_and_relative():
    dec = _forms()[2]
    target = dec.total().clone()
    target[1, 2, 3] += 0.5
    residual = dec.completeness_residual(target)
    torch.testing.assert_close(residual, torch.tensor([0.0, 0.5], dtype=torch.float64), atol=1e-12, rtol=0)
    relative = dec.completeness_residual(target, relative=True)
    assert float(relative[1]) == pytest.approx(0.5 / float(target[1].abs().max()))


def test_shape_errors():
    with pytest.raises(ValueError, match="batch, n_out, n_in, d"):
        Decomposition(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="do not match"):
        Decomposition(torch.zeros(2, 3, 3, 4), torch.zeros(2, 2, 4))
    with pytest.raises(ValueError, match="different shapes"):
        _ = Decomposition(torch.zeros(1, 2, 2, 3), torch.zeros(1, 2, 3)) + Decomposition(torch.zeros(1, 3, 3, 3), torch.zeros(1, 3, 3))


def test_linear_picks_the_cheaper_form_of_a_low_rank_group():
    from captum_ffb.core.decomposition import _cheaper_form

    torch.manual_seed(4)
    short = FactoredDecomposition(torch.rand(1, 2, 2, 2, dtype=torch.float64), torch.randn(1, 2, 2, 8, dtype=torch.float64),
                                  torch.randn(1, 2, 8, dtype=torch.float64), proj=torch.randn(2, 8, 8, dtype=torch.float64))
    weight = torch.randn(8, 16, dtype=torch.float64)
    assert _cheaper_form(short.groups[0], weight).proj is None  # tiny n: materialise
    out = short.linear(weight)
    torch.testing.assert_close(out.terms, short.terms @ weight)
    long = FactoredDecomposition(torch.rand(4, 2, 64, 64, dtype=torch.float64), torch.randn(4, 2, 64, 2, dtype=torch.float64),
                                 torch.randn(4, 64, 8, dtype=torch.float64), proj=torch.randn(2, 2, 8, dtype=torch.float64))
    assert _cheaper_form(long.groups[0], weight).proj is not None  # many tokens: stay low rank
    torch.testing.assert_close(long.linear(weight).total(), long.total() @ weight)
