"""LayerNormDecomposition on tiny random models of every registered architecture."""

from __future__ import annotations

import pytest
import torch
from captum.attr import LayerAttribution

from captum_ffb import (
    Decomposition,
    LayerNormDecomposition,
    UnsupportedArchitectureError,
    supported_architectures,
)
from captum_ffb.rules import GatedIGActivation, IGActivation
from tests.models import TINY_MODELS, capture_references, token_ids

NAMES = sorted(TINY_MODELS)
#: every family's layer maps: part of the smoke run on the lowest supported versions (.ci/run)
pytestmark = pytest.mark.smoke


@pytest.fixture(scope="module", params=NAMES)
def tiny(request):
    spec = TINY_MODELS[request.param]
    return spec, spec.build()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_every_registered_family_has_a_tiny_model():
    from tests.models import TINY_SEQ2SEQ  # encoder–decoders: tests/encoder_decoder

    covered = {name.split("-post-ln")[0].split("-sequential")[0] for name in TINY_MODELS}
    covered |= {model.build().config.model_type for model in TINY_SEQ2SEQ.values()}
    assert set(supported_architectures()) <= covered


def test_is_a_captum_layer_attribution(tiny):
    spec, model = tiny
    lnd = LayerNormDecomposition(model, spec.blocks(model)[0])
    assert isinstance(lnd, LayerAttribution)
    assert lnd.has_convergence_delta()
    assert any(p.requires_grad for p in model.parameters())
    maps, delta = lnd.attribute(token_ids(), return_convergence_delta=True)
    assert not maps.requires_grad and not delta.requires_grad  # computed under no_grad


def test_completeness_at_every_scope_against_real_tensors(tiny):
    spec, model = tiny
    ids = token_ids()
    blocks = spec.blocks(model)
    for block in blocks:
        lnd = LayerNormDecomposition(model, block)
        decs = lnd.decompose(ids, scope=list(lnd.scopes))
        refs = capture_references(model, block, spec.references, input_ids=ids)
        assert set(decs) == set(refs)
        for scope, dec in decs.items():
            assert dec.terms.shape == (2, 9, 9, 32)
            assert refs[scope].abs().max() > 0
            assert _relative(dec.total(), refs[scope]) < 1e-5, scope


def test_whole_layer_equals_next_hidden_state(tiny):
    spec, model = tiny
    ids = token_ids()
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    blocks = spec.blocks(model)
    lnd = LayerNormDecomposition(model, list(blocks))
    results = lnd.decompose(ids, return_convergence_delta=True)
    assert len(results) == len(blocks)
    for index, (dec, delta) in enumerate(results):
        target = hidden[index + 1]
        if spec.final_norm and index == len(blocks) - 1:
            continue  # the model's last hidden state is taken after its final norm
        assert _relative(dec.total(), target) < 1e-5
        assert delta.shape == (2,)
        assert float(delta.max()) < 1e-4


def test_convergence_delta_is_the_completeness_residual(tiny):
    spec, model = tiny
    ids = token_ids()
    block = spec.blocks(model)[1]
    lnd = LayerNormDecomposition(model, block)
    maps, deltas = lnd.attribute(ids, scope=list(lnd.scopes), return_convergence_delta=True)
    refs = capture_references(model, block, spec.references, input_ids=ids)
    decs = lnd.decompose(ids, scope=list(lnd.scopes))
    _, relative = lnd.attribute(ids, scope=list(lnd.scopes), return_convergence_delta=True,
                                relative_delta=True)
    for scope in lnd.scopes:
        expected = (decs[scope].total() - refs[scope]).abs().amax(dim=(1, 2))
        # the test's own forward pass may use another attention kernel (sdpa): allow rounding
        scale = float(refs[scope].abs().max())
        torch.testing.assert_close(deltas[scope], expected, atol=1e-6 * max(1.0, scale), rtol=0)
        torch.testing.assert_close(maps[scope], decs[scope].terms.norm(dim=-1))
        torch.testing.assert_close(relative[scope], deltas[scope] / refs[scope].abs().amax(dim=(1, 2)))


