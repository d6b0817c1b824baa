"""Rules passed in by role: the user's own rules, clear errors, the ablation rules, a new
chain registered next to the built-in ones."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import Decomposition, LayerNormDecomposition
from captum_ffb.architectures import ArchitectureSpec, registry
from captum_ffb.engine import Chain, chains
from captum_ffb.rules import (
    IGActivation,
    LayerNorm,
    LinearisedGatedActivation,
    NoTokenActivation,
    NoTokenGatedActivation,
    Rule,
    TimedRule,
)
from tests.models import TINY_MODELS, capture_references, token_ids


def _bert():
    spec = TINY_MODELS["bert"]
    return spec, spec.build()


def test_roles_are_those_the_chain_calls():
    spec, model = _bert()
    assert LayerNormDecomposition(model, model.encoder.layer[0]).roles == (
        "activation", "attention", "linear", "norm", "residual")
    llama = TINY_MODELS["llama"].build()
    lnd = LayerNormDecomposition(llama, llama.layers[0])
    assert "gated_activation" in lnd.roles and "activation" not in lnd.roles


def test_a_users_subclass_replaces_a_role():
    """A LayerNorm that also counts its calls and leaves β out of the bias."""

    class CountingLayerNorm(LayerNorm):
        calls = 0

        def __call__(self, decomposition, real_input, weight, bias, eps):
            CountingLayerNorm.calls += 1
            return super().__call__(decomposition, real_input, weight, None, eps)

    spec, model = _bert()
    layer = model.encoder.layer[0]
    ids = token_ids()
    plain = LayerNormDecomposition(model, layer).decompose(ids, scope="Atb")
    custom = LayerNormDecomposition(model, layer, rules={"norm": CountingLayerNorm()})
    dec = custom.decompose(ids, scope="Atb")
    assert CountingLayerNorm.calls >= 1
    torch.testing.assert_close(dec.terms, plain.terms)  # β is owed to no token either way
    beta = layer.attention.output.LayerNorm.bias.detach()
    torch.testing.assert_close(dec.bias + beta, plain.bias)


def test_any_callable_with_the_signature_is_a_rule():
    seen = []

    def doubling_activation(decomposition: Decomposition, fn, pre_activation):
        seen.append(tuple(decomposition.terms.shape))
        out = IGActivation()(decomposition, fn, pre_activation)
        return Decomposition(2 * out.terms, 2 * out.bias, out.token_mask)

    spec, model = _bert()
    layer = model.encoder.layer[0]
    ids = token_ids()
    lnd = LayerNormDecomposition(model, layer, rules={"activation": doubling_activation})
    got, delta = lnd.decompose(ids, scope="AtbFf", return_convergence_delta=True)
    plain = LayerNormDecomposition(model, layer).decompose(ids, scope="AtbFf")
    assert seen and seen[0][-1] == 64  # the FF hidden width of the tiny BERT
    # the output projection is affine: its bias stays, everything else doubles
    out_bias = layer.output.dense.bias.detach()
    torch.testing.assert_close(got.terms, 2 * plain.terms)
    torch.testing.assert_close(got.bias - out_bias, 2 * (plain.bias - out_bias))
    # ... and the convergence delta reports that the doubled FF is not the model's
    refs = capture_references(model, layer, spec.references, input_ids=ids)
    expected = (got.total() - refs["AtbFf"]).abs().amax(dim=(1, 2))
    torch.testing.assert_close(delta, expected, rtol=1e-4, atol=1e-6)


def test_unknown_roles_and_misplaced_rules_are_clear_errors():
    spec, model = _bert()
    layer = model.encoder.layer[0]
    with pytest.raises(ValueError, match=r"unknown role 'actvation'.*activation, attention, linear"):
        LayerNormDecomposition(model, layer, rules={"actvation": IGActivation()})
    with pytest.raises(ValueError, match="use 'activation'"):
        LayerNormDecomposition(model, layer, rules={"gated_activation": NoTokenGatedActivation()})
    with pytest.raises(ValueError, match="IGActivation is a 'activation' rule and cannot play 'norm'"):
        LayerNormDecomposition(model, layer, rules={"norm": IGActivation()})
    with pytest.raises(TypeError, match="not callable"):
        LayerNormDecomposition(model, layer, rules={"norm": 3})
    llama = TINY_MODELS["llama"].build()
    with pytest.raises(ValueError, match="gated: pass the rule as 'gated_activation'"):
        LayerNormDecomposition(llama, llama.layers[0], rules={"activation": IGActivation()})


def test_the_no_token_rules_leave_only_the_attention_path():
    """With the FF owed to no token, the layer's token terms after the FF residual are the
    attention block's own (Kobayashi et al. 2021's view); the whole is still complete."""
    for name, role, rule in (("bert", "activation", NoTokenActivation()),
                             ("llama", "gated_activation", NoTokenGatedActivation())):
        spec = TINY_MODELS[name]
        model = spec.build()
        layer = spec.blocks(model)[0]
        ids = token_ids()
        lnd = LayerNormDecomposition(model, layer, rules={role: rule})
        decs, deltas = lnd.decompose(ids, scope=list(lnd.scopes), return_convergence_delta=True)
        before, after = lnd.chain.ff_pair
        assert float(decs[after].terms.abs().max()) == 0.0
        res = lnd.scopes[lnd.scopes.index(after) + 1]
        torch.testing.assert_close(decs[res].terms, decs["Atb"].terms)
        assert all(float(d.max()) < 1e-4 for d in deltas.values())


def test_the_linearised_rule_is_incomplete_and_its_delta_says_so():
    spec = TINY_MODELS["llama"]
    model = spec.build()
    layer = spec.blocks(model)[0]
    ids = token_ids()
    exact = LayerNormDecomposition(model, layer)
    linear = LayerNormDecomposition(model, layer, rules={"gated_activation": LinearisedGatedActivation()})
    _, exact_delta = exact.decompose(ids, scope="AtbLnFf", return_convergence_delta=True)
    _, linear_delta = linear.decompose(ids, scope="AtbLnFf", return_convergence_delta=True)
    assert float(exact_delta.max()) < 1e-5
    assert float(linear_delta.min()) > 100 * float(exact_delta.max())


def test_a_timed_rule_counts_its_calls_per_row_chunk():
    spec, model = _bert()
    timed = TimedRule(IGActivation())
    lnd = LayerNormDecomposition(model, model.encoder.layer[0], rules={"activation": timed})
    lnd.attribute(token_ids(n=9), internal_batch_size=4)
    assert timed.calls == 3 and timed.seconds > 0


def test_register_chain_adds_a_block_type(monkeypatch):
    """An attention-only chain (``x + ATTN(x)`` then LN1, the 2021 paper's ATB), registered
    and used by a spec of the user's, on a BERT block."""
    monkeypatch.setattr(registry, "_CHAINS", dict(registry._CHAINS))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    def mix(block, rules, start):
        x = chains.start_of(block, start)
        return {"Atb": chains.norm(block, "norm1", rules,
                                   rules["residual"](chains.attention(block, rules, x), x))}

    def local(block, state, rows, rules):
        yield "Atb", state["Atb"].rows(rows).dense()

    atb_only = Chain(name="atb_only", scopes=("Atb",), references={"Atb": (("norm1", "output"),)},
                     mix=mix, local=local, ff_pair=("Atb", "Atb"),
                     roles=lambda spec: frozenset({"attention", "residual", "norm"}))
    registry.register_chain("atb_only", atb_only)
    assert "atb_only" in registry.registered_chains()
    with pytest.raises(ValueError, match="already registered"):
        registry.register_chain("atb_only", atb_only)
    with pytest.raises(TypeError, match="needs a 'name'"):
        registry.register_chain("broken", object())
    bert = registry.get_architecture("bert")
    registry.register_architecture("bert_atb", ArchitectureSpec(
        chain="atb_only", attention=bert.attention, value=bert.value,
        attention_output=bert.attention_output, norm1=bert.norm1, norm2=bert.norm2,
        ff_in=bert.ff_in, activation=bert.activation, ff_out=bert.ff_out))
    with pytest.raises(ValueError, match="not registered"):
        registry.register_architecture("bad", ArchitectureSpec(
            chain="nowhere", attention=bert.attention, value=bert.value,
            attention_output=bert.attention_output, norm1=None, norm2=None,
            ff_in=bert.ff_in, activation=bert.activation, ff_out=bert.ff_out))

    spec, model = _bert()
    layer = model.encoder.layer[1]
    ids = token_ids()
    lnd = LayerNormDecomposition(model, layer, model_type="bert_atb")
    assert lnd.scopes == ("Atb",)
    got, delta = lnd.decompose(ids, return_convergence_delta=True)
    torch.testing.assert_close(got.terms, LayerNormDecomposition(model, layer).decompose(ids, scope="Atb").terms)
    assert float(delta.max()) < 1e-5


def test_rule_subclasses_print_their_settings():
    assert repr(IGActivation(route="captum", n_steps=8)).startswith("IGActivation(route='captum'")
    assert repr(Rule()) == "Rule()"
