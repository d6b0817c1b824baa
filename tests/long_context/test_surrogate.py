"""The surrogate fitted around a prior (``captum_ffb/long_context/surrogate.py``) on values
whose weights are known."""

from __future__ import annotations

import json

import pytest
import torch

from captum_ffb.long_context.surrogate import Surrogate, fit_surrogate


def _case(m: int = 16, sources: int = 30, noise: float = 0.0, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weights = torch.zeros(sources, dtype=torch.float64)
    weights[[3, 7, 20]] = torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64)
    weights += 0.05 * torch.randn(sources, generator=generator, dtype=torch.float64)
    masks = torch.rand(m, sources, generator=generator) < 0.5
    values = -3.0 + masks.double() @ weights + noise * torch.randn(m, generator=generator, dtype=torch.float64)
    return masks, values, weights, generator


def test_a_prior_that_explains_the_ablations_is_kept_as_it_is():
    """Values exactly ``b + M s``: the prior is the fit (``c = 1``, ``δ = 0``), the bias ``b``."""
    masks, values, weights, _ = _case()
    found = fit_surrogate(masks, values, weights)
    assert isinstance(found, Surrogate)
    assert found.scale == pytest.approx(1.0, abs=1e-9)
    assert found.bias == pytest.approx(-3.0, abs=1e-9)
    assert torch.allclose(found.scores, weights, atol=1e-9)
    assert found.residual < 1e-9


def test_without_a_prior_many_ablations_recover_the_weights():
    masks, values, weights, _ = _case(m=400)
    found = fit_surrogate(masks, values)
    assert found.scale == 0.0
    assert (found.scores - weights).abs().max() < 0.02
    assert found.bias == pytest.approx(-3.0, abs=0.05)


def test_a_rough_prior_beats_no_prior_on_few_ablations():
    """16 noisy ablations of 30 sources: shrinking toward a rough prior (the weights plus
    noise) gives weights nearer the truth than shrinking toward zero, and nearer than the
    prior itself."""
    errors = {"prior": [], "fitted": [], "alone": []}
    for seed in range(5):
        masks, values, weights, generator = _case(noise=0.05, seed=seed)
        prior = weights + 0.3 * torch.randn(weights.shape, generator=generator, dtype=torch.float64)
        errors["prior"].append(float((prior - weights).norm()))
        errors["fitted"].append(float((fit_surrogate(masks, values, prior).scores - weights).norm()))
        errors["alone"].append(float((fit_surrogate(masks, values).scores - weights).norm()))
    assert sum(errors["fitted"]) < sum(errors["prior"]) < sum(errors["alone"])


def test_a_prior_against_the_ablations_is_dropped():
    masks, values, weights, _ = _case()
    assert fit_surrogate(masks, values, -weights).scale == 0.0
    assert torch.equal(fit_surrogate(masks, values, -weights).scores, fit_surrogate(masks, values).scores)


def test_two_priors_each_get_their_factor_and_one_against_the_ablations_is_dropped():
    """Values exactly ``b + M (2 s₁ + 0.5 s₂)``: both factors found, the prior rows recombined
    exactly; a row predicting against the ablations gets factor 0, the fit then the one-prior
    fit of the other row."""
    masks, values, weights, generator = _case(m=40)
    other = torch.randn(weights.shape, generator=generator, dtype=torch.float64)
    values = -3.0 + masks.double() @ (2.0 * weights + 0.5 * other)
    found = fit_surrogate(masks, values, torch.stack([weights, other]))
    assert found.scale == pytest.approx((2.0, 0.5), abs=1e-8)
    assert torch.allclose(found.scores, 2.0 * weights + 0.5 * other, atol=1e-8)
    plain = -3.0 + masks.double() @ weights
    dropped = fit_surrogate(masks, plain, torch.stack([-weights, weights]))
    assert dropped.scale[0] == 0.0 and dropped.scale[1] == pytest.approx(1.0, abs=1e-8)
    assert torch.allclose(dropped.scores, fit_surrogate(masks, plain, weights).scores, atol=1e-10)


