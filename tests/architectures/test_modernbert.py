"""ModernBERT's particulars: no attention norm in its first layer (an identity), a norm inside
its classifier head, and the transformers versions whose ModernBERT calls the attention
interface."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.architectures import get_architecture
from captum_ffb.core import versions
from captum_ffb.core.versions import UnsupportedVersionError
from captum_ffb.engine.model import find_blocks
from tests.models import TINY_MODELS, tiny_task_model, token_ids


def test_the_first_layer_has_no_attention_norm_and_the_others_have_one():
    model = TINY_MODELS["modernbert"].build()
    blocks = find_blocks(model)
    assert isinstance(blocks[0].attn_norm, torch.nn.Identity)
    nd = NormDecomposition(tiny_task_model("modernbert", "sequence_classification"))
    contributions, bias, delta = nd.attribute(token_ids(), target=1, return_bias=True,
                                              return_convergence_delta=True)
    assert float(delta.max()) < 1e-5 * float((contributions.sum(1) + bias).abs().max())


def test_older_transformers_are_refused_in_one_line(monkeypatch):
    model = TINY_MODELS["modernbert"].build()
    monkeypatch.setattr(versions, "installed_version", lambda name: "5.0.0")
    with pytest.raises(UnsupportedVersionError, match=r"^modernbert: .* from transformers 5\.1\.0 on, not in "
                                                      r"transformers 5\.0\.0 .*transformers>=5\.1\.0,<"):
        get_architecture("modernbert").check_config(model.config)


def test_a_classifier_that_pools_by_the_mean_is_refused():
    model = tiny_task_model("modernbert", "sequence_classification")
    model.config.classifier_pooling = "mean"
    with pytest.raises(ValueError, match="pools the positions"):
        NormDecomposition(model)
