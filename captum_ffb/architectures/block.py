"""A Transformer block bound to its spec and to the tensors one forward pass captured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from captum_ffb.architectures.spec import ArchitectureSpec, Projection
from captum_ffb.capture import BlockCapture


def resolve(root: nn.Module, path: str) -> object:
    """The attribute at dotted ``path`` below ``root``, with a clear error when it is missing."""
    obj: object = root
    for name in path.split("."):
        if not hasattr(obj, name):
            raise ValueError(
                f"{type(root).__name__} has no {path!r} (missing {name!r}): the layer does not "
                "match the registered architecture"
            )
        obj = getattr(obj, name)
    return obj


def projection_weights(
    module: nn.Module, part: int = 0, parts: int = 1, groups: int = 1
) -> tuple[Tensor, Tensor | None]:
    """``(W, c)`` of a projection as ``(d_in, d_out)`` and ``(d_out,)``.

    Handles ``nn.Linear`` (weight stored ``(out, in)``) and transformers' ``Conv1D`` (weight
    stored ``(in, out)``); for fused projections returns the ``part``-th of ``parts`` slices
    of each of ``groups`` equal groups of outputs (see :class:`Projection`).
    """
    if isinstance(module, nn.Linear):
        weight = module.weight.t()
    elif type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        weight = module.weight
    else:
        raise TypeError(f"unsupported projection module {type(module).__name__}")
    bias = module.bias
    if parts > 1:
        d_in, width = weight.shape
        step = width // (groups * parts)
        cols = slice(part * step, (part + 1) * step)
        weight = weight.reshape(d_in, groups, parts * step)[:, :, cols].reshape(d_in, -1)
        if bias is not None:
            bias = bias.reshape(groups, parts * step)[:, cols].reshape(-1)
    return weight, bias


@dataclass
class Block:
    """One block: its module, its spec and what the forward pass showed of it.

    All tensors handed out are in ``dtype`` (float32 by default, whatever the model runs in).
    """

    module: nn.Module
    spec: ArchitectureSpec
    capture: BlockCapture
    dtype: torch.dtype = torch.float32
    token_mask: Tensor | None = None

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
            raise RuntimeError(
                "no attention probabilities were recorded for this layer: its attention does "
                "not call transformers' AttentionInterface"
            )
        return self.cast(self.capture.probs[0])

    def real(self, role: str, which: str = "output") -> Tensor:
        """The real input or output of the module playing ``role`` (e.g. ``"norm2"``)."""
        key = (role, which)
        if key not in self.capture.tensors:
            raise RuntimeError(f"the forward pass recorded no {which} for {role!r}")
        return self.cast(self.capture.tensors[key])

    @property
    def config(self) -> object:
        """The transformers config of the block's model (from any sub-module that keeps it)."""
        for module in self.module.modules():
            config = getattr(module, "config", None)
            if config is not None:
                return config
        return None

    def projection(self, projection: Projection) -> tuple[Tensor, Tensor | None]:
        """``(W, c)`` of a projection of the spec, ``W`` as ``(d_in, d_out)``."""
        module = resolve(self.module, projection.path)
        groups = projection.groups
        if isinstance(groups, str):
            groups = int(getattr(self.config, groups))
        weight, bias = projection_weights(module, projection.part, projection.parts, groups)
        return self.cast(weight), self.cast(bias)

    # ------------------------------------------------------------------ mixture of experts
    @property
    def is_moe(self) -> bool:
        """Whether this block's FF is a sparse mixture of experts."""
        moe = self.spec.moe
        if moe is None:
            return False
        try:
            resolve(self.module, moe.experts)
        except ValueError:
            return False
        return True

    def router_weights(self) -> Tensor:
        """Routing weight of every expert for every token ``(B, n, E)`` (zero if not chosen)."""
        moe = self.spec.moe
        _, top_weights, top_index = self.capture.raw_outputs["router"][:3]
        experts = resolve(self.module, moe.experts)
        batch, n = self.capture.inputs.shape[:2]
        dense = torch.zeros(batch * n, experts.gate_up_proj.shape[0], dtype=self.dtype,
                            device=top_weights.device)
        dense.scatter_(1, top_index.reshape(batch * n, -1), top_weights.reshape(batch * n, -1).to(self.dtype))
        return dense.reshape(batch, n, -1)

    def expert_weights(self, expert: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(W_gate, W_up, W_down)`` of one expert, each ``(d_in, d_out)``."""
        experts = resolve(self.module, self.spec.moe.experts)
        gate_up = experts.gate_up_proj[expert]
        width = gate_up.shape[0] // 2
        return (
            self.cast(gate_up[:width].t()),
            self.cast(gate_up[width:].t()),
            self.cast(experts.down_proj[expert].t()),
        )

    def expert_activation(self) -> Callable[[Tensor], Tensor]:
        """The experts' activation function."""
        return resolve(self.module, self.spec.moe.experts).act_fn

    def attention_weights(self) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """``(W_V, b_V, W_O, b_O)`` of the block's attention."""
        return (*self.projection(self.spec.value), *self.projection(self.spec.attention_output))

    def norm_parameters(self, role: str) -> tuple[Tensor | None, Tensor | None, float]:
        """``(γ, β, ε)`` of the norm playing ``role``; γ includes the spec's weight offset."""
        module = resolve(self.module, getattr(self.spec, role))
        weight = self.cast(getattr(module, "weight", None))
        if weight is not None and self.spec.norm_weight_offset:
            weight = weight + self.spec.norm_weight_offset
        bias = self.cast(getattr(module, "bias", None))
        eps = getattr(module, "eps", None)
        if eps is None:
            eps = getattr(module, "variance_epsilon", 1e-6)
        return weight, bias, float(eps)

    def activation_fn(self) -> Callable[[Tensor], Tensor]:
        """The FF activation function ``g``."""
        fn = resolve(self.module, self.spec.activation)
        if not callable(fn):
            raise TypeError(f"{self.spec.activation!r} is not callable")
        return fn
