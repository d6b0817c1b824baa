"""The fast paths (token-wise and low-rank factored forms, cached bases, row chunks) give the
same maps as a plain chain of the rules on dense decompositions; a chain started from any
input decomposition agrees with them."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import Decomposition, LayerNormDecomposition
from captum_ffb.engine import Block, capture_layers, layers
from captum_ffb.rules import (
    Attention,
    GatedIGActivation,
    IGActivation,
    LayerNorm,
    Linear,
    Residual,
    RMSNorm,
)
from tests.models import TINY_MODELS, token_ids


def _dense(dec: Decomposition) -> Decomposition:
    return Decomposition(dec.terms.clone(), dec.bias.clone())


def _plain_chain(block: Block) -> dict[str, Decomposition]:
    """Every rule applied to dense decompositions, with no chunking and no compact forms."""
    spec = block.spec
    linear, residual = Linear(), Residual()

    def norm(role, dec):
        if getattr(spec, role) is None:
            return dec
        weight, bias, eps = block.norm_parameters(role)
        rule = RMSNorm() if spec.norm == "rms_norm" else LayerNorm()
        return _dense(rule(dec, block.real(role, "input"), weight, bias, eps))

    def gated_mlp(dec, w_gate, w_up, w_down, fn):
        gate, up = _dense(linear(dec, w_gate)), _dense(linear(dec, w_up))
        hidden = GatedIGActivation()(gate, up, fn, gate.total(), up.total())
        return _dense(linear(_dense(hidden), w_down))

    def ff(dec):
        if block.is_moe:
            weights = block.router_weights()
            out = None
            for expert in range(weights.shape[-1]):
                part = gated_mlp(dec, *block.expert_weights(expert), block.expert_activation())
                part = _dense(part.scale_rows(weights[..., expert]))
                out = part if out is None else _dense(out + part)
            shared = block.shared_expert()
            if shared is not None:
                part = gated_mlp(dec, *shared[0], shared[1])
                out = _dense(out + part.scale_rows(block.real("shared_expert_gate")[..., 0].sigmoid()))
            return norm("ff_post_norm", out)
        up = _dense(linear(dec, *block.projection(spec.ff_in)))
        real_up = block.projection_output("ff_in", spec.ff_in)
        if spec.ff_gate is None:
            hidden = IGActivation()(up, block.activation_fn(), real_up)
        else:
            gate = _dense(linear(dec, *block.projection(spec.ff_gate)))
            hidden = GatedIGActivation()(gate, up, block.activation_fn(),
                                         block.projection_output("ff_gate", spec.ff_gate), real_up)
        return norm("ff_post_norm", _dense(linear(_dense(hidden), *block.projection(spec.ff_out))))

    def attention(dec):
        out = _dense(Attention()(dec, block.probs, *block.attention_weights()))
        return norm("attention_post_norm", out)

    x = _dense(Decomposition.identity(block.inputs))
    chain = layers.chain_for(spec, block.config).name
    if chain == "post_ln":
        atb = norm("norm1", _dense(residual(attention(x), x)))
        out = ff(atb)
        res = _dense(residual(out, atb))
        return {"Atb": atb, "AtbFf": out, "AtbFfRes": res, "AtbFfResLn": norm("norm2", res)}
    atb = _dense(residual(attention(norm("norm1", x)), x))
    if chain == "parallel":
        out = ff(norm("norm2", x))
        return {"Atb": atb, "LnFf": out, "AtbLnFfRes": _dense(residual(out, atb))}
    ln = norm("norm2", atb)
    out = ff(ln)
    return {"Atb": atb, "AtbLn": ln, "AtbLnFf": out, "AtbLnFfRes": _dense(residual(out, atb))}


FAMILIES = ["bert", "gpt2", "llama", "qwen2", "phi", "gptj", "gpt_neox", "gemma2", "mixtral",
            "qwen2_moe", "qwen3_moe", "phi3", "olmo", "olmo2", "starcoder2", "cohere"]
#: transformers' grouped expert matmul runs in float32 at most
MOE = {"mixtral", "qwen2_moe", "qwen3_moe"}


def _precision(name: str) -> tuple[torch.dtype, dict]:
    if name in MOE:
        return torch.float32, {"rtol": 1e-5, "atol": 1e-6}
    return torch.float64, {"rtol": 1e-9, "atol": 1e-10}


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("rows_per_chunk", [None, 3])
def test_fast_paths_equal_the_plain_chain(name, rows_per_chunk):
    spec = TINY_MODELS[name]
    dtype, tolerance = _precision(name)
    model = spec.build().to(dtype)
    layer = spec.blocks(model)[0]
    ids = token_ids(batch=2, n=7)
    lnd = LayerNormDecomposition(model, layer, dtype=dtype)
    fast = lnd.attribute(ids, scope=list(lnd.scopes), internal_batch_size=rows_per_chunk)

    (block,), _ = capture_layers(model, model, [layer], lnd.spec, ids, dtype=dtype)
    plain = _plain_chain(block)
    assert set(plain) == set(lnd.scopes)
    for scope in lnd.scopes:
        torch.testing.assert_close(fast[scope], plain[scope].maps(), **tolerance)


@pytest.mark.parametrize("name", ["bert", "llama", "phi", "mixtral"])
def test_a_dense_start_equal_to_the_identity_gives_the_same_maps(name):
    """Starting from the identity stored densely takes the general (dense) paths."""
    spec = TINY_MODELS[name]
    dtype, tolerance = _precision(name)
    model = spec.build().to(dtype)
    layer = spec.blocks(model)[1]
    ids = token_ids(batch=2, n=6)
    lnd = LayerNormDecomposition(model, layer, dtype=dtype)
    fast = lnd.attribute(ids, scope=list(lnd.scopes))
    (block,), _ = capture_layers(model, model, [layer], lnd.spec, ids, dtype=dtype)
    start = Decomposition.identity(block.inputs).dense()
    dense, dense_delta = lnd.attribute(ids, scope=list(lnd.scopes), return_convergence_delta=True,
                                       input_decomposition=start, internal_batch_size=4,
                                       relative_delta=True)
    for scope in lnd.scopes:
        torch.testing.assert_close(dense[scope], fast[scope], **tolerance)
        assert float(dense_delta[scope].max()) < 1e-6  # some models norm in float32


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "gpt_neox", "qwen2_moe"])
def test_chaining_two_blocks_decomposes_over_the_first_blocks_input(name):
    """Block 0's output decomposition, fed to block 1, gives block 1's output as a sum over
    block 0's input tokens, and each token's part equals propagating that token alone."""
    spec = TINY_MODELS[name]
    dtype, tolerance = _precision(name)
    model = spec.build().to(dtype)
    first, second = spec.blocks(model)[0], spec.blocks(model)[1]
    ids = token_ids(batch=1, n=5)
    out0 = LayerNormDecomposition(model, first, dtype=dtype).decompose(ids)
    lnd1 = LayerNormDecomposition(model, second, dtype=dtype)
    out1, delta = lnd1.decompose(ids, input_decomposition=out0, return_convergence_delta=True,
                                 relative_delta=True)
    assert out1.terms.shape == out0.terms.shape
    assert float(delta.max()) < 1e-6  # against block 1's real output (some norms run in float32)

    # linear in the players: token 2's column alone (the rest in the bias) gives the same column
    alone = Decomposition(out0.terms[:, :, 2:3].clone(), out0.bias + out0.terms.sum(2) - out0.terms[:, :, 2])
    part = lnd1.decompose(ids, input_decomposition=alone)
    torch.testing.assert_close(part.terms[:, :, 0], out1.terms[:, :, 2], **tolerance)


def test_memory_budget_sets_the_row_chunks(monkeypatch):
    spec = TINY_MODELS["bert"]
    model = spec.build()
    ids = token_ids(batch=2, n=9)
    roomy = LayerNormDecomposition(model, model.encoder.layer[0])
    tight = LayerNormDecomposition(model, model.encoder.layer[0], memory_budget=1)
    seen = []
    plain = layers.row_chunks

    def spy(*args, **kwargs):
        seen.append(plain(*args, **kwargs))
        return seen[-1]

    from captum_ffb.attr import layer_norm_decomposition as attr_module

    monkeypatch.setattr(attr_module, "row_chunks", spy)
    torch.testing.assert_close(tight.attribute(ids), roomy.attribute(ids))
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
