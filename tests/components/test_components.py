"""Token × component attributions: sums, writers against the model's own tensors, padding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from captum_ffb import Direction, NormDecomposition
from captum_ffb.components.table import ComponentAttribution
from captum_ffb.rules import GatedIGActivation
from tests.models import TINY_MODELS, padded_pair, tiny_task_model, token_ids

CASES = [(name, "causal_lm") for name in sorted(TINY_MODELS) if TINY_MODELS[name].causal]
CASES += [(name, "sequence_classification") for name in sorted(TINY_MODELS)]


def _target(task: str) -> int:
    return 5 if task == "causal_lm" else 2


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("name, task", CASES)
def test_components_add_up_on_every_family(name, task):
    model = tiny_task_model(name, task)
    nd = NormDecomposition(model)
    ids = token_ids()
    target = _target(task)
    tokens, bias = nd.attribute(ids, target=target, route="forward", return_bias=True)
    by_granularity = {}
    for granularity in ("block", "sublayer", "head"):
        found = nd.attribute_components(ids, target=target, granularity=granularity)
        assert found.contributions.shape == (*ids.shape, len(found.components))
        assert found.bias.shape == (ids.shape[0], len(found.components))
        assert found.components[0] == "embeddings" and found.components[-1] == "output_head"
        assert _relative(found.token_contributions(), tokens) < 1e-5
        torch.testing.assert_close(found.bias.sum(-1), bias, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(found.contributions.sum((1, 2)) + found.bias.sum(-1), found.value,
                                   atol=1e-5, rtol=1e-5)
        assert float(found.delta.max()) < 1e-5
        by_granularity[granularity] = found
    sublayer, head, block = by_granularity["sublayer"], by_granularity["head"], by_granularity["block"]
    for layer in sublayer.blocks():
        for writer in ("attention", "ff"):
            whole = sublayer.contributions[..., sublayer.components.index(f"block.{layer}.{writer}")]
            parts = head.contributions[..., head.select(rf"^block\.{layer}\.{writer}(\.|$)")].sum(-1)
            assert _relative(parts, whole) < 1e-5, (layer, writer)
        inside = sublayer.select(rf"^block\.{layer}\.")
        torch.testing.assert_close(sublayer.component_totals()[:, inside].sum(-1),
                                   block.component_totals()[:, block.components.index(f"block.{layer}")],
                                   atol=1e-6, rtol=1e-5)
    assert len(head.select(r"\.head\.\d+$")) == model.config.num_attention_heads * len(head.blocks())


ROUTE_CASES = [(name, task, granularity) for name, task in CASES if task == "causal_lm" or name in ("bert", "opt")
               for granularity in ("block", "sublayer", "head")]


@pytest.mark.parametrize("name, task, granularity", ROUTE_CASES)
def test_the_backward_route_equals_the_forward_route(name, task, granularity):
    """Every tiny family and granularity, a padded batch, the default (centred) and the
    paper's reference from zero, and groups of tokens as players: the same table."""
    model = tiny_task_model(name, task)
    ids, mask, _, _ = padded_pair("right")
    groups = torch.tensor([[0, 0, 1, 2, 2, 3, 4], [0, 1, 1, 2, 3, 3, 3]])
    for reference, feature_mask in (("centered", None), ("zero", groups), ("mean", None)):
        nd = NormDecomposition(model, reference=reference)
        kwargs = dict(target=_target(task), granularity=granularity, forward_kwargs={"attention_mask": mask},
                      feature_mask=feature_mask)
        forward = nd.attribute_components(ids, route="forward", **kwargs)
        backward = nd.attribute_components(ids, route="backward", **kwargs)
        assert backward.components == forward.components
        scale = float(forward.contributions.abs().max())
        assert float((backward.contributions - forward.contributions).abs().max()) < 1e-5 * scale
        assert float((backward.bias - forward.bias).abs().max()) < 1e-5 * scale
        torch.testing.assert_close(backward.delta, forward.delta, atol=1e-5 * scale, rtol=0)  # both check
        assert float(backward.contributions[1, 4:].abs().max()) == 0.0  # padding


def test_the_backward_route_with_a_rule_that_credits_scores():
    from captum_ffb.rules import AttnLRPAttention

    model = tiny_task_model("llama")
    nd = NormDecomposition(model, rules={"attention": AttnLRPAttention()})
    for granularity in ("sublayer", "head"):
        forward = nd.attribute_components(token_ids(), target=5, granularity=granularity, route="forward")
        backward = nd.attribute_components(token_ids(), target=5, granularity=granularity, route="backward")
        torch.testing.assert_close(backward.contributions, forward.contributions, atol=1e-6, rtol=1e-5)


