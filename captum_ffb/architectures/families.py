"""Registrations of the supported model families: one declarative spec each."""

from __future__ import annotations

from dataclasses import replace

from captum_ffb._private import effective_attention_implementation
from captum_ffb.architectures.registry import register_architecture
from captum_ffb.architectures.spec import ArchitectureSpec, MixtureOfExperts, Projection


def _is_decoder(config) -> bool:
    """when the config says is_decoder"""
    return bool(getattr(config, "is_decoder", False))


# BERT and the families that kept its module layout.
BERT = ArchitectureSpec(
    chain="post_ln",
    blocks="encoder.layer",
    causal=_is_decoder,
    attention="attention.self",
    value=Projection("attention.self.value"),
    attention_output=Projection("attention.output.dense"),
    norm1="attention.output.LayerNorm",
    norm2="output.LayerNorm",
    ff_in=Projection("intermediate.dense"),
    activation="intermediate.intermediate_act_fn",
    ff_out=Projection("output.dense"),
    description="Post-LN encoder, LayerNorm, GELU",
)

DISTILBERT = ArchitectureSpec(
    chain="post_ln",
    blocks="transformer.layer",
    causal=False,
    attention="attention",
    value=Projection("attention.v_lin"),
    attention_output=Projection("attention.out_lin"),
    norm1="sa_layer_norm",
    norm2="output_layer_norm",
    ff_in=Projection("ffn.lin1"),
    activation="ffn.activation",
    ff_out=Projection("ffn.lin2"),
    description="Post-LN encoder, LayerNorm, GELU",
)

GPT2 = ArchitectureSpec(
    chain="pre_ln",
    blocks="h",
    final_norm="ln_f",
    causal=True,
    attention="attn",
    value=Projection("attn.c_attn", part=2, parts=3),
    attention_output=Projection("attn.c_proj"),
    norm1="ln_1",
    norm2="ln_2",
    ff_in=Projection("mlp.c_fc"),
    activation="mlp.act",
    ff_out=Projection("mlp.c_proj"),
    description="Pre-LN decoder, LayerNorm, gelu_new, fused QKV (Conv1D)",
)


def _opt_chain(config) -> str:
    """pre_ln; post_ln when do_layer_norm_before=False (OPT-350m)"""
    return "pre_ln" if getattr(config, "do_layer_norm_before", True) else "post_ln"


OPT = ArchitectureSpec(
    chain=_opt_chain,
    blocks="decoder.layers",
    final_norm="decoder.final_layer_norm",
    causal=True,
    attention="self_attn",
    value=Projection("self_attn.v_proj"),
    attention_output=Projection("self_attn.out_proj"),
    norm1="self_attn_layer_norm",
    norm2="final_layer_norm",
    ff_in=Projection("fc1"),
    activation="activation_fn",
    ff_out=Projection("fc2"),
    description="Pre-LN decoder (Post-LN when do_layer_norm_before=False), LayerNorm, ReLU",
)

for _model_type in ("bert", "roberta", "xlm-roberta", "camembert", "electra"):
    register_architecture(_model_type, BERT)
register_architecture("distilbert", DISTILBERT)


register_architecture("modernbert", ArchitectureSpec(
    chain="pre_ln",
    blocks="layers",
    final_norm="final_norm",
    causal=False,
    attention="attn",
    value=Projection("attn.Wqkv", part=2, parts=3),
    attention_output=Projection("attn.Wo"),
    norm1="attn_norm",  # an identity in the first layer: no norm there
    norm2="mlp_norm",
    ff_in=Projection("mlp.Wi", part=1, parts=2),
    ff_gate=Projection("mlp.Wi", part=0, parts=2),
    activation="mlp.act",
    ff_out=Projection("mlp.Wo"),
    ff_output="mlp",
    norm="layer_norm",
    transformers_since="5.1.0",  # before, ModernBERT ran its own attention on unpadded sequences
    description="Pre-LN encoder (no attention norm in the first layer), LayerNorm, GeGLU from a "
    "fused Wi, fused Wqkv, RoPE, alternating local and global attention",
))
register_architecture("gpt2", GPT2)
register_architecture("opt", OPT)


