"""App. E: Shapley values for the FF activation, and the study that compares them with IG."""

from __future__ import annotations

import pytest
import torch
from transformers.activations import ACT2FN

from captum_ffb import Decomposition, LayerNormDecomposition
from captum_ffb.baselines import activation_study, capture_layer, scopes_with_activation
from captum_ffb.rules import IGActivation, ShapleyActivation
from tests.baselines.conftest import padded_pair
from tests.models import TINY_MODELS, token_ids


def _pre_activation() -> Decomposition:
    generator = torch.Generator().manual_seed(2)
    terms = torch.randn(1, 3, 4, 5, generator=generator, dtype=torch.float64)
    bias = 0.3 * torch.randn(1, 3, 5, generator=generator, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    terms[:, :, 3] = 0  # a padded token owns nothing
    return Decomposition(terms, bias, mask)


@pytest.mark.parametrize("method", ["exact", "kernel", "permutation"])
@pytest.mark.parametrize("offset", [0.0, 0.3])
def test_shapley_of_a_linear_activation_equals_the_closed_form(method, offset):
    dec = _pre_activation()

    def linear(t):
        return 2.5 * t + offset

    shapley = ShapleyActivation(method)(dec, linear)
    closed = IGActivation()(dec, linear)
    torch.testing.assert_close(shapley.terms, 2.5 * dec.terms)
    torch.testing.assert_close(shapley.terms, closed.terms)
    torch.testing.assert_close(shapley.bias, closed.bias)


def test_exact_shapley_of_gelu_is_complete_and_differs_from_ig():
    dec = _pre_activation()
    gelu = ACT2FN["gelu"]
    shapley = ShapleyActivation("exact")(dec, gelu)
    torch.testing.assert_close(shapley.total(), gelu(dec.total()))
    assert shapley.terms[:, :, 3].abs().max() == 0
    assert (shapley.terms - IGActivation()(dec, gelu).terms).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_the_study_chain_with_ig_reproduces_the_decomposition(name):
    spec = TINY_MODELS[name]
    model = spec.build()
    block = spec.blocks(model)[0]
    ids = token_ids(2, 5)
    mask = torch.ones_like(ids)
    mask[1, 3:] = 0
    context = capture_layer(model, block, ids, forward_kwargs={"attention_mask": mask})
    decs, seconds = scopes_with_activation(context, "ig")
    lnd = LayerNormDecomposition(model, block)
    expected = lnd.attribute(ids, scope=list(lnd.scopes), forward_kwargs={"attention_mask": mask})
    assert list(decs) == list(lnd.scopes) and seconds >= 0
    for scope, maps in expected.items():
        torch.testing.assert_close(decs[scope].maps(), maps, atol=1e-5, rtol=1e-5)


def test_shapley_decomposition_of_a_layer_is_complete():
    context, _ = padded_pair("bert", n=4)
    decs, _ = scopes_with_activation(context, "shap_exact")
    torch.testing.assert_close(decs["AtbFfResLn"].total(), context.output, atol=1e-4, rtol=1e-4)


def test_activation_study_tables():
    context, _ = padded_pair("gpt2", n=4)
    study = activation_study(context, ["shap_exact", "shap_kernel"], extra={"layer": 1})
    assert study.methods == ["ig", "shap_exact", "shap_kernel"]
    after_ff = context.scopes[context.scopes.index(context.ff_pair[0]) + 1 :]
    assert len(study.agreement) == 2 * len(after_ff)
    row = study.agreement.lookup(method="shap_exact", scope=after_ff[-1])
    assert row["reference"] == "ig" and row["layer"] == 1 and row["n"] == 4
    assert row["seconds"] == study.seconds["shap_exact"] > 0
    # the table's number is 1 − Spearman ρ of the two maps over the real, causal cells
    from scipy.stats import spearmanr

    ours, ig = study.maps["shap_exact"][after_ff[-1]], study.maps["ig"][after_ff[-1]]
    real = context.real_tokens(0)
    cells = torch.ones(4, 4, dtype=torch.bool).tril()[real][:, real]
    a, b = ours[0][real][:, real][cells], ig[0][real][:, real][cells]
    assert row["1-spearman"] == pytest.approx(1 - spearmanr(a.numpy(), b.numpy()).statistic)
    # Kernel SHAP enumerates all 2^5 coalitions here, so it is exact.
    torch.testing.assert_close(
        study.maps["shap_kernel"][after_ff[-1]], study.maps["shap_exact"][after_ff[-1]],
        atol=1e-5, rtol=1e-4,
    )
    assert [r["method"] for r in study.contextualization.rows] == study.methods
    assert "AtbLnFf->AtbLnFfRes" in study.contextualization.columns


def test_unsupported_blocks_and_methods_are_refused():
    context, _ = padded_pair("bert", n=3)
    with pytest.raises(ValueError, match="unknown activation method"):
        activation_study(context, ["lime"])
    spec = TINY_MODELS["llama"]
    model = spec.build()
    gated = capture_layer(model, spec.blocks(model)[0], token_ids(1, 3))
    with pytest.raises(ValueError, match="splits an element-wise activation.*gated_activation"):
        scopes_with_activation(gated, "ig")


def test_the_study_runs_on_any_chain_with_an_element_wise_activation():
    """The study swaps only the activation rule, so a parallel block works as it is."""
    spec = TINY_MODELS["gpt_neox"]
    model = spec.build()
    block = spec.blocks(model)[0]
    ids = token_ids(1, 4)
    context = capture_layer(model, block, ids)
    decs, seconds = scopes_with_activation(context, "shap_exact")
    assert seconds > 0
    reference = LayerNormDecomposition(model, block).decompose(ids, scope=list(context.scopes))
    for scope, dec in decs.items():
        torch.testing.assert_close(dec.total(), reference[scope].total(), rtol=1e-5, atol=1e-5)
    # the FF branch of a parallel block does not mix tokens, whatever splits the activation
    ff = decs["LnFf"].terms
    off_diagonal = ~torch.eye(4, dtype=torch.bool)
    assert float(ff[0][off_diagonal].abs().max()) < 1e-12 * float(ff.abs().max())
