"""A recorded pass keeps each attention call's queries, keys and values, not its probabilities;
the rows it computes again are the model's own, and the graph's products that read only the
rows they need equal autograd's."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.engine.autograd import batched_vjp
from captum_ffb.engine.rows import AttentionRows
from captum_ffb.engine.tape import graph_pass
from tests.models import tiny_task_model, token_ids

ENCODERS = ("bert", "modernbert")


def _tape(name: str):
    model = tiny_task_model(name, "sequence_classification" if name in ENCODERS else "causal_lm")
    nd = NormDecomposition(model)
    ids = token_ids()[:1, :7]
    request = nd.engine.request((ids,), {})
    target = nd._target(2 if name in ENCODERS else 5, None, request.read_mask)
    return model, ids, graph_pass(nd.engine, request, target, nd.rules, "head")


def _sparse_cotangents(shape: torch.Size, rows: list[tuple[int, int]], width: int) -> torch.Tensor:
    """``len(rows)`` cotangents of ``shape``, each non-zero at one position only (the ``k``-th
    at ``rows[k]``'s position)."""
    generator = torch.Generator().manual_seed(3)
    cotangents = torch.zeros((len(rows), *shape))
    flat = cotangents.view(len(rows), -1, width)
    for k, (_, position) in enumerate(rows):
        flat[k, position] = torch.randn(width, generator=generator)
    return cotangents


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt2", "bert", "qwen2", "modernbert"])
def test_the_row_route_equals_autograd(name):
    _, _, tape = _tape(name)
    routes = 0
    for index, writer in enumerate(tape.writers):
        if writer.kind != "attention":
            continue
        for parts, start in ((True, writer.raw), (False, writer.output)):
            route = tape.route(index, parts)
            assert route is not None, (name, index, parts)
            routes += 1
            cotangents = _sparse_cotangents(start.shape, [(0, 2), (1, 5), (2, 5), (3, 6)], start.shape[-1])
            (expected,) = batched_vjp(start, [tape.reads[writer.read][1]], cotangents)
            found = route.pull(cotangents)
            scale = float(expected.abs().max())
            assert scale > 0
            torch.testing.assert_close(found, expected, atol=1e-6 * scale, rtol=1e-5)
    assert routes == 2 * sum(w.kind == "attention" for w in tape.writers)


def test_an_sdpa_pass_keeps_no_probabilities_and_computes_the_model_s_rows():
    model, ids, tape = _tape("llama")
    assert model.config._attn_implementation == "sdpa"
    kept = [v for k, v in tape.coefficients.values.items() if k[0] == "attention"]
    assert len(kept) == 2 and all(isinstance(v, AttentionRows) and v.weights is None for v in kept)
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            real = model(ids, output_attentions=True).attentions
    finally:
        model.config._attn_implementation = "sdpa"
    for layer, rows in enumerate(kept):
        torch.testing.assert_close(rows.rows(torch.tensor([1, 4, 6])), real[layer][:, :, [1, 4, 6]])
        torch.testing.assert_close(rows.full(), real[layer])


def test_a_call_whose_rows_do_not_give_its_output_takes_no_route():
    """An attention whose eager function does not compute what the recorded call did (here
    its mask is lost) is checked once and left to autograd."""
    _, _, tape = _tape("llama")
    index = next(k for k, w in enumerate(tape.writers) if w.kind == "attention")
    kept = [v for v in tape.coefficients.values.values() if isinstance(v, AttentionRows)]
    for rows in kept:
        rows.mask, rows.checked = None, None  # no causal mask: the rows see the future
    assert tape.route(index, parts=True) is None
    with pytest.raises(ValueError, match="cannot be computed again"):
        kept[0].full()
