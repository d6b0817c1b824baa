"""``UniformGatedActivation`` (AttnLRP's identity rule on ``g`` and uniform rule on ``⊙``) and
``attnlrp_rules``: complete, the hand-derived shares, both routes, the roles of each family."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from captum_ffb import Decomposition, NormDecomposition, TokenwiseDecomposition
from captum_ffb.rules import (
    AttnLRPAttention,
    IGActivation,
    LayerNorm,
    RMSNorm,
    UniformGatedActivation,
    attnlrp_rules,
)
from tests.models import tiny_task_model, token_ids

FUNCTIONS = {"silu": nn.SiLU(), "gelu": nn.GELU(), "sigmoid (g(0) != 0)": nn.Sigmoid()}


def _pair(seed: int = 2) -> tuple[Decomposition, Decomposition]:
    generator = torch.Generator().manual_seed(seed)

    def one() -> Decomposition:
        return Decomposition(torch.randn(1, 3, 4, 5, generator=generator, dtype=torch.float64),
                             torch.randn(1, 3, 5, generator=generator, dtype=torch.float64))

    return one(), one()


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_complete_and_the_uniform_split(name):
    fn = FUNCTIONS[name]
    gate, up = _pair()
    out = UniformGatedActivation()(gate, up, fn)
    a, b = gate.total(), up.total()
    torch.testing.assert_close(out.total(), fn(a) * b)
    # by hand: half of g(A)·B follows A's shares (in proportion to (g(A) − g(0)) / A, the
    # identity rule), half follows B's shares (in proportion to g(A))
    g0 = fn(torch.zeros(1, dtype=torch.float64))
    ratio = (fn(a) - g0) / a
    expected = 0.5 * b[:, :, None] * ratio[:, :, None] * gate.terms + 0.5 * fn(a)[:, :, None] * up.terms
    torch.testing.assert_close(out.terms, expected)
    # without a g(0), the two halves of every share of ⊙ are exactly equal
    if float(g0) == 0.0:
        halves = (b * ratio * a, fn(a) * b)
        torch.testing.assert_close(halves[0], halves[1])


def test_slopes_are_the_rules_linear_map():
    gate, up = _pair(5)
    rule = UniformGatedActivation()
    coeff_gate, coeff_up = rule.slopes(nn.SiLU(), gate.total(), up.total())
    out = rule(gate, up, nn.SiLU())
    expected = gate.terms * coeff_gate[:, :, None] + up.terms * coeff_up[:, :, None]
    torch.testing.assert_close(out.terms, expected)
    at_zero, _ = rule.slopes(nn.SiLU(), torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(at_zero, torch.full((3,), 0.25, dtype=torch.float64))  # ½ · 1 · g'(0)


def test_tokenwise_inputs_stay_tokenwise():
    generator = torch.Generator().manual_seed(3)
    gate, up = (TokenwiseDecomposition(torch.randn(1, 4, 5, generator=generator),
                                       torch.randn(1, 4, 5, generator=generator)) for _ in range(2))
    out = UniformGatedActivation()(gate, up, nn.SiLU())
    assert isinstance(out, TokenwiseDecomposition)
    dense = UniformGatedActivation()(gate.dense(), up.dense(), nn.SiLU())
    torch.testing.assert_close(out.terms, dense.terms)


def test_attnlrp_rules_by_family():
    llama = attnlrp_rules(tiny_task_model("llama"))
    assert isinstance(llama["attention"], AttnLRPAttention) and isinstance(llama["norm"], RMSNorm)
    assert isinstance(llama["gated_activation"], UniformGatedActivation) and "activation" not in llama
    assert set(llama) == set(attnlrp_rules())  # the default is a Llama-style decoder
    gpt2 = attnlrp_rules("gpt2")
    assert isinstance(gpt2["norm"], LayerNorm) and isinstance(gpt2["activation"], IGActivation)
    assert "gated_activation" not in gpt2


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen2_moe", "gemma2"])
def test_attnlrp_rules_complete_on_both_routes(name):
    model = tiny_task_model(name)
    ids = token_ids()
    nd = NormDecomposition(model, rules=attnlrp_rules(model))
    backward, bias, delta = nd.attribute(ids, target=4, return_bias=True, return_convergence_delta=True)
    forward, bias_f = nd.attribute(ids, target=4, route="forward", return_bias=True)
    with torch.no_grad():
        real = model(input_ids=ids).logits[:, -1, 4]
    scale = float(real.abs().max())
    torch.testing.assert_close(backward.sum(1) + bias, real, atol=1e-5 * scale, rtol=0)
    torch.testing.assert_close(backward, forward, atol=1e-5 * float(forward.abs().max()), rtol=0)
    torch.testing.assert_close(bias, bias_f, atol=1e-6 * scale, rtol=0)
    assert float(delta.max()) < 1e-5 * scale
