"""The whole model's pieces (``engine/whole.py``) against the tensors of a real forward pass:
the players' start, the propagation through every block, the head, and the element-wise rule."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import Decomposition, get_architecture
from captum_ffb.engine import capture_layers, chain_for, find_blocks, resolve_rules
from captum_ffb.engine.whole import (
    HeadTarget,
    element_wise_rule,
    head_forward,
    player_start,
    propagate,
    reference_inputs,
    resolve_head,
)
from captum_ffb.rules import IGActivation, LinearisedActivation
from tests.models import TINY_MODELS, tiny_task_model, token_ids

#: Post-LN, Pre-LN, gated Pre-LN, parallel and mixture-of-experts blocks.
FAMILIES = ["bert", "gpt2", "llama", "gptj", "mixtral"]
BUDGET = 1 << 30


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _run(model, ids, mask=None, extra=None):
    """One capture of every block; the family's chain and default rules."""
    spec = get_architecture(model.config.model_type)
    kwargs = {} if mask is None else {"attention_mask": mask}
    blocks, recorded = capture_layers(model, model, list(find_blocks(model)), spec, ids, None, kwargs,
                                      with_next_norms=False, extra=extra, keep_output=True)
    chain = chain_for(spec, model.config)
    return spec, chain, resolve_rules(chain, spec, None, "a test"), blocks, recorded


def _tokens_as_players(x: torch.Tensor, mask: torch.Tensor | None = None) -> Decomposition:
    batch, n, _ = x.shape
    return player_start(x, torch.arange(n).expand(batch, n), range(n), mask)


@pytest.mark.parametrize("name", FAMILIES)
def test_propagate_reproduces_every_blocks_real_output(name):
    model = TINY_MODELS[name].build()
    _, chain, rules, blocks, _ = _run(model, token_ids(2, 6))
    start = _tokens_as_players(blocks[0].inputs)
    outputs = list(propagate(blocks, chain, rules, start, BUDGET))
    assert len(outputs) == len(blocks)
    for block, decomposition in zip(blocks, outputs):
        assert decomposition.n_in == 6  # the first block's tokens stay the players
        assert _relative(decomposition.total(), block.output) < 1e-4


