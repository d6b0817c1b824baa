"""Tiny randomly initialised models of every registered family, for the test suite."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

VOCAB = 60


@dataclass(frozen=True)
class TinyModel:
    """A factory for one tiny model, and where its blocks and sub-modules live."""

    name: str
    build: Callable[[], nn.Module]
    blocks: Callable[[nn.Module], nn.ModuleList]
    causal: bool
    # scope -> (path from the block, "input" | "output"), or a list of those to add up: the
    # real tensor the scope explains ("" is the block itself)
    references: dict[str, tuple[str, str] | list[tuple[str, str]]]
    final_norm: bool = False  # a norm after the last block (Pre-LN decoders)


def _seeded(factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        model = factory().eval()
        _randomise_norms(model)
        return model

    return build


def _randomise_norms(model: nn.Module) -> None:
    """Random γ and β (and MoE routers) so that every component is non-trivial."""
    with torch.no_grad():
        for module in model.modules():
            name = type(module).__name__
            if isinstance(module, nn.LayerNorm) and module.weight is not None:
                module.weight.uniform_(0.5, 1.5)
                if module.bias is not None:
                    module.bias.uniform_(-0.2, 0.2)
            elif name.endswith("RMSNorm") and getattr(module, "weight", None) is not None:
                module.weight.uniform_(0.5, 1.5)
            elif name.endswith("TopKRouter"):
                module.weight.normal_(0, 0.5)


def _bert_like(config_cls, model_cls, **extra) -> Callable[[], nn.Module]:
    def factory() -> nn.Module:
        config = config_cls(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, **extra,
        )
        return model_cls(config)

    return _seeded(factory)


POST_LN_REFS = {
    "Atb": ("attention.output.LayerNorm", "output"),
    "AtbFf": ("output.dense", "output"),
    "AtbFfRes": ("output.LayerNorm", "input"),
    "AtbFfResLn": ("", "output"),
}


def tiny_models() -> list[TinyModel]:
    from transformers import (
        BertConfig,
        BertModel,
        CamembertConfig,
        CamembertModel,
        DistilBertConfig,
        DistilBertModel,
        ElectraConfig,
        ElectraModel,
        GPT2Config,
        GPT2Model,
        OPTConfig,
        OPTModel,
        RobertaConfig,
        RobertaModel,
        XLMRobertaConfig,
        XLMRobertaModel,
    )

    def distilbert() -> nn.Module:
        return DistilBertModel(DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
            max_position_embeddings=64,
        ))

    def gpt2() -> nn.Module:
        return GPT2Model(GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
            bos_token_id=0, eos_token_id=0,
        ))

    def opt(pre: bool) -> Callable[[], nn.Module]:
        def factory() -> nn.Module:
            return OPTModel(OPTConfig(
                vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32,
                do_layer_norm_before=pre, pad_token_id=1, bos_token_id=0, eos_token_id=0,
            ))

        return factory

    pre_ln_gpt2 = {
        "Atb": ("ln_2", "input"), "AtbLn": ("ln_2", "output"),
        "AtbLnFf": ("mlp.c_proj", "output"), "AtbLnFfRes": ("", "output"),
    }
    pre_ln_opt = {
        "Atb": ("final_layer_norm", "input"), "AtbLn": ("final_layer_norm", "output"),
        "AtbLnFf": ("fc2", "output"), "AtbLnFfRes": ("", "output"),
    }
    post_ln_opt = {
        "Atb": ("self_attn_layer_norm", "output"), "AtbFf": ("fc2", "output"),
        "AtbFfRes": ("final_layer_norm", "input"), "AtbFfResLn": ("", "output"),
    }
    post_ln_distil = {
        "Atb": ("sa_layer_norm", "output"), "AtbFf": ("ffn.lin2", "output"),
        "AtbFfRes": ("output_layer_norm", "input"), "AtbFfResLn": ("", "output"),
    }
    llama_refs = {
        "Atb": ("post_attention_layernorm", "input"), "AtbLn": ("post_attention_layernorm", "output"),
        "AtbLnFf": ("mlp", "output"), "AtbLnFfRes": ("", "output"),
    }
    sandwich_refs = {
        "Atb": ("pre_feedforward_layernorm", "input"), "AtbLn": ("pre_feedforward_layernorm", "output"),
        "AtbLnFf": ("post_feedforward_layernorm", "output"), "AtbLnFfRes": ("", "output"),
    }

    def parallel_refs(attention: str, ff: str) -> dict:
        return {"Atb": [("", "input"), (attention, "output")], "LnFf": (ff, "output"), "AtbLnFfRes": ("", "output")}

    def decoder(config_cls, model_cls, **extra) -> Callable[[], nn.Module]:
        def factory() -> nn.Module:
            fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          pad_token_id=0, bos_token_id=0, eos_token_id=0)
            fields.update(extra)
            return model_cls(config_cls(**fields))

        return _seeded(factory)

    from transformers import (
        Gemma2Config,
        Gemma2Model,
        Gemma3TextConfig,
        Gemma3TextModel,
        GemmaConfig,
        GemmaModel,
        GPTJConfig,
        GPTJModel,
        GPTNeoXConfig,
        GPTNeoXModel,
        LlamaConfig,
        LlamaModel,
        MistralConfig,
        MistralModel,
        MixtralConfig,
        MixtralModel,
        Olmo2Config,
        Olmo2Model,
        OlmoConfig,
        OlmoModel,
        Phi3Config,
        Phi3Model,
        PhiConfig,
        PhiModel,
        Qwen2Config,
        Qwen2Model,
        Qwen2MoeConfig,
        Qwen2MoeModel,
        Qwen3Config,
        Qwen3Model,
    )

    def gptj() -> nn.Module:
        return GPTJModel(GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                    n_positions=64, bos_token_id=0, eos_token_id=0))

    olmo2_refs = {
        "Atb": ("mlp", "input"), "AtbLn": ("mlp", "input"),
        "AtbLnFf": ("post_feedforward_layernorm", "output"), "AtbLnFfRes": ("", "output"),
    }
    modern = [
        TinyModel("llama", decoder(LlamaConfig, LlamaModel), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("mistral", decoder(MistralConfig, MistralModel, sliding_window=4), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("qwen2", decoder(Qwen2Config, Qwen2Model), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("qwen3", decoder(Qwen3Config, Qwen3Model, head_dim=8), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("gemma", decoder(GemmaConfig, GemmaModel, head_dim=8, num_key_value_heads=1, hidden_activation="gelu_pytorch_tanh"), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("gemma2", decoder(Gemma2Config, Gemma2Model, head_dim=8, sliding_window=4, attn_logit_softcapping=5.0, query_pre_attn_scalar=8), lambda m: m.layers, True, sandwich_refs, final_norm=True),
        TinyModel("gemma3_text", decoder(Gemma3TextConfig, Gemma3TextModel, head_dim=8, sliding_window=4, query_pre_attn_scalar=8, layer_types=["sliding_attention", "full_attention"]), lambda m: m.layers, True, sandwich_refs, final_norm=True),
        TinyModel("gpt_neox", decoder(GPTNeoXConfig, GPTNeoXModel, rotary_pct=0.5, num_key_value_heads=None), lambda m: m.layers, True, parallel_refs("attention", "mlp"), final_norm=True),
        TinyModel("gpt_neox-sequential", decoder(GPTNeoXConfig, GPTNeoXModel, rotary_pct=0.5, num_key_value_heads=None, use_parallel_residual=False), lambda m: m.layers, True,
                  {"Atb": ("post_attention_layernorm", "input"), "AtbLn": ("post_attention_layernorm", "output"), "AtbLnFf": ("mlp", "output"), "AtbLnFfRes": ("", "output")}, final_norm=True),
        TinyModel("gptj", _seeded(gptj), lambda m: m.h, True, parallel_refs("attn", "mlp"), final_norm=True),
        TinyModel("phi", decoder(PhiConfig, PhiModel, partial_rotary_factor=0.5, num_key_value_heads=4), lambda m: m.layers, True, parallel_refs("self_attn", "mlp"), final_norm=True),
        TinyModel("phi3", decoder(Phi3Config, Phi3Model, head_dim=8, num_key_value_heads=2, pad_token_id=0), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("olmo", decoder(OlmoConfig, OlmoModel), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("olmo2", decoder(Olmo2Config, Olmo2Model), lambda m: m.layers, True, olmo2_refs, final_norm=True),
        TinyModel("mixtral", decoder(MixtralConfig, MixtralModel, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("qwen2_moe", decoder(Qwen2MoeConfig, Qwen2MoeModel, moe_intermediate_size=24, shared_expert_intermediate_size=40, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1]), lambda m: m.layers, True, llama_refs, final_norm=True),
    ]
    return modern + [
        TinyModel("bert", _bert_like(BertConfig, BertModel), lambda m: m.encoder.layer, False, POST_LN_REFS),
        TinyModel("roberta", _bert_like(RobertaConfig, RobertaModel, pad_token_id=1), lambda m: m.encoder.layer, False, POST_LN_REFS),
        TinyModel("xlm-roberta", _bert_like(XLMRobertaConfig, XLMRobertaModel, pad_token_id=1), lambda m: m.encoder.layer, False, POST_LN_REFS),
        TinyModel("camembert", _bert_like(CamembertConfig, CamembertModel, pad_token_id=1), lambda m: m.encoder.layer, False, POST_LN_REFS),
        TinyModel("electra", _bert_like(ElectraConfig, ElectraModel, embedding_size=32), lambda m: m.encoder.layer, False, POST_LN_REFS),
        TinyModel("distilbert", _seeded(distilbert), lambda m: m.transformer.layer, False, post_ln_distil),
        TinyModel("gpt2", _seeded(gpt2), lambda m: m.h, True, pre_ln_gpt2, final_norm=True),
        TinyModel("opt", _seeded(opt(True)), lambda m: m.decoder.layers, True, pre_ln_opt, final_norm=True),
        TinyModel("opt-post-ln", _seeded(opt(False)), lambda m: m.decoder.layers, True, post_ln_opt),
    ]


TINY_MODELS = {model.name: model for model in tiny_models()}


def tiny_task_model(name: str, task: str = "causal_lm", num_labels: int = 3) -> nn.Module:
    """The tiny model ``name`` with a head (``"causal_lm"`` or ``"sequence_classification"``),
    norms and every bias randomised so that the bias player is not trivially zero."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = TINY_MODELS[name].build().config
    torch.manual_seed(0)
    if task == "causal_lm":
        model = AutoModelForCausalLM.from_config(config)
    else:
        config.num_labels = num_labels
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = 0
        model = AutoModelForSequenceClassification.from_config(config)
    model.eval()
    _randomise_norms(model)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.1)
    return model