def test_closed_form_equals_captum_integrated_gradients(tiny):
    spec, model = tiny
    ids = token_ids(batch=1, n=6)
    lnd = LayerNormDecomposition(model, spec.blocks(model)[0])
    exact = lnd.attribute(ids, scope=list(lnd.scopes))
    role = "activation" if "activation" in lnd.roles else "gated_activation"
    rule = {"activation": IGActivation, "gated_activation": GatedIGActivation}[role]
    captum_route = LayerNormDecomposition(model, spec.blocks(model)[0], rules={
        role: rule(route="captum", method="gausslegendre", n_steps=50)})
    numeric = captum_route.attribute(ids, scope=list(lnd.scopes))
    for scope in lnd.scopes:
        assert _relative(numeric[scope], exact[scope]) < 1e-5, scope


def test_causal_models_have_zeros_above_the_diagonal(tiny):
    spec, model = tiny
    if not spec.causal:
        pytest.skip("bidirectional model")
    lnd = LayerNormDecomposition(model, spec.blocks(model)[1])
    maps = lnd.attribute(token_ids(), scope=list(lnd.scopes))
    upper = torch.triu(torch.ones(9, 9, dtype=torch.bool), diagonal=1)
    for scope, m in maps.items():
        assert torch.all(m[:, upper] == 0), scope
        assert torch.all(m[:, ~upper].sum(-1) > 0)


