"""NormDecomposition on tiny models of every family and head, checked against the real
output of the test's own forward pass."""

from __future__ import annotations

import pytest
import torch
from captum.attr import Attribution

from captum_ffb import Contrast, Direction, LayerNormDecomposition, NormDecomposition
from captum_ffb.explained.readouts import ClassLogit, NextToken
from captum_ffb.rules import Attention, NoTokenActivation, NoTokenGatedActivation, ShapleyActivation
from tests.models import TINY_MODELS, padded_pair, tiny_task_model, token_ids

CASES = [(name, "causal_lm") for name in sorted(TINY_MODELS) if TINY_MODELS[name].causal]
CASES += [(name, "sequence_classification") for name in sorted(TINY_MODELS)]


def _real_logits(model, ids, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, **kwargs).logits


@pytest.mark.smoke
@pytest.mark.parametrize("name, task", CASES)
def test_complete_against_the_real_output_and_both_routes_agree(name, task):
    model = tiny_task_model(name, task)
    ids = token_ids()
    nd = NormDecomposition(model)
    assert isinstance(nd, Attribution) and nd.has_convergence_delta() and nd.task == task
    target = torch.tensor([7, 11]) if task == "causal_lm" else 1
    logits = _real_logits(model, ids)
    real = logits[:, -1, [7, 11]].diagonal() if task == "causal_lm" else logits[:, 1]
    answers = {}
    for route in ("backward", "forward"):
        contributions, bias, delta = nd.attribute(ids, target=target, route=route, return_bias=True,
                                                  return_convergence_delta=True)
        assert contributions.shape == ids.shape
        total = contributions.sum(1) + bias
        scale = float(real.abs().max()) + 1e-3
        assert float((total - real).abs().max()) < 1e-5 * scale + 1e-6, route
        assert float(delta.max()) < 1e-5 * scale + 1e-6
        answers[route] = contributions, bias
    forward, backward = answers["forward"][0], answers["backward"][0]
    assert float((forward - backward).abs().max()) < 1e-5 * float(forward.abs().max())
    torch.testing.assert_close(answers["forward"][1], answers["backward"][1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["gpt2", "llama", "phi"])
def test_causal_zeros_and_target_position(name):
    model = tiny_task_model(name)
    ids = token_ids(n=8)
    nd = NormDecomposition(model)
    contributions, bias = nd.attribute(ids, target=5, target_position=4, return_bias=True)
    assert float(contributions[:, 5:].abs().max()) == 0.0
    real = _real_logits(model, ids)[:, 4, 5]
    torch.testing.assert_close(contributions.sum(1) + bias, real, atol=1e-5, rtol=1e-5)
    negative = nd.attribute(ids, target=5, target_position=torch.tensor([-4, -4]))
    torch.testing.assert_close(negative, contributions)


@pytest.mark.smoke
@pytest.mark.parametrize("name, side", [("gpt2", "right"), ("llama", "left"), ("qwen2", "right"),
                                        ("bert", "right")])
def test_padding_and_batch_invariance(name, side):
    task = "sequence_classification" if name == "bert" else "causal_lm"
    model = tiny_task_model(name, task)
    nd = NormDecomposition(model)
    padded, mask, short, real_columns = padded_pair(side)
    ids = token_ids(batch=2, n=7)
    for route in ("backward", "forward"):
        batch = nd.attribute(padded, target=2, forward_kwargs={"attention_mask": mask}, route=route)
        alone = nd.attribute(short, target=2, route=route)
        first = nd.attribute(ids[:1], target=2, route=route)
        torch.testing.assert_close(batch[1, real_columns], alone[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(batch[0], first[0], atol=1e-5, rtol=1e-4)
        padding = torch.ones(7, dtype=torch.bool)
        padding[real_columns] = False
        assert float(batch[1, padding].abs().max()) == 0.0


def test_feature_mask_groups_add_up():
    model = tiny_task_model("llama")
    nd = NormDecomposition(model)
    ids = token_ids(n=6)
    groups = torch.tensor([[0, 0, 1, 1, 1, 2], [0, 1, 1, 2, 2, 2]])
    tokens, bias = nd.attribute(ids, target=3, return_bias=True)
    for route in ("backward", "forward"):
        grouped, grouped_bias = nd.attribute(ids, target=3, feature_mask=groups, route=route, return_bias=True)
        for b in range(2):
            for g in range(3):
                members = groups[b] == g
                expected = tokens[b, members].sum()
                assert torch.allclose(grouped[b, members], expected.expand(int(members.sum())), atol=1e-5)
        torch.testing.assert_close(grouped_bias, bias, atol=1e-5, rtol=1e-5)


def test_contrast_and_per_row_targets():
    model = tiny_task_model("gpt2")
    nd = NormDecomposition(model)
    ids = token_ids()
    difference = nd.attribute(ids, target=Contrast(4, 9))
    torch.testing.assert_close(difference, nd.attribute(ids, target=4) - nd.attribute(ids, target=9))
    rows = nd.attribute(ids, target=torch.tensor([4, 9]))
    torch.testing.assert_close(rows[0], nd.attribute(ids[:1], target=4)[0])
    torch.testing.assert_close(rows[1], nd.attribute(ids[1:], target=9)[0])
    classifier = NormDecomposition(tiny_task_model("bert", "sequence_classification"))
    contrast, delta = classifier.attribute(ids, target=Contrast(0, 2), return_convergence_delta=True,
                                           route="forward")
    assert float(delta.max()) < 1e-5


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", 3])
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_direction_on_a_base_model(name, pooling):
    tiny = TINY_MODELS[name]
    model = tiny.build()
    ids = token_ids(n=6)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    vector = torch.randn(32, generator=torch.Generator().manual_seed(0))
    target = Direction(vector, pooling=pooling, bias=0.25)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    if pooling == "mean":
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    else:
        index = {"cls": [0, 0], "last": [5, 4], 3: [3, 3]}[pooling]
        pooled = hidden[torch.arange(2), index]
    real = pooled @ vector + 0.25
    nd = NormDecomposition(model)
    for route in ("backward", "forward"):
        contributions, bias = nd.attribute(ids, target=target, forward_kwargs={"attention_mask": mask},
                                           route=route, return_bias=True)
        torch.testing.assert_close(contributions.sum(1) + bias, real, atol=1e-5, rtol=1e-5)
        assert float(contributions[1, 5]) == 0.0


def test_one_block_model_equals_the_layer_decomposition_contracted_with_the_head():
    """A BERT classifier with one block: the whole-model forward route is the layer's
    decomposition, then the pooler (tanh by the IG rule) and the classifier row."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, num_labels=2)).eval()
    ids = token_ids(batch=1, n=5)
    layer = LayerNormDecomposition(model, model.bert.encoder.layer[0]).decompose(ids)
    first = layer.terms[0, 0]  # (n, d): the [CLS] row, one vector per input token
    with torch.no_grad():
        pre = model.bert.pooler.dense(layer.total()[0, 0])
        ratio = torch.tanh(pre) / pre  # the IG closed form of tanh (tanh(0) = 0)
        per_token = ((first @ model.bert.pooler.dense.weight.t()) * ratio) @ model.classifier.weight[1]
    # the layer maps keep the paper's frozen attention; the whole model does so when asked
    got = NormDecomposition(model, rules={"attention": Attention()}, reference="zero").attribute(
        ids, target=1, route="forward")
    torch.testing.assert_close(got[0], per_token, atol=1e-6, rtol=1e-5)


def test_ablation_rules_work_on_both_routes():
    for name, rules in (("gpt2", {"activation": NoTokenActivation()}),
                        ("llama", {"gated_activation": NoTokenGatedActivation()})):
        model = tiny_task_model(name)
        nd = NormDecomposition(model, rules=rules)
        ids = token_ids()
        backward = nd.attribute(ids, target=3)
        forward, delta = nd.attribute(ids, target=3, route="forward", return_convergence_delta=True)
        torch.testing.assert_close(backward, forward, atol=1e-5, rtol=1e-4)
        assert float(delta.max()) < 1e-4  # the no-token rule is complete
        assert float((backward - NormDecomposition(model).attribute(ids, target=3)).abs().max()) > 1e-4


def test_rules_that_are_not_linear_in_the_players_need_the_forward_route():
    model = tiny_task_model("gpt2")
    nd = NormDecomposition(model, rules={"activation": ShapleyActivation("permutation", n_samples=20)})
    with pytest.raises(ValueError, match="not linear in the players; use route='forward'"):
        nd.attribute(token_ids(n=4), target=1)
    contributions, delta = nd.attribute(token_ids(n=4), target=1, route="forward",
                                        return_convergence_delta=True)
    assert float(delta.max()) < 1e-4


def test_whole_model_maps():
    tiny = TINY_MODELS["gpt2"]
    model = tiny.build()
    ids = token_ids(n=7)
    nd = NormDecomposition(model, rules={"attention": Attention()})  # the layer maps' rule
    maps, delta = nd.maps(ids, return_convergence_delta=True)
    assert maps.shape == (2, 2, 7, 7)
    assert float(delta.max()) < 1e-4
    assert float(maps[:, :, :, :].triu(1).abs().max()) == 0.0
    # the first block's map is the layer decomposition's whole-layer map
    layer = LayerNormDecomposition(model, tiny.blocks(model)[0]).attribute(ids)
    torch.testing.assert_close(maps[:, 0], layer, atol=1e-5, rtol=1e-5)
    # players propagated in small groups give the same maps
    grouped = NormDecomposition(model, rules={"attention": Attention()}, memory_budget=20_000).maps(ids)
    torch.testing.assert_close(grouped, maps, atol=1e-6, rtol=1e-5)


def test_clear_errors():
    model = tiny_task_model("gpt2")
    nd = NormDecomposition(model)
    ids = token_ids()
    with pytest.raises(ValueError, match="out of range"):
        nd.attribute(ids, target=10_000)
    with pytest.raises(ValueError, match="route must be"):
        nd.attribute(ids, target=1, route="sideways")
    with pytest.raises(ValueError, match="Direction reads a base model"):
        nd.attribute(ids, target=Direction(torch.ones(32)))
    with pytest.raises(ValueError, match="outside the 9 positions"):
        nd.attribute(ids, target=1, target_position=9)
    with pytest.raises(ValueError, match="feature_mask must be"):
        nd.attribute(ids, target=1, feature_mask=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="give a Direction"):
        NormDecomposition(TINY_MODELS["gpt2"].build()).attribute(ids, target=1)
    with pytest.raises(TypeError, match="nn.Module"):
        NormDecomposition(lambda x: x)


@pytest.mark.parametrize("route", ["backward", "forward"])
def test_every_generation_step_from_one_pass_equals_a_per_step_loop(route):
    model = tiny_task_model("llama")
    nd = NormDecomposition(model)
    ids = token_ids(batch=1, n=8)
    positions = [4, 5, 6]
    tokens = ids[0, [5, 6, 7]]  # teacher forcing: each step explains the next token
    steps, delta = nd.attribute_steps(ids, tokens, positions, route=route, return_convergence_delta=True)
    assert steps.shape == (3, 8) and float(delta.max()) < 1e-5
    for row, (token, position) in enumerate(zip(tokens.tolist(), positions)):
        alone = nd.attribute(ids, target=token, target_position=position, route=route)
        torch.testing.assert_close(steps[row], alone[0], atol=1e-6, rtol=1e-5)
        assert float(steps[row, position + 1:].abs().max()) == 0.0


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_recomputing_blocks_changes_nothing(name):
    """Under a tiny memory budget the backward route runs each block again during the
    backward pass instead of keeping its tensors (every family): the same answer, for one
    target and for several at once."""
    task = "causal_lm" if TINY_MODELS[name].causal else "sequence_classification"
    model = tiny_task_model(name, task)
    ids = token_ids()
    kept = NormDecomposition(model)
    recomputed = NormDecomposition(model, memory_budget=1)
    assert not kept.engine._recompute(kept.engine.request((ids,), {}))
    assert recomputed.engine._recompute(recomputed.engine.request((ids,), {}))
    torch.testing.assert_close(recomputed.attribute(ids, target=1), kept.attribute(ids, target=1))
    several = [ClassLogit(1), ClassLogit(0)] if task == "sequence_classification" else [NextToken(3), NextToken(4)]
    torch.testing.assert_close(recomputed.explain(ids, several).contributions, kept.explain(ids, several).contributions)
    assert not [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]  # nothing left behind


def test_without_a_budget_blocks_are_recomputed_only_when_memory_is_short(monkeypatch):
    """No ``memory_budget`` given: the backward route keeps the blocks' tensors unless they
    would take more than half the memory available; a budget given decides alone."""
    import captum_ffb.engine.whole as whole

    model = tiny_task_model("llama")
    ids = token_ids()
    nd = NormDecomposition(model)
    request = nd.engine.request((ids,), {})
    assert nd.memory_budget == whole.DEFAULT_MEMORY_BUDGET and not nd.engine._recompute(request)
    monkeypatch.setattr(whole, "available_bytes", lambda device: 2)
    assert nd.engine._recompute(request)
    nd.memory_budget = 1 << 40  # set by hand: the budget decides
    assert not nd.engine._recompute(request)
    monkeypatch.undo()
    assert whole.available_bytes(torch.device("cpu")) > 0


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_one_block_at_a_time_and_player_parts_add_up(name):
    """With a budget too small for every block's probabilities, the forward route replays
    one block at a time: same answer; and parts over player subsets add up to the whole."""
    task = "sequence_classification" if name == "bert" else "causal_lm"
    model = tiny_task_model(name, task)
    ids = token_ids()
    whole, bias = NormDecomposition(model).attribute(ids, target=1, route="forward", return_bias=True)
    light = NormDecomposition(model, memory_budget=4_000)
    assert light.engine.is_light(ids)
    streamed, streamed_bias = light.attribute(ids, target=1, route="forward", return_bias=True)
    torch.testing.assert_close(streamed, whole, atol=1e-6, rtol=1e-5)
    first, first_bias = light.attribute(ids, target=1, route="forward", players=[0, 2, 4, 6, 8],
                                        return_bias=True)
    second = light.attribute(ids, target=1, route="forward", players=[1, 3, 5, 7])
    torch.testing.assert_close(first + second, whole, atol=1e-6, rtol=1e-5)
    assert float(first[:, 1::2].abs().max()) == 0.0
    torch.testing.assert_close(first_bias, bias, atol=1e-6, rtol=1e-5)
    maps = NormDecomposition(model).maps(ids)
    torch.testing.assert_close(light.maps(ids), maps, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="use route='forward'"):
        light.attribute(ids, target=1, players=[0])


def test_reduced_precision_is_said_once(recwarn):
    model = tiny_task_model("llama", "causal_lm").eval()
    ids = token_ids(1, 6)
    nd = NormDecomposition(model)
    nd.attribute(ids, target=3)
    assert not [w for w in recwarn if "reduced precision" in str(w.message)]  # float32: silent
    model.to(torch.bfloat16)
    low = NormDecomposition(model)
    with pytest.warns(UserWarning, match=r"reduced precision \(bfloat16\).*own bfloat16 output"):
        low.attribute(ids, target=3)
    recwarn.clear()
    low.attribute(ids, target=3, route="backward")
    assert not [w for w in recwarn if "reduced precision" in str(w.message)]  # once per instance
