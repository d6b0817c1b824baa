"""The model with its coefficients frozen (``engine/linearise.py``), against a real forward pass:
it computes the real output, and its input gradients are the forward route's decomposition."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import LayerNormDecomposition, get_architecture
from captum_ffb.engine import capture_layers, chain_for, find_blocks, resolve_rules
from captum_ffb.engine.linearise import FrozenRules, linearise
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.whole import player_start, propagate
from captum_ffb.rules import AttnLRPAttention, IGActivation, LinearisedActivation, NoTokenActivation
from tests.models import TINY_MODELS, token_ids

#: Post-LN, Pre-LN, gated Pre-LN, parallel, mixture-of-experts (gated experts and a shared one).
FAMILIES = ["bert", "gpt2", "llama", "gptj", "mixtral", "qwen2_moe"]


def _setup(name: str, rules: dict | None = None):
    model = TINY_MODELS[name].build()
    spec = get_architecture(model.config.model_type)
    chain = chain_for(spec, model.config)
    return model, spec, chain, resolve_rules(chain, spec, rules, "a test"), list(find_blocks(model))


def _frozen_run(model, spec, rules, blocks, ids, mask=None):
    """The frozen model's last block output, its first block's input (a leaf) and the model's
    output, from one forward pass inside :func:`linearise`."""
    kwargs = {} if mask is None else {"attention_mask": mask}
    with ModelPass(model, grad=True) as run, linearise(run, spec, blocks, rules, watch={"last": blocks[-1]}) as frozen:
        output = run.run(ids, **kwargs).last_hidden_state
        return frozen.outputs["last"], frozen.inputs, output


@pytest.mark.parametrize("name", FAMILIES)
def test_the_frozen_model_computes_the_real_output(name):
    model, spec, _, rules, blocks = _setup(name)
    ids = token_ids(2, 6)
    with torch.no_grad():
        real = model(ids).last_hidden_state
    last, inputs, output = _frozen_run(model, spec, rules, blocks, ids)
    torch.testing.assert_close(output.detach(), real, atol=1e-6, rtol=1e-6)
    assert inputs.is_leaf and inputs.requires_grad and inputs.shape == (2, 6, real.shape[-1])
    assert last.requires_grad  # the output's graph leads back to the leaf
    assert all(p.requires_grad for p in model.parameters())  # restored after the context


@pytest.mark.parametrize("name", FAMILIES)
def test_input_gradients_are_the_forward_routes_decomposition(name):
    """``⟨∂(v·y)/∂x_j, x_j⟩`` through the frozen model equals ``v·F(x_j)`` of the
    decomposition propagated through every block with the same rules."""
    model, spec, chain, rules, blocks = _setup(name)
    ids = token_ids(2, 6)
    captured, _ = capture_layers(model, model, blocks, spec, ids, with_next_norms=False)
    x = captured[0].inputs
    start = player_start(x, torch.arange(6).expand(2, 6), range(6), None)
    with torch.no_grad():
        *_, last = propagate(captured, chain, rules, start, 1 << 30)
    direction = torch.randn(last.bias.shape, generator=torch.Generator().manual_seed(0))
    forward = torch.einsum("bipd,bid->bp", last.terms, direction)

    output, inputs, _ = _frozen_run(model, spec, rules, blocks, ids)
    (gradient,) = torch.autograd.grad((output * direction).sum(), inputs)
    backward = (gradient * inputs.detach()).sum(-1)
    torch.testing.assert_close(inputs.detach(), x)
    torch.testing.assert_close(backward, forward, atol=1e-4, rtol=1e-3)
    # and with the bias player the target itself: the frozen model is affine in its input
    bias = torch.einsum("bid,bid->b", last.bias, direction)
    torch.testing.assert_close(backward.sum(-1) + bias, (output.detach() * direction).sum((1, 2)),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("activation", [IGActivation(), LinearisedActivation(), NoTokenActivation()])
def test_the_activation_is_frozen_at_its_rules_slope(activation):
    """Through the first block's FF output (``AtbFf``), the frozen model's gradients are the
    activation rule's decomposition: IG's slope, the derivative, or none at all."""
    model, spec, _, rules, blocks = _setup("bert", {"activation": activation})
    ids = token_ids(1, 5)
    lnd = LayerNormDecomposition(model, blocks[0], rules={"activation": activation})
    terms = lnd.decompose(ids, scope="AtbFf").terms[0]  # (n, n, d): F_i(x_j)
    ff_out = blocks[0].get_submodule(spec.ff_out.path)
    direction = torch.randn(terms.shape[0], terms.shape[-1], generator=torch.Generator().manual_seed(1))
    with ModelPass(model, grad=True) as run, linearise(run, spec, blocks, rules, watch={"ff": ff_out}) as frozen:
        run.run(ids)
        (gradient,) = torch.autograd.grad((frozen.outputs["ff"][0] * direction).sum(), frozen.inputs)
    backward = (gradient * frozen.inputs.detach()).sum(-1)[0]
    forward = torch.einsum("ijd,id->j", terms, direction)
    torch.testing.assert_close(backward, forward, atol=1e-5, rtol=1e-4)
    if isinstance(activation, NoTokenActivation):
        assert float(backward.abs().max()) == 0  # no token's share passes the activation


def test_padded_positions_get_no_gradient_from_real_rows():
    model, spec, _, rules, blocks = _setup("llama")
    ids = torch.cat([token_ids(1, 5, seed=3), torch.zeros(1, 2, dtype=torch.long)], dim=1)
    mask = torch.ones_like(ids)
    mask[:, 5:] = 0
    output, inputs, _ = _frozen_run(model, spec, rules, blocks, ids, mask)
    (gradient,) = torch.autograd.grad(output[:, :5].sum(), inputs)
    assert float(gradient[:, 5:].abs().max()) == 0
    assert float(gradient[:, :5].abs().max()) > 0


def test_frozen_rules_refuse_what_the_backward_route_cannot_run():
    from captum_ffb.rules import default_rules

    rules = default_rules()
    frozen = FrozenRules.of(rules)
    assert frozen.activation is rules["activation"] and frozen.attention is None
    assert FrozenRules.of({**rules, "attention": AttnLRPAttention()}).attention is not None
    with pytest.raises(ValueError, match="not linear in the players"):
        FrozenRules.of({**rules, "activation": IGActivation(route="captum")})
    with pytest.raises(ValueError, match="a replaced 'linear' rule needs route='forward'"):
        FrozenRules.of({**rules, "linear": lambda *args: None})


def test_grouped_values_are_the_repeated_values_product_and_its_batched_gradient():
    """The frozen attention's mixing of grouped values (four query heads on two key–value
    heads): the product of the repeated values, and the same gradients under a batched
    backward."""
    from captum_ffb.engine.linearise import _weighted_values

    g = torch.Generator().manual_seed(3)
    weights = torch.softmax(torch.randn(2, 4, 5, 6, generator=g), -1)
    value = torch.randn(2, 2, 6, 3, generator=g, requires_grad=True)
    reference = torch.matmul(weights, value.repeat_interleave(2, dim=1))
    mixed = _weighted_values(weights, value)
    torch.testing.assert_close(mixed, reference)
    cotangents = torch.randn(7, *reference.shape, generator=g)
    (got,) = torch.autograd.grad(mixed, value, cotangents, is_grads_batched=True)
    (want,) = torch.autograd.grad(reference, value, cotangents, is_grads_batched=True)
    torch.testing.assert_close(got, want)


def test_frozen_eager_attention_runs_an_eager_function_it_cannot_read_as_it_is(monkeypatch):
    """An eager function that cannot run on values of no width, or whose output is not
    ``weights @ value``, runs as it is (its own output, the gradient through it)."""
    import captum_ffb.engine.linearise as linearise_module

    g = torch.Generator().manual_seed(5)
    query, key = torch.randn(1, 2, 4, 3, generator=g), torch.randn(1, 2, 4, 3, generator=g)
    value = torch.randn(1, 2, 4, 3, generator=g, requires_grad=True)

    def indexing(module, q, k, v, mask, **kwargs):  # reads a value column: fails on no width
        weights = torch.softmax(q @ k.transpose(-1, -2), -1)
        return (weights @ v).transpose(1, 2) + v[..., :1, 0].mean(), weights

    def truncating(module, q, k, v, mask, **kwargs):  # weights that are not the output's
        weights = torch.softmax(q @ k.transpose(-1, -2), -1)
        return (weights @ v).transpose(1, 2) * 2.0, weights[..., :2, :]

    for eager in (indexing, truncating):
        monkeypatch.setattr(linearise_module, "eager_attention", lambda module, eager=eager: eager)
        output, _ = linearise_module._frozen_eager(None, query, key, value, None)
        expected, _ = eager(None, query, key, value, None)
        torch.testing.assert_close(output, expected)
        assert output.requires_grad