def token_ids(batch: int = 2, n: int = 9, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, n), generator=generator)


def padded_pair(side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, slice]:
    """Two sequences of 7 token ids whose second row is 4 real tokens padded on ``side``
    ("left" or "right"): ``(padded ids, attention mask, those 4 ids alone (1, 4), the real
    columns of the second row)``."""
    ids = token_ids(batch=2, n=7)
    short = ids[1:, :4]
    padded = ids.clone()
    mask = torch.ones_like(ids)
    if side == "right":
        padded[1, 4:] = 0
        mask[1, 4:] = 0
        return padded, mask, short, slice(0, 4)
    padded[1] = torch.cat([torch.zeros(3, dtype=ids.dtype), short[0]])
    mask[1, :3] = 0
    return padded, mask, short, slice(3, 7)


def capture_references(model: nn.Module, block: nn.Module, refs: dict[str, tuple[str, str]], **forward_kwargs) -> dict[str, torch.Tensor]:
    """The real tensor behind each scope, taken with the test's own hooks."""
    found: dict[tuple[str, str], torch.Tensor] = {}
    handles = []
    sources = {scope: ([ref] if isinstance(ref, tuple) else list(ref)) for scope, ref in refs.items()}
    for path, which in {src for srcs in sources.values() for src in srcs}:
        module = block.get_submodule(path) if path else block

        def hook(mod, args, kwargs, output, key=(path, which)):
            value = (args[0] if args else kwargs["hidden_states"]) if key[1] == "input" else output
            value = value[0] if isinstance(value, tuple) else value
            found.setdefault(key, value.detach())

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(**forward_kwargs)
    finally:
        for handle in handles:
            handle.remove()
    batch = forward_kwargs["input_ids"].shape[0]
    return {
        scope: sum(found[src].reshape(batch, -1, found[src].shape[-1]) for src in srcs)
        for scope, srcs in sources.items()
    }
