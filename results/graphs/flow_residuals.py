"""Flow conservation of the unpruned attribution graph on every tiny family.

Run from the repository root::

    python results/graphs/flow_residuals.py     # writes FLOW_RESIDUALS.md and .json here

For every registered one-stack family (a tiny random model of each, 7 tokens) and every
encoder–decoder (a tiny one, its source and a target prefix), the unpruned graph at head
granularity explaining one logit: the largest in-flow residual over writer nodes
(``|Σ in-edges + bias edge − value|``: zero by construction, the bias edge holds the model's
constants), the largest out-flow residual over all nodes but the output (``|Σ out-edges +
direct edge − value|``: the check), the largest difference between the token nodes and
``attribute(...)`` with the same reference, and the bias edges' total where the family has no
bias terms; all relative to the largest ``|value|`` of the graph.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

ENCODERS = {"bert", "roberta", "xlm-roberta", "camembert", "electra", "modernbert", "distilbert", "deberta-v2"}


def _row(name: str, nd, source, target, kwargs) -> dict:
    graph = nd.attribute_graph(source, target, forward_kwargs=kwargs, granularity="head", prune=False)
    d = graph.data
    inflow, outflow = graph.flow()
    writers = torch.tensor([k not in ("token", "bias", "output") for k in d.kinds])
    scale = float(d.values.abs().max()) or 1.0
    found = nd.attribute(source, target=target, forward_kwargs=kwargs)
    expected = torch.cat([f[0] for f in found]) if isinstance(found, tuple) else found[0]
    tokens = [k for k, kind in enumerate(d.kinds) if kind == "token"]
    token_error = max(abs(float(d.values[k]) - float(expected[d.positions[k]])) for k in tokens)
    return {"family": name, "nodes": len(d), "edges": len(d.weights),
            "in_flow": float((inflow - d.values)[writers].abs().max()) / scale,
            "out_flow": float((outflow - d.values)[: d.output].abs().max()) / scale,
            "tokens": token_error / scale,
            "bias_edges": float(d.weights[d.sources == d.bias].abs().sum()) / scale}


def main() -> None:
    from captum_ffb import NormDecomposition
    from tests.models import (
        TINY_MODELS,
        TINY_SEQ2SEQ,
        seq2seq_inputs,
        split_source,
        tiny_task_model,
        token_ids,
    )

    rows = []
    for name in sorted(TINY_MODELS):
        encoder = name in ENCODERS
        model = tiny_task_model(name, "sequence_classification" if encoder else "causal_lm")
        rows.append(_row(name, NormDecomposition(model), token_ids()[:1, :7], 2 if encoder else 5, None))
        print(rows[-1], flush=True)
    for name in sorted(TINY_SEQ2SEQ):
        family = TINY_SEQ2SEQ[name]
        source, kwargs = split_source(seq2seq_inputs(family))
        rows.append(_row(name, NormDecomposition(family.build()), source[:1], 5, {k: v[:1] for k, v in kwargs.items()}))
        print(rows[-1], flush=True)
    (HERE / "FLOW_RESIDUALS.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    lines = ["# Flow conservation of attribution graphs, every tiny family", "",
             "Unpruned graph, head granularity, one logit; residuals relative to the graph's largest |value| "
             "(`python results/graphs/flow_residuals.py`). In-flow includes the bias edge (zero by construction); "
             "out-flow is the check; tokens: the token nodes against `attribute`; bias edges: their total.", "",
             "| family | nodes | edges | in-flow | out-flow | tokens vs attribute | bias edges |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['nodes']} | {r['edges']} | {r['in_flow']:.1e} | {r['out_flow']:.1e} | "
                     f"{r['tokens']:.1e} | {r['bias_edges']:.1e} |")
    worst = max(rows, key=lambda r: r["out_flow"])
    lines += ["", f"Largest out-flow residual: {worst['out_flow']:.1e} ({worst['family']}); largest token difference: "
              f"{max(r['tokens'] for r in rows):.1e}."]
    (HERE / "FLOW_RESIDUALS.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
