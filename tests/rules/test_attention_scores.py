"""Attention rules that credit queries and keys, on one attention head, checked against
independent computations: Shapley values of the bilinear α·V from the attention function
evaluated on the four coalitions, Captum's Integrated Gradients over the scores, and a
hand-written AttnLRP in relevance form."""

from __future__ import annotations

import pytest
import torch
from captum.attr import IntegratedGradients

from captum_ffb.core.decomposition import Decomposition
from captum_ffb.rules import AttnLRPAttention, IGAttention, ScorePath
from captum_ffb.rules.attention_scores import gauss_legendre

N, D, E = 5, 6, 4


def _head(seed: int = 0, sharp: float = 1.5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, N, D, generator=g, dtype=torch.float64)
    w_q = sharp * torch.randn(D, E, generator=g, dtype=torch.float64)
    w_k = sharp * torch.randn(D, E, generator=g, dtype=torch.float64)
    w_v = torch.randn(D, E, generator=g, dtype=torch.float64)
    allowed = torch.ones(N, N, dtype=torch.bool).tril()[None, None]
    return x, w_q, w_k, w_v, allowed


def _cap(s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return s if softcap is None else softcap * torch.tanh(s / softcap)


def _attention(scores: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor, softcap=None) -> torch.Tensor:
    """The attention function itself: softmax over the allowed keys of the (capped) scores."""
    probs = torch.softmax(_cap(scores, softcap).masked_fill(~allowed[0, 0], float("-inf")), -1)
    return probs @ values


def _rule_contributions(rule, x, w_q, w_k, w_v, allowed, scaling, softcap=None):
    q, k = (x @ w_q)[:, None], (x @ w_k)[:, None]
    scores = scaling * q @ k.transpose(-1, -2)
    probs = torch.softmax(_cap(scores, softcap).masked_fill(~allowed, float("-inf")), -1)

    def project(vectors, affine):
        return (torch.einsum("bnmd,de->bnme", vectors, w_q)[:, None],
                torch.einsum("bnmd,de->bnme", vectors, w_k)[:, None])

    path = ScorePath(q, k, allowed, scaling, softcap, project)
    out = rule(Decomposition.identity(x), probs, w_v, None, torch.eye(E, dtype=x.dtype), None, scores=path)
    return out, probs[0, 0], scores[0, 0]


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_ig_attention_equals_shapley_of_alpha_v_and_captum_ig_over_the_scores(softcap):
    x, w_q, w_k, w_v, allowed = _head()
    scaling = E ** -0.5
    out, probs, scores = _rule_contributions(IGAttention(n_steps=48), x, w_q, w_k, w_v, allowed, scaling, softcap)
    values = (x @ w_v)[0]
    zero = torch.zeros_like(scores)

    # Shapley over two players {scores, values}, baseline (0, 0), from the function itself,
    # per value player j (the function is linear in the values)
    def f(s, v):
        return _attention(s, v, allowed, softcap)

    expected = torch.zeros(N, N, E, dtype=x.dtype)  # (row i, player p, e)
    for j in range(N):
        only = torch.zeros_like(values)
        only[j] = values[j]
        expected[:, j] += 0.5 * ((f(zero, only) - f(zero, 0 * only)) + (f(scores, only) - f(scores, 0 * only)))
    # the scores' share, ½[(f(s, 0) − f(0, 0)) + (f(s, v) − f(0, v))] = ½(α − u)·V, by Captum IG
    # over every score (zero baseline), each score split evenly between its query and key
    ig = IntegratedGradients(lambda s: 0.5 * f(s, values).reshape(s.shape[0], -1).mul(1.0))
    share = torch.zeros(N, N, N, E, dtype=x.dtype)  # (row i, key j, e) per score
    for i in range(N):
        for e in range(E):
            attr = ig.attribute(scores[None], baselines=zero[None], target=i * E + e,
                                n_steps=200, method="gausslegendre")[0]
            share[i, :, :, e] = attr  # attr[i', j]: only row i matters
    for i in range(N):
        for j in range(N):
            expected[i, i] += 0.5 * share[i, i, j]  # query half to the player at i
            expected[i, j] += 0.5 * share[i, i, j]  # key half to the player at j
    total = f(scores, values)
    torch.testing.assert_close(expected.sum(1), total, atol=1e-7, rtol=1e-6)  # the reference is complete
    torch.testing.assert_close(out.terms[0], expected, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(out.total()[0], total, atol=1e-9, rtol=1e-8)  # the rule too


def test_ig_attention_converges_with_more_steps_and_is_exact_in_the_limit():
    x, w_q, w_k, w_v, allowed = _head(sharp=3.0)
    residuals = []
    for steps in (2, 8, 64):
        out, probs, scores = _rule_contributions(IGAttention(n_steps=steps), x, w_q, w_k, w_v, allowed, E ** -0.5)
        real = probs @ (x @ w_v)[0]
        residuals.append(float((out.total()[0] - real).abs().max()))
    assert residuals[0] > residuals[1] > residuals[2]
    assert residuals[2] < 1e-10
    nodes, weights = gauss_legendre(5)
    assert abs(sum(weights) - 1) < 1e-12 and all(0 < t < 1 for t in nodes)


def test_attnlrp_attention_equals_hand_written_relevance_rules():
    x, w_q, w_k, w_v, allowed = _head(seed=3)
    scaling = E ** -0.5
    out, probs, scores = _rule_contributions(AttnLRPAttention(), x, w_q, w_k, w_v, allowed, scaling)
    values = (x @ w_v)[0]
    g = torch.Generator().manual_seed(5)
    direction = torch.randn(N, E, generator=g, dtype=x.dtype)  # explain w_i · o_i for each row i
    for i in range(N):
        w = direction[i]
        r_alpha = 0.5 * probs[i] * (values @ w)            # uniform rule on α·V: half to α
        r_values = 0.5 * probs[i] * (values @ w)           # … and half to the values
        s = scores[i].masked_fill(~allowed[0, 0, i], 0.0)
        r_scores = s * (r_alpha - probs[i] * r_alpha.sum())  # the softmax rule
        relevance = r_values.clone()
        relevance[i] += 0.5 * r_scores.sum()               # queries: half of every score of row i
        relevance += 0.5 * r_scores                        # keys: half of their score
        contributions = out.terms[0, i] @ w
        torch.testing.assert_close(contributions, relevance, atol=1e-10, rtol=1e-9)
        # conservation: tokens + what the linearised softmax leaves (the bias) = the output
        torch.testing.assert_close(contributions.sum() + out.bias[0, i] @ w, (probs[i] @ values) @ w)
        assert float((out.bias[0, i] @ w - (0.5 * probs[i] @ values @ w - r_scores.sum())).abs()) < 1e-10


@pytest.mark.parametrize("rule", [IGAttention(n_steps=16), AttnLRPAttention()])
def test_gradient_replacement_gives_the_forward_contributions(rule):
    """The backward route's replacement: ⟨∂(w·o)/∂x, x⟩ per token equals the forward rule."""
    x, w_q, w_k, w_v, allowed = _head(seed=2)
    scaling = E ** -0.5
    out, probs, _ = _rule_contributions(rule, x, w_q, w_k, w_v, allowed, scaling)
    leaf = x.clone().requires_grad_(True)
    q, k, v = (leaf @ w_q)[:, None], (leaf @ w_k)[:, None], (leaf @ w_v)[:, None]
    real = (probs[None, None] @ v).detach()
    o = real + rule.linearised(q, k, v, allowed, scaling, None)
    assert float((o - real).detach().abs().max()) == 0.0  # value-preserving
    w = torch.randn(N, E, dtype=x.dtype, generator=torch.Generator().manual_seed(9))
    (grad,) = torch.autograd.grad((o[0, 0] * w).sum(), leaf)
    per_token = (grad * x).sum(-1)[0]
    torch.testing.assert_close(per_token, torch.einsum("ipe,ie->p", out.terms[0], w), atol=1e-10, rtol=1e-9)


def test_scores_are_required():
    x, _, _, w_v, allowed = _head()
    with pytest.raises(ValueError, match="queries and keys"):
        IGAttention()(Decomposition.identity(x), allowed.double(), w_v, None, torch.eye(E, dtype=x.dtype), None)
    with pytest.raises(ValueError):
        IGAttention(n_steps=0)
