"""The statistics on hand-checkable inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from captum_ffb.analysis.stats import (
    PairTable,
    contextualization_change,
    correlations,
    entry_mask,
    ff_amp_pairs,
    maps_without_dims,
    pair_pmi,
    pearson,
    smallest_dims,
    spearman,
)


def test_change_is_zero_for_monotone_maps_and_two_for_reversed_ones():
    a = torch.arange(9, dtype=torch.float32).reshape(3, 3)
    assert contextualization_change(a, a) == pytest.approx(0.0)
    assert contextualization_change(a, 2 * a + 1) == pytest.approx(0.0)  # ranks only
    assert contextualization_change(a, -a) == pytest.approx(2.0)


def test_change_by_hand():
    # flattened ranks (1, 2, 3, 4) against (1, 3, 2, 4): rho = 1 - 6 * 2 / (4 * 15) = 0.8
    before = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    after = torch.tensor([[1.0, 3.0], [2.0, 4.0]])
    assert contextualization_change(before, after) == pytest.approx(0.2)


def test_padding_rows_and_columns_are_dropped():
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(3, 3, generator=g), torch.rand(3, 3, generator=g)
    expected = contextualization_change(a, b)
    for mask, place in (([1, 1, 1, 0, 0], slice(0, 3)), ([0, 0, 1, 1, 1], slice(2, 5))):
        pa, pb = torch.rand(5, 5, generator=g) * 10, torch.rand(5, 5, generator=g) * 10
        pa[place, place], pb[place, place] = a, b
        assert contextualization_change(pa, pb, torch.tensor(mask)) == pytest.approx(expected)
    assert contextualization_change(pa, pb) != pytest.approx(expected)  # without the mask


def test_causal_uses_the_lower_triangle_with_the_diagonal():
    a = torch.tensor([[1.0, 9.0, 8.0], [2.0, 3.0, 7.0], [4.0, 5.0, 6.0]])
    b = a.clone()
    b[0, 1], b[0, 2], b[1, 2] = -9.0, 100.0, -7.0  # only the upper triangle differs
    assert contextualization_change(a, b, causal=True) == pytest.approx(0.0)
    assert contextualization_change(a, b) > 0.1
    assert entry_mask(3, causal=True).sum() == 6
    assert entry_mask(3, torch.tensor([1, 1, 0]), causal=True, diagonal=False).sum() == 1


def test_change_is_nan_when_undefined_and_rejects_bad_shapes():
    assert math.isnan(contextualization_change(torch.ones(3, 3), torch.rand(3, 3)))
    assert math.isnan(contextualization_change(torch.ones(1, 1), torch.ones(1, 1)))
    with pytest.raises(ValueError, match="maps must be"):
        contextualization_change(torch.ones(3, 3), torch.ones(2, 2))


def test_spearman_and_pearson_by_hand():
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 2, 3], [10, 20, 20, 30]) == pytest.approx(1.0)  # ties: mean ranks
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    # x centred (-1, 0, 1), y centred (-7/3, -1/3, 8/3): r = 5 / sqrt(2 * 114 / 9)
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    assert correlations([1, 2, 3], [3, 2, 1]) == {"pearson": pytest.approx(-1.0),
                                                  "spearman": pytest.approx(-1.0)}
    with pytest.raises(ValueError, match="different lengths"):
        pearson([1, 2], [1, 2, 3])


def test_ff_amp_pairs_by_hand():
    before = torch.ones(2, 2)  # columns normalise to 1/2, 1/2
    after = torch.tensor([[3.0, 1.0], [1.0, 3.0]])  # columns (3/4, 1/4) and (1/4, 3/4)
    receivers, givers, scores = ff_amp_pairs(before, after, [7, 9])
    assert receivers.tolist() == [7, 9] and givers.tolist() == [9, 7]
    assert scores.tolist() == pytest.approx([-0.25, -0.25])


def test_ff_amp_pairs_padding_and_causal():
    g = torch.Generator().manual_seed(1)
    before, after = torch.rand(3, 3, generator=g).tril(), torch.rand(3, 3, generator=g).tril()
    r, gv, _ = ff_amp_pairs(before, after, [5, 6, 7], causal=True)
    assert list(zip(r.tolist(), gv.tolist())) == [(6, 5), (7, 5), (7, 6)]
    padded_b, padded_a = torch.zeros(4, 4), torch.zeros(4, 4)
    padded_b[:3, :3], padded_a[:3, :3] = before, after
    r2, g2, s2 = ff_amp_pairs(padded_b, padded_a, [5, 6, 7, 0], torch.tensor([1, 1, 1, 0]), causal=True)
    _, _, s = ff_amp_pairs(before, after, [5, 6, 7], causal=True)
    assert r2.tolist() == r.tolist() and g2.tolist() == gv.tolist()
    assert s2 == pytest.approx(s)
    with pytest.raises(ValueError, match="token ids"):
        ff_amp_pairs(before, after, [1, 2])


def test_pair_table_means_counts_and_top():
    table = PairTable.from_pairs(
        np.array([1, 1, 2, 3, 3]), np.array([2, 2, 1, 3, 3]), np.array([0.5, 0.3, 1.0, 0.2, 0.4])
    )
    means = table.means(min_count=2)
    assert sorted(zip(means.first.tolist(), means.second.tolist())) == [(1, 2), (3, 3)]
    assert means.top(5) == [(1, 2, pytest.approx(0.4), 2), (3, 3, pytest.approx(0.3), 2)]
    assert table.means(min_count=2, exclude={3}).top(5) == [(1, 2, pytest.approx(0.4), 2)]
    assert table.means(min_count=1).top(1) == [(2, 1, pytest.approx(1.0), 1)]
    halves = PairTable.merge([
        PairTable.from_pairs(np.array([1, 2]), np.array([2, 1]), np.array([0.5, 1.0])),
        PairTable.from_pairs(np.array([1, 3, 3]), np.array([2, 3, 3]), np.array([0.3, 0.2, 0.4])),
    ])
    assert halves.keys.tolist() == table.keys.tolist()
    assert halves.sums == pytest.approx(table.sums) and halves.counts.tolist() == table.counts.tolist()
    assert len(PairTable.merge([])) == 0


def test_smallest_dims():
    gamma = torch.tensor([0.5, 0.1, 0.9, 0.1, 0.3])
    assert smallest_dims(gamma, 0.4).tolist() == [1, 3]  # ties go to the lower index
    assert smallest_dims(gamma, 0.01).tolist() == [1]  # at least one dimension
    assert smallest_dims(torch.rand(768), 0.01).numel() == 7  # the paper's "seven"
    with pytest.raises(ValueError, match="fraction"):
        smallest_dims(gamma, 1.5)


def test_maps_without_dims():
    terms = torch.zeros(1, 2, 2, 3)
    terms[0, 0, 1] = torch.tensor([3.0, 4.0, 12.0])
    assert maps_without_dims(terms, [])[0, 0, 1] == pytest.approx(13.0)
    assert maps_without_dims(terms, [2])[0, 0, 1] == pytest.approx(5.0)
    assert maps_without_dims(terms, torch.tensor([0, 2]))[0, 0, 1] == pytest.approx(4.0)
    masked = maps_without_dims(terms, [2], token_mask=torch.tensor([[1, 0]]))
    assert masked[0, 0, 1] == 0.0


def test_pair_pmi_by_hand():
    documents = [[1, 2], [1, 3], [2, 3], [1, 2, 3, 3]]
    pmi = pair_pmi(documents, np.array([1, 2, 1]), np.array([2, 3, 4]))
    assert pmi[0] == pytest.approx(math.log(4 * 2 / (3 * 3)))  # c1 = c2 = 3, c12 = 2, N = 4
    assert pmi[1] == pytest.approx(math.log(4 * 2 / (3 * 3)))
    assert math.isnan(pmi[2])  # token 4 never occurs


def test_mean_sem_by_hand_and_with_non_finite_values():
    from captum_ffb.texts.stats import mean_sem

    mean, sem = mean_sem([1.0, 2.0, 3.0, 6.0])  # s² = (4 + 1 + 0 + 9) / 3
    assert mean == 3.0 and sem == pytest.approx(math.sqrt(14 / 3) / 2)
    assert mean_sem([2, 4]) == (3.0, 1.0)  # integers work too
    # non-finite values: left out with finite_only, else they make the result non-finite
    with_nan = np.array([1.0, np.nan, 2.0, 3.0, 6.0, np.inf])
    assert mean_sem(with_nan, finite_only=True) == mean_sem([1.0, 2.0, 3.0, 6.0])
    assert all(math.isnan(v) for v in mean_sem(with_nan))
    # fewer than two values: no error for one, nothing at all for none
    mean, sem = mean_sem([5.0])
    assert mean == 5.0 and math.isnan(sem)
    assert all(math.isnan(v) for v in mean_sem([]))
    assert all(math.isnan(v) for v in mean_sem([np.nan, np.inf], finite_only=True))
    # a float32 array keeps its precision (the evidence scores are float32)
    values = np.array([0.1, 0.2, 0.7], dtype=np.float32)
    assert mean_sem(values)[0] == float(values.mean())
