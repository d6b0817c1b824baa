"""The evaluation's ``gim`` method (GIM's attribution: its gradient at the input embeddings times
each embedding less the baseline token's, summed over the hidden dimension) against the
authors' package ``gim-explain`` (its pieces applied by hand: ``tests/patching/test_gim.py``),
on a left-padded batch of a tiny Llama in double precision; and the baseline token's choice."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from captum_ffb.evaluation.methods import METHODS, baseline_token_id, resolve_methods
from captum_ffb.evaluation.tasks import EvaluationTask
from captum_ffb.explained.models import load_model
from tests.patching.test_gim import package_gradient

TEXTS = ["the cat sat on the mat", "a dog was tired", "she loves big green math"]


def test_gim_is_the_packages_attribution_on_a_padded_batch(lm_dir):
    pytest.importorskip("gim")
    loaded = load_model(str(lm_dir), show_progress=False, task="causal_lm")
    loaded.model.double()  # the method runs with the model's own attention (sdpa)
    task = EvaluationTask(loaded, "next-token")
    batch = task.batch([task.example(text, None, k) for k, text in enumerate(TEXTS)])
    assert not batch.attention_mask.all()  # left padding in the batch
    target = task.predict(batch)
    method = METHODS["gim"]
    found = method.fn(task, batch, target, dict(method.options))
    assert found.shape == batch.input_ids.shape
    baseline = baseline_token_id(loaded.tokenizer)
    assert baseline == loaded.tokenizer.pad_token_id  # the word-level tokenizer encodes no space
    embeddings = loaded.model.get_input_embeddings()
    loaded.model.set_attn_implementation("eager")  # the package's softmax is applied by hand there
    for row in range(len(TEXTS)):
        real = batch.attention_mask[row].bool()
        ids = batch.input_ids[row, real][None]
        grad, _ = package_gradient(loaded.model, ids, int(target[row]))
        with torch.no_grad():
            x, x_ref = embeddings(ids)[0], embeddings(torch.full_like(ids, baseline))[0]
        expected = (grad * (x - x_ref)).sum(-1)
        scale = float(expected.abs().max())
        assert scale > 1e-3
        torch.testing.assert_close(found[row, real].double(), expected, rtol=1e-6, atol=1e-6 * scale)
        assert (found[row, ~real] == 0).all()
    # not the plain gradient × (input − baseline): GIM's changes matter here
    plain = METHODS["input_x_gradient"].fn(task, batch, target, {})
    assert not torch.allclose(found.double(), plain.double(), atol=1e-4)
    assert resolve_methods("gim") == ["gim"]


def test_the_baseline_token_is_a_space_else_padding_else_unknown():
    space = SimpleNamespace(encode=lambda text, add_special_tokens: [7, 8], pad_token_id=1, unk_token_id=2)
    assert baseline_token_id(space) == 7
    no_space = SimpleNamespace(encode=lambda text, add_special_tokens: [], pad_token_id=None, unk_token_id=2)
    assert baseline_token_id(no_space) == 2
    with pytest.raises(ValueError, match="baseline token"):
        baseline_token_id(SimpleNamespace(pad_token_id=None, unk_token_id=None))
