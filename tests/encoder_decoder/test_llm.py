"""Captum's LLM attribution API on an encoder–decoder: the prompt is the source, the output
the target; every step exact."""

from __future__ import annotations

import pytest
import torch
from captum.attr import TextTokenInput

from captum_ffb import NormDecomposition
from captum_ffb.attr import LLMNormAttribution
from tests.models import load_saved, save_tiny_seq2seq


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    return load_saved(save_tiny_seq2seq(tmp_path_factory.mktemp("marian"), "marian"))


@pytest.mark.parametrize("target", ["the dog run fast", None])
def test_source_to_target_in_captums_result(marian, target):
    tokenizer = marian.tokenizer
    llm = LLMNormAttribution(NormDecomposition(marian.model), tokenizer)
    source = "the cat sat on the mat"
    arguments = {"target": target} if target is not None else {"gen_args": {"max_new_tokens": 4}}
    result = llm.attribute(TextTokenInput(source, tokenizer), **arguments)
    steps = len(result.output_tokens)
    assert result.token_attr.shape == (steps, len(tokenizer(source).input_ids))
    total = (result.prompt_attr.sum(1) + result.output_attr.sum(1) + result.decoder_start_attr + result.bias)
    torch.testing.assert_close(total, result.logits, atol=1e-5, rtol=1e-5)
    assert float(result.convergence_delta.max()) < 1e-5
    assert torch.all(result.output_attr.triu() == 0)  # a step owes nothing to itself or later tokens
    prompt = torch.tensor([tokenizer(source).input_ids])
    prefix = torch.cat([torch.tensor([0]), result.target_ids[:-1]])[None]
    expected = NormDecomposition(marian.model).explain_target(prompt, prefix, result.target_ids)
    torch.testing.assert_close(result.prompt_attr, expected.source)
    assert bool(((result.output_probs > 0) & (result.output_probs < 1)).all())
