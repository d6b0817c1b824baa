"""Attention rule: against a plain multi-head attention, with grouped-query heads, and
against BERT's own attention module."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import Decomposition, FactoredDecomposition
from captum_ffb.rules import Attention
from tests.models import TINY_MODELS, token_ids


def _reference_attention(z, probs, w_v, b_v, w_o, b_o, n_kv):
    batch, n, _ = z.shape
    heads = probs.shape[1]
    head_dim = w_o.shape[0] // heads
    values = (z @ w_v + b_v).reshape(batch, n, n_kv, head_dim).transpose(1, 2)
    values = values.repeat_interleave(heads // n_kv, dim=1)
    mixed = (probs @ values).transpose(1, 2).reshape(batch, n, heads * head_dim)
    return mixed @ w_o + b_o


@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_attention_total_matches_multi_head_attention(n_kv):
    torch.manual_seed(0)
    batch, n, d, heads, head_dim = 2, 5, 8, 4, 3
    probs = torch.softmax(torch.randn(batch, heads, n, n, dtype=torch.float64), dim=-1)
    w_v = torch.randn(d, n_kv * head_dim, dtype=torch.float64)
    b_v = torch.randn(n_kv * head_dim, dtype=torch.float64)
    w_o = torch.randn(heads * head_dim, d, dtype=torch.float64)
    b_o = torch.randn(d, dtype=torch.float64)
    x = torch.randn(batch, n, d, dtype=torch.float64)
    ident = Decomposition.identity(x)
    expected = _reference_attention(x, probs, w_v, b_v, w_o, b_o, n_kv)

    out = Attention()(ident, probs, w_v, b_v, w_o, b_o)
    assert isinstance(out, FactoredDecomposition) and out.n_components == heads
    torch.testing.assert_close(out.total(), expected)
    # Kobayashi et al. 2020: F[i, j] = Σ_h α^h_ij x_j W_V^h W_O^h
    torch.testing.assert_close(out.terms.sum(2) + out.bias, expected)

    # the same rule on the other forms of the same input gives the same terms
    dense = Attention()(Decomposition(ident.terms, ident.bias), probs, w_v, b_v, w_o, b_o)
    factored = Attention()(ident.factored(), probs, w_v, b_v, w_o, b_o)
    torch.testing.assert_close(dense.terms, out.terms)
    torch.testing.assert_close(factored.terms, out.terms)


def test_attention_of_a_mixed_input_is_complete():
    torch.manual_seed(1)
    batch, n, d, heads = 1, 4, 6, 2
    probs = torch.softmax(torch.randn(batch, heads, n, n, dtype=torch.float64), dim=-1)
    w_v, w_o = torch.randn(d, d, dtype=torch.float64), torch.randn(d, d, dtype=torch.float64)
    dec = Decomposition(torch.randn(batch, n, n, d, dtype=torch.float64), torch.randn(batch, n, d, dtype=torch.float64))
    out = Attention()(dec, probs, w_v, None, w_o, None)
    expected = _reference_attention(dec.total(), probs, w_v, torch.zeros(d, dtype=torch.float64), w_o, torch.zeros(d, dtype=torch.float64), heads)
    torch.testing.assert_close(out.total(), expected)


def test_attention_shape_errors():
    probs = torch.softmax(torch.randn(1, 4, 3, 3), -1)
    ident = Decomposition.identity(torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match="multiple of 4 heads"):
        Attention()(ident, probs, torch.randn(8, 8), None, torch.randn(6, 8), None)
    with pytest.raises(ValueError, match="key positions"):
        Attention()(Decomposition.identity(torch.randn(1, 5, 8)), probs, torch.randn(8, 8), None, torch.randn(8, 8), None)


def test_attention_reproduces_bert_attention_output():
    """The rule with the captured probabilities reproduces BERT's own attention sub-layer."""
    from captum_ffb.architectures import get_architecture
    from captum_ffb.engine import capture_layers

    spec = TINY_MODELS["bert"]
    model = spec.build()
    layer = model.encoder.layer[0]
    ids = token_ids()
    seen = {}
    handle = layer.attention.output.dense.register_forward_hook(lambda m, a, o: seen.setdefault("out", o))
    try:
        (block,), _ = capture_layers(model, model, [layer], get_architecture("bert"), ids)
    finally:
        handle.remove()
    out = Attention()(Decomposition.identity(block.inputs), block.probs, *block.attention_weights())
    torch.testing.assert_close(out.total(), seen["out"], atol=1e-5, rtol=1e-5)


def test_dense_input_over_other_players_matches_the_reference():
    """A dense value input over P players (not the tokens): each player's part goes through
    attention on its own, and the parts add up to the attention of the total."""
    torch.manual_seed(4)
    batch, n, players, d, heads, n_kv, head_dim = 2, 5, 3, 8, 4, 2, 3
    probs = torch.softmax(torch.randn(batch, heads, n, n, dtype=torch.float64), dim=-1)
    w_v = torch.randn(d, n_kv * head_dim, dtype=torch.float64)
    w_o = torch.randn(heads * head_dim, d, dtype=torch.float64)
    dec = Decomposition(torch.randn(batch, n, players, d, dtype=torch.float64),
                        torch.randn(batch, n, d, dtype=torch.float64))
    out = Attention()(dec, probs, w_v, None, w_o, None)
    assert out.terms.shape == (batch, n, players, d)
    for p in range(players):
        expected = _reference_attention(dec.terms[:, :, p], probs, w_v, 0, w_o, 0, n_kv)
        torch.testing.assert_close(out.terms[:, :, p], expected)
    torch.testing.assert_close(out.total(), _reference_attention(dec.total(), probs, w_v, 0, w_o, 0, n_kv))
