"""Declarative architecture specs: where a block keeps its components, and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from captum_ffb.architectures.paths import has_path
from captum_ffb.core import versions

#: A config-dependent value: the value itself, or a function of the model config.
ConfigValue = Callable[[Any], Any]


@dataclass(frozen=True)
class Projection:
    """A linear projection inside a block: an ``nn.Linear`` or a transformers ``Conv1D``.

    Attributes:
        path (str): dotted path from the block, e.g. ``"attention.self.value"``.
        part (int): for fused projections (GPT-2's ``c_attn``), which slice of the output.
        parts (int): into how many equal slices the fused output is split.
        groups (int or str): for fused projections laid out per head (GPT-NeoX's
                    ``query_key_value``: ``[q_h, k_h, v_h]`` for each head ``h``), the number of
                    groups, or the name of the config attribute holding it; slice ``part`` is
                    taken from every group.
        columns (Callable, optional): for fused projections with unequal parts (Phi-3's
                    ``qkv_proj`` with grouped-query attention): a function of the model
                    config returning the ``(start, stop)`` output columns to take, or the list
                    of their indices (Falcon's layouts).
    """

    path: str
    part: int = 0
    parts: int = 1
    groups: int | str = 1
    columns: Callable[[Any], tuple[int, int] | list[int]] | None = None


@dataclass(frozen=True)
class MixtureOfExperts:
    """Where a sparse mixture-of-experts FF keeps its router and experts.

    The experts module stores ``gate_up_proj`` ``(E, 2·I, d)`` (gate rows first) and
    ``down_proj`` ``(E, d, I)`` and has ``act_fn``, as transformers' fused experts do. The
    router returns ``(logits, top-k weights, top-k indices)``; the weights from the real
    forward pass act as fixed coefficients, like attention probabilities.

    Attributes:
        module (str): the whole MoE block (its output is the FF output).
        router (str): the router module.
        experts (str): the experts module.
        shared_expert (str, optional): an always-on gated MLP (Qwen2-MoE).
        shared_expert_gate (str, optional): the linear whose sigmoid scales the shared expert.
    """

    module: str
    router: str
    experts: str
    shared_expert: str | None = None
    shared_expert_gate: str | None = None


@dataclass(frozen=True)
class ArchitectureSpec:
    r"""Where one family's Transformer block keeps its components.

    Paths are dotted attribute paths relative to the block module. Roles that a chain does
    not use may be left empty.

    Attributes:
        chain (str or Callable): name of a registered chain (``"post_ln"``, ``"pre_ln"``,
                    ``"parallel"``, or one added with :func:`register_chain`), or a function of
                    the model config returning one (OPT switches on ``do_layer_norm_before``).
        attention (str): the module that calls the attention function (its probabilities).
        value (Projection): the value projection ``W_V``.
        attention_output (Projection): the output projection ``W_O``.
        norm1 (str, optional): the norm before (Pre-LN) or after (Post-LN) attention;
                    ``None`` for a block without one (OLMo 2 normalises only the outputs).
        norm2 (str, optional): the norm before (Pre-LN) or after (Post-LN) the feed-forward.
        ff_in (Projection): the FF input projection (the *up* projection of gated FFs).
        activation (str): the activation module or function.
        ff_out (Projection): the FF output projection. The three FF fields may be left out
                    for a mixture of experts without dense layers.
        ff_gate (Projection, optional): the gate projection of a gated FF (SwiGLU, GeGLU).
        ff_output (str, optional): the module whose output is the whole FF branch (for the
                    convergence delta); ``ff_out`` by default.
        attention_post_norm (str, optional): a norm on the attention output before the
                    residual (Gemma 2's "sandwich" norms, OLMo 2).
        ff_post_norm (str, optional): a norm on the FF output before the residual.
        cross_attention (str, optional): in a decoder block of an encoder–decoder model, the
                    module that attends to the encoder's output (its probabilities).
        cross_value (Projection, optional): the cross-attention's value projection (it reads
                    the encoder's output).
        cross_output (Projection, optional): the cross-attention's output projection.
        cross_norm (str, optional): the cross-attention's norm: after it (Post-LN) or before
                    it (Pre-LN).
        decoder (ArchitectureSpec, optional): for an encoder–decoder family, the spec of the
                    decoder's blocks (with the ``cross_*`` fields); this spec then describes
                    the encoder's blocks.
        alternative (ArchitectureSpec, optional): the spec for blocks of this family that
                    lack this spec's FF input projection or one of its norms (T5's gated FF
                    ``wi_0``/``wi_1`` where the original has ``wi``; Falcon's parallel blocks);
                    chosen block by block in :meth:`for_block`.
        residual_scale (Callable, optional): the factor on each branch (attention, FF) as it
                    joins the residual stream, from the config (Granite's
                    ``residual_multiplier``); the branches' own outputs stay unscaled.
        moe (MixtureOfExperts, optional): the FF is a sparse mixture of experts (in blocks
                    where the MoE module exists; other blocks use the dense FF paths).
        norm (str): ``"layer_norm"`` or ``"rms_norm"``.
        norm_weight_offset (float): added to the norm weight (Gemma stores ``γ − 1``).
        norm_eps (float, optional): the norms' ε when neither the norm module nor the config
                    holds it (OLMo's parameter-free LayerNorm hard-codes 1e-5); otherwise it
                    is read from the module (``eps``, ``variance_epsilon``) or the config.
        blocks (str, optional): where the list of blocks lives, from the base model (e.g.
                    ``"encoder.layer"``); found by searching when left out.
        final_norm (str, optional): the norm after the last block, from the base model
                    (GPT-2's ``"ln_f"``); ``None`` when there is none.
        causal (bool or Callable, optional): whether tokens see only the past, or a function
                    of the config. By default: Post-LN chains are bidirectional unless the
                    config says ``is_decoder``; the other chains are causal.
        attention_method (str, optional): for attention modules that do not call
                    transformers' ``AttentionInterface``: the name of their method that maps
                    ``(query, key, value, attention_mask)`` to ``(output, probabilities)``
                    (GPT-J's ``"_attn"``).
        transformers_since (str, optional): the lowest transformers whose modules take the
                    form this spec describes, when above the tested range's lowest (an older
                    one is refused with ``UnsupportedVersionError``).
        unsupported (Callable, optional): a function of the config returning why a model
                    of this family cannot be decomposed (a setting the rules do not cover),
                    or ``None``.
        description (str): one line for the supported-architectures table.

    Examples::

        >>> from captum_ffb import ArchitectureSpec, Projection, register_architecture
        >>> register_architecture("my_llama", ArchitectureSpec(
        ...     chain="pre_ln", blocks="layers", final_norm="norm", causal=True,
        ...     attention="self_attn", value=Projection("self_attn.v_proj"),
        ...     attention_output=Projection("self_attn.o_proj"),
        ...     norm1="input_layernorm", norm2="post_attention_layernorm",
        ...     ff_in=Projection("mlp.up_proj"), ff_gate=Projection("mlp.gate_proj"),
        ...     activation="mlp.act_fn", ff_out=Projection("mlp.down_proj"), norm="rms_norm"))
    """

    chain: str | Callable[[Any], str]
    attention: str
    value: Projection
    attention_output: Projection
    norm1: str | None
    norm2: str | None
    ff_in: Projection | None = None
    activation: str | None = None
    ff_out: Projection | None = None
    ff_gate: Projection | None = None
    ff_output: str | None = None
    attention_post_norm: str | None = None
    ff_post_norm: str | None = None
    cross_attention: str | None = None
    cross_value: Projection | None = None
    cross_output: Projection | None = None
    cross_norm: str | None = None
    decoder: ArchitectureSpec | None = None
    alternative: ArchitectureSpec | None = None
    moe: MixtureOfExperts | None = None
    norm: str = "layer_norm"
    norm_weight_offset: float = 0.0
    norm_eps: float | None = None
    residual_scale: Callable[[Any], float] | None = None
    blocks: str | None = None
    final_norm: str | None = None
    causal: bool | ConfigValue | None = None
    attention_method: str | None = None
    transformers_since: str | None = None
    unsupported: Callable[[Any], str | None] | None = None
    description: str = ""

    def __post_init__(self) -> None:
        dense = (self.ff_in, self.activation, self.ff_out)
        if self.moe is None and any(part is None for part in dense):
            raise ValueError("a spec needs ff_in, activation and ff_out, or moe")
        if self.norm not in ("layer_norm", "rms_norm"):
            raise ValueError(f"norm must be 'layer_norm' or 'rms_norm', got {self.norm!r}")
        if self.cross_attention is not None and (self.cross_value is None or self.cross_output is None):
            raise ValueError("a spec with cross_attention needs cross_value and cross_output")

    @property
    def has_cross_attention(self) -> bool:
        """Whether this spec's blocks attend to an encoder's output (decoder blocks of an
        encoder–decoder model)."""
        return self.cross_attention is not None

    def for_block(self, block: Any) -> ArchitectureSpec:
        """The spec describing ``block``: the decoder's for a decoder block of an
        encoder–decoder family (it has the decoder's cross-attention), the alternative's
        for a block without this spec's FF input or norms, else this one."""
        decoder = self.decoder
        if decoder is not None and has_path(block, decoder.cross_attention):
            return decoder.for_block(block)
        if self.alternative is not None and not self._fits(block):
            return self.alternative.for_block(block)
        return self

    def _fits(self, block: Any) -> bool:
        """Whether ``block`` has this spec's FF input and norms (the ones it names)."""
        paths = [self.ff_in.path if self.ff_in is not None else None, self.norm1, self.norm2]
        return all(has_path(block, path) for path in paths if path is not None)

    def chain_name(self, config: Any) -> str:
        """The chain that applies to a model with this ``config``."""
        return self.chain(config) if callable(self.chain) else self.chain

    def is_causal(self, config: Any) -> bool:
        """Whether a model with this ``config`` lets token ``i`` see only tokens ``j ≤ i``."""
        if self.causal is None:
            if self.chain_name(config) == "post_ln":
                return bool(getattr(config, "is_decoder", False))
            return True
        return bool(self.causal(config) if callable(self.causal) else self.causal)

    def check_config(self, config: Any) -> None:
        """Raise a clear error when a setting of ``config``, or the installed transformers,
        is not supported."""
        model_type = getattr(config, "model_type", "this model")
        if self.transformers_since is not None:
            installed = versions.installed_version("transformers")
            if installed is not None and versions.release(installed) < versions.release(self.transformers_since):
                raise versions.UnsupportedVersionError(
                    model_type, f"its modules match its spec from transformers {self.transformers_since} on, not",
                    lowest=self.transformers_since)
        reason = self.unsupported(config) if self.unsupported is not None else None
        if reason:
            raise ValueError(f"{model_type} is not supported here: {reason}")

    def norm_roles(self) -> list[str]:
        """The roles of the block's norms that this spec names."""
        roles = ("norm1", "cross_norm", "norm2", "attention_post_norm", "ff_post_norm")
        return [role for role in roles if getattr(self, role) is not None]
