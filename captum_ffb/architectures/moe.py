"""The tensor layout of a sparse mixture of experts, described once.

transformers' fused experts (Mixtral, Qwen2-MoE) keep all experts in two 3-D parameters:
``gate_up_proj`` ``(E, 2·I, d)`` with the gate rows first, and ``down_proj`` ``(E, d, I)``,
with one ``act_fn``; the MoE block calls them as ``experts(x, top_k_index, top_k_weights)``
on ``(T, d)`` rows. The router returns ``(logits, top-k weights, top-k indices)``. A shared
expert is a gated MLP (``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn``). Both routes
(the chains and the frozen model of the backward route) read the experts through
:class:`MoEAdapter` only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.architectures.paths import has_path, resolve
from captum_ffb.architectures.spec import ArchitectureSpec

#: ``(W_gate, W_up, W_down)``, each as ``(d_in, d_out)``.
GatedWeights = tuple[Tensor, Tensor, Tensor]


@dataclass(frozen=True)
class GatedMLP:
    """A gated MLP ``down(g(gate(x)) ⊙ up(x))``: its three linear layers and ``g``."""

    gate: nn.Linear
    up: nn.Linear
    down: nn.Linear
    activation: Callable[[Tensor], Tensor]

    def weights(self) -> GatedWeights:
        """``(W_gate, W_up, W_down)``, each as ``(d_in, d_out)``."""
        return self.gate.weight.t(), self.up.weight.t(), self.down.weight.t()


@dataclass(frozen=True)
class MoEAdapter:
    """One block's mixture of experts, bound to its modules.

    Attributes:
        module (nn.Module): the whole MoE block (its output is the FF output).
        router (nn.Module): the router.
        experts (nn.Module): the fused experts.
        shared_expert (GatedMLP, optional): the always-on expert (Qwen2-MoE).
        shared_expert_gate (nn.Module, optional): the linear whose sigmoid scales it.
    """

    module: nn.Module
    router: nn.Module
    experts: nn.Module
    shared_expert: GatedMLP | None = None
    shared_expert_gate: nn.Module | None = None

    @classmethod
    def of(cls, block: nn.Module, spec: ArchitectureSpec) -> MoEAdapter | None:
        """The mixture of experts of ``block``; ``None`` when its FF is dense (a family
        without experts, or a dense layer of one with them, as Qwen2-MoE's mlp-only layers)."""
        moe = spec.moe
        if moe is None or not has_path(block, moe.experts):
            return None
        shared = None
        if moe.shared_expert is not None:
            mlp = resolve(block, moe.shared_expert)
            shared = GatedMLP(mlp.gate_proj, mlp.up_proj, mlp.down_proj, mlp.act_fn)
        gate = None if moe.shared_expert_gate is None else resolve(block, moe.shared_expert_gate)
        return cls(resolve(block, moe.module), resolve(block, moe.router), resolve(block, moe.experts),
                   shared, gate)

    @property
    def num_experts(self) -> int:
        """The number of routed experts ``E``."""
        return self.experts.gate_up_proj.shape[0]

    @property
    def activation(self) -> Callable[[Tensor], Tensor]:
        """The routed experts' activation ``g``."""
        return self.experts.act_fn

    def expert_weights(self, expert: int) -> GatedWeights:
        """``(W_gate, W_up, W_down)`` of one routed expert, each as ``(d_in, d_out)``."""
        gate_up = self.experts.gate_up_proj[expert]
        width = gate_up.shape[0] // 2
        return gate_up[:width].t(), gate_up[width:].t(), self.experts.down_proj[expert].t()

    @staticmethod
    def routing(router_output: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """``(top-k weights, top-k indices)``, each ``(T, k)``, from what the router returned."""
        _, top_weights, top_index = router_output[:3]
        return top_weights, top_index

    @staticmethod
    def experts_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
        """``(x, top-k indices, top-k weights)`` from the arguments of an experts call."""
        names = ("top_k_index", "top_k_weights")
        x, top_index, top_weights = (list(args) + [kwargs.get(name) for name in names])[:3]
        return x, top_index, top_weights

    def dense_routing(self, top_weights: Tensor, top_index: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """The routing weight of every expert for every row ``(T, E)``, zero where the expert
        was not chosen."""
        rows = top_index.reshape(-1, top_index.shape[-1])
        dtype = top_weights.dtype if dtype is None else dtype
        dense = torch.zeros(rows.shape[0], self.num_experts, dtype=dtype, device=top_weights.device)
        dense.scatter_(1, rows, top_weights.reshape(rows.shape[0], -1).to(dtype))
        return dense
