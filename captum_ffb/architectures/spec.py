"""Declarative architecture specs: where a block keeps its components, and nothing else."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Projection:
    """A linear projection inside a block: an ``nn.Linear`` or a transformers ``Conv1D``.

    Attributes:
        path (str): dotted path from the block, e.g. ``"attention.self.value"``.
        part (int): for fused projections (GPT-2's ``c_attn``), which slice of the output.
        parts (int): into how many equal slices the fused output is split.
    """

    path: str
    part: int = 0
    parts: int = 1


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
        ff_out (Projection): the FF output projection.
        ff_gate (Projection, optional): the gate projection of a gated FF (SwiGLU, GeGLU).
        norm (str): ``"layer_norm"`` or ``"rms_norm"``.
        norm_weight_offset (float): added to the norm weight (Gemma stores ``γ − 1``).
        description (str): one line for the supported-architectures table.
        options (Mapping): family-specific extras read by a chain.
    """

    chain: str | Callable[[Any], str]
    attention: str
    value: Projection
    attention_output: Projection
    norm1: str
    norm2: str
    ff_in: Projection
    activation: str
    ff_out: Projection
    ff_gate: Projection | None = None
    norm: str = "layer_norm"
    norm_weight_offset: float = 0.0
    description: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)

    def chain_name(self, config: Any) -> str:
        """The chain that applies to a model with this ``config``."""
        return self.chain(config) if callable(self.chain) else self.chain
