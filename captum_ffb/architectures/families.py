"""Registrations of the supported model families: one declarative spec each."""

from __future__ import annotations

from captum_ffb.architectures.registry import register_architecture
from captum_ffb.architectures.spec import ArchitectureSpec, Projection

# BERT and the families that kept its module layout.
BERT = ArchitectureSpec(
    chain="post_ln",
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
    # OPT-350m normalises after each sub-block; the other sizes before.
    return "pre_ln" if getattr(config, "do_layer_norm_before", True) else "post_ln"


OPT = ArchitectureSpec(
    chain=_opt_chain,
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
register_architecture("gpt2", GPT2)
register_architecture("opt", OPT)
