"""The protocols on a linear scorer, where the exact attribution and every value are known."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from captum_ffb.evaluation import (
    abpc,
    comprehensiveness,
    decompx_aopc,
    eraser_faithfulness,
    ferret_aopc,
    kendall_tau,
    leave_one_out,
    perturbation_curve,
    protected_mask,
    random_attribution,
    sufficiency,
    taucorr_loo,
)
from tests.evaluation.linear import CLS, MASK, PAD, SEP, SPECIAL, LinearScorer, batch, sentence

N_FREE = 6


def _one(n_free: int = N_FREE, seed: int = 0, copies: int = 1):
    ids, mask = batch([sentence(n_free, seed)] * copies)
    return ids, mask, protected_mask(ids, mask, SPECIAL)


def _permutation_attributions(n_free: int) -> torch.Tensor:
    """One row per ordering of the free positions 1..n (the rank as relevance)."""
    rows = []
    for perm in itertools.permutations(range(n_free)):
        row = torch.zeros(n_free + 2, dtype=torch.float64)
        row[1:-1] = torch.tensor(perm, dtype=torch.float64)
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("kind", ["zero_embedding", "remove"])
def test_exact_attribution_maximises_morf_aopc(kind):
    scorer = LinearScorer()
    perms = _permutation_attributions(N_FREE)
    ids, mask, protected = _one(copies=perms.shape[0])
    brute = perturbation_curve(scorer, ids, mask, perms, protected, perturbation=kind).aopc()
    exact = scorer.contributions(ids[:1]).masked_fill(protected[:1], 0.0)
    best = perturbation_curve(scorer, ids[:1], mask[:1], exact, protected[:1],
                              perturbation=kind).aopc()
    assert best.item() == pytest.approx(brute.max().item(), abs=1e-12)
    # the maximiser is unique: every other ordering loses on at least one prefix sum
    assert int((brute > brute.max() - 1e-9).sum()) == 1
    winner = perms[brute.argmax(), 1:-1]
    assert torch.equal(winner.argsort(descending=True), exact[0, 1:-1].argsort(descending=True))


def test_exact_attribution_maximises_abpc():
    scorer = LinearScorer(seed=1)
    perms = _permutation_attributions(N_FREE)
    ids, mask, protected = _one(seed=5, copies=perms.shape[0])
    brute = abpc(scorer, ids, mask, perms, protected).abpc
    exact = scorer.contributions(ids[:1]).masked_fill(protected[:1], 0.0)
    best = abpc(scorer, ids[:1], mask[:1], exact, protected[:1])
    assert best.abpc.item() == pytest.approx(brute.max().item(), abs=1e-12)
    assert int((brute > brute.max() - 1e-9).sum()) == 1
    # and pointwise: the exact MoRF curve lies below, its LeRF curve above, every other one
    morf_all = perturbation_curve(scorer, ids, mask, perms, protected).scores
    assert (best.morf.scores <= morf_all + 1e-12).all()
    lerf_all = perturbation_curve(scorer, ids, mask, perms, protected,
                                  most_relevant_first=False).scores
    assert (best.lerf.scores >= lerf_all - 1e-12).all()


def test_abpc_mean_reduction_and_fraction_grid():
    scorer = LinearScorer(seed=2)
    ids, mask, protected = _one(n_free=10, seed=3)
    exact = scorer.contributions(ids).masked_fill(protected, 0.0)
    on_grid = abpc(scorer, ids, mask, exact, protected, fractions=[0.0, 0.5, 1.0],
                   reduction="mean")
    gap = on_grid.lerf.scores - on_grid.morf.scores
    assert on_grid.morf.steps.tolist() == [[0, 5, 10]]
    assert on_grid.abpc.item() == pytest.approx(gap.mean().item())
    # at k = 0 and k = n both curves meet
    assert gap[0, 0].item() == pytest.approx(0.0, abs=1e-12)
    assert gap[0, -1].item() == pytest.approx(0.0, abs=1e-12)


def _closed_form_random_curve(scorer: LinearScorer, ids: torch.Tensor,
                              protected: torch.Tensor) -> torch.Tensor:
    """E[f(x^(k))] under a uniformly random order: b + protected + (1 - k/n) Σ free."""
    c = scorer.contributions(ids[0])
    free = c[~protected[0]].sum()
    fixed = c[protected[0]].sum()
    n = int((~protected[0]).sum())
    k = torch.arange(n + 1, dtype=torch.float64)
    return scorer.bias + fixed + (1 - k / n) * free


def test_expected_random_curve_by_enumeration():
    scorer = LinearScorer(seed=3)
    perms = _permutation_attributions(N_FREE)
    ids, mask, protected = _one(seed=7, copies=perms.shape[0])
    curves = perturbation_curve(scorer, ids, mask, perms, protected).scores
    expected = _closed_form_random_curve(scorer, ids, protected)
    assert torch.allclose(curves.mean(dim=0), expected, atol=1e-12)


def test_expected_random_curve_over_seeds():
    scorer = LinearScorer(seed=3)
    rows = 3000
    ids, mask, protected = _one(seed=7, copies=rows)
    attributions = random_attribution(ids, seed=11)
    curves = perturbation_curve(scorer, ids, mask, attributions, protected,
                                batch_size=4096).scores
    expected = _closed_form_random_curve(scorer, ids, protected)
    # spread of a single random curve, from the exact distribution over all orderings
    perms = _permutation_attributions(N_FREE)
    ids_all, mask_all, protected_all = _one(seed=7, copies=perms.shape[0])
    spread = perturbation_curve(scorer, ids_all, mask_all, perms, protected_all).scores.std(dim=0)
    error = (curves.mean(dim=0) - expected).abs()
    assert (error <= 5 * spread / math.sqrt(rows) + 1e-12).all()
    again = perturbation_curve(scorer, ids, mask, random_attribution(ids, seed=11), protected,
                               batch_size=4096).scores
    assert torch.equal(curves, again)


def test_insertion_is_deletion_from_the_other_end():
    scorer = LinearScorer(seed=4)
    ids, mask, protected = _one(n_free=7, seed=2)
    attributions = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    insertion = perturbation_curve(scorer, ids, mask, attributions, protected, mode="insertion")
    lerf = perturbation_curve(scorer, ids, mask, attributions, protected,
                              most_relevant_first=False)
    # keeping the k most relevant = deleting the n - k least relevant (no ties here)
    assert torch.allclose(insertion.scores, lerf.scores.flip(1), atol=1e-12)
    assert insertion.scores[0, -1].item() == pytest.approx(insertion.base.item())


def _spy_batch(side: str):
    rows = [sentence(9, 1), sentence(4, 2), sentence(6, 3)]
    ids, mask = batch(rows, side)
    return ids, mask, protected_mask(ids, mask, SPECIAL)


def _check_calls(scorer: LinearScorer, side: str, kind: str) -> None:
    assert scorer.calls
    for ids, mask, zeroed in scorer.calls:
        real = mask == 1
        # every row still has its [CLS] and [SEP], and padding only on its own side
        assert ((ids == CLS) & real).sum(dim=1).eq(1).all()
        assert ((ids == SEP) & real).sum(dim=1).eq(1).all()
        assert (ids[~real] == PAD).all()
        edge = real[:, 0] if side == "right" else real[:, -1]
        assert edge.all()
        assert torch.equal(real, real.cummax(dim=1).values if side == "left"
                           else real.flip(1).cummax(dim=1).values.flip(1))
        if zeroed is not None:
            assert kind == "zero_embedding"
            assert not (zeroed & ~real).any()
            assert not (zeroed & ((ids == CLS) | (ids == SEP))).any()


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", ["zero_embedding", "replace", "remove"])
def test_protected_positions_are_never_touched(side, kind):
    ids, mask, protected = _spy_batch(side)
    attributions = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    attributions[protected] = 100.0  # tempting: would be perturbed first if not protected
    options = dict(perturbation=kind, token_id=MASK)
    runs = [
        lambda s: perturbation_curve(s, ids, mask, attributions, protected, **options),
        lambda s: perturbation_curve(s, ids, mask, attributions, protected, mode="insertion",
                                     **options),
        lambda s: abpc(s, ids, mask, attributions, protected, **options),
        lambda s: eraser_faithfulness(s, ids, mask, attributions, protected, **options),
        lambda s: ferret_aopc(s, ids, mask, attributions, protected, **options),
        lambda s: leave_one_out(s, ids, mask, protected, **options),
    ]
    for run in runs:
        scorer = LinearScorer()
        run(scorer)
        _check_calls(scorer, side, kind)


@pytest.mark.parametrize("side", ["left", "right"])
def test_percentages_count_only_unprotected_tokens(side):
    ids, mask, protected = _spy_batch(side)
    attributions = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    scorer = LinearScorer()
    fractions = [0.5, 0.75]
    curve = perturbation_curve(scorer, ids, mask, attributions, protected, fractions=fractions)
    free = (~protected).sum(dim=1)
    expected = [[math.floor(int(n) * f) for f in fractions] for n in free]
    assert curve.steps.tolist() == expected
    zeroed = torch.cat([z for _, _, z in scorer.calls if z is not None])
    assert zeroed.sum(dim=1).tolist() == [k for row in expected for k in row]


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_is_protected_even_when_the_mask_omits_it(side):
    ids, mask, _ = _spy_batch(side)
    attributions = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    attributions[mask == 0] = 100.0
    for protected in (None, torch.zeros_like(mask, dtype=torch.bool)):
        scorer = LinearScorer()
        curve = perturbation_curve(scorer, ids, mask, attributions, protected)
        assert torch.equal(curve.n_tokens, mask.sum(dim=1))
        for _, call_mask, zeroed in scorer.calls:
            if zeroed is not None:
                assert not (zeroed & (call_mask == 0)).any()


def test_linear_loo_is_the_exact_attribution():
    scorer = LinearScorer(seed=5)
    ids, mask = batch([sentence(5, 1), sentence(3, 2)], "left")
    protected = protected_mask(ids, mask, SPECIAL)
    exact = scorer.contributions(ids).masked_fill(protected, 0.0)
    for kind in ("remove", "zero_embedding"):
        loo = leave_one_out(scorer, ids, mask, protected, perturbation=kind)
        assert torch.allclose(loo, exact, atol=1e-12)


def test_comprehensiveness_and_sufficiency_by_hand():
    table = torch.zeros(60, dtype=torch.float64)
    a, b, c, d = 10, 11, 12, 13
    table[a], table[b], table[c], table[d] = 3.0, -1.0, 2.0, 0.5
    table[CLS], table[SEP] = 0.25, -0.125

    def score(ids, mask, zeroed=None):
        values = table[ids] * mask
        if zeroed is not None:
            values = values.masked_fill(zeroed, 0.0)
        return values.sum(dim=1)

    ids, mask = batch([[CLS, a, b, c, d, SEP]])
    protected = protected_mask(ids, mask, SPECIAL)
    rationale = torch.isin(ids, torch.tensor([a, c]))
    for kind in ("remove", "zero_embedding"):
        comp = comprehensiveness(score, ids, mask, rationale, protected, perturbation=kind)
        suff = sufficiency(score, ids, mask, rationale, protected, perturbation=kind)
        assert comp.item() == pytest.approx(3.0 + 2.0)  # the rationale's own share
        assert suff.item() == pytest.approx(-1.0 + 0.5)  # the share of what was dropped
    # replacing by a token worth 1 adds one per replaced token
    table[MASK] = 1.0
    comp = comprehensiveness(score, ids, mask, rationale, protected, perturbation="replace",
                             token_id=MASK)
    assert comp.item() == pytest.approx(5.0 - 2 * 1.0)


def test_eraser_bins_by_hand():
    scorer = LinearScorer(seed=6)
    ids, mask, protected = _one(n_free=20, seed=4)
    exact = scorer.contributions(ids).masked_fill(protected, 0.0)
    ranked = exact[0, 1:-1].sort(descending=True).values
    result = eraser_faithfulness(scorer, ids, mask, exact, protected)
    counts = [math.ceil(20 * b) for b in (0.01, 0.05, 0.1, 0.2, 0.5)]
    assert result.counts.tolist() == [counts]
    comp = torch.stack([ranked[:k].sum() for k in counts])  # taken out: the top k
    suff = torch.stack([ranked[k:].sum() for k in counts])  # taken out: all but the top k
    assert torch.allclose(result.comprehensiveness[0], comp, atol=1e-12)
    assert torch.allclose(result.sufficiency[0], suff, atol=1e-12)
    assert result.aopc_comprehensiveness.item() == pytest.approx(comp.mean().item())
    alti = eraser_faithfulness(scorer, ids, mask, exact, protected, divisor="bins+1")
    assert alti.aopc_sufficiency.item() == pytest.approx(suff.sum().item() / 6)


def _ferret_reference(scores: list[float], thresholds, only_positive: bool) -> list[list[int]]:
    """The rationales ferret evaluates, by its documented rules, with lists and sets."""
    order = sorted(range(len(scores)), key=lambda j: -scores[j])
    evaluated, last = [], None
    for t in thresholds:
        k = int(t * len(scores))
        if k == 0:
            continue
        top = [j for j in order[:k] if scores[j] > 0] if only_positive else order[:k]
        if not top or set(top) == last:
            continue
        evaluated.append(top)
        last = set(top)
    return evaluated


@pytest.mark.parametrize("only_positive", [True, False])
@pytest.mark.parametrize("n_free", [4, 10, 13])
def test_ferret_steps_follow_its_rules(only_positive, n_free):
    from captum_ffb.evaluation import FERRET_THRESHOLDS

    scorer = LinearScorer(seed=7)
    ids, mask, protected = _one(n_free=n_free, seed=n_free)
    scores = torch.randn(n_free, generator=torch.Generator().manual_seed(n_free),
                         dtype=torch.float64)
    attributions = torch.zeros(1, n_free + 2, dtype=torch.float64)
    attributions[0, 1:-1] = scores
    result = ferret_aopc(scorer, ids, mask, attributions, protected, only_positive=only_positive)
    rationales = _ferret_reference(scores.tolist(), FERRET_THRESHOLDS, only_positive)
    c = scorer.contributions(ids[0])[1:-1]
    comp = [float(c[r].sum()) for r in rationales]
    suff = [float(c.sum() - c[r].sum()) for r in rationales]
    assert int(result.evaluated.sum()) == len(rationales)
    if rationales:
        assert result.aopc_compr.item() == pytest.approx(sum(comp) / len(comp))
        assert result.aopc_suff.item() == pytest.approx(sum(suff) / len(suff))
    else:
        assert result.aopc_compr.item() == 0.0 and result.aopc_suff.item() == 1.0


def test_ferret_without_positive_tokens_scores_its_defaults():
    scorer = LinearScorer()
    ids, mask, protected = _one()
    result = ferret_aopc(scorer, ids, mask, -torch.ones(ids.shape), protected)
    assert not result.evaluated.any()
    assert result.aopc_compr.item() == 0.0 and result.aopc_suff.item() == 1.0
    assert not scorer.calls[1:]  # only the unperturbed forward


def _two_class(scorer: LinearScorer):
    """Class probabilities ``softmax([0, f(x)])`` from the linear score."""

    def score(ids, mask, zeroed=None):
        logit = scorer(ids, mask, zeroed)
        return torch.stack([torch.zeros_like(logit), logit], dim=1).softmax(dim=1)

    return score


def test_decompx_masks_floor_of_k_percent_with_mask_token():
    scorer = LinearScorer(seed=8)
    ids, mask = batch([sentence(7, 1), sentence(12, 2), sentence(3, 3)])
    protected = protected_mask(ids, mask, SPECIAL)
    attributions = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    labels = torch.tensor([1, 0, 1])
    score = _two_class(scorer)
    result = decompx_aopc(score, ids, mask, attributions, protected, mask_token_id=MASK,
                          labels=labels)
    ratios = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    free = (~protected).sum(dim=1).tolist()
    assert result.curve.steps.tolist() == [[math.floor(n * r) for r in ratios] for n in free]
    # every perturbed row carries exactly k [MASK] tokens, one row per nonzero k
    masked = [int(row.sum()) for call_ids, _, _ in scorer.calls[1:] for row in call_ids == MASK]
    assert sorted(masked) == sorted(k for row in result.curve.steps.tolist() for k in row if k)
    # p(ŷ|x) - p(ŷ|x̃) with ŷ predicted on x; K = 0 contributes exactly 0 and is left out
    base = score(ids, mask)
    predicted = base.argmax(dim=1)
    assert torch.equal(result.curve.target, predicted)
    assert result.aopc_per_ratio[0].item() == 0.0
    assert result.aopc == pytest.approx(result.aopc_per_ratio[1:].mean().item())
    assert result.accuracy_per_ratio[0].item() == pytest.approx(
        (predicted == labels).double().mean().item())
    assert result.accuracy == pytest.approx(result.accuracy_per_ratio[1:].mean().item())


def test_target_must_match_the_scorer():
    scorer = LinearScorer()
    ids, mask, protected = _one()
    with pytest.raises(ValueError, match="target needs class scores"):
        perturbation_curve(scorer, ids, mask, torch.zeros(ids.shape), protected, target=1)
    with pytest.raises(ValueError, match="accuracy needs class scores"):
        decompx_aopc(scorer, ids, mask, torch.zeros(ids.shape), protected,
                     mask_token_id=MASK, labels=[0])
    with pytest.raises(ValueError, match="target classes"):
        perturbation_curve(_two_class(scorer), ids, mask, torch.zeros(ids.shape), protected,
                           target=2)


def test_following_a_fixed_class():
    scorer = LinearScorer(seed=9)
    ids, mask, protected = _one()
    attributions = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    score = _two_class(scorer)
    zero = perturbation_curve(score, ids, mask, attributions, protected, target=0)
    one = perturbation_curve(score, ids, mask, attributions, protected, target=1)
    assert torch.allclose(zero.scores + one.scores, torch.ones_like(zero.scores))


def test_class_scores_are_kept_only_on_request():
    score = _two_class(LinearScorer(seed=12))
    ids, mask, protected = _one()
    attributions = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    curve = perturbation_curve(score, ids, mask, attributions, protected)
    assert curve.class_scores is None
    with pytest.raises(ValueError, match="keep_class_scores"):
        curve.accuracy([0])
    kept = perturbation_curve(score, ids, mask, attributions, protected, keep_class_scores=True)
    assert kept.class_scores.shape == (1, N_FREE + 1, 2)
    followed = kept.class_scores[0, :, kept.target[0]]
    assert torch.equal(followed, kept.scores[0])
    assert torch.equal(curve.scores, kept.scores)


def test_batch_size_does_not_change_results():
    scorer = LinearScorer(seed=10)
    ids, mask, protected = _spy_batch("left")
    attributions = torch.randn(ids.shape, generator=torch.Generator().manual_seed(5))
    small = ferret_aopc(scorer, ids, mask, attributions, protected, batch_size=1)
    large = ferret_aopc(scorer, ids, mask, attributions, protected, batch_size=1000)
    assert torch.allclose(small.aopc_compr, large.aopc_compr, atol=1e-12)
    assert torch.allclose(small.aopc_suff, large.aopc_suff, atol=1e-12)


def test_kendall_tau_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (6, 11), generator=generator).double()  # many ties
    y = torch.randn(6, 11, generator=generator, dtype=torch.float64).round()
    mask = torch.rand(6, 11, generator=generator) < 0.8
    ours = kendall_tau(x, y, mask)
    for row in range(6):
        keep = mask[row]
        expected = stats.kendalltau(x[row][keep].numpy(), y[row][keep].numpy())[0]
        assert ours[row].item() == pytest.approx(expected, abs=1e-12)
    assert math.isnan(kendall_tau(torch.ones(5), torch.arange(5.0)).item())


def test_taucorr_loo_is_one_for_loo_and_minus_one_reversed():
    def score(ids, mask, zeroed=None):  # a non-linear scorer
        base = LinearScorer(seed=11)(ids, mask, zeroed)
        return torch.tanh(base) + 0.1 * base**2

    ids, mask = batch([sentence(8, 1), sentence(5, 2)])
    protected = protected_mask(ids, mask, SPECIAL)
    loo = leave_one_out(score, ids, mask, protected)
    assert taucorr_loo(score, ids, mask, loo, protected).tolist() == pytest.approx([1.0, 1.0])
    assert taucorr_loo(score, ids, mask, -loo, protected, loo=loo).tolist() == pytest.approx(
        [-1.0, -1.0])


def test_bad_input_is_rejected():
    scorer = LinearScorer()
    ids, mask, protected = _one()
    with pytest.raises(ValueError, match="attributions shape"):
        perturbation_curve(scorer, ids, mask, torch.zeros(1, 3), protected)
    with pytest.raises(ValueError, match="finite"):
        perturbation_curve(scorer, ids, mask, torch.full(ids.shape, float("nan")), protected)
    with pytest.raises(ValueError, match="increasing"):
        perturbation_curve(scorer, ids, mask, torch.zeros(ids.shape), protected,
                           fractions=[0.5, 0.1])
    with pytest.raises(ValueError, match="batch_size"):
        leave_one_out(scorer, ids, mask, protected, batch_size=0)
    with pytest.raises(ValueError, match="token_id"):
        abpc(scorer, ids, mask, torch.zeros(ids.shape), protected, perturbation="replace")
    with pytest.raises(ValueError, match=r"\(batch,\)"):
        perturbation_curve(lambda i, m, z: torch.zeros(3, 2, 2), ids, mask,
                           torch.zeros(ids.shape), protected)


def test_the_shared_options_are_one_object():
    from captum_ffb.evaluation import PerturbOptions

    assert PerturbOptions.of({}, "zero_embedding").perturbation == "zero_embedding"
    assert PerturbOptions.of({"perturbation": "remove"}, "zero_embedding").perturbation == "remove"
    assert PerturbOptions.of({"batch_size": 8}).fields() == ("remove", None, None, 0, None, 8)
    with pytest.raises(TypeError, match="unknown option 'batchsize'; the metrics take perturbation"):
        PerturbOptions.of({"batchsize": 8})
