"""Answers of several tokens: the teacher-forced log-probability, exact against the model's own
logits, from ``attribute``, ``context_attribution`` and the command line."""

from __future__ import annotations

import json
import math

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.explained.readouts import (
    AnswerLogProbability,
    TokenLogProbability,
    normaliser_weights,
)
from captum_ffb.viz.neuronpedia import neuronpedia_graph
from tests.models import byte_level_tokenizer, save_tiny_lm, tiny_lm

PROMPT, ANSWER = "the cat sat on the", " mat because it"


def log_probability(model, prompt_ids, answer_ids):
    """``Σ_t log p(a_t | prompt, a_<t)`` from the model's own logits, in float64."""
    ids = torch.cat([prompt_ids, torch.tensor([answer_ids[:-1]])], 1)
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    n = prompt_ids.shape[1]
    return sum(float(torch.log_softmax(logits[n - 1 + t], -1)[a]) for t, a in enumerate(answer_ids))


@pytest.fixture(scope="module")
def lm():
    tokenizer = byte_level_tokenizer()
    model = tiny_lm("llama")
    return NormDecomposition(model, tokenizer=tokenizer), tokenizer


@pytest.mark.parametrize("route", ["backward", "forward"])
def test_an_answer_of_several_tokens_is_its_exact_log_probability(lm, route):
    nd, tokenizer = lm
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    answer = tokenizer(ANSWER).input_ids
    contributions, bias, delta = nd.attribute(ids, target=ANSWER, route=route, return_bias=True,
                                              return_convergence_delta=True)
    assert contributions.shape == (1, ids.shape[1] + len(answer) - 1)  # the answer's tokens but its last
    truth = log_probability(nd.model, ids, answer)
    assert float(contributions.sum() + bias) == pytest.approx(truth, abs=1e-5)
    assert float(delta) <= 1e-5
    assert contributions[0, ids.shape[1]:].abs().sum() > 0  # the answer's earlier tokens feed its later ones
    same = nd.attribute(ids, target=AnswerLogProbability(answer), route=route)
    torch.testing.assert_close(same, contributions)