# --------------------------------------------------------------------------- Llama family
def _llama_like(description: str, **changes) -> ArchitectureSpec:
    """Pre-RMSNorm decoder with a gated (SwiGLU / GeGLU) MLP, rotary attention and GQA."""
    fields = dict(
        chain="pre_ln",
        blocks="layers",
        final_norm="norm",
        causal=True,
        attention="self_attn",
        value=Projection("self_attn.v_proj"),
        attention_output=Projection("self_attn.o_proj"),
        norm1="input_layernorm",
        norm2="post_attention_layernorm",
        ff_in=Projection("mlp.up_proj"),
        ff_gate=Projection("mlp.gate_proj"),
        activation="mlp.act_fn",
        ff_out=Projection("mlp.down_proj"),
        ff_output="mlp",
        norm="rms_norm",
        description=description,
    )
    fields.update(changes)
    return ArchitectureSpec(**fields)


LLAMA = _llama_like("Pre-LN decoder, RMSNorm, SwiGLU, RoPE, GQA")
register_architecture("llama", LLAMA)
register_architecture("mistral", _llama_like("Pre-LN decoder, RMSNorm, SwiGLU, RoPE, GQA, sliding window"))
register_architecture("qwen2", _llama_like("Pre-LN decoder, RMSNorm, SwiGLU, RoPE, GQA, QKV bias"))
register_architecture("qwen3", _llama_like("Pre-LN decoder, RMSNorm, SwiGLU, RoPE, GQA, QK-norm"))
register_architecture("granite", _llama_like(
    "Pre-LN decoder, RMSNorm, SwiGLU, RoPE, GQA; branches scaled as they join the residual "
    "stream (residual_multiplier), scaled embeddings, attention and logits",
    residual_scale=lambda config: float(config.residual_multiplier),
))
register_architecture("starcoder2", _llama_like(
    "Pre-LN decoder, LayerNorm, GELU MLP (c_fc, c_proj), biases, RoPE, GQA, sliding window",
    norm="layer_norm",
    ff_in=Projection("mlp.c_fc"),
    ff_gate=None,
    activation="mlp.act",
    ff_out=Projection("mlp.c_proj"),
))
register_architecture(
    "gemma",
    _llama_like("Pre-LN decoder, RMSNorm with weight 1 + w, GeGLU (tanh GELU), RoPE, MQA",
                norm_weight_offset=1.0),
)
_GEMMA2 = _llama_like(
    "Pre-LN decoder with post-norms on both branches, RMSNorm 1 + w, GeGLU, soft-capping, "
    "sliding window",
    norm2="pre_feedforward_layernorm",
    attention_post_norm="post_attention_layernorm",
    ff_post_norm="post_feedforward_layernorm",
    norm_weight_offset=1.0,
)
register_architecture("gemma2", _GEMMA2)
register_architecture(
    "gemma3_text",
    replace(_GEMMA2, description="as gemma2, with QK-norm and local/global attention layers"),
)

# --------------------------------------------------------------------------- parallel blocks
def _neox_chain(config) -> str:
    """parallel; pre_ln when use_parallel_residual=False"""
    return "parallel" if getattr(config, "use_parallel_residual", True) else "pre_ln"


register_architecture("gpt_neox", ArchitectureSpec(
    chain=_neox_chain,
    blocks="layers",
    final_norm="final_layer_norm",
    causal=True,
    attention="attention",
    value=Projection("attention.query_key_value", part=2, parts=3, groups="num_attention_heads"),
    attention_output=Projection("attention.dense"),
    norm1="input_layernorm",
    norm2="post_attention_layernorm",
    ff_in=Projection("mlp.dense_h_to_4h"),
    activation="mlp.act",
    ff_out=Projection("mlp.dense_4h_to_h"),
    description="parallel attention and FF (sequential Pre-LN when use_parallel_residual=False), "
    "LayerNorm, GELU, partial RoPE, fused per-head QKV",
))
register_architecture("gptj", ArchitectureSpec(
    chain="parallel",
    blocks="h",
    final_norm="ln_f",
    causal=True,
    attention="attn",
    attention_method="_attn",
    value=Projection("attn.v_proj"),
    attention_output=Projection("attn.out_proj"),
    norm1="ln_1",
    norm2="ln_1",
    ff_in=Projection("mlp.fc_in"),
    activation="mlp.act",
    ff_out=Projection("mlp.fc_out"),
    description="parallel attention and FF sharing one LayerNorm, gelu_new, RoPE",
))
register_architecture("phi", ArchitectureSpec(
    chain="parallel",
    blocks="layers",
    final_norm="final_layernorm",
    causal=True,
    attention="self_attn",
    value=Projection("self_attn.v_proj"),
    attention_output=Projection("self_attn.dense"),
    norm1="input_layernorm",
    norm2="input_layernorm",
    ff_in=Projection("mlp.fc1"),
    activation="mlp.activation_fn",
    ff_out=Projection("mlp.fc2"),
    description="parallel attention and FF sharing one LayerNorm, gelu_new, partial RoPE",
))

