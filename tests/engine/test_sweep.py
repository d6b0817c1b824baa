"""The backward sweep (engine/sweep.py): many gradients carried down the blocks at once equal
the gradients taken one at a time through the whole graph, whatever the number carried."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from captum_ffb import NormDecomposition
from captum_ffb.engine.sweep import swept_gradients
from tests.models import tiny_task_model, token_ids


def _blocks(depth: int = 4, width: int = 6) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)]


def test_sweeps_equal_gradients_through_the_whole_graph():
    blocks = _blocks()
    x = torch.randn(2, 3, 6, requires_grad=True)
    # the whole graph, and the same blocks each starting at a leaf of its own
    whole, hidden = [], x
    separate_in, separate_out = [], []
    current = x
    for block in blocks:
        hidden = hidden + block(hidden)
        whole.append(hidden)
        separate_in.append(current)
        out = current + block(current)
        separate_out.append(out)
        current = out.detach().requires_grad_(True)
    weights = torch.randn(len(blocks), 3, 6)
    picks = [(0, 0), (2, 1), (2, 3), (3, 0), (3, 2), (1, 1)]  # (block, which weight row), any order
    expected = [torch.autograd.grad((whole[b] * weights[k]).sum(), x, retain_graph=True)[0] for b, k in picks]
    values = [(b, (separate_out[b] * weights[k]).sum((1, 2))) for b, k in picks]
    for limit in (1, 2, 4, 100):
        found = swept_gradients(separate_out, separate_in, values, limit)
        assert len(found) == len(picks)
        for got, want in zip(found, expected):
            torch.testing.assert_close(got, want)


def test_progress_counts_every_value():
    blocks = _blocks(depth=2)
    x = torch.randn(1, 3, 6, requires_grad=True)
    out = x + blocks[0](x)
    leaf = out.detach().requires_grad_(True)
    out2 = leaf + blocks[1](leaf)
    done = []
    swept_gradients([out, out2], [x, leaf], [(1, out2.sum((1, 2))), (0, out.sum((1, 2))), (1, out2.mean((1, 2)))],
                    limit=2, progress=done.append)
    assert sum(done) == 3


@pytest.mark.parametrize("name", ["llama", "bert"])
@pytest.mark.parametrize("granularity", ["sublayer", "head"])
def test_component_tables_are_the_same_whatever_the_sweeps_carry(name, granularity):
    """A memory budget that lets one read-out through at a time gives the same table as one
    sweep carrying all of them, and as the forward route; the narrow budget also keeps the
    model's attention kernel where the wide one runs the frozen attention eagerly."""
    task = "causal_lm" if name == "llama" else "sequence_classification"
    model = tiny_task_model(name, task)
    ids = token_ids()
    target = 5 if task == "causal_lm" else 2
    wide = NormDecomposition(model).attribute_components(ids, target=target, granularity=granularity,
                                                         route="backward")
    narrow_engine = NormDecomposition(model, memory_budget=1)
    assert narrow_engine.engine.sweep_limit(torch.zeros(1, 8, 32)) == 1
    assert narrow_engine.engine.is_light(ids) and not NormDecomposition(model).engine.is_light(ids)
    narrow = narrow_engine.attribute_components(ids, target=target, granularity=granularity, route="backward")
    forward = NormDecomposition(model).attribute_components(ids, target=target, granularity=granularity,
                                                            route="forward")
    torch.testing.assert_close(narrow.contributions, wide.contributions, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(narrow.bias, wide.bias, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(wide.contributions, forward.contributions, atol=1e-5, rtol=1e-4)


def test_groups_pull_a_blocks_values_apart_with_the_same_gradients():
    """Values of one block in batches of their own (by key) give the gradients of one batch,
    in the values' order; a key per value is required."""
    blocks = _blocks(depth=3)
    x = torch.randn(2, 3, 6, requires_grad=True)
    outs, ins, current = [], [], x
    for block in blocks:
        ins.append(current)
        outs.append(current + block(current))
        current = outs[-1].detach().requires_grad_(True)
    weights = torch.randn(5, 3, 6)
    values = [(2, (outs[2] * weights[0]).sum((1, 2))), (1, (outs[1] * weights[1]).sum((1, 2))),
              (2, (outs[2] * weights[2]).sum((1, 2))), (2, (outs[2] * weights[3]).sum((1, 2))),
              (0, (outs[0] * weights[4]).sum((1, 2)))]
    together = swept_gradients(outs, ins, values, 100)
    for keys in (["a", "a", "b", "a", "c"], list(range(5))):
        for limit in (2, 100):
            apart = swept_gradients(outs, ins, values, limit, groups=keys)
            for got, want in zip(apart, together):
                torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="one key per value"):
        swept_gradients(outs, ins, values, 100, groups=["a"])


def test_a_sweep_on_the_cpu_keeps_its_ff_activations_under_the_cap():
    """On a CPU a sweep carries at most as many read-outs as keep one batched FF activation
    within ``CPU_SWEEP_BYTES``, and at least one."""
    from captum_ffb.engine.whole import CPU_SWEEP_BYTES

    model = tiny_task_model("llama")
    engine = NormDecomposition(model).engine
    ff = int(model.config.intermediate_size)
    for n in (8, 4096, 10**5):
        inputs = torch.zeros(1, n, int(model.config.hidden_size))
        limit = engine.sweep_limit(inputs)
        assert limit >= 1
        assert limit == 1 or limit * n * ff * 4 <= CPU_SWEEP_BYTES
    assert engine.sweep_limit(torch.zeros(1, 8, int(model.config.hidden_size))) > 1
