"""Orderings, counts and the three perturbations, against plain-Python references."""

from __future__ import annotations

import math

import pytest
import torch

from captum_ffb.evaluation import (
    perturb,
    protected_mask,
    random_attribution,
    rank_positions,
    relevance_order,
    remove_tokens,
    replace_tokens,
    tokens_for_fractions,
    top_k_mask,
    zero_embeddings,
)
from tests.evaluation.linear import CLS, MASK, PAD, SEP, SPECIAL, batch, sentence


def test_order_is_stable_and_puts_protected_last():
    attributions = torch.tensor([[0.5, 2.0, 0.5, -1.0, 2.0, 9.0]])
    protected = torch.tensor([[False, False, False, False, False, True]])
    morf, n = relevance_order(attributions, protected)
    lerf, _ = relevance_order(attributions, protected, descending=False)
    values = attributions[0].tolist()
    free = [j for j in range(6) if not protected[0, j]]
    # reference: Python's sort is stable; ties keep position order
    assert morf[0, :5].tolist() == sorted(free, key=lambda j: -values[j])
    assert lerf[0, :5].tolist() == sorted(free, key=lambda j: values[j])
    assert morf[0, 5].item() == lerf[0, 5].item() == 5
    assert n.tolist() == [5]


def test_ranks_invert_the_order():
    attributions = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    protected = torch.zeros(3, 7, dtype=torch.bool)
    protected[:, 0] = True
    order, _ = relevance_order(attributions, protected)
    ranks, _ = rank_positions(attributions, protected)
    assert torch.equal(order.gather(1, ranks), torch.arange(7).expand(3, 7))


def test_top_k_mask_picks_the_extremes_and_clips():
    attributions = torch.tensor([[3.0, 1.0, 2.0, 5.0], [0.0, -1.0, 4.0, 4.0]])
    protected = torch.tensor([[False, False, False, True], [False, False, False, False]])
    top = top_k_mask(attributions, protected, torch.tensor([2, 1]))
    assert top.tolist() == [[True, False, True, False], [False, False, True, False]]
    low = top_k_mask(attributions, protected, 1, descending=False)
    assert low.tolist() == [[False, True, False, False], [False, True, False, False]]
    everything = top_k_mask(attributions, protected, 10)
    assert torch.equal(everything, ~protected)


@pytest.mark.parametrize("rounding", ["floor", "ceil", "round"])
def test_counts_follow_the_float_product(rounding):
    fractions = [0.0, 0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]
    n = torch.arange(0, 200)
    counts = tokens_for_fractions(n, fractions, rounding)
    rule = {"floor": math.floor, "ceil": math.ceil, "round": lambda v: math.floor(v + 0.5)}[rounding]
    expected = [[min(rule(m * f), m) for f in fractions] for m in range(200)]
    assert counts.tolist() == expected


def test_counts_reject_bad_input():
    with pytest.raises(ValueError, match="rounding"):
        tokens_for_fractions(torch.tensor([3]), [0.5], "up")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tokens_for_fractions(torch.tensor([3]), [1.5])


def _remove_reference(ids, mask, where, side):
    rows = [[t for t, m, w in zip(r, mr, wr) if m and not w] for r, mr, wr in
            zip(ids.tolist(), mask.tolist(), where.tolist())]
    return batch(rows, side)


@pytest.mark.parametrize("side", ["left", "right"])
def test_remove_deletes_and_repads_on_the_same_side(side):
    ids, mask = batch([sentence(6, 1), sentence(3, 2), sentence(8, 3)], side)
    generator = torch.Generator().manual_seed(4)
    where = (torch.rand(ids.shape, generator=generator) < 0.4) & (mask == 1)
    where &= ~protected_mask(ids, mask, SPECIAL)
    out = remove_tokens(ids, mask, where)
    ref_ids, ref_mask = _remove_reference(ids, mask, where, side)
    assert torch.equal(out.input_ids, ref_ids)
    assert torch.equal(out.attention_mask, ref_mask)
    assert out.zeroed is None


def test_remove_uses_the_given_side_without_padding():
    ids, mask = batch([sentence(4, 1), sentence(4, 2)])
    where = torch.zeros_like(ids, dtype=torch.bool)
    where[0, 2] = True
    left = remove_tokens(ids, mask, where, padding_side="left")
    assert left.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    with pytest.raises(ValueError, match="padding_side"):
        remove_tokens(ids, mask, where, padding_side="middle")


def test_mixed_padding_needs_a_side():
    ids = torch.tensor([[PAD, CLS, 5, SEP], [CLS, 6, SEP, PAD]])
    mask = (ids != PAD).long()
    where = torch.tensor([[False, False, True, False], [False, True, False, False]])
    with pytest.raises(ValueError, match="mixes left and right"):
        remove_tokens(ids, mask, where)
    out = remove_tokens(ids, mask, where, padding_side="right")
    assert out.input_ids.tolist() == [[CLS, SEP], [CLS, SEP]]


def test_replace_and_zero_keep_shape():
    ids, mask = batch([sentence(5, 1), sentence(2, 2)])
    where = torch.zeros_like(ids, dtype=torch.bool)
    where[0, 1] = where[1, 2] = True
    replaced = replace_tokens(ids, mask, where, MASK)
    assert torch.equal(replaced.input_ids[where], torch.full((2,), MASK))
    assert torch.equal(replaced.input_ids[~where], ids[~where])
    zeroed = zero_embeddings(ids, mask, where)
    assert torch.equal(zeroed.input_ids, ids) and torch.equal(zeroed.zeroed, where)
    with pytest.raises(ValueError, match="token_id"):
        perturb(ids, mask, where, "replace")
    with pytest.raises(ValueError, match="perturbation must be one of"):
        perturb(ids, mask, where, "shuffle")


@pytest.mark.parametrize("kind", ["remove", "replace", "zero_embedding"])
def test_padding_is_never_perturbed(kind):
    ids, mask = batch([sentence(5, 1), sentence(2, 2)])
    where = mask == 0
    with pytest.raises(ValueError, match="padding"):
        perturb(ids, mask, where, kind, token_id=MASK)


def test_protected_mask_covers_specials_and_padding():
    ids, mask = batch([sentence(3, 1), sentence(1, 2)], "left")
    protected = protected_mask(ids, mask, SPECIAL)
    expected = (mask == 0) | (ids == CLS) | (ids == SEP)
    assert torch.equal(protected, expected)


def test_random_attribution_is_seeded():
    like = torch.zeros(4, 9, dtype=torch.long)
    first = random_attribution(like, seed=3)
    assert torch.equal(first, random_attribution(like, seed=3))
    assert not torch.equal(first, random_attribution(like, seed=4))
    generator = torch.Generator().manual_seed(3)
    assert torch.equal(first, random_attribution(like, generator=generator))
    assert first.shape == like.shape
