"""Many gradients in one backward sweep, block by block.

The component tables' backward route needs, for every writer ``c`` of the residual stream,
the gradient of its direct read-out ``r_c`` with respect to the players. Taken one read-out
(or one block's read-outs) at a time, each is a backward pass through every block below its
own. A sweep instead runs down the blocks once, carrying every read-out born so far as one
cotangent of a batch: at block ``l`` the cotangents at its output, with the read-outs of
block ``l`` joining them, are pulled back to its input in one batched vector–Jacobian
product. The arithmetic is the same; the products are a few large matrix products instead of
many small ones.

The blocks' graphs must start at leaves of their own
(``linearise(..., separate_blocks=True)``): block ``l``'s output depends on the blocks below
only through its input, the residual stream (true of every registered family).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def swept_gradients(block_outputs: Sequence[Tensor], block_inputs: Sequence[Tensor],
                    values: Sequence[tuple[int, Tensor]], limit: int,
                    progress: Callable[[int], object] | None = None) -> list[Tensor]:
    """The gradient of each value with respect to the first block's input.

    Args:
        block_outputs (Sequence[Tensor]): block ``l``'s output, its graph starting at
                    ``block_inputs[l]``.
        block_inputs (Sequence[Tensor]): block ``l``'s input (a leaf).
        values (Sequence[tuple[int, Tensor]]): ``(block, value)``: a ``(B,)`` value whose
                    graph starts at that block's input (its gradient is taken of its sum).
        limit (int): at most this many cotangents carried at once; more values are swept in
                    several sweeps (the highest blocks' first).
        progress (Callable, optional): called with the number of values done.

    Returns:
        list[Tensor]: one gradient ``block_inputs[0].shape`` per value, in their order.
    """
    found: list[Tensor | None] = [None] * len(values)
    order = sorted(range(len(values)), key=lambda k: -values[k][0])  # stable: a block's in order
    limit = max(1, int(limit))
    for start in range(0, len(order), limit):
        group = order[start:start + limit]
        channels: Tensor | None = None
        members: list[int] = []
        for block in range(values[group[0]][0], -1, -1):
            new = [k for k in group if values[k][0] == block]
            channels = _pull_back(block_outputs[block], block_inputs[block], channels,
                                  [values[k][1] for k in new])
            members += new
        for row, k in enumerate(members):
            found[k] = channels[row]
        if progress is not None:
            progress(len(group))
    return found  # type: ignore[return-value]


def _pull_back(output: Tensor, inputs: Tensor, channels: Tensor | None, new: Sequence[Tensor]) -> Tensor:
    """``(k + m, *inputs.shape)``: the ``k`` cotangents at a block's output and the gradients of
    its ``m`` new values, pulled back to its input in one batched product."""
    k = 0 if channels is None else channels.shape[0]
    m = len(new)
    outputs: list[Tensor] = []
    cotangents: list[Tensor] = []
    if channels is not None:
        outputs.append(output)
        pad = channels.new_zeros((m, *channels.shape[1:]))
        cotangents.append(torch.cat([channels.to(output.dtype), pad]).reshape(k + m, *output.shape))
    if m:
        stacked = torch.stack([v.sum() for v in new])
        picks = stacked.new_zeros((k + m, m))
        picks[k:] = torch.eye(m, dtype=stacked.dtype, device=stacked.device)
        outputs.append(stacked)
        cotangents.append(picks)
    if k + m == 1:
        return _grad(outputs, inputs, [c[0] for c in cotangents])[None]
    try:
        (grads,) = torch.autograd.grad(outputs, inputs, cotangents, retain_graph=True, allow_unused=True,
                                       is_grads_batched=True)
    except RuntimeError:  # an operation the batched backward cannot run: one cotangent at a time
        return torch.stack([_grad(outputs, inputs, [c[row] for c in cotangents]) for row in range(k + m)])
    return torch.zeros((k + m, *inputs.shape), dtype=inputs.dtype, device=inputs.device) if grads is None else grads


def _grad(outputs: list[Tensor], inputs: Tensor, cotangents: list[Tensor]) -> Tensor:
    (found,) = torch.autograd.grad(outputs, inputs, cotangents, retain_graph=True, allow_unused=True)
    return torch.zeros_like(inputs) if found is None else found
