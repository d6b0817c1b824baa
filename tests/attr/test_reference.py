"""NormDecomposition's ``reference``: players measured from a reference input, the
difference owed to the bias player, completeness kept on both routes."""

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
    plain = nd.attribute(ids, target=2, forward_kwargs=kwargs, return_bias=True)
    zero = nd.attribute(ids, target=2, forward_kwargs=kwargs, return_bias=True, reference="zero")
    torch.testing.assert_close(zero, plain, rtol=0, atol=0)
    d = model.config.hidden_size
    for reference in ("mean", 5, torch.randn(d, generator=torch.Generator().manual_seed(0))):
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


def test_reference_is_linear_in_the_difference():
    """c_j(r) = c_j(0) − L_j(r): the zero-reference contributions minus those of the reference
    alone (the frozen map of x − r), checked with a reference equal to the input itself."""
    model = tiny_task_model("llama")
    ids = token_ids(batch=1)
    nd = NormDecomposition(model, rules={"attention": IGAttention(n_steps=8)})
    x = model.model.embed_tokens(ids).detach()
    c, bias = nd.attribute(ids, target=3, reference=x, return_bias=True)
    assert float(c.abs().max()) < 1e-6  # measured from themselves, tokens get nothing
    plain, plain_bias = nd.attribute(ids, target=3, return_bias=True)
    torch.testing.assert_close(bias, plain.sum(1) + plain_bias, atol=1e-5, rtol=1e-5)


def test_bad_reference():
    nd = NormDecomposition(tiny_task_model("llama"))
    with pytest.raises(ValueError, match="reference"):
        nd.attribute(token_ids(), target=2, reference="median")