register_architecture("cohere", _llama_like(
    "parallel attention and SwiGLU FF sharing one LayerNorm without bias, interleaved RoPE, "
    "GQA, optional QK-norm, scaled logits",
    chain="parallel",
    norm2="input_layernorm",
    norm="layer_norm",
))

# --------------------------------------------------------------------------- mixtures of experts
register_architecture("mixtral", ArchitectureSpec(
    chain="pre_ln",
    blocks="layers",
    final_norm="norm",
    causal=True,
    attention="self_attn",
    value=Projection("self_attn.v_proj"),
    attention_output=Projection("self_attn.o_proj"),
    norm1="input_layernorm",
    norm2="post_attention_layernorm",
    moe=MixtureOfExperts(module="mlp", router="mlp.gate", experts="mlp.experts"),
    norm="rms_norm",
    description="Pre-LN decoder, RMSNorm, top-k mixture of SwiGLU experts, RoPE, GQA",
))
register_architecture("qwen2_moe", _llama_like(
    "Pre-LN decoder, RMSNorm, top-k mixture of SwiGLU experts plus a sigmoid-gated shared "
    "expert (dense SwiGLU in mlp-only layers), RoPE, GQA",
    moe=MixtureOfExperts(
        module="mlp",
        router="mlp.gate",
        experts="mlp.experts",
        shared_expert="mlp.shared_expert",
        shared_expert_gate="mlp.shared_expert_gate",
    ),
))

register_architecture("qwen3_moe", _llama_like(
    "Pre-LN decoder, RMSNorm, top-k mixture of SwiGLU experts (dense SwiGLU in mlp-only "
    "layers), RoPE, GQA, QK-norm",
    moe=MixtureOfExperts(module="mlp", router="mlp.gate", experts="mlp.experts"),
))

# --------------------------------------------------------------------------- Phi-3, OLMo
def _phi3_value_columns(config) -> tuple[int, int]:
    """The value slice of Phi-3's fused ``qkv_proj``: ``[q (H·e) | k (H_kv·e) | v (H_kv·e)]``."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = (config.num_key_value_heads or config.num_attention_heads) * head_dim
    start = config.num_attention_heads * head_dim + kv
    return start, start + kv


register_architecture("phi3", _llama_like(
    "Pre-LN decoder, RMSNorm, SwiGLU with fused gate_up_proj, fused qkv_proj with unequal "
    "parts (GQA), RoPE",
    value=Projection("self_attn.qkv_proj", columns=_phi3_value_columns),
    ff_in=Projection("mlp.gate_up_proj", part=1, parts=2),
    ff_gate=Projection("mlp.gate_up_proj", part=0, parts=2),
    activation="mlp.activation_fn",
))
register_architecture("olmo", _llama_like(
    "Pre-LN decoder, LayerNorm without parameters (ε = 1e-5, fixed in its code), SwiGLU, "
    "RoPE; value clipping (clip_qkv) is not supported",
    norm="layer_norm",
    norm_eps=1e-5,
    unsupported=lambda config: (
        "its config clips q, k and v (clip_qkv), which is not linear in the values"
        if getattr(config, "clip_qkv", None) is not None else None
    ),
))
register_architecture("olmo2", _llama_like(
    "decoder normalising the outputs of attention and FF (RMSNorm, no pre-norms), QK-norm, "
    "SwiGLU, RoPE",
    norm1=None,
    norm2=None,
    attention_post_norm="post_attention_layernorm",
    ff_post_norm="post_feedforward_layernorm",
))


def _deberta_unsupported(config) -> str | None:
    """a convolution joining the first layer's output (DeBERTa-v2-xlarge's conv_kernel_size)"""
    if (getattr(config, "conv_kernel_size", 0) or 0) > 0:
        return "conv_kernel_size > 0 (a convolution joins the first layer's output)"
    return None


# DeBERTa-v2/v3: BERT's layout; the disentangled (content and relative-position) scores only
# shape the probabilities, which its attention computes inline and are read from its softmax.
register_architecture("deberta-v2", replace(
    BERT,
    causal=False,
    value=Projection("attention.self.value_proj"),
    unsupported=_deberta_unsupported,
    description="Post-LN encoder, LayerNorm, GELU, disentangled attention (DeBERTa-v2/v3)",
))


def _falcon_chain(config) -> str:
    """parallel where parallel_attn (Falcon-7B, every new-architecture model), else pre_ln"""
    return "parallel" if getattr(config, "parallel_attn", True) else "pre_ln"


def _falcon_value_columns(config) -> list[int]:
    """The value columns of Falcon's fused ``query_key_value``, in its three layouts."""
    heads = int(config.num_attention_heads)
    width = int(config.hidden_size) // heads
    if getattr(config, "new_decoder_architecture", False):  # per key/value group: its queries, k, v
        groups = int(config.num_kv_heads)
        per = heads // groups + 2
        return [g * per * width + (per - 1) * width + c for g in range(groups) for c in range(width)]
    if getattr(config, "multi_query", False):  # all queries, one key, one value
        return list(range((heads + 1) * width, (heads + 2) * width))
    return [h * 3 * width + 2 * width + c for h in range(heads) for c in range(width)]  # per head q, k, v