def test_the_auto_route_takes_the_cheaper_one():
    """Few players or many writers (heads): forward; many players: backward; a mixture of
    experts split per expert: forward. An unknown route is refused."""
    from captum_ffb.components.pipeline import component_route

    assert component_route(16, 30, "sublayer", 9, moe=False) == "forward"
    assert component_route(128, 30, "sublayer", 9, moe=False) == "backward"
    assert component_route(128, 30, "head", 9, moe=False) == "forward"
    assert component_route(512, 30, "head", 9, moe=False) == "backward"
    assert component_route(4096, 30, "head", 9, moe=True) == "forward"
    with pytest.raises(ValueError, match="route must be one of"):
        NormDecomposition(tiny_task_model("llama")).attribute_components(token_ids(), target=5, route="sideways")


def test_experts_are_components():
    model = tiny_task_model("mixtral")
    found = NormDecomposition(model).attribute_components(token_ids(), target=5, granularity="head")
    experts = model.config.num_local_experts
    assert len(found.select(r"^block\.0\.ff\.expert\.\d+$")) == experts
    assert found.select(r"^block\.0\.ff\.bias$")
    shared = NormDecomposition(tiny_task_model("qwen2_moe")).attribute_components(
        token_ids(), target=5, granularity="head")
    assert shared.select(r"^block\.0\.ff\.shared_expert$")


