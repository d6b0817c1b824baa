"""Where a model keeps its blocks and the norms that read them (``engine/model.py``): found
from the spec, checked against what the forward pass shows."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from captum_ffb import get_architecture
from captum_ffb.engine import final_norm_of, find_blocks, next_norms
from tests.models import TINY_MODELS, token_ids

NAMES = sorted(TINY_MODELS)


def _task_model(base: nn.Module, causal: bool) -> nn.Module:
    auto = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    torch.manual_seed(0)
    return auto.from_config(base.config)


@pytest.mark.parametrize("name", NAMES)
def test_find_blocks_on_base_and_task_models(name):
    tiny = TINY_MODELS[name]
    base = tiny.build()
    assert find_blocks(base) is tiny.blocks(base)
    wrapped = _task_model(base, tiny.causal)
    blocks = find_blocks(wrapped)
    assert blocks is tiny.blocks(wrapped.base_model)
    assert len(blocks) == len(tiny.blocks(base))


def _norm_reading_last_block(model: nn.Module, blocks: nn.ModuleList) -> nn.Module | None:
    """Found the slow way: the norm outside the blocks whose input is the last block's output."""
    inside = {id(m) for block in blocks for m in block.modules()}
    seen: dict[str, torch.Tensor] = {}

    def keep(key: str, which: str):
        def hook(module, args, output) -> None:  # returns nothing: the output stays
            value = args[0] if which == "input" else output
            seen.setdefault(key, value[0] if isinstance(value, tuple) else value)

        return hook

    handles = [blocks[-1].register_forward_hook(keep("last", "output"))]
    candidates = [m for m in model.modules()
                  if "norm" in type(m).__name__.lower() and id(m) not in inside]
    for k, module in enumerate(candidates):
        handles.append(module.register_forward_hook(keep(f"norm{k}", "input")))
    with torch.no_grad():
        model(input_ids=token_ids())
    for handle in handles:
        handle.remove()
    for k, module in enumerate(candidates):
        if f"norm{k}" in seen and torch.equal(seen[f"norm{k}"], seen["last"]):
            return module
    return None


@pytest.mark.parametrize("name", NAMES)
def test_final_norm_and_next_norms_from_the_spec(name):
    tiny = TINY_MODELS[name]
    model = tiny.build()
    spec = get_architecture(model.config.model_type)
    blocks = tiny.blocks(model)
    expected = _norm_reading_last_block(model, blocks)
    assert final_norm_of(model, spec) is expected
    assert (expected is not None) == tiny.final_norm
    following = next_norms(model, spec, list(blocks))
    assert following[-1] is expected
    norm1 = spec.for_block(blocks[1]).norm1  # the block's layout (Falcon's new architecture: ln_attn)
    if norm1 is not None:
        assert following[0] is blocks[1].get_submodule(norm1)
