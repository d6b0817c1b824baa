"""NormDecomposition's ``reference``: players measured from a reference input, the
difference owed to the bias player (or, for the default ``"centered"``, shared back to the
tokens the mean is made of), completeness kept on both routes."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.rules import IGAttention
from tests.models import tiny_task_model, token_ids


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_reference_keeps_completeness_and_routes_agree(name):
    task = "sequence_classification" if name == "bert" else "causal_lm"
    model = tiny_task_model(name, task)
    ids = token_ids()
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0  # right padding in the second row
    kwargs = {"attention_mask": mask}
    nd = NormDecomposition(model)
    plain = nd.attribute(ids, target=2, forward_kwargs=kwargs, return_bias=True, reference="zero")
    default = nd.attribute(ids, target=2, forward_kwargs=kwargs, return_bias=True)
    centered = nd.attribute(ids, target=2, forward_kwargs=kwargs, return_bias=True, reference="centered")
    torch.testing.assert_close(default, centered, rtol=0, atol=0)
    assert NormDecomposition(model, reference="zero").reference == "zero"
    d = model.config.hidden_size
    for reference in ("mean", "centered", 5, torch.randn(d, generator=torch.Generator().manual_seed(0))):
        answers = {}
        for route in ("backward", "forward"):
            c, bias, delta = nd.attribute(ids, target=2, forward_kwargs=kwargs, route=route, reference=reference,
                                          return_bias=True, return_convergence_delta=True)
            # rounding follows the size of the parts (a large reference: parts ≫ their sum)
            scale = float((c.abs().sum(1) + bias.abs()).max())
            assert float(delta.max()) < 1e-5 * scale + 1e-6
            assert float(c[1, -2:].abs().max()) == 0.0
            answers[route] = c, bias
        torch.testing.assert_close(answers["forward"], answers["backward"], atol=1e-5, rtol=1e-4)
        c, bias = answers["backward"]
        torch.testing.assert_close(c.sum(1) + bias, plain[0].sum(1) + plain[1], atol=1e-5, rtol=1e-5)
        assert float((c - plain[0]).abs().max()) > 1e-4 * float(plain[0].abs().max())
        if isinstance(reference, str) and reference == "centered":  # the tokens own the mean's output
            torch.testing.assert_close(bias, plain[1], atol=1e-6, rtol=1e-5)


def test_reference_is_linear_in_the_difference():
    """c_j(r) = c_j(0) − L_j(r): the zero-reference contributions minus those of the reference
    alone (the frozen map of x − r), checked with a reference equal to the input itself."""
    model = tiny_task_model("llama")
    ids = token_ids(batch=1)
    nd = NormDecomposition(model, rules={"attention": IGAttention(n_steps=8)})
    x = model.model.embed_tokens(ids).detach()
    c, bias = nd.attribute(ids, target=3, reference=x, return_bias=True)
    assert float(c.abs().max()) < 1e-6  # measured from themselves, tokens get nothing
    plain, plain_bias = nd.attribute(ids, target=3, return_bias=True, reference="zero")
    torch.testing.assert_close(bias, plain.sum(1) + plain_bias, atol=1e-5, rtol=1e-5)


def test_bad_reference():
    nd = NormDecomposition(tiny_task_model("llama"))
    with pytest.raises(ValueError, match="reference"):
        nd.attribute(token_ids(), target=2, reference="median")


def test_centered_is_the_mean_reference_with_its_output_shared_back():
    """c_k(centered) = c_k(mean) + (1/|V|) Σ_j L_j(x_k): the mean's output, Σ_j L_j(x̄), goes
    back to the tokens it averages; checked against the zero and mean references and the
    frozen map of each token placed at every position."""
    model = tiny_task_model("llama")
    ids = token_ids(batch=1, n=6)
    nd = NormDecomposition(model)
    zero, zero_bias = nd.attribute(ids, target=3, reference="zero", return_bias=True)
    mean, mean_bias = nd.attribute(ids, target=3, reference="mean", return_bias=True)
    centered, centered_bias = nd.attribute(ids, target=3, reference="centered", return_bias=True)
    torch.testing.assert_close(centered_bias, zero_bias, atol=1e-6, rtol=1e-5)  # only the model's biases
    torch.testing.assert_close(centered.sum(1), zero.sum(1), atol=1e-5, rtol=1e-5)  # the tokens own it all
    x = model.model.embed_tokens(ids).detach()
    # measured from x − x_k, every position holds x_k: the contributions add up to Σ_j L_j(x_k)
    placed = torch.stack([nd.attribute(ids, target=3, reference=x - x[:, k:k + 1]).sum(1)
                          for k in range(ids.shape[1])], 1)
    shared = placed / ids.shape[1]
    torch.testing.assert_close(centered, mean + shared, atol=1e-5, rtol=1e-4)


def test_centered_sees_only_what_the_output_sees():
    """A causal model read at position 4: later tokens get nothing, and the mean is of the
    positions up to 4 (the contributions equal those of the cut sequence)."""
    model = tiny_task_model("gpt2")
    ids = token_ids(batch=1, n=8)
    nd = NormDecomposition(model)
    for route in ("backward", "forward"):
        c = nd.attribute(ids, target=5, target_position=4, route=route, reference="centered")
        assert float(c[:, 5:].abs().max()) == 0.0
        cut = nd.attribute(ids[:, :5], target=5, route=route, reference="centered")
        torch.testing.assert_close(c[:, :5], cut, atol=1e-6, rtol=1e-5)
