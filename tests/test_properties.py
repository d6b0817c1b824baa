"""Properties of the whole machinery on random inputs (hypothesis): the decomposition algebra
(sums, linearity in the players, row chunks), chain completeness on random tiny models of
every family (both routes equal, padding on either side), read-outs (a contrast is the
difference of its two targets) and the encoder–decoder layout ``[source | target]``."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from captum_ffb import Contrast, Decomposition, NormDecomposition
from captum_ffb.core.decomposition import stack_rows
from tests.models import TINY_MODELS, TINY_SEQ2SEQ, VOCAB, tiny_task_model

PROPERTY = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
#: One of each shape of block: Pre-LN (RMSNorm, rotary, gated), Pre-LN LayerNorm, Post-LN,
#: parallel, mixture of experts, sandwich norms.
CAUSAL = ["llama", "gpt2", "opt-post-ln", "gpt_neox", "mixtral", "gemma2"]
SEQ2SEQ = ["bart", "t5-gated", "marian"]


@cache
def _model(name: str) -> NormDecomposition:
    return NormDecomposition(tiny_task_model(name, "causal_lm"))


@cache
def _seq2seq(name: str) -> NormDecomposition:
    return NormDecomposition(TINY_SEQ2SEQ[name].build())


def _random(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --------------------------------------------------------------------------- the algebra
@PROPERTY
@given(batch=st.integers(1, 2), n=st.integers(1, 5), players=st.integers(1, 5), d=st.integers(1, 6),
       seed=st.integers(0, 2**16))
def test_a_decomposition_is_linear_in_its_players_and_chunks_by_rows(batch, n, players, d, seed):
    terms, bias = _random(seed, batch, n, players, d), _random(seed + 1, batch, n, d)
    whole = Decomposition(terms, bias)
    # the total is the sum of the terms and the bias
    torch.testing.assert_close(whole.total(), terms.sum(2) + bias)
    # splitting the players in two and adding the parts gives the whole back
    cut = players // 2
    first = Decomposition(torch.cat([terms[:, :, :cut], torch.zeros_like(terms[:, :, cut:])], 2), bias)
    second = Decomposition(torch.cat([torch.zeros_like(terms[:, :, :cut]), terms[:, :, cut:]], 2),
                           torch.zeros_like(bias))
    torch.testing.assert_close((first + second).terms, whole.terms)
    # a linear map acts term by term: the map of the total is the total of the map
    weight = _random(seed + 2, d, 3)
    mapped = whole.linear(weight)
    torch.testing.assert_close(mapped.total(), whole.total() @ weight)
    # rows in chunks, stacked again, are the whole
    rows = [whole.rows(slice(k, k + 2)) for k in range(0, n, 2)]
    torch.testing.assert_close(stack_rows(rows).terms, whole.terms)


# --------------------------------------------------------------------------- chains, whole model
@PROPERTY
@given(name=st.sampled_from(CAUSAL), n=st.integers(2, 7), padding=st.integers(0, 3), left=st.booleans(),
       target=st.integers(0, VOCAB - 1), seed=st.integers(0, 2**16))
def test_every_family_is_complete_and_both_routes_agree(name, n, padding, left, target, seed):
    nd = _model(name)
    torch.manual_seed(seed)
    ids = torch.randint(4, VOCAB, (2, n + padding))
    mask = torch.ones_like(ids)
    if padding:  # the second row padded on one side
        mask[1, :padding] = 0 if left else 1
        if not left:
            mask[1, -padding:] = 0
    kwargs = {"attention_mask": mask}
    back, back_bias, back_delta = nd.attribute(ids, target=target, forward_kwargs=kwargs, return_bias=True,
                                               return_convergence_delta=True)
    front, front_bias, front_delta = nd.attribute(ids, target=target, forward_kwargs=kwargs, route="forward",
                                                  return_bias=True, return_convergence_delta=True)
    assert float(back_delta.max()) < 1e-4 and float(front_delta.max()) < 1e-4
    torch.testing.assert_close(back, front, atol=2e-5, rtol=1e-4)
    assert float(back[mask == 0].abs().sum()) == 0.0  # padding belongs to no player


@PROPERTY
@given(name=st.sampled_from(CAUSAL), a=st.integers(0, VOCAB - 1), b=st.integers(0, VOCAB - 1),
       route=st.sampled_from(["backward", "forward"]), seed=st.integers(0, 2**16))
def test_a_contrast_is_the_difference_of_its_targets(name, a, b, route, seed):
    assume(a != b)  # a contrast of a unit with itself is refused (0 for every input)
    nd = _model(name)
    torch.manual_seed(seed)
    ids = torch.randint(4, VOCAB, (1, 6))
    both, bias = nd.attribute(ids, target=Contrast(a, b), route=route, return_bias=True)
    first, first_bias = nd.attribute(ids, target=a, route=route, return_bias=True)
    second, second_bias = nd.attribute(ids, target=b, route=route, return_bias=True)
    torch.testing.assert_close(both, first - second, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(bias, first_bias - second_bias, atol=2e-5, rtol=1e-4)


# --------------------------------------------------------------------------- encoder–decoders
@PROPERTY
@given(name=st.sampled_from(SEQ2SEQ), n_source=st.integers(2, 6), n_target=st.integers(1, 4),
       source_padding=st.integers(0, 2), target=st.integers(0, VOCAB - 1), seed=st.integers(0, 2**16))
def test_the_layout_is_source_then_target_and_exact(name, n_source, n_target, source_padding, target, seed):
    nd = _seq2seq(name)
    torch.manual_seed(seed)
    source = torch.randint(4, VOCAB, (2, n_source + source_padding))
    mask = torch.ones_like(source)
    if source_padding:
        mask[1, -source_padding:] = 0
    prefix = torch.cat([torch.zeros(2, 1, dtype=torch.long), torch.randint(4, VOCAB, (2, n_target - 1))], 1)
    kwargs = {"attention_mask": mask, "decoder_input_ids": prefix}
    (src, tgt), bias, delta = nd.attribute(source, target=target, forward_kwargs=kwargs, return_bias=True,
                                           return_convergence_delta=True)
    assert src.shape == source.shape and tgt.shape == prefix.shape
    assert float(delta.max()) < 1e-4
    assert float(src[mask == 0].abs().sum()) == 0.0
    (fsrc, ftgt), fbias = nd.attribute(source, target=target, forward_kwargs=kwargs, route="forward",
                                       return_bias=True)
    torch.testing.assert_close(src, fsrc, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(tgt, ftgt, atol=2e-5, rtol=1e-4)
    table = nd.attribute_components(source, target=target, forward_kwargs=kwargs)
    per_player = table.contributions.sum(-1)  # rows: [source | target]
    torch.testing.assert_close(per_player[:, : source.shape[1]], src, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(per_player[:, source.shape[1]:], tgt, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_an_encoder_decoder_contrast_adds_up_to_the_logit_difference(name):
    nd = _seq2seq(name)
    torch.manual_seed(0)
    source = torch.randint(4, VOCAB, (2, 6))
    prefix = torch.cat([torch.zeros(2, 1, dtype=torch.long), torch.randint(4, VOCAB, (2, 3))], 1)
    kwargs = {"decoder_input_ids": prefix}
    (src, tgt), bias = nd.attribute(source, target=Contrast(7, 9), forward_kwargs=kwargs, return_bias=True)
    with torch.no_grad():
        logits = nd.model(source, decoder_input_ids=prefix).logits[:, -1]
    torch.testing.assert_close(src.sum(1) + tgt.sum(1) + bias, logits[:, 7] - logits[:, 9], atol=5e-5, rtol=1e-4)
    (one_src, one_tgt), one_bias = nd.attribute(source, target=7, forward_kwargs=kwargs, return_bias=True)
    (two_src, two_tgt), two_bias = nd.attribute(source, target=9, forward_kwargs=kwargs, return_bias=True)
    torch.testing.assert_close(src, one_src - two_src, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(tgt, one_tgt - two_tgt, atol=2e-5, rtol=1e-4)


def test_the_families_sampled_are_registered():
    assert set(CAUSAL) <= set(TINY_MODELS) and set(SEQ2SEQ) <= set(TINY_SEQ2SEQ)
