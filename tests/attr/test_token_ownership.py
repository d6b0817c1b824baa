"""The default gives the tokens the whole output: on every family with its bias terms removed,
``Σ_j c_j`` is the explained value (both routes, padded batches), and the bias player holds
nothing; with bias terms, it holds exactly what the zero reference gives it (the model's own)."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from tests.models import TINY_MODELS, padded_pair, tiny_task_model

CASES = [(name, "causal_lm" if TINY_MODELS[name].causal else "sequence_classification")
         for name in sorted(TINY_MODELS)]


def _without_bias_terms(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or name.endswith("_bias"):
                parameter.zero_()
    return model


@pytest.mark.parametrize("name, task", CASES)
def test_the_tokens_own_the_whole_value_of_a_bias_free_model(name, task):
    model = _without_bias_terms(tiny_task_model(name, task))
    nd = NormDecomposition(model)
    # left padding only where positions follow the mask (an encoder reads [CLS] first; GPT-2's
    # learned positions count from the first column)
    sides = ("left", "right") if task == "causal_lm" and name != "gpt2" else ("right",)
    for side in sides:
        ids, mask, short, columns = padded_pair(side)
        for route in ("backward", "forward"):
            c, bias, delta = nd.attribute(ids, target=2, forward_kwargs={"attention_mask": mask}, route=route,
                                          return_bias=True, return_convergence_delta=True)
            value = c.sum(1) + bias  # = the real output, to the delta
            scale = float(c.abs().sum(1).max())
            assert float(delta.max()) < 1e-5 * scale + 1e-7, (side, route)
            assert float(bias.abs().max()) < 1e-5 * scale + 1e-7, (side, route)  # Σ_j c_j is the value
            assert float(c[mask == 0].abs().max()) == 0.0
            alone = nd.attribute(short, target=2, route=route)  # padding changes nothing
            torch.testing.assert_close(c[1, columns], alone[0], atol=1e-5 * scale, rtol=1e-4)
            assert float(value.abs().min()) > 0


@pytest.mark.parametrize("name", ["gpt2", "bert", "phi"])
def test_with_bias_terms_the_bias_player_holds_only_them(name):
    task = "causal_lm" if TINY_MODELS[name].causal else "sequence_classification"
    model = tiny_task_model(name, task)  # every bias randomised
    ids, mask, _, _ = padded_pair("right")
    nd = NormDecomposition(model)
    _, own = nd.attribute(ids, target=1, forward_kwargs={"attention_mask": mask}, reference="zero", return_bias=True)
    c, bias = nd.attribute(ids, target=1, forward_kwargs={"attention_mask": mask}, return_bias=True)
    assert float(own.abs().max()) > 1e-3  # the model's bias terms are not trivial here
    torch.testing.assert_close(bias, own, atol=1e-6, rtol=1e-5)


def _forward_route_runs(nd, monkeypatch, **kwargs) -> bool:
    """Whether ``attribute`` on the backward route, asked for the bias and the delta, runs
    the forward route (the bias player's own pass)."""
    calls = []
    real = nd.engine.forward

    def counted(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(nd.engine, "forward", counted)
    ids, mask, _, _ = padded_pair("right")
    c, bias, delta = nd.attribute(ids, target=2, forward_kwargs={"attention_mask": mask}, return_bias=True,
                                  return_convergence_delta=True, **kwargs)
    assert float(delta.max()) < 1e-5 * float(c.abs().sum(1).max()) + 1e-7
    monkeypatch.undo()
    return bool(calls)


def test_without_bias_terms_the_bias_pass_is_skipped_and_the_delta_still_checks(monkeypatch):
    """A bias-free model under the default rules holds no bias: one backward pass gives the
    contributions, the bias (exactly 0) and the delta against the real output; a bias term, a
    rule of the user's or a token reference bring the bias player's own pass back."""
    from captum_ffb.rules import IGAttention

    model = _without_bias_terms(tiny_task_model("llama", "causal_lm"))
    nd = NormDecomposition(model)
    assert not _forward_route_runs(nd, monkeypatch)
    assert not _forward_route_runs(nd, monkeypatch, reference="zero")
    assert _forward_route_runs(nd, monkeypatch, reference=3)  # the reference's output is the bias player's
    assert _forward_route_runs(nd, monkeypatch, rules={"attention": IGAttention()})
    ids, mask, _, _ = padded_pair("right")
    c, bias, delta = nd.attribute(ids, target=2, forward_kwargs={"attention_mask": mask}, return_bias=True,
                                  return_convergence_delta=True)
    assert torch.equal(bias, torch.zeros_like(bias))
    # the delta is the backward pass's tokens against the real model's output
    last = mask.sum(1) - 1
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
    real = logits[torch.arange(len(ids)), last, 2]
    torch.testing.assert_close(delta, (c.sum(1) - real).abs(), atol=1e-6, rtol=1e-5)
    with torch.no_grad():  # one bias term back
        model.model.layers[0].mlp.down_proj.bias = torch.nn.Parameter(torch.full((model.config.hidden_size,), 0.1))
    assert _forward_route_runs(NormDecomposition(model), monkeypatch)
