"""Presence attention by blocks of queries: the mask's numbers, in memory linear in the prompt."""

from __future__ import annotations

import pytest
import torch

from captum_ffb.explained.readouts import AnswerLogProbability, NextToken
from captum_ffb.long_context import blocks
from captum_ffb.long_context.blocks import Unsupported, block_plan
from captum_ffb.long_context.presence import _BLOCKS, presence_attribution
from tests.models import tiny_lm, token_ids


def sentences(n: int, size: int = 5, head: int = 2, tail: int = 3) -> list[int]:
    """Each token's group: ``head`` tokens in none, runs of ``size`` tokens, ``tail`` in none."""
    middle = n - head - tail
    return [-1] * head + [k // size for k in range(middle)] + [-1] * tail


def test_the_plan_gives_each_run_its_cut():
    plan = block_plan(torch.tensor([-1, -1, 0, 0, 1, 1, 1, -2, 2]))
    assert plan.runs == ((0, 2, 2), (2, 4, 2), (4, 7, 4), (7, 8, 8), (8, 9, 8))
    assert block_plan(torch.tensor([0, 0, 1, 0])) is None  # a group in two runs: no plan
    assert block_plan(torch.tensor([-1, 0, -1, 1])).runs == ((0, 1, 1), (1, 2, 1), (2, 3, 3), (3, 4, 3))


def test_blocks_are_whole_runs_of_at_least_the_block_size(monkeypatch):
    monkeypatch.setattr(blocks, "BLOCK", 3)
    plan = block_plan(torch.tensor([-1, 0, 0, 1, 1, 1, -1, 2]))
    assert [(b.start, b.end) for b in plan.blocks] == [(0, 3), (3, 6), (6, 8)]
    first, _, last = plan.blocks
    assert first.query_columns.tolist() == [[1, 1, 0], [1, 0, 1], [1, 0, 1]]
    assert first.key_signs.tolist() == [[1, 0, 0], [1, 0, -1], [1, 0, -1]]  # a group's own keys
    assert last.key_signs.tolist() == [[1, 0, 0]] * 6 + [[1, 0, 0], [1, 0, -1]]  # none outside groups
    assert last.causal.tolist() == [[True] * 7 + [False], [True] * 8]
    assert len(block_plan(torch.tensor([0] * 200)).blocks) == 1  # a run is never cut


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma", "gpt2", "gpt_neox", "falcon"])
@pytest.mark.parametrize("readout", ["token", "answer"])
def test_blocks_give_the_masks_attributions(name, readout, monkeypatch):
    monkeypatch.setattr(blocks, "BLOCK", 6)  # several blocks of several runs
    model = tiny_lm(name)
    ids = token_ids(1, 24, seed=5)
    groups = sentences(ids.shape[1])
    if readout == "token":
        read = NextToken(7)
    else:  # the last three tokens are an answer's, read where they are fed
        read = AnswerLogProbability((int(ids[0, -2]), int(ids[0, -1]), 9), positions=(21, 22, 23))
        ids = torch.cat([ids, ids.new_tensor([[int(ids[0, -1])]])], dim=1)[:, :24]
    masked = presence_attribution(model, ids, groups, max(groups) + 1, read, blocks=False)
    by_blocks = presence_attribution(model, ids, groups, max(groups) + 1, read, blocks=True)
    assert torch.allclose(by_blocks.contributions, masked.contributions, rtol=1e-4, atol=1e-6)
    assert by_blocks.value == masked.value  # the ends' passes are the mask's (no gradient)
    assert by_blocks.without == pytest.approx(masked.without, rel=1e-6)  # a batch of 2 rows, then of 1
    # attention through transformers' interface: blocks ran; Falcon's attention did not take them
    assert _BLOCKS[model] == {"sdpa": name != "falcon"}


def test_a_group_in_two_runs_takes_the_mask():
    model = tiny_lm("llama")
    ids = token_ids(1, 16, seed=2)
    groups = [0] * 4 + [1] * 4 + [0] * 4 + [-1] * 4
    masked = presence_attribution(model, ids, groups, 2, NextToken(7), blocks=False)
    found = presence_attribution(model, ids, groups, 2, NextToken(7), blocks=True)
    assert torch.equal(found.contributions, masked.contributions) and model not in _BLOCKS


def test_an_eager_model_takes_the_mask():
    model = tiny_lm("llama")
    model.config._attn_implementation = "eager"
    ids = token_ids(1, 16, seed=2)
    groups = sentences(16)
    masked = presence_attribution(model, ids, groups, max(groups) + 1, NextToken(7), blocks=False)
    found = presence_attribution(model, ids, groups, max(groups) + 1, NextToken(7), blocks=True)
    assert torch.equal(found.contributions, masked.contributions) and _BLOCKS[model] == {"eager": False}


def test_block_attention_that_disagrees_with_the_mask_is_not_used(monkeypatch):
    """The first use with a model compares the two passes' values: a block attention that
    computed something else is dropped for that model, and the mask's numbers come back."""
    model = tiny_lm("llama")
    ids = token_ids(1, 16, seed=2)
    groups = sentences(16)
    masked = presence_attribution(model, ids, groups, max(groups) + 1, NextToken(7), blocks=False)
    real = blocks._attend
    monkeypatch.setattr(blocks, "_attend", lambda *args: 1.5 * real(*args))
    found = presence_attribution(model, ids, groups, max(groups) + 1, NextToken(7), blocks=True)
    assert torch.allclose(found.contributions, masked.contributions, rtol=1e-6) and _BLOCKS[model] == {"sdpa": False}


def test_attention_the_blocks_do_not_compute_is_refused():
    query = key = value = torch.zeros(1, 2, 4, 8)
    with pytest.raises(Unsupported):  # outside a presence pass
        blocks._block_attention(None, query, key, value, None)
    plan = block_plan(torch.tensor([0, 0, 1, 1]))
    token = blocks._PASS.set((plan, torch.zeros(4), []))
    try:
        for name in ("softcap", "s_aux", "sliding_window"):
            with pytest.raises(Unsupported, match=name):
                blocks._block_attention(None, query, key, value, None, **{name: 1.0})
        with pytest.raises(Unsupported):
            blocks._block_attention(None, query, key, value, None, dropout=0.1)
        out, weights = blocks._block_attention(None, query, key, value, None, sliding_window=None)
        assert out.shape == (1, 4, 2, 8) and weights is None
    finally:
        blocks._PASS.reset(token)


def saved_bytes(model, n: int, by_blocks: bool) -> int:
    """The bytes autograd keeps for the backward of one presence step at ``n`` tokens."""
    from captum_ffb.long_context.presence import _log_mask, _presence_pass, _Reader

    ids = token_ids(1, n, seed=1)
    groups = torch.tensor(sentences(n, size=8))
    log_presence = torch.full((int(groups.max()) + 1,), -0.7, dtype=torch.float64, requires_grad=True)
    read = _Reader(model, NextToken(7), n)
    kept = []

    def pack(tensor):
        kept.append(tensor.untyped_storage().nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        if by_blocks:
            _presence_pass(read, ids, groups, log_presence, block_plan(groups))
        else:
            read.forward(ids, _log_mask(groups, log_presence[None], torch.float32), grad=True)
    return sum(kept)


def test_memory_grows_linearly_by_blocks_and_quadratically_by_the_mask():
    """Doubling the prompt doubles what the block attention keeps for the backward pass and
    about quadruples what the mask's pass keeps (the attention weights of every layer)."""
    model = tiny_lm("llama")
    presence_attribution(model, token_ids(1, 16, seed=2), sentences(16), 3, NextToken(7), blocks=True)  # checked
    short, long = (saved_bytes(model, n, True) for n in (256, 512))
    masked_short, masked_long = (saved_bytes(model, n, False) for n in (256, 512))
    assert long / short < 2.3 and masked_long / masked_short > 3.0 and long < masked_long / 3



def test_by_default_the_passes_attend_by_blocks():
    from captum_ffb.long_context.presence import mask_bytes

    model = tiny_lm("llama")
    ids = token_ids(1, 16, seed=2)
    groups = sentences(16)
    config = model.config
    assert mask_bytes(model, 16) == config.num_hidden_layers * config.num_attention_heads * 16 * 16 * 4
    found = presence_attribution(model, ids, groups, max(groups) + 1, NextToken(7))
    assert _BLOCKS[model] == {"sdpa": True} and found.unit == 7

def test_a_pass_the_blocks_refuse_takes_the_mask(monkeypatch):
    """Attention that asks for what the blocks do not compute (raised inside the model's
    forward) leaves the model as it was, and the pass runs through the mask."""
    from captum_ffb._private import effective_attention_implementation

    model = tiny_lm("llama")
    ids = token_ids(1, 16, seed=2)
    groups = sentences(16)
    masked = presence_attribution(model, ids, groups, max(groups) + 1, NextToken(7), blocks=False)

    def refuse(*args):
        raise Unsupported("soft-capping")

    monkeypatch.setattr(blocks, "_attend", refuse)
    found = presence_attribution(model, ids, groups, max(groups) + 1, NextToken(7), blocks=True)
    assert torch.equal(found.contributions, masked.contributions) and _BLOCKS[model] == {"sdpa": False}
    assert effective_attention_implementation(model.config) == "sdpa"
