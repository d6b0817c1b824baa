"""Whole-model attribution of encoder–decoders: each target logit written exactly over the
source tokens, the target prefix and the bias player, by two independent routes."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from tests.models import TINY_SEQ2SEQ, seq2seq_inputs, split_source

FAMILIES = sorted(TINY_SEQ2SEQ)
pytestmark = pytest.mark.smoke  # every family, also on the lowest supported versions



@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("reference", ["zero", "centered"])
def test_both_routes_are_complete_and_agree(name, reference):
    family = TINY_SEQ2SEQ[name]
    model = family.build()
    nd = NormDecomposition(model)
    source, kwargs = split_source(seq2seq_inputs(family))
    target = torch.tensor([5, 9])
    with torch.no_grad():
        logits = model(source, **kwargs).logits
    last = kwargs["decoder_attention_mask"].sum(1) - 1
    real = logits[torch.arange(2), last, target]
    answers = {}
    for route in ("backward", "forward"):
        (src, tgt), bias, delta = nd.attribute(source, target=target, forward_kwargs=kwargs, route=route,
                                               reference=reference, return_bias=True,
                                               return_convergence_delta=True)
        assert src.shape == (2, source.shape[1] if not family.audio else src.shape[1])
        assert tgt.shape == kwargs["decoder_input_ids"].shape
        total = src.sum(1) + tgt.sum(1) + bias
        assert torch.allclose(total, real, atol=2e-5), (route, total, real)
        assert delta.max() < 2e-5
        # padding owns nothing: the second target's last position, the second source's last two
        assert tgt[1, -1] == 0
        if not family.audio:
            assert torch.all(src[1, -2:] == 0) and torch.all(src[0] != 0)
        answers[route] = (src, tgt, bias)
    for got, expected in zip(answers["backward"], answers["forward"]):
        assert torch.allclose(got, expected, atol=2e-5)


@pytest.mark.parametrize("name", ["t5", "mt5", "umt5"])
def test_a_bias_free_model_gives_the_whole_logit_to_the_tokens(name):
    family = TINY_SEQ2SEQ[name]
    model = family.build()
    source, kwargs = split_source(seq2seq_inputs(family))
    (src, tgt), bias = NormDecomposition(model).attribute(source, target=4, forward_kwargs=kwargs, return_bias=True)
    assert torch.all(bias.abs() < 1e-6)


def test_the_source_share_does_not_depend_on_centring():
    """Centring moves credit within a stack (the mean's output goes back to that stack's
    tokens), never between the source and the target."""
    family = TINY_SEQ2SEQ["marian"]
    model = family.build()
    nd = NormDecomposition(model)
    source, kwargs = split_source(seq2seq_inputs(family))
    (zero, _), = (nd.attribute(source, target=6, forward_kwargs=kwargs, reference="zero"),)
    (centered, _), = (nd.attribute(source, target=6, forward_kwargs=kwargs, reference="centered"),)
    assert torch.allclose(zero.sum(1), centered.sum(1), atol=1e-6)
    assert not torch.allclose(zero, centered, atol=1e-6)


@pytest.mark.parametrize("route", ["backward", "forward"])
@pytest.mark.parametrize("name", ["bart", "t5-gated", "whisper"])
def test_generated_tokens_equal_forced_decoding(name, route):
    family = TINY_SEQ2SEQ[name]
    model = family.build()
    nd = NormDecomposition(model)
    source, _ = split_source(seq2seq_inputs(family))
    source = source[:1]
    key = "input_features" if family.audio else "input_ids"
    with torch.no_grad():
        generated = model.generate(**{key: source}, max_new_tokens=4, do_sample=False, num_beams=1,
                                   output_logits=True, return_dict_in_generate=True)
    explained = nd.explain_generation(source, max_new_tokens=4, route=route)
    steps = len(generated.logits)
    assert torch.equal(explained.tokens, generated.sequences[0, -steps:])
    scores = torch.stack([generated.logits[t][0, explained.tokens[t]] for t in range(steps)])
    assert torch.allclose(explained.value, scores, atol=1e-5)
    assert explained.delta.max() < 2e-5
    share = explained.source.sum(1) / explained.value
    assert torch.allclose(explained.source_share, share)
    # the decoder is causal: step t owes nothing to prefix positions after t
    for t in range(steps):
        assert torch.all(explained.target[t, t + 1:] == 0)
    assert "source share" in explained.table()


def test_encoder_decoder_errors_are_clear():
    family = TINY_SEQ2SEQ["bart"]
    model = family.build()
    nd = NormDecomposition(model)
    source, kwargs = split_source(seq2seq_inputs(family))
    with pytest.raises(ValueError, match="decoder_input_ids"):
        nd.attribute(source, target=3)
    with pytest.raises(ValueError, match="feature_mask"):
        nd.attribute(source, target=3, forward_kwargs=kwargs, feature_mask=torch.zeros_like(source))
    with pytest.raises(ValueError, match="not available for encoder–decoder"):
        nd.maps(source)
    with pytest.raises(TypeError, match="token id"):
        nd.attribute(source, target="hello", forward_kwargs=kwargs)
    with pytest.raises(ValueError, match="language-model head"):
        NormDecomposition(model.model)
