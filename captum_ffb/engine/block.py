"""A Transformer block bound to its spec and to the tensors one forward pass captured.

The block is where a spec's module paths meet the model: it resolves them, reads weights
(slicing fused projections), norm parameters (ε from the module, the spec or the config,
never guessed) and the real tensors each role saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb._private import model_eager_attention, private_attention_method
from captum_ffb.architectures.moe import GatedWeights, MoEAdapter
from captum_ffb.architectures.paths import has_path, is_present, resolve
from captum_ffb.architectures.spec import ArchitectureSpec, Projection
from captum_ffb.core.versions import UnsupportedVersionError
from captum_ffb.engine.capture import BlockCapture, BlockWatch

#: A real tensor: ``(role, "input" | "output")``. Besides the watched roles: ``"block"`` is
#: the block itself; ``"ff_input"`` the FF's input (of its first projection, or of the MoE
#: module); ``"ff"`` the whole FF branch (with its post-norm); ``"attn_out"`` the attention
#: output projection; ``"next_norm"`` the norm that reads the block's output.
Source = tuple[str, str]

#: Config keys that may hold a norm's ε, by norm kind.
_EPS_KEYS = {
    "layer_norm": ("layer_norm_eps", "layer_norm_epsilon", "norm_eps"),
    "rms_norm": ("rms_norm_eps", "norm_eps", "layer_norm_eps"),
}


def projection_columns(projection: Projection, config: Any, width: int) -> tuple[list[int] | slice, int]:
    """Which output columns of a (possibly fused) projection belong to it."""
    if projection.columns is not None:
        chosen = projection.columns(config)
        if isinstance(chosen, tuple) and len(chosen) == 2:
            return slice(*chosen), 1
        return list(chosen), 1
    if projection.parts == 1:
        return slice(None), 1
    groups = projection.groups
    if isinstance(groups, str):
        groups = int(getattr(config, groups))
    step = width // (groups * projection.parts)
    columns = [
        g * projection.parts * step + projection.part * step + c
        for g in range(groups) for c in range(step)
    ]
    return columns, groups


def projection_weights(module: nn.Module, projection: Projection, config: Any = None) -> tuple[Tensor, Tensor | None]:
    """``(W, c)`` of a projection as ``(d_in, d_out)`` and ``(d_out,)``.

    Handles ``nn.Linear`` (weight stored ``(out, in)``) and transformers' ``Conv1D`` (weight
    stored ``(in, out)``); for fused projections keeps the columns of ``projection``'s part.
    """
    if isinstance(module, nn.Linear):
        weight = module.weight.t()
    elif type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        weight = module.weight
    else:
        raise TypeError(f"unsupported projection module {type(module).__name__}")
    bias = module.bias
    columns, _ = projection_columns(projection, config, weight.shape[1])
    if columns != slice(None):
        weight = weight[:, columns]
        bias = None if bias is None else bias[columns]
    return weight, bias


def norm_parameters(module: nn.Module, spec: ArchitectureSpec, config: Any) -> tuple[Tensor | None, Tensor | None, float]:
    """``(γ, β, ε)`` of a norm module; γ includes the spec's weight offset.

    ε is read from the module (``eps``, ``variance_epsilon``, ``epsilon``), else from the
    spec (``norm_eps``), else from the config; a norm whose ε is nowhere is an error.
    """
    weight = getattr(module, "weight", None)
    if weight is not None and spec.norm_weight_offset:
        weight = weight + spec.norm_weight_offset
    bias = getattr(module, "bias", None)
    eps = next((getattr(module, k) for k in ("eps", "variance_epsilon", "epsilon")
                if isinstance(getattr(module, k, None), (int, float))), None)
    if eps is None:
        eps = spec.norm_eps
    if eps is None and config is not None:
        eps = next((getattr(config, k) for k in _EPS_KEYS[spec.norm]
                    if isinstance(getattr(config, k, None), (int, float))), None)
    if eps is None:
        raise ValueError(
            f"cannot read the ε of {type(module).__name__}: it is not an attribute of the "
            "module nor in the config; set norm_eps in the family's ArchitectureSpec"
        )
    return weight, bias, float(eps)


def config_of(*roots: nn.Module | None) -> Any:
    """The transformers config of the first of ``roots`` (or their sub-modules) that has one."""
    for root in roots:
        if root is None:
            continue
        for module in root.modules():
            config = getattr(module, "config", None)
            if config is not None:
                return config
    return None


def watched_modules(module: nn.Module, spec: ArchitectureSpec) -> dict[str, nn.Module]:
    """Role → module of the block ``module`` whose real input and output the chains and
    the convergence deltas need."""
    ff_in = None if spec.ff_in is None else spec.ff_in.path
    roles: dict[str, str | None] = {
        "norm1": spec.norm1,
        "norm2": spec.norm2,
        "attn_out": spec.attention_output.path,
        "attention_post_norm": spec.attention_post_norm,
        "ff_post_norm": spec.ff_post_norm,
        "ff_in": ff_in,
        "ff_gate": None if spec.ff_gate is None else spec.ff_gate.path,
        "ff_out": None if spec.ff_out is None else spec.ff_out.path,
        "activation": spec.activation,
        "ff": spec.ff_output or (None if spec.ff_out is None else spec.ff_out.path),
        "value": spec.value.path,
        "cross_norm": spec.cross_norm,
        "cross_value": None if spec.cross_value is None else spec.cross_value.path,
        "cross_out": None if spec.cross_output is None else spec.cross_output.path,
    }
    moe = spec.moe
    if MoEAdapter.of(module, spec) is not None:
        roles.update(ff=moe.module, ff_in=moe.module, router=moe.router,
                     shared_expert_gate=moe.shared_expert_gate)
    if spec.ff_post_norm is not None:
        roles["ff"] = spec.ff_post_norm  # the FF branch ends with its post-norm
    return {
        role: resolve(module, path)
        for role, path in roles.items()
        if path is not None and has_path(module, path) and isinstance(resolve(module, path), nn.Module)
    }


def attention_method(attention: nn.Module, spec: ArchitectureSpec) -> str | None:
    """The method of ``attention`` to record its probabilities from (the spec's
    ``attention_method``), or ``None`` where its modeling file calls transformers' public
    ``AttentionInterface``, which is always preferred (GPT-J: ``_attn`` up to transformers
    5.23, the interface from 5.24 on).

    Raises:
        UnsupportedVersionError: the module offers neither.
    """
    method = private_attention_method(attention, spec.attention_method)
    if method is None and spec.attention_method is not None and model_eager_attention(attention) is None:
        raise UnsupportedVersionError(
            getattr(config_of(attention), "model_type", None),
            f"{type(attention).__name__} neither calls transformers' attention interface nor has "
            f"the method {spec.attention_method!r}",
        )
    return method


def block_watch(module: nn.Module, spec: ArchitectureSpec, next_norm: nn.Module | None = None) -> BlockWatch:
    """What ``capture()`` must record of one block."""
    roles = watched_modules(module, spec)
    if next_norm is not None:
        roles["next_norm"] = next_norm
    attention = resolve(module, spec.attention)
    modules = [attention]
    if spec.has_cross_attention:
        modules.append(resolve(module, spec.cross_attention))
    return BlockWatch(module, roles, modules, attention_method(attention, spec))


@dataclass
class Block:
    """One block: its module, its spec and what the forward pass showed of it.

    All tensors handed out are detached and in ``dtype`` (float32 by default, whatever the
    model runs in).

    Attributes:
        module (nn.Module): the block.
        spec (ArchitectureSpec): its family's spec.
        capture (BlockCapture): what one forward pass recorded.
        dtype (torch.dtype): the decomposition's precision.
        token_mask (Tensor, optional): ``(B, n)``, 1 for real tokens.
        config (Any): the model's config.
        next_norm (nn.Module, optional): the norm that reads this block's output (the next
                    block's first norm, or the model's final norm).
        source_mask (Tensor, optional): for a decoder block of an encoder–decoder model,
                    ``(B, n_source)``, 1 for the encoder's real tokens.
        source (Decomposition, optional): for such a block, a decomposition of the encoder's
                    output over any source players (the identity over the encoder's output
                    vectors by default); its players follow the block's own.
    """

    module: nn.Module
    spec: ArchitectureSpec
    capture: BlockCapture
    dtype: torch.dtype = torch.float32
    token_mask: Tensor | None = None
    config: Any = None
    next_norm: nn.Module | None = None
    source_mask: Tensor | None = None
    source: Any = None

    def __post_init__(self) -> None:
        if self.config is None:
            self.config = config_of(self.module)

    def cast(self, tensor: Tensor | None) -> Tensor | None:
        """``tensor`` detached and in the decomposition's dtype."""
        return None if tensor is None else tensor.detach().to(self.dtype)

    @property
    def inputs(self) -> Tensor:
        """The block's real input hidden states ``(B, n, d)``."""
        return self.cast(self.capture.inputs)

    @property
    def output(self) -> Tensor:
        """The block's real output hidden states ``(B, n, d)``."""
        return self.cast(self.capture.output)

    @property
    def probs(self) -> Tensor:
        """Attention probabilities of the block's self-attention ``(B, H, n, n)``."""
        if not self.capture.probs:
            raise UnsupportedVersionError(
                getattr(self.config, "model_type", None),
                f"{type(resolve(self.module, self.spec.attention)).__name__} recorded no attention "
                "probabilities: it does not call transformers' attention interface (a spec names "
                "the method that returns them in attention_method)",
            )
        return self.cast(self.capture.probs[0])

    @property
    def cross_probs(self) -> Tensor:
        """Cross-attention probabilities ``(B, H, n, n_source)`` (decoder blocks of an
        encoder–decoder model)."""
        self._require_cross_attention()
        return self.cast(self.capture.probs[1])

    @property
    def encoder_output(self) -> Tensor:
        """The encoder's output vectors the cross-attention read ``(B, n_source, d)``."""
        self._require_cross_attention()
        return self.real("cross_value", "input")

    def _require_cross_attention(self) -> None:
        if len(self.capture.probs) < 2 or ("cross_value", "input") not in self.capture.tensors:
            raise RuntimeError(
                "the forward pass recorded no cross-attention: run the encoder–decoder model "
                "with its source (input_ids) and its target (decoder_input_ids) together"
            )

    def cross_attention_weights(self) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """``(W_V, b_V, W_O, b_O)`` of the block's cross-attention."""
        return (*self.projection(self.spec.cross_value), *self.projection(self.spec.cross_output))

    @property
    def residual_scale(self) -> float | None:
        """The factor on each branch as it joins the residual stream (``None``: 1)."""
        scale = self.spec.residual_scale
        return None if scale is None else float(scale(self.config))

    def has(self, role: str) -> bool:
        """Whether the spec names the module of ``role`` and it exists in this block."""
        return is_present(self.module, getattr(self.spec, role, None))

    def real(self, role: str, which: str = "output") -> Tensor:
        """The real input or output of the module playing ``role`` (e.g. ``"norm2"``), or of
        one of the derived sources (see ``Source``)."""
        if role == "block":
            return self.output if which == "output" else self.inputs
        if role == "ff_input":
            return self.real("ff_in", "input")
        if role in ("norm1", "norm2") and not self.has(role):
            # a norm the family does not have is the identity: what it would have read
            return self.inputs if role == "norm1" else self.real("ff_input")
        key = (role, which)
        if key not in self.capture.tensors:
            raise RuntimeError(f"the forward pass recorded no {which} for {role!r}")
        return self.cast(self.capture.tensors[key])

    def projection_output(self, role: str, projection: Projection) -> Tensor:
        """The real output of a projection, its own columns only (for fused projections)."""
        full = self.real(role)
        columns, _ = projection_columns(projection, self.config, full.shape[-1])
        return full if columns == slice(None) else full[..., columns]

    def projection(self, projection: Projection) -> tuple[Tensor, Tensor | None]:
        """``(W, c)`` of a projection of the spec, ``W`` as ``(d_in, d_out)``."""
        weight, bias = projection_weights(resolve(self.module, projection.path), projection, self.config)
        return self.cast(weight), self.cast(bias)

    def attention_weights(self) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """``(W_V, b_V, W_O, b_O)`` of the block's attention."""
        return (*self.projection(self.spec.value), *self.projection(self.spec.attention_output))

    def norm_parameters(self, role: str) -> tuple[Tensor | None, Tensor | None, float]:
        """``(γ, β, ε)`` of the norm playing ``role`` (``"next_norm"`` too)."""
        module = self.next_norm if role == "next_norm" else resolve(self.module, getattr(self.spec, role))
        weight, bias, eps = norm_parameters(module, self.spec, self.config)
        return self.cast(weight), self.cast(bias), eps

    def activation_fn(self) -> Callable[[Tensor], Tensor]:
        """The FF activation function ``g``."""
        fn = resolve(self.module, self.spec.activation)
        if not callable(fn):
            raise TypeError(f"{self.spec.activation!r} is not callable")
        return fn

    # ------------------------------------------------------------------ mixture of experts
    @cached_property
    def moe(self) -> MoEAdapter | None:
        """The block's mixture of experts, or ``None`` when its FF is dense."""
        return MoEAdapter.of(self.module, self.spec)

    @property
    def is_moe(self) -> bool:
        """Whether this block's FF is a sparse mixture of experts."""
        return self.moe is not None

    def router_weights(self) -> Tensor:
        """Routing weight of every expert for every token ``(B, n, E)`` (zero if not chosen)."""
        top_weights, top_index = self.moe.routing(self.capture.raw_outputs["router"])
        batch, n = self.capture.inputs.shape[:2]
        return self.moe.dense_routing(top_weights, top_index, self.dtype).reshape(batch, n, -1)

    def expert_weights(self, expert: int) -> GatedWeights:
        """``(W_gate, W_up, W_down)`` of one expert, each ``(d_in, d_out)``."""
        return tuple(self.cast(weight) for weight in self.moe.expert_weights(expert))

    def expert_activation(self) -> Callable[[Tensor], Tensor]:
        """The experts' activation function."""
        return self.moe.activation

    def shared_expert(self) -> tuple[GatedWeights, Callable[[Tensor], Tensor]] | None:
        """``((W_gate, W_up, W_down), g)`` of the always-on shared expert, if there is one."""
        shared = self.moe.shared_expert
        if shared is None:
            return None
        return tuple(self.cast(weight) for weight in shared.weights()), shared.activation
