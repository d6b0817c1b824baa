"""A block's norms read their ε from the module, the spec or the config (``engine/block.py``)."""

from __future__ import annotations

import pytest
from torch import nn

from captum_ffb import get_architecture
from captum_ffb.architectures import ArchitectureSpec, Projection
from captum_ffb.engine import norm_parameters
from tests.models import TINY_MODELS


def test_eps_is_read_from_the_module_the_spec_or_the_config_never_guessed():
    olmo = TINY_MODELS["olmo"].build()
    norm = olmo.layers[0].input_layernorm
    assert not hasattr(norm, "eps")
    spec = get_architecture("olmo")
    assert norm_parameters(norm, spec, olmo.config)[2] == 1e-5  # from the spec: OLMo's code
    llama = TINY_MODELS["llama"].build()
    llama_spec = get_architecture("llama")
    assert norm_parameters(llama.layers[0].input_layernorm, llama_spec, None)[2] == llama.config.rms_norm_eps

    class NoEpsNorm(nn.Module):
        weight = None

    bare = ArchitectureSpec(chain="pre_ln", attention="a", value=Projection("v"),
                            attention_output=Projection("o"), norm1="n1", norm2="n2",
                            ff_in=Projection("i"), activation="g", ff_out=Projection("o"))
    assert norm_parameters(NoEpsNorm(), bare, type("C", (), {"layer_norm_eps": 1e-7})())[2] == 1e-7
    with pytest.raises(ValueError, match="cannot read the ε of NoEpsNorm"):
        norm_parameters(NoEpsNorm(), bare, None)