def test_padding_gives_zero_rows_and_columns_and_keeps_real_maps(tiny):
    spec, model = tiny
    short = token_ids(batch=1, n=5, seed=3)
    long = token_ids(batch=1, n=8, seed=4)
    padded = torch.cat([short, torch.full((1, 3), 1)], dim=1)
    batch = torch.cat([padded, long])
    mask = torch.ones_like(batch)
    mask[0, 5:] = 0
    lnd = LayerNormDecomposition(model, spec.blocks(model)[1])
    together = lnd.attribute(batch, scope=list(lnd.scopes), forward_kwargs={"attention_mask": mask})
    alone = lnd.attribute(short, scope=list(lnd.scopes))
    alone_long = lnd.attribute(long, scope=list(lnd.scopes))
    for scope in lnd.scopes:
        assert torch.all(together[scope][0, 5:] == 0) and torch.all(together[scope][0, :, 5:] == 0)
        torch.testing.assert_close(together[scope][0, :5, :5], alone[scope][0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(together[scope][1], alone_long[scope][0], atol=1e-5, rtol=1e-4)


def test_row_chunks_do_not_change_the_result(tiny):
    spec, model = tiny
    ids = token_ids()
    lnd = LayerNormDecomposition(model, spec.blocks(model)[0])
    whole = lnd.attribute(ids, scope=list(lnd.scopes), internal_batch_size=9)
    chunked, delta = lnd.attribute(ids, scope=list(lnd.scopes), internal_batch_size=2,
                                   return_convergence_delta=True)
    for scope in lnd.scopes:
        torch.testing.assert_close(chunked[scope], whole[scope])
        assert delta[scope].shape == (2,)


def test_default_scope_is_the_whole_layer(tiny):
    spec, model = tiny
    ids = token_ids()
    lnd = LayerNormDecomposition(model, spec.blocks(model)[0])
    default, delta = lnd.attribute(ids, return_convergence_delta=True)
    last = lnd.attribute(ids, scope=lnd.scopes[-1])
    torch.testing.assert_close(default, last)
    assert default.shape == (2, 9, 9) and delta.shape == (2,)


def test_decompose_returns_the_vectors():
    spec = TINY_MODELS["bert"]
    model = spec.build()
    lnd = LayerNormDecomposition(model, spec.blocks(model)[0])
    dec = lnd.decompose(token_ids(), scope="AtbFf")
    assert isinstance(dec, Decomposition)
    assert dec.terms.shape == (2, 9, 9, 32) and dec.bias.shape == (2, 9, 32)


def test_forward_func_may_be_a_function_of_the_model():
    spec = TINY_MODELS["gpt2"]
    model = spec.build()
    ids = token_ids()
    direct = LayerNormDecomposition(model, model.h[0]).attribute(ids)
    wrapped = LayerNormDecomposition(lambda x: model(input_ids=x).last_hidden_state, model.h[0])
    torch.testing.assert_close(wrapped.attribute(ids), direct)


def test_half_precision_model_is_decomposed_in_float32():
    spec = TINY_MODELS["bert"]
    model = spec.build().to(torch.bfloat16)
    lnd = LayerNormDecomposition(model, model.encoder.layer[0])
    maps, delta = lnd.attribute(token_ids(), return_convergence_delta=True)
    assert maps.dtype == torch.float32
    assert torch.isfinite(maps).all() and float(delta.max()) < 0.1


def test_training_mode_is_restored_and_dropout_does_not_break_completeness():
    spec = TINY_MODELS["bert"]
    model = spec.build()
    model.train()
    lnd = LayerNormDecomposition(model, model.encoder.layer[0])
    _, delta = lnd.attribute(token_ids(), return_convergence_delta=True)
    assert model.encoder.layer[0].training
    assert float(delta.max()) < 1e-4


def test_the_model_attention_setting_is_restored():
    spec = TINY_MODELS["bert"]
    model = spec.build()
    before = model.config._attn_implementation
    LayerNormDecomposition(model, model.encoder.layer[0]).attribute(token_ids())
    assert model.config._attn_implementation == before


# ---------------------------------------------------------------------- errors
def test_unsupported_model_lists_what_is_supported():
    from transformers import XLNetConfig, XLNetModel

    model = XLNetModel(XLNetConfig(vocab_size=60, d_model=16, n_layer=1, n_head=4, d_inner=32))
    with pytest.raises(UnsupportedArchitectureError, match="Supported: .*bert.*register_architecture"):
        LayerNormDecomposition(model, model.layer[0])


def test_layer_not_in_the_model():
    spec = TINY_MODELS["bert"]
    model, other = spec.build(), spec.build()
    with pytest.raises(ValueError, match="not part of the model"):
        LayerNormDecomposition(model, other.encoder.layer[0])


def test_a_module_that_is_not_a_block():
    spec = TINY_MODELS["bert"]
    model = spec.build()
    with pytest.raises(ValueError, match="not a bert Transformer block"):
        LayerNormDecomposition(model, model.encoder.layer[0].attention)


def test_empty_input():
    spec = TINY_MODELS["bert"]
    model = spec.build()
    lnd = LayerNormDecomposition(model, model.encoder.layer[0])
    with pytest.raises(ValueError, match="empty"):
        lnd.attribute(torch.zeros(1, 0, dtype=torch.long))


def test_unknown_scope_names_the_valid_ones():
    spec = TINY_MODELS["gpt2"]
    model = spec.build()
    lnd = LayerNormDecomposition(model, model.h[0])
    with pytest.raises(ValueError, match="AtbLnFfRes"):
        lnd.attribute(token_ids(), scope="AtbFfResLn")


def test_bad_internal_batch_size():
    spec = TINY_MODELS["bert"]
    model = spec.build()
    lnd = LayerNormDecomposition(model, model.encoder.layer[0])
    with pytest.raises(ValueError, match="internal_batch_size"):
        lnd.attribute(token_ids(), internal_batch_size=0)


def test_parallel_blocks_feed_forward_branch_does_not_mix_tokens():
    for name in ("gpt_neox", "gptj", "phi"):
        spec = TINY_MODELS[name]
        model = spec.build()
        lnd = LayerNormDecomposition(model, spec.blocks(model)[0])
        assert lnd.scopes == ("Atb", "LnFf", "AtbLnFfRes")
        maps = lnd.attribute(token_ids(), scope=["Atb", "LnFf"])
        eye = torch.eye(9, dtype=torch.bool)
        assert torch.all(maps["LnFf"][:, ~eye] == 0) and torch.all(maps["LnFf"][:, eye] > 0), name
        assert torch.any(maps["Atb"][:, ~eye] > 0), name


def test_mixture_of_experts_uses_the_real_routing():
    """Tokens routed away from an expert get nothing from it: zeroing an unused expert's
    weights leaves the maps unchanged, zeroing a used one changes them."""
    spec = TINY_MODELS["mixtral"]
    model = spec.build()
    block = spec.blocks(model)[0]
    ids = token_ids(batch=1, n=1)  # one token: two of the four experts are chosen
    lnd = LayerNormDecomposition(model, block)
    before = lnd.attribute(ids, scope="AtbLnFf")
    seen = {}
    handle = block.mlp.gate.register_forward_hook(lambda m, a, out: seen.update(index=out[2]))
    with torch.no_grad():
        model(input_ids=ids)
    handle.remove()
    used = set(seen["index"].flatten().tolist())
    assert len(used) < 4
    unused = [e for e in range(4) if e not in used]
    with torch.no_grad():
        for e in unused:
            block.mlp.experts.down_proj[e].zero_()
    torch.testing.assert_close(lnd.attribute(ids, scope="AtbLnFf"), before)
    with torch.no_grad():
        block.mlp.experts.down_proj[min(used)].zero_()
    assert not torch.allclose(lnd.attribute(ids, scope="AtbLnFf"), before)


def test_a_list_of_one_layer_returns_a_list():
    spec = TINY_MODELS["bert"]
    model = spec.build()
    ids = token_ids()
    single = LayerNormDecomposition(model, model.encoder.layer[0]).attribute(ids)
    listed = LayerNormDecomposition(model, [model.encoder.layer[0]]).attribute(ids)
    assert isinstance(listed, list) and len(listed) == 1
    torch.testing.assert_close(listed[0], single)


def test_progress_bar_over_row_chunks(capsys):
    spec = TINY_MODELS["bert"]
    model = spec.build()
    lnd = LayerNormDecomposition(model, list(model.encoder.layer), show_progress=True)
    lnd.attribute(token_ids(), internal_batch_size=3)
    err = capsys.readouterr().err
    assert "decomposing" in err and "6/6" in err  # 2 layers x 3 chunks of rows


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_inputs_embeds_give_the_maps_of_the_token_ids(name):
    spec = TINY_MODELS[name]
    model = spec.build().eval()
    ids = token_ids(2, 7)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    embeds = model.get_input_embeddings()(ids).detach()
    lnd = LayerNormDecomposition(model, spec.blocks(model)[1])
    kwargs = {"forward_kwargs": {"attention_mask": mask}}
    from_ids = lnd.attribute(ids, scope=list(lnd.scopes), **kwargs)
    from_embeds = lnd.attribute(embeds, scope=list(lnd.scopes), **kwargs)
    for scope in lnd.scopes:
        torch.testing.assert_close(from_embeds[scope], from_ids[scope], rtol=0, atol=0)
    decomposition = lnd.decompose(embeds, **kwargs)
    torch.testing.assert_close(decomposition.terms, lnd.decompose(ids, **kwargs).terms, rtol=0, atol=0)
    assert float(lnd.compute_convergence_delta(decomposition, embeds, **kwargs).max()) < 1e-4


def test_compute_convergence_delta_checks_given_decompositions():
    tiny = TINY_MODELS["bert"]
    model = tiny.build()
    layer = tiny.blocks(model)[0]
    ids = token_ids()
    lnd = LayerNormDecomposition(model, layer)
    dec, delta = lnd.decompose(ids, scope="AtbFf", return_convergence_delta=True)
    torch.testing.assert_close(lnd.compute_convergence_delta(dec, ids, scope="AtbFf"), delta)
    shifted = Decomposition(dec.terms, dec.bias + 0.5)
    torch.testing.assert_close(lnd.compute_convergence_delta(shifted, ids, scope="AtbFf"),
                               delta + 0.5, atol=1e-5, rtol=0)