@pytest.mark.parametrize("masks, values, prior, error", [
    (torch.ones(4), torch.ones(4), None, "masks must be"),
    (torch.ones(4, 3), torch.ones(5), None, "masks must be"),
    (torch.ones(2, 3), torch.ones(2), None, "at least 3"),
    (torch.ones(4, 3), torch.ones(4), torch.ones(2), "prior must be"),
    (torch.ones(4, 3), torch.ones(4), torch.ones(2, 2), "prior must be"),
    (torch.ones(4, 3), torch.ones(4), torch.ones(1, 1, 3), "prior must be"),
    (torch.ones(4, 3), torch.tensor([1.0, float("nan"), 0.0, 1.0]), None, "finite"),
    (torch.ones(4, 3), torch.ones(4), torch.tensor([1.0, float("inf"), 0.0]), "finite"),
])
def test_bad_input_is_refused(masks, values, prior, error):
    with pytest.raises(ValueError, match=error):
        fit_surrogate(masks, values, prior)


# --------------------------------------------------------------------------- method="fitted"
@pytest.fixture(scope="module")
def lm():
    from captum_ffb import NormDecomposition
    from tests.models import causal_tokenizer, tiny_lm

    return NormDecomposition(tiny_lm("llama")), causal_tokenizer(bos=True)


def _spy_on_the_fit(monkeypatch) -> tuple[dict, object]:
    """What ``method="fitted"`` hands to ``fit_surrogate`` (filled in by each call), and the
    real function."""
    from captum_ffb.long_context import attribution, surrogate

    seen, fit = {}, surrogate.fit_surrogate

    def spy(masks, values, prior=None):
        seen.update(masks=masks, values=values, prior=prior)
        return fit(masks, values, prior)

    monkeypatch.setattr(attribution, "fit_surrogate", spy)
    return seen, fit


CONTEXT = ("the cat sat on the mat . it was tired .\n\nthe dog ran fast . she loves math .\n"
           "tokyo is the capital .\n\n\nhello world")
QUESTION = "the cat was"


@pytest.mark.parametrize("target, prior_method", [(7, "presence"), (None, "decomposition"), (" the cat", "presence"),
                                                  (" the cat", "decomposition")])
def test_fitted_is_the_surrogate_of_the_models_own_values_on_ablated_texts(lm, target, prior_method, monkeypatch):
    """``method="fitted"`` fits the model's own value on each ablated prompt (the context's
    kept sentences, the template around them), shrunk toward the prior method's scores; the
    result holds the fit's weights and bias, the whole prompt's value and the fit's miss there."""
    from captum_ffb import context_attribution
    from captum_ffb.long_context import surrogate

    nd, tokenizer = lm
    seen, fit = _spy_on_the_fit(monkeypatch)
    found = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=target,
                                method="fitted", ablations=6, seed=3, prior=prior_method, rounds=0)
    prior = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=target,
                                method=prior_method)
    assert found.method == "fitted" and found.target == prior.target
    assert found.value == pytest.approx(prior.value, abs=1e-5)
    assert torch.equal(seen["prior"], prior.contributions)
    assert torch.equal(seen["masks"], surrogate.ablation_masks(len(prior.spans), 6, seed=3))
    token = [target] if isinstance(target, int) else None if target is None else nd.engine.token_ids(tokenizer, target)
    for keep, value in zip(seen["masks"].tolist()[:3], seen["values"].tolist()):
        text = surrogate.ablated_context(CONTEXT, prior.spans, keep)
        ids = tokenizer(text + "\n\n" + QUESTION, return_tensors="pt").input_ids
        with torch.no_grad():
            if target == " the cat":  # the answer's teacher-forced log-probability
                full = torch.cat([ids, torch.tensor([token[:-1]])], 1)
                logp = torch.log_softmax(nd.model(full).logits[0, -len(token):].double(), -1)
                expected = float(logp[torch.arange(len(token)), torch.tensor(token)].sum())
            else:  # the logit of the token the whole prompt predicts (or of the one given)
                unit = token[0] if token else int(nd.model(tokenizer(CONTEXT + "\n\n" + QUESTION,
                                                                     return_tensors="pt").input_ids).logits[0, -1].argmax())
                expected = float(nd.model(ids).logits[0, -1, unit])
        assert value == pytest.approx(expected, abs=1e-5)
    assert torch.allclose(found.contributions, fit(seen["masks"], seen["values"], prior.contributions).scores)
    assert found.delta == pytest.approx(abs(float(found.contributions.sum()) + found.bias - found.value))
    assert found.question == found.rest == 0.0 and found.token_contributions is None


