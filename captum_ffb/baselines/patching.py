r"""Activation patching: the field's ground truth for what a component does.

For each component ``A`` (an attention sublayer or one of its heads, an FF block) one forward
pass of the real model runs on the clean input with ``A``'s output replaced, at every
position, by its output in the baseline (corrupted) run; the effect is
``output(inputs) − output(inputs, A patched)``. One pass per component: what the graph's
patching estimates (:mod:`captum_ffb.attr.patching`) estimate from two passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

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
                        batch_size: int = 16, show_progress: bool = True) -> PatchingResult:
    r"""Patch each component's output from the baseline run, one forward pass per component.

    Args:
        model (nn.Module or NormDecomposition): a Hugging Face model (or one bound already).
        inputs (Tensor): ``(1, n)`` the clean token ids.
        baseline_inputs (Tensor): ``(1, n)`` the corrupted ones (same length).
        target (int, str, ReadOut, optional): what is explained, as in ``attribute``
                    (``None``: the clean prediction).
        granularity (str): ``"head"`` (each head and each FF block) or ``"sublayer"``.
        forward_kwargs (dict, optional): further arguments of the model's forward.
        batch_size (int): patched passes run together (each row of a batch the input with its
                    own patch).
        show_progress (bool): a progress bar over the patched passes.

    Returns:
        PatchingResult: one effect per component.
    """
    from captum_ffb.attr.graph import resolved_target
    from captum_ffb.attr.norm_decomposition import NormDecomposition
    from captum_ffb.attr.patching import Patch, baseline_like, patched_values, writer_module
    from captum_ffb.engine.graph import real_writers

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive number of passes, got {batch_size!r}")
    if granularity not in PATCHING_GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(PATCHING_GRANULARITIES)} (one patched pass per "
                         f"component), got {granularity!r}")
    nd = model if isinstance(model, NormDecomposition) else NormDecomposition(model)
    engine = nd.engine
    engine.refuse_two_stacks("activation patching")
    request = nd._request(inputs, None, forward_kwargs, nd.reference)
    if request.batch_size != 1:
        raise ValueError("inputs: activation patching runs one input at a time (a batch of 1)")
    baseline = baseline_like(baseline_inputs, request)
    corrupt = nd._request(baseline, None, forward_kwargs, nd.reference)
    target = resolved_target(nd, request, target)
    base = real_writers(engine, corrupt, target, granularity)
    n_heads = int(getattr(engine.config, "num_attention_heads", 1) or 1)
    names: list[str] = []
    patches: list[Patch] = []
    for index in range(len(engine.blocks)):
        key = f"block.{index}.attention"
        if granularity == "head":
            for head in range(n_heads):
                names.append(component_id("head", index, head))
                patches.append(Patch(writer_module(engine, index, "head", part=True), base.parts[key][:, :, head],
                                     head, n_heads))
        else:
            names.append(component_id("attention", index))
            patches.append(Patch(writer_module(engine, index, "attention"), base.outputs[key]))
        names.append(component_id("ff", index))
        patches.append(Patch(writer_module(engine, index, "ff"), base.outputs[f"block.{index}.ff"]))
    clean = float(real_writers(engine, request, target, "sublayer").value[0])
    bar = _progress(len(patches), show_progress)
    try:
        values = patched_values(engine, request, target, patches, batch_size, bar)
    finally:
        if bar is not None:
            bar.close()
    effects = {name: clean - value for name, value in zip(names, values)}
    return PatchingResult(effects, clean, float(base.value[0]))


def _progress(total: int, show: bool) -> Any:
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="patching", unit="pass")
