"""Our AttnLRP rule set (:func:`captum_ffb.rules.attnlrp_rules`) against the real ``lxt`` 2.1
on a tiny random Llama: lxt runs in its own environment (transformers 4.53) through
:func:`captum_ffb.evaluation.peers.attnlrp_relevance`; the per-token relevances must agree
to float rounding on both of our routes.

Marked ``peer``; skipped when the peer environment is missing
(``bash captum_ffb/evaluation/peers/setup_lxt.sh``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from captum_ffb import Contrast, NormDecomposition
from captum_ffb.evaluation import peers
from captum_ffb.rules import Attention, attnlrp_rules
from tests.models import tiny_lm

pytestmark = pytest.mark.peer

#: Query/key weight factors: the tiny model as built (nearly uniform attention), and sharp
#: attention, where the softmax rule and its remainder matter.
SHARPNESS = (1.0, 30.0)


def _model(sharpness: float) -> torch.nn.Module:
    model = tiny_lm("llama")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(sharpness)
            layer.self_attn.k_proj.weight.mul_(sharpness)
    return model


def save_for_transformers_4(model: torch.nn.Module, folder: Path) -> Path:
    """Save ``model`` so that transformers 4.53 loads the same model: transformers 5 writes
    the rotary base under ``rope_parameters``, which 4.53 ignores (it would fall back on its
    default ``rope_theta``), so ``rope_theta`` is written out as well."""
    model.save_pretrained(folder)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    path.write_text(json.dumps(config))
    return folder


def _examples() -> list[dict]:
    generator = torch.Generator().manual_seed(3)
    examples = [{"input_ids": torch.randint(4, 60, (n,), generator=generator).tolist(),
                 "target_position": -1, "target_id": 17} for n in (6, 11, 16)]
    examples.append({"input_ids": examples[1]["input_ids"], "target_position": 5, "contrast": [9, 21]})
    return examples


@pytest.fixture(scope="module", params=SHARPNESS, ids=lambda s: f"qk x{s:g}")
def lxt_run(request, tmp_path_factory):
    problem = peers.attnlrp_setup_problem()
    if problem is not None:
        pytest.skip(problem)
    model = _model(request.param)
    folder = save_for_transformers_4(model, tmp_path_factory.mktemp("tiny_llama"))
    examples = _examples()
    relevances, info = peers.attnlrp_relevance(examples, model_dir=folder, timeout=600)
    return model, examples, relevances, info


def _ours(nd: NormDecomposition, example: dict, route: str = "backward") -> torch.Tensor:
    ids = torch.tensor([example["input_ids"]])
    target = example["target_id"] if "target_id" in example else Contrast(*example["contrast"])
    return nd.attribute(ids, target=target, target_position=example["target_position"], route=route)[0]


def _relative_gap(ours: torch.Tensor, theirs) -> float:
    theirs = torch.as_tensor(theirs, dtype=torch.float64)
    return float((ours.double() - theirs).abs().max() / theirs.abs().max())


def test_same_model_in_both_environments(lxt_run):
    model, examples, _, info = lxt_run
    assert info["meta"]["lxt"] == "2.1" and info["meta"]["transformers"].startswith("4.")
    for example, value in zip(examples, info["target_value"]):
        with torch.no_grad():
            logits = model(torch.tensor([example["input_ids"]])).logits[0, example["target_position"]]
        if "target_id" in example:
            ours = float(logits[example["target_id"]])
        else:
            ours = float(logits[example["contrast"][0]] - logits[example["contrast"][1]])
        assert abs(value - ours) <= 1e-5 * max(1.0, abs(ours))


@pytest.mark.parametrize("route", ["backward", "forward"])
def test_attnlrp_rules_reproduce_lxt(lxt_run, route):
    model, examples, relevances, _ = lxt_run
    nd = NormDecomposition(model, rules=attnlrp_rules(model), reference="zero")  # lxt's relevance: from zero
    for example, theirs in zip(examples, relevances):
        assert _relative_gap(_ours(nd, example, route), theirs) < 1e-4


def test_the_comparison_tells_rule_sets_apart(lxt_run):
    """The agreement is not a property of the tiny model: the paper's frozen attention is far
    from lxt, and AttnLRP's attention rule alone (with the default IG rule on the gated
    feed-forward instead of the uniform split) is off by more than rounding."""
    model, examples, relevances, _ = lxt_run
    frozen = NormDecomposition(model, rules={"attention": Attention()}, reference="zero")
    attention_only = NormDecomposition(model, rules={"attention": attnlrp_rules(model)["attention"]},
                                       reference="zero")
    assert max(_relative_gap(_ours(frozen, e), r) for e, r in zip(examples, relevances)) > 1e-2
    assert max(_relative_gap(_ours(attention_only, e), r) for e, r in zip(examples, relevances)) > 3e-4