@pytest.mark.parametrize("settings, ends", [({}, False), ({"focus": None, "rounds": 0}, True)])
def test_presence_inside_the_fit_skips_its_ends_where_the_decomposition_runs(lm, settings, ends, monkeypatch):
    """By default the decomposition runs (it names the focus and the nested prompts): its value
    is the result's, and presence runs only its steps; without it presence runs its ends."""
    from captum_ffb import context_attribution
    from captum_ffb.long_context import presence

    nd, tokenizer = lm
    called, real = [], presence.presence_attribution

    def spy(*args, **kwargs):
        called.append(args[6] if len(args) > 6 else kwargs.get("ends", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(presence, "presence_attribution", spy)
    found = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=7,
                                method="fitted", **settings)
    exact = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=7)
    assert called == [ends]
    assert found.value == pytest.approx(exact.value, abs=1e-5)
    assert found.delta == pytest.approx(abs(float(found.contributions.sum()) + found.bias - found.value))


@pytest.mark.parametrize("settings, extra", [({}, 0), ({"focus": None, "rounds": 0}, 1)])
def test_the_predicted_token_is_named_by_the_decompositions_pass_where_it_runs(lm, settings, extra):
    """With no target the fit explains the predicted token: where the decomposition runs its
    pass names it (as many passes as with the token given), else one forward pass more does
    (counted once presence has checked the model's mask)."""
    from captum_ffb import context_attribution

    nd, tokenizer = lm
    ids = tokenizer(CONTEXT + "\n\n" + QUESTION, return_tensors="pt").input_ids
    with torch.no_grad():
        predicted = int(nd.model(ids).logits[0, -1].argmax())
    context_attribution(nd, tokenizer, CONTEXT, QUESTION, target=predicted, method="presence")  # the mask checked
    found, passes, rows = {}, {}, []
    hook = nd.model.get_input_embeddings().register_forward_hook(lambda m, args, out: rows.append(1))
    try:
        for target in (None, predicted):
            before = len(rows)
            found[target] = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=target,
                                                method="fitted", **settings)
            passes[target] = len(rows) - before
    finally:
        hook.remove()
    assert passes[None] == passes[predicted] + extra
    assert found[None].target == found[predicted].target
    assert torch.equal(found[None].contributions, found[predicted].contributions)
    assert found[None].value == found[predicted].value


@pytest.mark.parametrize("prior_method", ["presence", "decomposition"])
def test_focused_ablations_remove_only_the_candidates_of_both_methods(lm, prior_method, monkeypatch):
    """``focus=4`` of 6 sentences: the ablations draw only the prior's and the decomposition's
    top two (filled up to four by the prior), every other sentence is kept in all of them, and
    the fit is the surrogate of those ablations around the prior."""
    from captum_ffb import context_attribution
    from captum_ffb.long_context import surrogate

    nd, tokenizer = lm
    seen, fit = _spy_on_the_fit(monkeypatch)
    found = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=7, method="fitted",
                                ablations=8, seed=1, prior=prior_method, focus=4, rounds=0)
    prior = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=7, method=prior_method)
    exact = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=7)
    order = lambda scores: torch.sort(-scores, stable=True).indices.tolist()  # noqa: E731
    among = surrogate.focus_groups(prior.contributions, exact.contributions, 4)
    assert set(among) >= set(order(prior.contributions)[:2]) | set(order(exact.contributions)[:2])
    assert len(among) == 4
    assert torch.equal(seen["masks"], surrogate.ablation_masks(6, 8, seed=1, among=among))
    outside = [j for j in range(6) if j not in among]
    assert seen["masks"][:, outside].all() and not seen["masks"][:, among].all()
    assert torch.allclose(found.contributions, fit(seen["masks"], seen["values"], prior.contributions).scores)
    unfocused = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=7,
                                    method="fitted", ablations=8, seed=1, prior=prior_method, focus=6, rounds=0)
    assert torch.equal(seen["masks"], surrogate.ablation_masks(6, 8, seed=1))  # as many candidates as groups
    assert not torch.allclose(unfocused.contributions, found.contributions)


