r"""Activation patching: the field's ground truth for what a component does.

For each component ``A`` (an attention sublayer or one of its heads, an FF block) one forward
pass of the real model runs on the clean input with ``A``'s output replaced, at every
position, by its output in the baseline (corrupted) run; the effect is
``output(inputs) − output(inputs, A patched)``. One pass per component: what the graph's
patching estimates (:mod:`captum_ffb.attr.patching`) estimate from two passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["PATCHING_GRANULARITIES", "PatchingResult", "activation_patching", "component_id"]

#: what one patched pass replaces: each attention sublayer or each head, and each FF block
PATCHING_GRANULARITIES = ("sublayer", "head")


def component_id(kind: str, layer: int, part: int = -1) -> str:
    """A component's id: ``block.<l>.attention``, ``block.<l>.head.<h>``, ``block.<l>.ff``
    (a graph node's id without its position)."""
    return f"block.{layer}.{kind}" if part < 0 else f"block.{layer}.{kind}.{part}"


@dataclass
class PatchingResult:
    """Real activation patching of every component.

    Attributes:
        effects (dict): component id (:func:`component_id`) → ``output(inputs) −
                    output(inputs with the component patched from the baseline run)``.
        clean (float): the explained value on the inputs.
        corrupted (float): on the baseline inputs.
    """

    effects: dict[str, float]
    clean: float
    corrupted: float

    def of(self, kind: str) -> dict[str, float]:
        """The effects of one kind of component (``"head"``, ``"attention"``, ``"ff"``)."""
        return {k: v for k, v in self.effects.items() if k.split(".")[2] == kind}


def activation_patching(model: Any, inputs: Tensor, baseline_inputs: Tensor, target: Any = None,
                        granularity: str = "head", *, forward_kwargs: dict[str, Any] | None = None,
                        show_progress: bool = True) -> PatchingResult:
    r"""Patch each component's output from the baseline run, one forward pass per component.

    Args:
        model (nn.Module or NormDecomposition): a Hugging Face model (or one bound already).
        inputs (Tensor): ``(1, n)`` the clean token ids.
        baseline_inputs (Tensor): ``(1, n)`` the corrupted ones (same length).
        target (int, str, ReadOut, optional): what is explained, as in ``attribute``
                    (``None``: the clean prediction).
        granularity (str): ``"head"`` (each head and each FF block) or ``"sublayer"``.
        forward_kwargs (dict, optional): further arguments of the model's forward.
        show_progress (bool): a progress bar over the patched passes.

    Returns:
        PatchingResult: one effect per component.
    """
    from captum_ffb.attr.graph import resolved_target
    from captum_ffb.attr.norm_decomposition import NormDecomposition
    from captum_ffb.engine.block import watched_modules
    from captum_ffb.engine.graph import real_writers
    from captum_ffb.engine.head import target_value

    if granularity not in PATCHING_GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(PATCHING_GRANULARITIES)} (one patched pass per "
                         f"component), got {granularity!r}")
    nd = model if isinstance(model, NormDecomposition) else NormDecomposition(model)
    engine = nd.engine
    engine.refuse_two_stacks("activation patching")
    request = nd._request(inputs, None, forward_kwargs, nd.reference)
    if request.batch_size != 1:
        raise ValueError("inputs: activation patching runs one input at a time (a batch of 1)")
    baseline = torch.as_tensor(baseline_inputs)
    baseline = baseline[None] if baseline.dim() == 1 else baseline
    if tuple(baseline.shape) != tuple(request.args[0].shape):
        raise ValueError(f"baseline_inputs must have the inputs' shape {tuple(request.args[0].shape)} (a corrupted "
                         f"prompt of the same length), got {tuple(baseline.shape)}")
    corrupt = nd._request(baseline, None, forward_kwargs, nd.reference)
    target = resolved_target(nd, request, target)
    base = real_writers(engine, corrupt, target, granularity)
    n_heads = int(getattr(engine.config, "num_attention_heads", 1) or 1)
    patches: list[tuple[str, nn.Module, Callable[..., Any], bool]] = []
    for index, block in enumerate(engine.blocks):
        roles = watched_modules(block, engine.family.for_block(block))
        key = f"block.{index}.attention"
        if granularity == "head":
            for head in range(n_heads):
                patches.append((component_id("head", index, head), roles["attn_out"],
                                _head_patch(base.parts[key][:, :, head], head, n_heads), True))
        else:
            patches.append((component_id("attention", index), roles.get("attention_post_norm") or roles["attn_out"],
                            _output_patch(base.outputs[key]), False))
        patches.append((component_id("ff", index), roles["ff"], _output_patch(base.outputs[f"block.{index}.ff"]), False))
    kwargs = dict(request.kwargs)
    model_ = nd.model
    training = model_.training
    model_.eval()
    effects: dict[str, float] = {}
    bar = _progress(len(patches), show_progress)
    try:
        with torch.no_grad():
            clean = float(target_value(engine.head, model_(*request.args, **kwargs), target)[0])
            for name, module, hook, before in patches:
                handle = (module.register_forward_pre_hook(hook) if before else module.register_forward_hook(hook))
                try:
                    patched = float(target_value(engine.head, model_(*request.args, **kwargs), target)[0])
                finally:
                    handle.remove()
                effects[name] = clean - patched
                if bar is not None:
                    bar.update(1)
    finally:
        model_.train(training)
        if bar is not None:
            bar.close()
    return PatchingResult(effects, clean, float(base.value[0]))


def _output_patch(value: Tensor) -> Callable[..., Any]:
    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        kept = output[0] if isinstance(output, tuple) else output
        new = value.reshape(kept.shape).to(kept.dtype)
        return (new, *output[1:]) if isinstance(output, tuple) else new
    return hook


def _head_patch(value: Tensor, head: int, n_heads: int) -> Callable[..., Any]:
    """Replace one head's slice of the output projection's input (``value``: ``(1, n, d_h)``)."""
    def hook(module: nn.Module, args: Any) -> Any:
        x = args[0]
        shaped = x.reshape(*x.shape[:-1], n_heads, -1).clone()
        shaped[..., head, :] = value.reshape(*shaped.shape[:-2], -1).to(x.dtype)
        return (shaped.reshape(x.shape), *args[1:])
    return hook


def _progress(total: int, show: bool) -> Any:
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="patching", unit="pass")