def _falcon_unsupported(config) -> str | None:
    """a new-architecture model without parallel attention (its blocks are incomplete), and
    ALiBi under any attention but eager"""
    if getattr(config, "new_decoder_architecture", False) and not getattr(config, "parallel_attn", True):
        return "new_decoder_architecture=True with parallel_attn=False"
    # transformers 5.24.0: with ALiBi, Falcon's sdpa path and its eager path (whose softmax
    # the decomposition reads) compute different attention (0.08 apart on a tiny model)
    implementation = effective_attention_implementation(config)
    if getattr(config, "alibi", False) and implementation not in (None, "eager"):
        return (f"ALiBi under attn_implementation={implementation!r}: transformers' Falcon computes other "
                "attention there than in its eager code; load the model with attn_implementation='eager'")
    return None


_FALCON_SEQUENTIAL = ArchitectureSpec(
    chain=_falcon_chain,
    blocks="h",
    final_norm="ln_f",
    causal=True,
    attention="self_attention",
    value=Projection("self_attention.query_key_value", columns=_falcon_value_columns),
    attention_output=Projection("self_attention.dense"),
    norm1="input_layernorm",
    norm2="post_attention_layernorm",
    ff_in=Projection("mlp.dense_h_to_4h"),
    activation="mlp.act",
    ff_out=Projection("mlp.dense_4h_to_h"),
    unsupported=_falcon_unsupported,
    description="decoder, LayerNorm, GELU, rotary or ALiBi, multi-query or grouped fused QKV; parallel "
                "(one or two LayerNorms) or Pre-LN",
)
# Its probabilities come from its softmax (its own attention code, run eagerly while recorded);
# parallel blocks with one shared LayerNorm, and the new architecture's two (ln_attn, ln_mlp).
register_architecture("falcon", replace(_FALCON_SEQUENTIAL, alternative=replace(
    _FALCON_SEQUENTIAL, norm2="input_layernorm",
    alternative=replace(_FALCON_SEQUENTIAL, norm1="ln_attn", norm2="ln_mlp"))))


def _bloom_unsupported(config) -> str | None:
    """settings whose residual or projections the chains do not follow"""
    if getattr(config, "apply_residual_connection_post_layernorm", False):
        return "apply_residual_connection_post_layernorm=True (the residual is the norm's output)"
    if getattr(config, "pretraining_tp", 1) > 1 and getattr(config, "slow_but_exact", False):
        return "slow_but_exact=True with pretraining_tp > 1 (projections split into slices)"
    return None


# BLOOM computes its probabilities inline (ALiBi): they are read from its softmax.
register_architecture("bloom", ArchitectureSpec(
    chain="pre_ln",
    blocks="h",
    final_norm="ln_f",
    causal=True,
    attention="self_attention",
    value=Projection("self_attention.query_key_value", part=2, parts=3, groups="n_head"),
    attention_output=Projection("self_attention.dense"),
    norm1="input_layernorm",
    norm2="post_attention_layernorm",
    ff_in=Projection("mlp.dense_h_to_4h"),
    activation="mlp.gelu_impl",
    ff_out=Projection("mlp.dense_4h_to_h"),
    unsupported=_bloom_unsupported,
    description="Pre-LN decoder, LayerNorm, GELU (tanh), fused per-head QKV, ALiBi",
))


