"""Many gradients in one backward sweep, block by block.

The component tables' backward route needs, for every writer ``c`` of the residual stream,
the gradient of its direct read-out ``r_c`` with respect to the players. Taken one read-out
(or one block's read-outs) at a time, each is a backward pass through every block below its
own. A sweep instead runs down the blocks once, carrying every read-out born so far as one
cotangent of a batch: at block ``l`` the cotangents at its output, with the read-outs of
block ``l`` joining them, are pulled back to its input in one batched vector–Jacobian
product. The arithmetic is the same; the products are a few large matrix products instead of
many small ones.

A batched product runs every cotangent through every operation of the block, zeros included:
a read-out of the attention, born at block ``l``, would run through its FF as zeros. The
cotangents carried from above are pulled back in one batch, and the values born at the block
in batches of their own by ``group`` (an attention's read-outs apart from the FF's), each
through the part of the block it depends on.

The blocks' graphs must start at leaves of their own
(``linearise(..., separate_blocks=True)``): block ``l``'s output depends on the blocks below
only through its input, the residual stream (true of every registered family).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch
from torch import Tensor

from captum_ffb.engine.autograd import batched_vjp


def swept_gradients(block_outputs: Sequence[Tensor], block_inputs: Sequence[Tensor],
                    values: Sequence[tuple[int, Tensor]], limit: int,
                    progress: Callable[[int], object] | None = None,
                    groups: Sequence[Hashable] | None = None) -> list[Tensor]:
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
        groups (Sequence[Hashable], optional): a key per value: the values of one block with
                    one key are pulled back through it together, apart from the others
                    (default: all of a block's values together).

    Returns:
        list[Tensor]: one gradient ``block_inputs[0].shape`` per value, in their order.
    """
    keys = [None] * len(values) if groups is None else list(groups)
    if len(keys) != len(values):
        raise ValueError(f"groups: give one key per value ({len(values)}), got {len(keys)}")
    found: list[Tensor | None] = [None] * len(values)
    order = sorted(range(len(values)), key=lambda k: -values[k][0])  # stable: a block's in order
    limit = max(1, int(limit))
    for start in range(0, len(order), limit):
        group = order[start:start + limit]
        channels: Tensor | None = None
        members: list[int] = []
        for block in range(values[group[0]][0], -1, -1):
            born: dict[Hashable, list[int]] = {}
            for k in group:
                if values[k][0] == block:
                    born.setdefault(keys[k], []).append(k)
            channels = _pull_back(block_outputs[block], block_inputs[block], channels,
                                  [[values[k][1] for k in same] for same in born.values()])
            members += [k for same in born.values() for k in same]
        for row, k in enumerate(members):
            found[k] = channels[row]
        if progress is not None:
            progress(len(group))
    return found  # type: ignore[return-value]


def _pull_back(output: Tensor, inputs: Tensor, channels: Tensor | None, born: Sequence[Sequence[Tensor]]
               ) -> Tensor:
    """``(k + m, *inputs.shape)``: the ``k`` cotangents at a block's output, then the gradients
    of its ``m`` new values (batch by batch, ``born``), pulled back to its input."""
    parts = []
    if channels is not None:
        parts.append(batched_vjp(output, [inputs], channels.to(output.dtype).reshape(-1, *output.shape))[0])
    for values in born:
        stacked = torch.stack([v.sum() for v in values])
        parts.append(batched_vjp(stacked, [inputs], torch.eye(len(values), dtype=stacked.dtype, device=stacked.device))[0])
    return parts[0] if len(parts) == 1 else torch.cat(parts)
