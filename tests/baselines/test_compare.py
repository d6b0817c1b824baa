"""Agreement scores: known values, masking of padding and causal triangles, tables."""

from __future__ import annotations

import math

import pytest
import torch

from captum_ffb.baselines import compare, compare_methods, spearman


def _maps(seed: int = 0, n: int = 5) -> torch.Tensor:
    return torch.rand(2, n, n, generator=torch.Generator().manual_seed(seed))


def test_identical_maps_agree_perfectly_and_reversed_ones_do_not():
    a = _maps()
    same = compare(a, a.clone())
    assert torch.allclose(same["1-spearman"], torch.zeros(2, dtype=torch.float64))
    assert torch.allclose(same["pearson"], torch.ones(2, dtype=torch.float64))
    assert torch.allclose(same["top-k"], torch.ones(2, dtype=torch.float64))
    flipped = compare(a, -a)
    assert torch.allclose(flipped["1-spearman"], torch.full((2,), 2.0, dtype=torch.float64))
    assert torch.allclose(flipped["pearson"], torch.full((2,), -1.0, dtype=torch.float64))


def test_spearman_averages_tied_ranks_like_scipy():
    stats = pytest.importorskip("scipy.stats")
    a = torch.tensor([1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 0.5])
    b = torch.tensor([0.1, 0.4, 0.2, 0.9, 0.3, 0.3, 0.0])
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a.numpy(), b.numpy()).statistic)
    assert math.isnan(spearman(torch.ones(4), b[:4]))


def test_padding_and_the_causal_triangle_are_left_out():
    a, b = _maps(1), _maps(2)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    reference = compare(a, b, token_mask=mask, causal=True)
    noisy_a, noisy_b = a.clone(), b.clone()
    noisy_a[0, 3:] = 100.0  # padded rows and columns of example 0
    noisy_b[0, :, 4] = -7.0
    upper = torch.ones(5, 5, dtype=torch.bool).triu(1)
    noisy_a[:, upper] = torch.rand(2, int(upper.sum()))
    again = compare(noisy_a, noisy_b, token_mask=mask, causal=True)
    for key in reference:
        torch.testing.assert_close(again[key], reference[key], equal_nan=True)
    # and it matters when the entries are compared
    assert not torch.allclose(compare(noisy_a, noisy_b)["pearson"], reference["pearson"])


def test_top_k_overlap_by_hand():
    a = torch.tensor([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 0.0], [4.0, 3.0, 2.0, 1.0]])
    b = torch.tensor([[4.0, 1.0, 3.0, 2.0], [1.0, 2.0, 3.0, 4.0], [0.0, 2.0, 3.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    # causal, k = 3: rows 0-2 have at most 3 comparable columns and are skipped; in row 3
    # the top three are {0, 1, 2} and {1, 2, 3}.
    assert compare(a, b, causal=True, k=3)["top-k"].item() == pytest.approx(2 / 3)
    # k = 2, every row: {0,1}/{0,2}, {2,3}/{2,3}, {1,2}/{2,1}, {0,1}/{2,3}
    assert compare(a, b, k=2)["top-k"].item() == pytest.approx((1 / 2 + 1 + 1 + 0) / 4)


def test_compare_methods_builds_a_table():
    maps = {"ours": _maps(0), "attention": _maps(1), "ig": _maps(0) * 2}
    table = compare_methods(maps, reference="ours", k=2, extra={"layer": 3})
    assert table.columns == ["layer", "method", "reference", "1-spearman", "pearson", "top2"]
    assert [r["method"] for r in table.rows] == ["attention", "ig"]
    assert table.lookup(method="ig")["1-spearman"] == pytest.approx(0.0)
    csv = table.to_csv()
    assert csv.splitlines()[0] == "layer,method,reference,1-spearman,pearson,top2"
    assert len(csv.splitlines()) == 3
    assert table.to_markdown().count("\n") == 4
    assert len(compare_methods(maps)) == 3  # every pair once


def test_bad_inputs_give_clear_errors():
    with pytest.raises(ValueError, match="differ in shape"):
        compare(_maps(n=4), _maps(n=5))
    with pytest.raises(ValueError, match=r"\(n, n\)"):
        compare(torch.rand(3, 4), torch.rand(3, 4))
    with pytest.raises(ValueError, match="not among the methods"):
        compare_methods({"a": _maps()}, reference="b")
    with pytest.raises(ValueError, match="token_mask"):
        compare(_maps(), _maps(), token_mask=torch.ones(3, 5))
