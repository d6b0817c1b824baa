"""Declarative architecture specs: where a block keeps its components, and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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
    """

    path: str
    part: int = 0
    parts: int = 1
    groups: int | str = 1


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
        chain (str or Callable): name of the chain in :mod:`captum_ffb.architectures.chains`
                    (``"post_ln"``, ``"pre_ln"``, ``"parallel"``, …), or a function of the model
                    config returning one (OPT switches on ``do_layer_norm_before``).
        attention (str): the module that calls the attention function (its probabilities).
        value (Projection): the value projection ``W_V``.
        attention_output (Projection): the output projection ``W_O``.
        norm1 (str): the norm before (Pre-LN) or after (Post-LN) attention.
        norm2 (str): the norm before (Pre-LN) or after (Post-LN) the feed-forward block.
        ff_in (Projection): the FF input projection (the *up* projection of gated FFs).
        activation (str): the activation module or function.
        ff_out (Projection): the FF output projection. The three FF fields may be left out
                    for a mixture of experts without dense layers.
        ff_gate (Projection, optional): the gate projection of a gated FF (SwiGLU, GeGLU).
        ff_output (str, optional): the module whose output is the whole FF branch (for the
                    convergence delta); ``ff_out`` by default.
        attention_post_norm (str, optional): a norm on the attention output before the
                    residual (Gemma 2's "sandwich" norms).
        ff_post_norm (str, optional): a norm on the FF output before the residual.
        moe (MixtureOfExperts, optional): the FF is a sparse mixture of experts (in blocks
                    where the MoE module exists; other blocks use the dense FF paths).
        norm (str): ``"layer_norm"`` or ``"rms_norm"``.
        norm_weight_offset (float): added to the norm weight (Gemma stores ``γ − 1``).
        description (str): one line for the supported-architectures table.
    """

    chain: str | Callable[[Any], str]
    attention: str
    value: Projection
    attention_output: Projection
    norm1: str
    norm2: str
    ff_in: Projection | None = None
    activation: str | None = None
    ff_out: Projection | None = None
    ff_gate: Projection | None = None
    ff_output: str | None = None
    attention_post_norm: str | None = None
    ff_post_norm: str | None = None
    moe: MixtureOfExperts | None = None
    norm: str = "layer_norm"
    norm_weight_offset: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        dense = (self.ff_in, self.activation, self.ff_out)
        if self.moe is None and any(part is None for part in dense):
            raise ValueError("a spec needs ff_in, activation and ff_out, or moe")
        if self.norm not in ("layer_norm", "rms_norm"):
            raise ValueError(f"norm must be 'layer_norm' or 'rms_norm', got {self.norm!r}")

    def chain_name(self, config: Any) -> str:
        """The chain that applies to a model with this ``config``."""
        return self.chain(config) if callable(self.chain) else self.chain
