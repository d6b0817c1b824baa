"""The fast paths (token-wise and low-rank factored forms, cached bases, row chunks) give the
same maps as a plain chain of the rules on dense decompositions."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import Decomposition, LayerNormDecomposition, rules
from captum_ffb.architectures import Block
from captum_ffb.attr import layer_norm_decomposition as engine
from captum_ffb.capture import capture_blocks
from tests.models import TINY_MODELS, token_ids


def _dense(dec: Decomposition) -> Decomposition:
    return Decomposition(dec.terms.clone(), dec.bias.clone())


def _plain_chain(block: Block) -> dict[str, Decomposition]:
    """Every rule applied to dense decompositions, with no chunking and no compact forms."""
    spec = block.spec

    def norm(role, dec):
        weight, bias, eps = block.norm_parameters(role)
        real = block.real(role, "input")
        if spec.norm == "rms_norm":
            return _dense(rules.rms_norm(dec, real, weight, eps))
        return _dense(rules.layer_norm(dec, real, weight, bias, eps))

    def ff(dec):
        up = _dense(rules.linear(dec, *block.projection(spec.ff_in)))
        if spec.ff_gate is None:
            hidden = rules.activation(up, block.activation_fn(), pre_activation=block.real("ff_in"))
        else:
            gate = _dense(rules.linear(dec, *block.projection(spec.ff_gate)))
            hidden = rules.gated_activation(gate, up, block.activation_fn(),
                                            real_gate=block.real("ff_gate"), real_up=block.real("ff_in"))
        return _dense(rules.linear(_dense(hidden), *block.projection(spec.ff_out)))

    x = _dense(Decomposition.identity(block.inputs))
    if spec.chain == "post_ln":
        atb = norm("norm1", _dense(rules.attention(x, block.probs, *block.attention_weights())) + x)
        out = ff(atb)
        res = out + atb
        return {"Atb": atb, "AtbFf": out, "AtbFfRes": res, "AtbFfResLn": norm("norm2", res)}
    attn = _dense(rules.attention(norm("norm1", x), block.probs, *block.attention_weights()))
    atb = attn + x
    ln = norm("norm2", atb)
    out = ff(ln)
    return {"Atb": atb, "AtbLn": ln, "AtbLnFf": out, "AtbLnFfRes": out + atb}


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("rows_per_chunk", [None, 3])
def test_fast_paths_equal_the_plain_chain(name, rows_per_chunk):
    spec = TINY_MODELS[name]
    model = spec.build().double()
    layer = spec.blocks(model)[1]
    ids = token_ids(batch=2, n=7)
    lnd = LayerNormDecomposition(model, layer, dtype=torch.float64)
    fast = lnd.attribute(ids, scope=list(lnd.scopes), internal_batch_size=rows_per_chunk)

    (capture,) = capture_blocks(lambda: model(input_ids=ids), [layer], [lnd.watched_modules(layer)],
                                [[layer.get_submodule(lnd.spec.attention)]], owners=[model])
    plain = _plain_chain(Block(layer, lnd.spec, capture, dtype=torch.float64))
    for scope in lnd.scopes:
        torch.testing.assert_close(fast[scope], plain[scope].maps(), rtol=1e-9, atol=1e-10)


def test_memory_budget_sets_the_row_chunks():
    spec = TINY_MODELS["bert"]
    model = spec.build()
    ids = token_ids(batch=2, n=9)
    roomy = LayerNormDecomposition(model, model.encoder.layer[0])
    tight = LayerNormDecomposition(model, model.encoder.layer[0], memory_budget=1)
    seen = []
    plain = engine._row_chunks

    def spy(*args, **kwargs):
        seen.append(plain(*args, **kwargs))
        return seen[-1]

    engine._row_chunks = spy
    try:
        torch.testing.assert_close(tight.attribute(ids), roomy.attribute(ids))
    finally:
        engine._row_chunks = plain
    assert len(seen[0]) == 9 and len(seen[1]) == 1  # one row per chunk under a tiny budget


def test_scratch_buffers_reused_across_calls_and_sizes_change_nothing():
    spec = TINY_MODELS["llama"]
    model = spec.build()
    block = spec.blocks(model)[0]
    reused = LayerNormDecomposition(model, block)
    for n, rows in ((9, None), (5, 2), (9, 4), (3, None)):
        ids = token_ids(batch=2, n=n, seed=n)
        got = reused.attribute(ids, scope=list(reused.scopes), internal_batch_size=rows)
        fresh = LayerNormDecomposition(model, block).decompose(ids, scope=list(reused.scopes))
        for scope in reused.scopes:
            torch.testing.assert_close(got[scope], fresh[scope].maps())
    assert reused._arena.buffers
    reused.release_memory()
    assert not reused._arena.buffers