def _captured(model: nn.Module, ids: torch.Tensor, outputs: dict[str, nn.Module],
              inputs: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    """One forward pass of ``model``: the outputs of the modules in ``outputs`` and the first
    inputs of those in ``inputs``, by name."""
    seen: dict[str, torch.Tensor] = {}

    def keep_output(name):
        def hook(module, args, output):
            seen[name] = (output[0] if isinstance(output, tuple) else output).detach()
        return hook

    def keep_input(name):
        def hook(module, args):
            seen[name] = args[0].detach()
        return hook

    handles = [m.register_forward_hook(keep_output(name)) for name, m in outputs.items()]
    handles += [m.register_forward_pre_hook(keep_input(name)) for name, m in inputs.items()]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _frozen_norm(norm: nn.Module, real: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """The norm's linear part at the real input's scale (β left out)."""
    if isinstance(norm, nn.LayerNorm):
        centred = vector - vector.mean(-1, keepdim=True)
        return centred / torch.sqrt(real.var(-1, unbiased=False, keepdim=True) + norm.eps) * norm.weight
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    return vector * torch.rsqrt(real.pow(2).mean(-1, keepdim=True) + eps) * norm.weight


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_writers_column_is_its_own_direct_logit(name):
    """Column sum plus bias = the writer's real output at the read row, through the final
    norm frozen at its real scale and the unembedding row (computed here from hooks)."""
    model = tiny_task_model(name)
    base = model.base_model
    layers = base.layers if name == "llama" else base.h
    final = base.norm if name == "llama" else base.ln_f
    writers = {}
    for index, layer in enumerate(layers):
        writers[f"block.{index}.attention"] = layer.self_attn if name == "llama" else layer.attn
        writers[f"block.{index}.ff"] = layer.mlp
    ids = token_ids(batch=1)
    seen = _captured(model, ids, writers, {"final_input": final})
    token = 7
    found = NormDecomposition(model).attribute_components(ids, target=token)
    row = model.get_output_embeddings().weight[token]
    real_row = seen["final_input"][:, -1]
    totals = found.component_totals()[0]
    with torch.no_grad():
        for component in writers:
            direct = (_frozen_norm(final, real_row, seen[component][:, -1]) * row).sum()
            torch.testing.assert_close(totals[found.components.index(component)], direct, atol=1e-5, rtol=1e-4)


def test_post_ln_writer_reads_through_later_norms():
    """Post-LN: the last FF writer's direct logit passes the block's norm and the head."""
    model = tiny_task_model("opt-post-ln")
    layer = model.model.decoder.layers[-1]
    ids = token_ids(batch=1)
    seen = _captured(model, ids, {"ff": layer.fc2}, {"norm_input": layer.final_layer_norm})
    found = NormDecomposition(model).attribute_components(ids, target=5)
    last = len(model.model.decoder.layers) - 1
    row = model.get_output_embeddings().weight[5]
    width = model.config.hidden_size
    real, written = (t.reshape(1, -1, width)[:, -1] for t in (seen["norm_input"], seen["ff"]))  # OPT flattens rows
    with torch.no_grad():
        direct = (_frozen_norm(layer.final_layer_norm, real, written) * row).sum()
    total = found.component_totals()[0, found.components.index(f"block.{last}.ff")]
    torch.testing.assert_close(total, direct, atol=1e-5, rtol=1e-4)
    assert found.select(rf"^block\.{last}\.norm2$")


@pytest.mark.parametrize("name, side", [("gpt2", "right"), ("llama", "left")])
def test_padding_gives_zeros_and_the_unpadded_table(name, side):
    model = tiny_task_model(name)
    nd = NormDecomposition(model)
    padded, mask, short, real = padded_pair(side)
    found = nd.attribute_components(padded, target=5, forward_kwargs={"attention_mask": mask})
    alone = nd.attribute_components(short, target=5)
    pad_columns = torch.ones(padded.shape[1], dtype=torch.bool)
    pad_columns[real] = False
    assert torch.all(found.contributions[1, pad_columns] == 0)
    torch.testing.assert_close(found.contributions[1, real], alone.contributions[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(found.value[1], alone.value[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_direction_of_a_base_model(pooling):
    model = TINY_MODELS["bert"].build()
    nd = NormDecomposition(model)
    ids = token_ids()
    target = Direction(torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(3)),
                       pooling=pooling)
    tokens = nd.attribute(ids, target=target, route="forward")
    found = nd.attribute_components(ids, target=target, granularity="head")
    assert _relative(found.token_contributions(), tokens) < 1e-5
    assert float(found.delta.max()) < 1e-5


def test_groups_and_predicted_target():
    model = tiny_task_model("llama")
    nd = NormDecomposition(model)
    ids = token_ids(batch=1)
    groups = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 3, 3]])
    with torch.no_grad():
        predicted = int(model(ids).logits[0, -1].argmax())
    found = nd.attribute_components(ids, feature_mask=groups)
    tokens = nd.attribute(ids, target=predicted, feature_mask=groups, route="forward")
    assert _relative(found.token_contributions(), tokens) < 1e-5
    # every position of a group carries the group's row
    torch.testing.assert_close(found.contributions[0, 0], found.contributions[0, 1])


@pytest.mark.parametrize("name", ["llama", "gpt_neox", "granite", "opt-post-ln"])
def test_a_given_target_takes_one_pass_on_the_backward_route(name):
    """With the target given, the backward route of a stream that passes no norm reads the
    head's covector from its own pass (no capture first); the table is the one a predicted
    target (read from a capture) gives, and the delta checks it against the model."""
    model = tiny_task_model(name)
    nd = NormDecomposition(model)
    ids = token_ids(batch=1)
    with torch.no_grad():
        predicted = int(model(ids).logits[0, -1].argmax())
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        given = nd.attribute_components(ids, target=predicted, route="backward")
        passes = len(calls)
        calls.clear()
        read = nd.attribute_components(ids, route="backward")
    finally:
        handle.remove()
    assert passes == (2 if name == "opt-post-ln" else 1)  # a Post-LN stream passes its norms: a capture
    assert len(calls) == 2  # a prediction is read from a capture
    assert given.components == read.components
    scale = float(read.contributions.abs().max())
    assert float((given.contributions - read.contributions).abs().max()) <= 1e-6 * scale
    assert float((given.bias - read.bias).abs().max()) <= 1e-6 * scale
    # the model's value, from the backward route's own pass and from the capture
    torch.testing.assert_close(given.value, read.value, atol=1e-5 * scale, rtol=0)
    torch.testing.assert_close(given.delta, read.delta, atol=1e-5 * scale, rtol=0)
    assert float(given.delta.max()) <= 1e-5 * max(1.0, float(given.value.abs().max()))


def test_players_in_groups_under_a_small_budget():
    model = tiny_task_model("gpt2")
    ids = token_ids()
    whole = NormDecomposition(model).attribute_components(ids, target=5, granularity="head")
    small = NormDecomposition(model, memory_budget=20_000).attribute_components(ids, target=5, granularity="head")
    assert small.components == whole.components
    torch.testing.assert_close(small.contributions, whole.contributions, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(small.bias, whole.bias, atol=1e-6, rtol=1e-5)


def test_ff_question_and_top_entries():
    model = tiny_task_model("llama")
    found = NormDecomposition(model).attribute_components(token_ids(), target=5)
    question = found.ff_question()
    layers = len(found.blocks())
    assert question.layer_share.shape == (2, layers, token_ids().shape[1])
    assert torch.all((question.share >= 0) & (question.share <= 1 + 1e-6))
    ff = found.contributions[..., found.select(r"\.ff$")].sum(-1)
    attention = found.contributions[..., found.select(r"\.attention$")].sum(-1)
    torch.testing.assert_close(question.ff, ff)
    assert torch.equal(question.amplifies, ff * attention > 0)
    top = found.top(5)
    values = [abs(value) for _, _, value in top]
    assert values == sorted(values, reverse=True) and len(top) == 5
    token, component, value = top[0]
    assert value == pytest.approx(float(found.contributions[0, token, found.components.index(component)]))
    data = found.to_dict()
    assert len(data["contributions"]) == token_ids().shape[1] and data["components"] == found.components


def test_refusals():
    model = tiny_task_model("llama")
    nd = NormDecomposition(model)
    with pytest.raises(ValueError, match="granularity"):
        nd.attribute_components(token_ids(), target=5, granularity="neuron")
    with pytest.raises(ValueError, match="linear in the players"):
        nd.attribute_components(token_ids(), target=5, rules={"gated_activation": GatedIGActivation(route="captum")})
    with pytest.raises(ValueError, match="Direction"):
        NormDecomposition(TINY_MODELS["bert"].build()).attribute_components(token_ids())
    found = nd.attribute_components(token_ids(), target=5, granularity="block")
    with pytest.raises(ValueError, match="sublayer"):
        found.ff_question()
    assert isinstance(found, ComponentAttribution)
