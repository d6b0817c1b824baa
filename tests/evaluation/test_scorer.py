"""``embedding_scorer`` on tiny randomly initialised Hugging Face models."""

from __future__ import annotations

import pytest
import torch

from captum_ffb.evaluation import (
    decompx_aopc,
    embedding_scorer,
    last_token,
    leave_one_out,
    perturbation_curve,
    protected_mask,
    taucorr_loo,
)
from tests.models import TINY_MODELS, VOCAB

CLS, SEP, MASK = 1, 2, 3


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = TINY_MODELS[name].build()
        return cache[name]

    return get


def _readout(seed: int = 0, out: int = 1) -> torch.Tensor:
    return torch.randn(32, out, generator=torch.Generator().manual_seed(seed))


def _target(causal: bool, head: torch.Tensor):
    """A scalar per row: a fixed read-out of [CLS] (encoders) or the last token (decoders)."""

    def target_fn(outputs, input_ids, attention_mask):
        hidden = outputs.last_hidden_state
        state = last_token(hidden, attention_mask) if causal else hidden[:, 0]
        return (state @ head).squeeze(-1)

    return target_fn


def _distinct_ids(batch: int, n: int, seed: int) -> torch.Tensor:
    """Rows of distinct ids in ``[4, VOCAB)`` (no id repeats inside a row)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(VOCAB - 4, generator=generator)[:n] + 4
                        for _ in range(batch)])


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_unzeroed_score_is_the_models_own_forward(models, name):
    model = models(name)
    causal = TINY_MODELS[name].causal
    target_fn = _target(causal, _readout())
    score_fn = embedding_scorer(model, target_fn)
    ids = _distinct_ids(3, 8, seed=1)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding on one row
    with torch.no_grad():
        own = target_fn(model(input_ids=ids, attention_mask=mask), ids, mask)
    assert torch.allclose(score_fn(ids, mask, None), own, atol=1e-5)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_zeroing_a_position_is_zeroing_its_embedding_row(models, name):
    model = models(name)
    causal = TINY_MODELS[name].causal
    target_fn = _target(causal, _readout(1))
    score_fn = embedding_scorer(model, target_fn)
    ids = _distinct_ids(2, 7, seed=2)
    mask = torch.ones_like(ids)
    zeroed = torch.zeros_like(ids, dtype=torch.bool)
    zeroed[0, 2] = zeroed[1, 4] = True
    perturbed = score_fn(ids, mask, zeroed)
    assert not torch.allclose(perturbed, score_fn(ids, mask, None), atol=1e-4)
    # independent route: blank the vocabulary row of that (unique) token in a copy of the model
    for row in range(2):
        token = ids[row][zeroed[row]].item()
        embedding = model.get_input_embeddings()
        saved = embedding.weight[token].clone()
        with torch.no_grad():
            embedding.weight[token] = 0.0
            own = target_fn(model(input_ids=ids[row:row + 1], attention_mask=mask[row:row + 1]),
                            ids[row:row + 1], mask[row:row + 1])
            embedding.weight[token] = saved
        assert perturbed[row].item() == pytest.approx(own.item(), abs=1e-5)


def test_left_padding_with_positions_from_mask_matches_unpadded(models):
    model = models("gpt2")
    target_fn = _target(True, _readout(2))
    score_fn = embedding_scorer(model, target_fn, positions_from_mask=True)
    ids = _distinct_ids(2, 7, seed=3)
    mask = torch.ones_like(ids)
    ids[0, :3] = 0
    mask[0, :3] = 0  # left padding
    padded = score_fn(ids, mask, None)
    alone = score_fn(ids[:1, 3:], mask[:1, 3:], None)
    assert padded[0].item() == pytest.approx(alone.item(), abs=1e-5)
    with pytest.raises(ValueError, match="get_input_embeddings"):
        embedding_scorer(torch.nn.Embedding(3, 2), target_fn)

    class NoPositions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 4)

        def get_input_embeddings(self):
            return self.embed

        def forward(self, inputs_embeds, attention_mask):
            return inputs_embeds

    with pytest.raises(ValueError, match="position_ids"):
        embedding_scorer(NoPositions(), target_fn, positions_from_mask=True)


@pytest.mark.parametrize("name,side", [("bert", "right"), ("gpt2", "left"), ("llama", "left")])
def test_metrics_run_batched_on_tiny_models(models, name, side):
    model = models(name)
    causal = TINY_MODELS[name].causal
    score_fn = embedding_scorer(model, _target(causal, _readout(3)),
                                positions_from_mask=(name == "gpt2"))
    ids = _distinct_ids(3, 9, seed=4)
    ids[:, 0] = CLS
    mask = torch.ones_like(ids)
    if side == "right":
        mask[1, 6:] = 0
    else:
        mask[1, :3] = 0
        ids[1, 3] = CLS
    ids[mask == 0] = 0
    protected = protected_mask(ids, mask, [CLS])
    loo = leave_one_out(score_fn, ids, mask, protected, batch_size=5)
    loo_one = leave_one_out(score_fn, ids, mask, protected, batch_size=1)
    # each variant is scored alone in the second run: batching and re-padding change nothing
    assert torch.allclose(loo, loo_one, atol=1e-5)
    assert (loo[protected] == 0).all()
    assert taucorr_loo(score_fn, ids, mask, loo, protected, loo=loo).tolist() == pytest.approx(
        [1.0, 1.0, 1.0])
    curve = perturbation_curve(score_fn, ids, mask, loo, protected, batch_size=7)
    free = (~protected).sum(dim=1)
    assert torch.equal(curve.n_tokens, free)
    assert torch.isnan(curve.scores).sum(dim=1).tolist() == (free.max() - free).tolist()


def test_class_scores_give_decompx_accuracy(models):
    model = models("bert")
    head = _readout(4, out=3)
    score_fn = embedding_scorer(
        model, lambda outputs, ids, mask: (outputs.last_hidden_state[:, 0] @ head).softmax(-1))
    ids = _distinct_ids(4, 8, seed=5)
    ids[:, 0], ids[:, -1] = CLS, SEP
    mask = torch.ones_like(ids)
    protected = protected_mask(ids, mask, [CLS, SEP])
    attributions = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 2, 1])
    result = decompx_aopc(score_fn, ids, mask, attributions, protected, mask_token_id=MASK,
                          labels=labels, batch_size=8)
    probabilities = score_fn(ids, mask, None)
    predicted = probabilities.argmax(dim=1)
    assert torch.equal(result.curve.target, predicted)
    assert result.accuracy_per_ratio[0].item() == pytest.approx(
        (predicted == labels).double().mean().item())
    at_ratio = result.curve.class_scores.argmax(dim=-1)
    assert result.accuracy_per_ratio.tolist() == pytest.approx(
        (at_ratio == labels.unsqueeze(1)).double().mean(dim=0).tolist())
    assert result.curve.base.tolist() == pytest.approx(
        probabilities.gather(1, predicted.unsqueeze(1)).squeeze(1).tolist(), abs=1e-6)