@pytest.mark.parametrize("target", [7, " the cat"])
def test_greedy_rounds_add_the_nested_prompts_without_the_decompositions_first_group(lm, target, monkeypatch):
    """With ``rerank``, each round removes the group the decomposition ranks first on the prompt
    so far (run again on the shortened text) and adds that prompt, with the model's value there,
    to the ablations the surrogate is fitted on."""
    from captum_ffb import context_attribution
    from captum_ffb.long_context import surrogate

    nd, tokenizer = lm
    seen, fit = _spy_on_the_fit(monkeypatch)
    found = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=target,
                                method="fitted", ablations=5, seed=2, rounds=3, rerank=True)
    random_part = surrogate.ablation_masks(6, 5, seed=2)  # 6 groups, fewer than focus: every one drawn
    assert seen["masks"].shape == (8, 6) and torch.equal(seen["masks"][:5], random_part)
    keep, text = torch.ones(6, dtype=torch.bool), CONTEXT
    for row in range(5, 8):
        shorter = context_attribution(nd, tokenizer, text, QUESTION, group_by="sentence", target=target)
        kept = keep.nonzero()[:, 0]
        assert [g for g in shorter.groups] == [found.groups[j] for j in kept.tolist()]  # the same groups, shortened
        keep = keep.clone()
        keep[kept[int(shorter.contributions.argmax())]] = False
        assert torch.equal(seen["masks"][row], keep)
        text = surrogate.ablated_context(CONTEXT, found.spans, keep.tolist())
        value = context_attribution(nd, tokenizer, text, QUESTION, group_by="sentence", target=target).value
        assert float(seen["values"][row]) == pytest.approx(value, abs=1e-6)
    model_value = context_attribution(nd, tokenizer, text, QUESTION, group_by="sentence", target=target,
                                      method="presence").value  # the model's own value, not the decomposition's sum
    assert float(seen["values"][7]) == pytest.approx(model_value, abs=1e-4)
    assert torch.allclose(found.contributions, fit(seen["masks"], seen["values"], seen["prior"]).scores)
    focused = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=target,
                                  method="fitted", ablations=5, seed=2, rounds=3, focus=4, rerank=True)
    picks = [int((~a & b).nonzero()) for a, b in zip(seen["masks"][5:], [torch.ones(6, dtype=torch.bool),
                                                                         *seen["masks"][5:7]])]
    prior = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=target,
                                method="presence").contributions
    among = surrogate.focus_groups(prior, torch.zeros(6), 4, leading=picks)
    assert set(among) >= set(picks[:2]) and torch.equal(seen["masks"][:5], surrogate.ablation_masks(6, 5, 2, among))
    assert focused.method == "fitted"
    few = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=target,
                              method="fitted", ablations=5, seed=2, rounds=9, rerank=True)
    assert seen["masks"].shape == (10, 6) and not seen["masks"][-1].all() and seen["masks"][-1].sum() == 1
    assert few.method == "fitted"