def test_grouped_players_are_sums_of_the_token_players():
    model = TINY_MODELS["llama"].build()
    _, chain, rules, blocks, _ = _run(model, token_ids(2, 6))
    x = blocks[0].inputs
    *_, by_token = propagate(blocks, chain, rules, _tokens_as_players(x), BUDGET)
    groups = torch.tensor([0, 0, 1, 1, 2, 2]).expand(2, 6)
    *_, by_pair = propagate(blocks, chain, rules, player_start(x, groups, [0, 2], None), BUDGET)
    summed = by_token.terms.reshape(2, 6, 3, 2, -1).sum(3)  # players (0, 1), (2, 3), (4, 5)
    torch.testing.assert_close(by_pair.terms, summed[:, :, [0, 2]], atol=1e-5, rtol=1e-4)
    # a player left out is left out alone: the rules' coefficients come from the real tensors
    torch.testing.assert_close(by_pair.bias, by_token.bias, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_padding_leaves_the_real_rows_alone_and_belongs_to_no_player(name):
    model = TINY_MODELS[name].build()
    ids = token_ids(1, 5, seed=3)
    padded = torch.cat([ids, torch.full((1, 2), 4)], dim=1)
    mask = torch.ones_like(padded)
    mask[:, 5:] = 0
    _, chain, rules, plain_blocks, _ = _run(model, ids)
    _, _, _, padded_blocks, _ = _run(model, padded, mask)
    token_mask = padded_blocks[0].token_mask
    *_, plain = propagate(plain_blocks, chain, rules, _tokens_as_players(plain_blocks[0].inputs), BUDGET)
    *_, with_padding = propagate(padded_blocks, chain, rules,
                                 _tokens_as_players(padded_blocks[0].inputs, token_mask), BUDGET)
    torch.testing.assert_close(with_padding.terms[:, :5, :5], plain.terms, atol=1e-5, rtol=1e-4)
    assert float(with_padding.terms[:, :5, 5:].abs().max()) == 0  # no real row reads padding
    maps = with_padding.maps()
    assert float(maps[:, 5:].abs().max()) == 0 and float(maps[:, :, 5:].abs().max()) == 0
    # players chosen among the positions (not all: no identity shortcut): padding is none
    x = padded_blocks[0].inputs
    start = player_start(x, torch.arange(7).expand(1, 7), range(6), token_mask)
    assert float(start.terms[:, 5:].abs().max()) == 0 and float(start.total()[:, 5:].abs().max()) == 0
    torch.testing.assert_close(start.total()[:, :5], x[:, :5])


def test_reference_inputs_and_the_start_measured_from_them():
    x = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert reference_inputs(None, x, mask) is None and reference_inputs("zero", x, mask) is None
    mean = reference_inputs("mean", x, mask)
    torch.testing.assert_close(mean[1, 3], x[1, :2].mean(0))  # over the real tokens only
    torch.testing.assert_close(reference_inputs(torch.ones(3), x, None), torch.ones(2, 4, 3))
    torch.testing.assert_close(reference_inputs(7, x, None, lambda token: torch.full_like(x, token)),
                               torch.full_like(x, 7))
    with pytest.raises(ValueError, match="reference must be one of"):
        reference_inputs("median", x, mask)
    start = player_start(x, torch.arange(4).expand(2, 4), range(4), mask, mean)
    real = mask[:, :, None].to(x.dtype)
    torch.testing.assert_close(start.total(), x)  # complete
    torch.testing.assert_close(start.bias, mean * real)  # the real tokens' reference: no player's


def test_element_wise_rule_is_the_models_activation_rule_or_ig():
    assert isinstance(element_wise_rule({}), IGActivation)
    chosen = LinearisedActivation()
    assert element_wise_rule({"activation": chosen}) is chosen
    generator = torch.Generator().manual_seed(0)
    decomposition = Decomposition(torch.randn(2, 3, 4, 5, generator=generator),
                                  torch.randn(2, 3, 5, generator=generator))
    real = decomposition.total()
    out = element_wise_rule({})(decomposition, torch.tanh, real)
    torch.testing.assert_close(out.total(), torch.tanh(real), atol=1e-6, rtol=1e-5)  # complete


@pytest.mark.parametrize("name, task", [("llama", "causal_lm"), ("gpt2", "causal_lm"),
                                        ("bert", "sequence_classification")])
def test_the_head_gives_the_real_logits(name, task):
    model = tiny_task_model(name, task)
    spec = get_architecture(model.config.model_type)
    head = resolve_head(model, spec)
    ids = token_ids(2, 6)
    _, chain, rules, blocks, recorded = _run(model, ids, extra=head.modules())
    *_, last = propagate(blocks, chain, rules, _tokens_as_players(blocks[0].inputs), BUDGET)
    logits = recorded.output.logits
    if task == "causal_lm":
        positions = torch.full((2,), 5)
        unit = logits[:, -1].argmax(-1)
        real = logits[:, -1].gather(1, unit[:, None])[:, 0]
    else:
        positions = torch.zeros(2, dtype=torch.long)  # the classifier reads the first token
        unit = torch.tensor([0, 1])
        real = logits.gather(1, unit[:, None])[:, 0]
    output = head.output
    biases = output.bias[unit][:, None] if output.bias is not None else torch.zeros(2, 1)
    target = HeadTarget(output.weight[unit][:, None].detach(), biases.detach(), torch.ones(2, 1),
                        unit[:, None], positions)
    with torch.no_grad():
        contributions, bias = head_forward(last, head, target, rules, recorded.tensors, spec,
                                           model.config, torch.float32)
    assert contributions.shape == (2, 6)
    torch.testing.assert_close(contributions.sum(-1) + bias, real, atol=1e-4, rtol=1e-4)
