"""Shared fixtures of the baseline tests: tiny models captured once per module."""

from __future__ import annotations

import pytest
import torch

from captum_ffb.baselines import capture_layer
from tests.models import TINY_MODELS, token_ids

#: One Post-LN encoder and one causal Pre-LN decoder cover both chains and both masks.
FAMILIES = ("bert", "gpt2")


def padded_pair(name: str, n: int = 4, extra: int = 2, layer: int = 1):
    """Contexts of the same tokens without and with ``extra`` padded positions."""
    spec = TINY_MODELS[name]
    model = spec.build()
    block = spec.blocks(model)[layer]
    ids = token_ids(1, n, seed=3)
    padded = torch.cat([ids, torch.full((1, extra), 5)], dim=1)
    mask = torch.ones_like(padded)
    mask[:, n:] = 0
    plain = capture_layer(model, block, ids)
    with_padding = capture_layer(model, block, padded, forward_kwargs={"attention_mask": mask})
    return plain, with_padding


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    return padded_pair(request.param)