@pytest.mark.parametrize("target", [7, " the cat"])
def test_nested_prompts_remove_the_decompositions_top_groups_of_its_first_ranking(lm, target, monkeypatch):
    """Without ``rerank`` (the default), prompt ``r`` removes the decomposition's top ``r``
    groups on the whole prompt, ranked once, and its value is the model's own there (a forward
    pass); the surrogate is fitted on the ablations and these prompts."""
    from captum_ffb import context_attribution
    from captum_ffb.long_context import surrogate

    nd, tokenizer = lm
    seen, fit = _spy_on_the_fit(monkeypatch)
    found = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=target,
                                method="fitted", ablations=5, seed=2, rounds=3)
    assert seen["masks"].shape == (8, 6) and torch.equal(seen["masks"][:5], surrogate.ablation_masks(6, 5, seed=2))
    first = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=target)
    order = torch.sort(-first.contributions, stable=True).indices
    for r in range(1, 4):
        keep = torch.ones(6, dtype=torch.bool)
        keep[order[:r]] = False
        assert torch.equal(seen["masks"][4 + r], keep)
        text = surrogate.ablated_context(CONTEXT, found.spans, keep.tolist())
        value = context_attribution(nd, tokenizer, text, QUESTION, group_by="sentence", target=target,
                                    method="presence").value  # the model's own value
        assert float(seen["values"][4 + r]) == pytest.approx(value, abs=1e-4)
    assert torch.allclose(found.contributions, fit(seen["masks"], seen["values"], seen["prior"]).scores)
    reranked = context_attribution(nd, tokenizer, CONTEXT, QUESTION, group_by="sentence", target=target,
                                   method="fitted", ablations=5, seed=2, rounds=3, rerank=True)
    assert reranked.method == found.method == "fitted"
    with pytest.raises(TypeError, match="rerank must be True or False, got int"):
        context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="fitted", rerank=1)


def test_ablated_spans_are_the_kept_groups_in_the_shortened_text():
    from captum_ffb.long_context.attribution import split_context
    from captum_ffb.long_context.surrogate import ablated_spans

    spans = split_context(CONTEXT, "sentence")
    for keep in ([True] * 6, [False, True, False, True, True, False], [False] * 5 + [True], [False] * 6):
        text, kept = ablated_spans(CONTEXT, spans, keep)
        assert [text[s:e] for s, e in kept] == [CONTEXT[s:e] for (s, e), k in zip(spans, keep) if k]
        assert split_context(text, "sentence") == kept


def test_focus_groups_and_masks_among_them():
    from captum_ffb.long_context.surrogate import ablation_masks, focus_groups

    prior = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    other = torch.tensor([0.0, 0.0, 0.0, 0.0, 2.0, 3.0])
    assert focus_groups(prior, other, 4) == [0, 1, 5, 4]
    assert focus_groups(prior, prior, 4) == [0, 1, 2, 3]  # the same top: filled up by the prior
    assert focus_groups(prior, other, 5) == [0, 1, 5, 4, 2]
    assert focus_groups(prior, other, 4, leading=[3]) == [0, 1, 3, 5]  # greedy picks before the order
    assert focus_groups(prior, other, 4, leading=[3, 2, 1]) == [0, 1, 3, 2]
    with pytest.raises(ValueError, match="leading must name groups"):
        focus_groups(prior, other, 4, leading=[6])
    masks = ablation_masks(6, 200, seed=0, among=[1, 4])
    assert masks[:, [0, 2, 3, 5]].all()
    assert 0.35 < masks[:, [1, 4]].double().mean() < 0.65
    with pytest.raises(ValueError, match="distinct groups"):
        ablation_masks(6, 4, among=[1, 1])
    with pytest.raises(ValueError, match="distinct groups"):
        ablation_masks(6, 4, among=[6])
    with pytest.raises(ValueError, match="alike"):
        focus_groups(prior, other[:3], 2)


def test_ablated_context_keeps_the_kept_groups_with_their_separators():
    from captum_ffb.long_context.attribution import split_context
    from captum_ffb.long_context.surrogate import ablated_context

    spans = split_context(CONTEXT, "sentence")
    assert ablated_context(CONTEXT, spans, [True] * len(spans)) == CONTEXT
    assert ablated_context(CONTEXT, spans, [False] * len(spans)) == ""
    keep = [False, True, False, True] + [False] * (len(spans) - 4)
    assert ablated_context(CONTEXT, spans, keep) == "it was tired . she loves math ."
    with pytest.raises(ValueError, match="keep flags"):
        ablated_context(CONTEXT, spans, [True])


