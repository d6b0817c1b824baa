"""A new decoder family is one registration: a Llama-like model under a model type of its
own, registered here and nowhere else, decomposes layer by layer and as a whole model (LM and
classifier heads) exactly as the same weights do under ``llama``."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    LlamaModel,
)

from captum_ffb import (
    ArchitectureSpec,
    LayerNormDecomposition,
    NormDecomposition,
    Projection,
    register_architecture,
)
from captum_ffb.architectures import registry
from tests.models import VOCAB, token_ids


class RenamedLlamaConfig(LlamaConfig):
    """Llama under a model type no module of the package names."""

    model_type = "renamed_llama"


class RenamedLlamaModel(LlamaModel):
    config_class = RenamedLlamaConfig


class RenamedLlamaForCausalLM(LlamaForCausalLM):
    config_class = RenamedLlamaConfig


class RenamedLlamaForSequenceClassification(LlamaForSequenceClassification):
    config_class = RenamedLlamaConfig


# transformers' side of a new family (its classifier builds its base through AutoModel)
AutoConfig.register("renamed_llama", RenamedLlamaConfig, exist_ok=True)
AutoModel.register(RenamedLlamaConfig, RenamedLlamaModel, exist_ok=True)

#: The whole registration of the new family.
RENAMED_LLAMA = ArchitectureSpec(
    chain="pre_ln", blocks="layers", final_norm="norm", causal=True,
    attention="self_attn", value=Projection("self_attn.v_proj"),
    attention_output=Projection("self_attn.o_proj"),
    norm1="input_layernorm", norm2="post_attention_layernorm",
    ff_in=Projection("mlp.up_proj"), ff_gate=Projection("mlp.gate_proj"),
    activation="mlp.act_fn", ff_out=Projection("mlp.down_proj"), ff_output="mlp", norm="rms_norm",
    description="a renamed Llama",
)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_architecture("renamed_llama", RENAMED_LLAMA)


def _pair(renamed_class, model_class, **extra) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same random weights under ``renamed_llama`` and under ``llama``."""
    fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  pad_token_id=0, bos_token_id=0, eos_token_id=0, **extra)
    torch.manual_seed(0)
    renamed = renamed_class(RenamedLlamaConfig(**fields)).eval()
    with torch.no_grad():
        for name, parameter in renamed.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                parameter.uniform_(0.5, 1.5)
    llama = model_class(LlamaConfig(**fields)).eval()
    llama.load_state_dict(renamed.state_dict())
    assert renamed.config.model_type == "renamed_llama" and llama.config.model_type == "llama"
    return renamed, llama


@pytest.mark.usefixtures("registered")
def test_layer_maps_of_a_new_family_equal_the_known_one():
    renamed, llama = _pair(RenamedLlamaForCausalLM, LlamaForCausalLM)
    ids = token_ids()
    maps, delta = LayerNormDecomposition(renamed, renamed.model.layers[1]).attribute(
        ids, scope="AtbLnFfRes", return_convergence_delta=True)
    assert float(delta.abs().max()) < 1e-4
    expected = LayerNormDecomposition(llama, llama.model.layers[1]).attribute(ids, scope="AtbLnFfRes")
    torch.testing.assert_close(maps, expected, rtol=0, atol=0)


@pytest.mark.usefixtures("registered")
@pytest.mark.parametrize("renamed_class, model_class, target", [
    (RenamedLlamaForCausalLM, LlamaForCausalLM, 7),
    (RenamedLlamaForSequenceClassification, LlamaForSequenceClassification, 1),
])
@pytest.mark.parametrize("route", ["backward", "forward"])
def test_whole_model_of_a_new_family_equals_the_known_one(renamed_class, model_class, target, route):
    extra = {"num_labels": 3} if model_class is LlamaForSequenceClassification else {}
    renamed, llama = _pair(renamed_class, model_class, **extra)
    ids = token_ids()
    with torch.no_grad():
        logits = renamed(input_ids=ids).logits
    real = logits[:, -1, target] if logits.dim() == 3 else logits[:, target]
    contributions, bias, delta = NormDecomposition(renamed).attribute(
        ids, target=target, route=route, return_bias=True, return_convergence_delta=True)
    torch.testing.assert_close(contributions.sum(1) + bias, real, atol=1e-5, rtol=1e-5)
    assert float(delta.max()) < 1e-4
    expected = NormDecomposition(llama).attribute(ids, target=target, route=route)
    torch.testing.assert_close(contributions, expected, rtol=0, atol=0)
