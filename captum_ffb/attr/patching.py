r"""Patching estimates: what patching each node's output from a corrupted run would change,
estimated from one clean and one corrupted pass (no patched pass).

For a node ``A`` with clean output ``o_A`` and output ``o_A^b`` in the baseline (corrupted)
run, every estimator is ``⟨G_A, o_A − o_A^b⟩`` with a gradient ``G_A`` of the explained value:

* ``"frozen"``: the frozen model's (every coefficient of the clean run fixed; exact for the
  frozen model);
* ``"atp"``: the real model's (attribution patching, Nanda 2023; Syed et al. 2023);

and the library's default, :data:`DEFAULT_ESTIMATOR` (see docs/graphs.md for how it was
chosen against real activation patching).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["DEFAULT_ESTIMATOR", "ESTIMATORS", "patch_estimates"]

#: The estimators by name.
ESTIMATORS = ("frozen", "atp")
#: The default estimator (chosen against activation patching on IOI, held-out rows).
DEFAULT_ESTIMATOR = "frozen"


def patch_estimates(nd: Any, request: Any, target: Any, rules: Mapping[str, Any], tape: Any, found: Any,
                    data: Any, baseline_inputs: Any, granularity: str) -> dict[str, Tensor]:
    """``{estimator: (N,)}``: each node's estimated patching effect (zero for tokens, the bias
    and the output) under every estimator of :data:`ESTIMATORS`."""
    from captum_ffb.engine.graph import real_writers

    engine = nd.engine
    baseline = torch.as_tensor(baseline_inputs)
    baseline = baseline[None] if baseline.dim() == 1 else baseline
    if tuple(baseline.shape) != tuple(request.args[0].shape):
        raise ValueError(f"baseline_inputs must have the inputs' shape {tuple(request.args[0].shape)} (a corrupted "
                         f"prompt of the same length), got {tuple(baseline.shape)}")
    corrupt = nd._request(baseline, request.args[1:] or None, request.kwargs)
    base = real_writers(engine, corrupt, target, granularity)
    real = real_writers(engine, request, target, granularity, gradients=True)
    estimates = {name: torch.zeros(len(data), dtype=data.values.dtype) for name in ESTIMATORS}
    covector = found.total
    index = _node_index(data)
    for k, writer in enumerate(tape.writers):
        n = request.read_mask.shape[1]
        if writer.parts is None:
            clean = real.outputs[writer.key]
            difference = clean - base.outputs[writer.key]
            frozen = covector[writer.key].reshape(difference.shape)
            atp = real.gradients[writer.key]
            per = {"frozen": (frozen * difference).sum(-1)[0], "atp": (atp * difference).sum(-1)[0]}
            for name, values in per.items():
                for p in range(n):
                    node = index.get((writer.layer, writer.kind, -1, p))
                    if node is not None:
                        estimates[name][node] = values[p]
        else:
            from captum_ffb.engine.graph import part_covectors

            difference = real.parts[writer.key] - base.parts[writer.key]
            frozen = part_covectors(tape, k, covector[writer.key])
            atp = real.gradients[f"{writer.key}.parts"]
            kind = "head" if writer.kind == "attention" else "neuron"
            per = {"frozen": (frozen * difference).sum(-1)[0], "atp": (atp * difference).sum(-1)[0]}
            for name, values in per.items():
                for p in range(n):
                    for j in range(values.shape[1]):
                        node = index.get((writer.layer, kind, j, p))
                        if node is not None:
                            estimates[name][node] = values[p, j]
    estimates["default"] = estimates[DEFAULT_ESTIMATOR].clone()
    return {name: value.detach() for name, value in estimates.items()}


def _node_index(data: Any) -> dict[tuple[int, str, int, int], int]:
    return {(layer, kind, part, p): k for k, (kind, layer, part, p)
            in enumerate(zip(data.kinds, data.layers, data.heads, data.positions))}