def test_fitted_bad_requests_are_refused(lm):
    from captum_ffb import context_attribution

    nd, tokenizer = lm
    for bad in (2, 0, 2.5, True, "16"):
        with pytest.raises(ValueError, match="ablations"):
            context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="fitted", ablations=bad)
    with pytest.raises(ValueError, match="prior must be"):
        context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="fitted", prior="fitted")
    for bad in (1, 0, 2.0, True, "8"):
        with pytest.raises(ValueError, match="focus must be None or an integer of at least 2"):
            context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="fitted", focus=bad)
    for bad in (-1, 1.0, True, "4"):
        with pytest.raises(ValueError, match="rounds must be an integer of at least 0"):
            context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="fitted", rounds=bad)
    with pytest.raises(ValueError, match="method must be one of"):
        context_attribution(nd, tokenizer, CONTEXT, QUESTION, method="fit")


def test_fitted_from_the_command_line_and_in_the_views(tmp_path, capsys):
    from captum_ffb import context_attribution
    from captum_ffb.cli import main
    from captum_ffb.viz.context import context_html, plot_context
    from tests.models import save_tiny_lm

    model = save_tiny_lm(tmp_path / "m")
    (tmp_path / "context.txt").write_text(CONTEXT)
    assert main(["explain", "--model", str(model), "--context", str(tmp_path / "context.txt"), "--question", QUESTION,
                 "--group-by", "sentence", "--context-method", "fitted", "--ablations", "5",
                 "--out", str(tmp_path / "o"), "--format", "json,html"]) == 0
    written = json.loads((tmp_path / "o" / "context.json").read_text())
    assert written["method"] == "fitted" and len(written["groups"]) == 6
    assert "every group removed, by the fit" in capsys.readouterr().out
    assert main(["explain", "--model", str(model), "--context", str(tmp_path / "context.txt"), "--question", QUESTION,
                 "--context-method", "fitted", "--ablations", "2", "--out", str(tmp_path / "p")]) == 2
    assert "--ablations must be at least 3" in capsys.readouterr().err
    assert main(["explain", "--model", str(model), "--context", str(tmp_path / "context.txt"), "--question", QUESTION,
                 "--group-by", "sentence", "--context-method", "fitted", "--ablations", "5", "--focus", "4",
                 "--out", str(tmp_path / "q"), "--format", "json", "--quiet"]) == 0
    focused = json.loads((tmp_path / "q" / "context.json").read_text())["groups"]
    assert [g["contribution"] for g in focused] != [g["contribution"] for g in written["groups"]]  # 4 of 6 drawn
    assert main(["explain", "--model", str(model), "--context", str(tmp_path / "context.txt"), "--question", QUESTION,
                 "--context-method", "fitted", "--focus", "1", "--out", str(tmp_path / "r")]) == 2
    assert "--focus must be 0 (every group) or at least 2, got 1" in capsys.readouterr().err
    assert main(["explain", "--model", str(model), "--context", str(tmp_path / "context.txt"), "--question", QUESTION,
                 "--group-by", "sentence", "--context-method", "fitted", "--ablations", "5", "--rounds", "0",
                 "--out", str(tmp_path / "s"), "--format", "json", "--quiet"]) == 0
    no_rounds = json.loads((tmp_path / "s" / "context.json").read_text())["groups"]
    assert [g["contribution"] for g in no_rounds] != [g["contribution"] for g in written["groups"]]
    assert main(["explain", "--model", str(model), "--context", str(tmp_path / "context.txt"), "--question", QUESTION,
                 "--context-method", "fitted", "--rounds", "-1", "--out", str(tmp_path / "t")]) == 2
    assert "--rounds must be 0 or more, got -1" in capsys.readouterr().err
    from captum_ffb import NormDecomposition
    from tests.models import causal_tokenizer, tiny_lm

    found = context_attribution(NormDecomposition(tiny_lm("llama")), causal_tokenizer(bos=True), CONTEXT, QUESTION,
                                method="fitted", ablations=4)
    assert [name for name, _ in found.terms()] == ["every group removed, by the fit"]
    page = context_html(found)
    assert "<html" in page.lower() and "every group removed, by the fit" in page and "bias" not in page
    assert "fit on ablations" in plot_context(found).axes[0].get_xlabel()