def test_each_token_is_a_log_probability_and_the_bias_holds_the_uniform_logits(lm):
    nd, tokenizer = lm
    ids = tokenizer(PROMPT + ANSWER, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = nd.model(ids).logits[0].double()
    readouts = [TokenLogProbability(int(ids[0, p + 1]), p) for p in (2, 5)]
    result = nd.explain(ids, readouts)
    assert float(result.bias.max()) == pytest.approx(-math.log(logits.shape[-1]))  # no bias terms: −log V alone
    for row, (readout, p) in enumerate(zip(result.readouts, (2, 5))):
        total = float(result.contributions[row].sum() + result.bias[row])
        assert total == pytest.approx(float(torch.log_softmax(logits[p], -1)[readout.token]), abs=1e-5)
        assert float(result.value[row]) == pytest.approx(total, abs=1e-5)


def test_the_normalisers_weights_integrate_the_log_normaliser():
    z = torch.randn(3, 500, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 8
    w = normaliser_weights(z)
    assert torch.allclose((w * z).sum(-1), torch.logsumexp(z, -1) - math.log(500), atol=1e-9, rtol=0)
    assert bool((w > 0).all()) and torch.allclose(w.sum(-1), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "gemma", "cohere", "granite", "mixtral"])
def test_other_families_are_exact_too(name):
    """Among them logit scales (Cohere's, Granite's) and a mixture of experts."""
    tokenizer = byte_level_tokenizer()
    nd = NormDecomposition(tiny_lm(name), tokenizer=tokenizer)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    contributions, bias = nd.attribute(ids, target=ANSWER, return_bias=True)
    truth = log_probability(nd.model, ids, tokenizer(ANSWER).input_ids)
    assert float(contributions.sum() + bias) == pytest.approx(truth, abs=1e-5)


def test_soft_capped_logits_are_refused_in_one_line():
    tokenizer = byte_level_tokenizer()
    nd = NormDecomposition(tiny_lm("gemma2"), tokenizer=tokenizer)
    assert nd.model.config.final_logit_softcapping
    with pytest.raises(ValueError, match="without soft-capping"):
        nd.attribute(tokenizer(PROMPT, return_tensors="pt").input_ids, target=ANSWER)


def test_what_an_answer_does_not_take_is_one_line(lm):
    nd, tokenizer = lm
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with pytest.raises(ValueError, match="takes no target_position"):
        nd.attribute(ids, target=ANSWER, target_position=2)
    with pytest.raises(ValueError, match="one input at a time"):
        nd.attribute(ids.repeat(2, 1), target=ANSWER)
    assert nd.attribute(ids, target=" mat").shape == ids.shape  # one token: its logit, as before


def test_context_attribution_of_an_answer(lm):
    from captum_ffb.long_context.attribution import context_attribution

    nd, tokenizer = lm
    context = "the cat sat on the mat.\n\nthe dog ran fast.\n\nhello world"
    found = context_attribution(nd, tokenizer, context, "the cat", target=ANSWER)
    parts = float(found.contributions.sum()) + found.question + found.rest + found.answer + found.bias
    assert parts == pytest.approx(found.value, abs=1e-5) and found.delta <= 1e-5
    assert found.answer != 0 and found.token_groups.count(-3) == len(tokenizer(ANSWER).input_ids) - 1
    assert found.target == f"log p({ANSWER!r})" and found.to_dict()["answer"] == found.answer


def run_command(tmp_path, command: str, formats: str, name: str) -> dict:
    """``captum-ffb COMMAND PROMPT --target ANSWER`` on the tiny Llama saved with its tokenizer:
    the file ``name`` it wrote."""
    from captum_ffb.cli import main

    model = save_tiny_lm(tmp_path / "m", byte_level=True)
    assert main([command, PROMPT, "--model", str(model), "--target", ANSWER, "--out", str(tmp_path / "o"),
                 "--format", formats, "--quiet"]) == 0
    return json.loads((tmp_path / "o" / name).read_text())


def test_the_command_line_explains_an_answer_token_by_token(tmp_path):
    found = run_command(tmp_path, "explain", "json", "explanation.json")
    tokenizer = byte_level_tokenizer()
    answer = tokenizer(ANSWER).input_ids
    assert [o["target"] for o in found["outputs"]] == tokenizer.convert_ids_to_tokens(answer)
    total = sum(o["value"] for o in found["outputs"])
    assert total == pytest.approx(log_probability(tiny_lm("llama"), tokenizer(PROMPT, return_tensors="pt").input_ids,
                                                  answer), abs=1e-4)
    for o in found["outputs"]:
        assert sum(o["contributions"]) + o["bias"] == pytest.approx(o["value"], abs=1e-5)


def test_the_graph_of_an_answer_is_its_exact_log_probability(lm, tmp_path):
    from captum_ffb import AttributionGraph
    from tests.graph.test_neuronpedia import validate

    nd, tokenizer = lm
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    answer = tokenizer(ANSWER).input_ids
    graph = nd.attribute_graph(ids, target=ANSWER, prune=False)
    assert graph.value == pytest.approx(log_probability(nd.model, ids, answer), abs=1e-5)
    assert graph.flow_residual() <= 1e-5
    assert len(graph.tokens) == ids.shape[1] + len(answer) - 1
    tokens = torch.tensor([float(graph.data.values[k]) for k, kind in enumerate(graph.data.kinds) if kind == "token"])
    torch.testing.assert_close(tokens, nd.attribute(ids, target=ANSWER)[0], atol=1e-5, rtol=0)  # the same players
    target = graph.target
    assert target.kind == "answer" and target.units == tuple(answer) and target.position == len(graph.tokens) - 1
    assert graph.output_label == f"log p({ANSWER!r})" and repr(graph).startswith(f'BoundGraph("log p({ANSWER!r})"')
    assert graph.probability == pytest.approx(math.exp(graph.value))
    pruned = graph.prune()
    loaded = AttributionGraph.load(pruned.save(tmp_path / "g.npz"), model=nd.model)
    assert loaded.bound and loaded.target == target and loaded.value == pytest.approx(graph.value)
    (logit,) = [n for n in validate(neuronpedia_graph(pruned, PROMPT)).values() if n["feature_type"] == "logit"]
    assert logit["clerp"].startswith(f'Output "log p({ANSWER})"')
    corrupted = tokenizer("the dog ran on the", return_tensors="pt").input_ids
    patched = nd.attribute_graph(ids, target=ANSWER, corrupted_inputs=corrupted)
    assert patched.patch_estimates and patched.value == pytest.approx(graph.value, abs=1e-5)


def test_the_graph_command_takes_an_answer(tmp_path):
    found = run_command(tmp_path, "graph", "json,neuronpedia", "graph.json")
    tokenizer = byte_level_tokenizer()
    truth = log_probability(tiny_lm("llama"), tokenizer(PROMPT, return_tensors="pt").input_ids,
                            tokenizer(ANSWER).input_ids)
    assert found["value"] == pytest.approx(truth, abs=1e-4)