# --------------------------------------------------------------------------- encoder–decoders
def _seq2seq(chain: str, final: str | None, description: str) -> ArchitectureSpec:
    """BART's block layout (fairseq's), shared by mBART, Marian, M2M100/NLLB and Whisper:
    the encoder's spec, with the decoder's (its cross-attention ``encoder_attn``) inside."""
    encoder = ArchitectureSpec(
        chain=chain,
        blocks="encoder.layers",
        final_norm=None if final is None else f"encoder.{final}",
        causal=False,
        attention="self_attn",
        value=Projection("self_attn.v_proj"),
        attention_output=Projection("self_attn.out_proj"),
        norm1="self_attn_layer_norm",
        norm2="final_layer_norm",
        ff_in=Projection("fc1"),
        activation="activation_fn",
        ff_out=Projection("fc2"),
        description=description,
    )
    decoder = replace(
        encoder,
        chain=f"{chain}_cross",
        blocks="decoder.layers",
        final_norm=None if final is None else f"decoder.{final}",
        causal=True,
        cross_attention="encoder_attn",
        cross_value=Projection("encoder_attn.v_proj"),
        cross_output=Projection("encoder_attn.out_proj"),
        cross_norm="encoder_attn_layer_norm",
    )
    return replace(encoder, decoder=decoder)


register_architecture("bart", _seq2seq("post_ln", None, "Post-LN encoder–decoder, LayerNorm, GELU"))
register_architecture("marian", _seq2seq(
    "post_ln", None, "Post-LN encoder–decoder, LayerNorm, SiLU/Swish, sinusoidal positions"))
register_architecture("mbart", _seq2seq("pre_ln", "layer_norm", "Pre-LN encoder–decoder, LayerNorm, GELU"))
register_architecture("m2m_100", _seq2seq(
    "pre_ln", "layer_norm", "Pre-LN encoder–decoder (M2M100, NLLB), LayerNorm, ReLU, sinusoidal positions"))
register_architecture("whisper", _seq2seq(
    "pre_ln", "layer_norm", "Pre-LN speech encoder–decoder, LayerNorm, GELU; source players are audio frames"))


def _t5(description: str) -> ArchitectureSpec:
    """T5's blocks: ``layer[0]`` self-attention, (decoder) ``layer[1]`` cross-attention, and
    the FF last; RMSNorm before each, no biases. The FF is ReLU (``wi``) or gated (``wi_0``,
    ``wi_1``; T5 v1.1, Flan-T5, mT5, UMT5): the gated layout is the alternative."""

    def feed_forward(layer: int, gated: bool) -> dict:
        ff = f"layer.{layer}.DenseReluDense"
        return dict(
            norm2=f"layer.{layer}.layer_norm",
            ff_in=Projection(f"{ff}.wi_1" if gated else f"{ff}.wi"),
            ff_gate=Projection(f"{ff}.wi_0") if gated else None,
            activation=f"{ff}.act",
            ff_out=Projection(f"{ff}.wo"),
        )

    encoder = ArchitectureSpec(
        chain="pre_ln",
        blocks="encoder.block",
        final_norm="encoder.final_layer_norm",
        causal=False,
        attention="layer.0.SelfAttention",
        value=Projection("layer.0.SelfAttention.v"),
        attention_output=Projection("layer.0.SelfAttention.o"),
        norm1="layer.0.layer_norm",
        norm="rms_norm",
        description=description,
        **feed_forward(1, gated=False),
    )
    decoder = replace(
        encoder,
        chain="pre_ln_cross",
        blocks="decoder.block",
        final_norm="decoder.final_layer_norm",
        causal=True,
        cross_attention="layer.1.EncDecAttention",
        cross_value=Projection("layer.1.EncDecAttention.v"),
        cross_output=Projection("layer.1.EncDecAttention.o"),
        cross_norm="layer.1.layer_norm",
        **feed_forward(2, gated=False),
    )
    decoder = replace(decoder, alternative=replace(decoder, **feed_forward(2, gated=True)))
    encoder = replace(encoder, alternative=replace(encoder, **feed_forward(1, gated=True)))
    return replace(encoder, decoder=decoder)


for _model_type in ("t5", "mt5", "umt5"):
    register_architecture(_model_type, _t5(
        "Pre-LN encoder–decoder, RMSNorm, ReLU or gated GELU, relative position bias, no biases"))
