"""Our methods in LIT: the models, the dataset, the interpreters and the application, called as
LIT calls them (the page itself is driven in tests/integrations/test_lit_browser.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from captum_ffb import LayerNormDecomposition, NormDecomposition
from captum_ffb.explained.models import load_model
from captum_ffb.texts.text import display_tokens
from tests.models import save_tiny_lm, tiny_task_model, wordpiece_tokenizer

TEXT = "the cat sat on the mat because it was tired ."


def test_importing_the_integration_does_not_import_lit():
    code = ("import sys, captum_ffb.integrations.lit as m; "
            "print('lit_nlp' in sys.modules, m.INSTALL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False pip install 'captum_ffb[lit]' && pip install --no-deps lit-nlp==1.3.1"


def test_without_lit_one_line_names_the_extra():
    code = ("import sys; sys.modules['lit_nlp'] = None\n"
            "from captum_ffb.integrations import lit\n"
            "for use in (lit.require_lit, lambda: lit.NormDecompositionSalience):\n"
            "    try:\n"
            "        use()\n"
            "    except ImportError as error:\n"
            "        print(error)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.startswith("the LIT integration needs lit-nlp")
        assert line.endswith("pip install 'captum_ffb[lit]' && pip install --no-deps lit-nlp==1.3.1")


pytest.importorskip("lit_nlp.app", reason="needs lit-nlp: pip install --no-deps lit-nlp==1.3.1 "
                    "(the README's install line brings it with --no-deps)")

from lit_nlp.lib import caching  # noqa: E402

from captum_ffb.integrations import _lit_components as components  # noqa: E402
from captum_ffb.integrations import lit as ffb_lit  # noqa: E402


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "tiny-bert-classifier"
    tiny_task_model("bert", "sequence_classification").save_pretrained(folder)
    wordpiece_tokenizer().save_pretrained(folder)
    return load_model(folder, task="auto", show_progress=False)


@pytest.fixture(scope="module")
def language_model(tmp_path_factory):
    folder = save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny-llama")
    return load_model(folder, task="auto", show_progress=False)


@pytest.fixture(scope="module")
def minilm():
    return load_model(show_progress=False)


def _ids(loaded, text=TEXT):
    return loaded.tokenizer(text, return_tensors="pt")["input_ids"]


def test_classifier_model_probabilities_tokens_and_gradients(classifier):
    (model,) = ffb_lit.lit_models(classifier, "tiny").values()
    assert model.labels == ["LABEL_0", "LABEL_1", "LABEL_2"]
    (out,) = model.predict([{"text": TEXT}])
    ids = _ids(classifier)
    assert out["tokens"] == display_tokens(classifier.tokenizer.convert_ids_to_tokens(ids[0]),
                                           classifier.tokenizer)
    embeddings = classifier.model.get_input_embeddings()(ids).detach().requires_grad_(True)
    logits = classifier.model(inputs_embeds=embeddings).logits[0]
    np.testing.assert_allclose(out["probas"], logits.softmax(-1).detach().numpy(), atol=1e-6)
    (grad,) = torch.autograd.grad(logits[logits.argmax()], embeddings)
    np.testing.assert_allclose(out["token_grads"], grad[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(out["token_embs"], embeddings[0].detach().numpy())
    (chosen,) = model.predict([{"text": TEXT, "label": "LABEL_2"}])  # the class to explain
    (grad,) = torch.autograd.grad(
        classifier.model(inputs_embeds=embeddings).logits[0, 2], embeddings)
    np.testing.assert_allclose(chosen["token_grads"], grad[0].numpy(), atol=1e-5)


def test_salience_equals_norm_decomposition_for_the_predicted_and_a_chosen_class(classifier):
    models = ffb_lit.lit_models(classifier, "tiny")
    wrapped = caching.CachingModelWrapper(models["tiny"], "tiny")  # as LIT hands it over
    interpreter = ffb_lit.NormDecompositionSalience()
    assert interpreter.is_compatible(wrapped, None)
    ids = _ids(classifier)
    nd = NormDecomposition(classifier.model)
    predicted = int(classifier.model(ids).logits.argmax())
    for index, expected_class in ((None, predicted), (2, 2), (0, 0)):
        config = {components.TARGET_INFO_KEY: {"field": "probas", "index": index}}
        (result,) = interpreter.run([{"text": TEXT}], wrapped, None, config=config)
        salience = result["text"]
        expected = nd.attribute(ids, target=expected_class)[0]
        assert salience.tokens == list(models["tiny"].predict([{"text": TEXT}]))[0]["tokens"]
        np.testing.assert_allclose(salience.salience, expected.numpy(), atol=1e-5)
    config[components.VALUES_KEY] = components.SHARES
    (result,) = interpreter.run([{"text": TEXT}], wrapped, None, config=config)
    expected = nd.attribute(ids, target=0)[0]
    np.testing.assert_allclose(result["text"].salience, (expected / expected.abs().sum()).numpy(),
                               atol=1e-6)


def _held_elsewhere() -> bool:
    """Whether another thread holds the model lock (it cannot take it now)."""
    taken = []
    probe = threading.Thread(target=lambda: taken.append(components.MODEL_LOCK.acquire(blocking=False)))
    probe.start()
    probe.join()
    if taken[0]:
        components.MODEL_LOCK.release()
    return not taken[0]


def test_every_model_call_of_the_salience_holds_the_model_lock(classifier, monkeypatch):
    # LIT answers requests in threads: a decomposition hooking the model while another
    # method runs it mixes their forward passes, so each call must hold the lock.
    held = []
    real = components.explain_text

    def watched(*args, **kwargs):
        held.append(_held_elsewhere())
        return real(*args, **kwargs)

    monkeypatch.setattr(components, "explain_text", watched)
    models = ffb_lit.lit_models(classifier, "tiny")
    wrapped = caching.CachingModelWrapper(models["tiny"], "tiny")
    ffb_lit.NormDecompositionSalience().run([{"text": TEXT}], wrapped, None, config={})
    models["tiny"].contributions(TEXT, None)
    assert held == [True, True]


@pytest.mark.real_weights
def test_minilm_with_its_head_two_classes_and_signed_contributions(minilm):
    from captum_ffb.evaluation.minilm_head import minilm_sentiment_readout

    (model,) = ffb_lit.lit_models(minilm).values()
    text = "a charming and often affecting journey."
    ids = _ids(minilm, text)
    readout = minilm_sentiment_readout()
    with torch.no_grad():
        z = float(readout.value(minilm.model(ids), torch.ones_like(ids))[0])
    (out,) = model.predict([{"text": text}])
    assert model.labels == ["negative", "positive"]
    p = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(out["probas"], [1 - p, p], atol=1e-6)
    expected = NormDecomposition(minilm.model).attribute(
        ids, target=readout, forward_kwargs={"attention_mask": torch.ones_like(ids)})[0]
    interpreter = ffb_lit.NormDecompositionSalience()
    for index, sign in ((None, 1.0 if z > 0 else -1.0), (1, 1.0), (0, -1.0)):
        config = {components.TARGET_INFO_KEY: {"field": "probas", "index": index}}
        (result,) = interpreter.run([{"text": text}], model, None, config=config)
        np.testing.assert_allclose(result["text"].salience, sign * expected.numpy(), atol=1e-5)


def test_layer_maps_rows_are_the_layer_maps(classifier):
    interpreter = ffb_lit.LayerMapsSalience(classifier)
    (model,) = ffb_lit.lit_models(classifier, "tiny").values()
    assert interpreter.is_compatible(model, None)
    assert interpreter.layers == ["1", "0"]  # LIT's settings open on the first: the default
    assert interpreter.scopes == ["AtbFfResLn", "AtbFfRes", "AtbFf", "Atb"]
    config = interpreter.config_spec()
    assert (config[components.LAYER_KEY].default, config[components.SCOPE_KEY].default) == ("1", "AtbFfResLn")
    ids = _ids(classifier)
    blocks = classifier.blocks
    (maps,) = LayerNormDecomposition(classifier.model, [blocks[0]]).attribute(ids, scope=["AtbFf"])
    matrix = maps["AtbFf"][0]
    for shares in (True, False):
        config = {components.LAYER_KEY: "0", components.SCOPE_KEY: "AtbFf",
                  components.NORMALIZE_KEY: shares}
        (rows,) = interpreter.run([{"text": TEXT}], model, None, config=config)
        tokens = display_tokens(classifier.tokenizer.convert_ids_to_tokens(ids[0]), classifier.tokenizer)
        assert list(rows) == [f"{i}: {t}" for i, t in enumerate(tokens)]
        expected = matrix / matrix.sum(-1, keepdim=True) if shares else matrix
        for i, row in enumerate(rows.values()):
            assert row.tokens == tokens
            np.testing.assert_allclose(row.salience, expected[i].numpy(), rtol=1e-5, atol=1e-7)
    (default,) = interpreter.run([{"text": TEXT}], model, None)  # last layer, whole layer, shares
    np.testing.assert_allclose(sum(next(iter(default.values())).salience), 1.0, atol=1e-6)


def test_language_model_group_generation_and_salience(language_model):
    models = ffb_lit.lit_models(language_model, "tiny")
    assert list(models) == ["tiny", "_tiny_salience", "_tiny_tokenizer"]
    prompt, target = "the cat sat on", " the mat"
    (generated,) = models["tiny"].predict([{"prompt": prompt, "target": ""}])
    ids = _ids(language_model, prompt)
    full = language_model.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         max_new_tokens=16, pad_token_id=0)
    assert generated["response"] == language_model.tokenizer.decode(full[0, ids.shape[1]:],
                                                                    skip_special_tokens=True)
    salience = models["_tiny_salience"]
    whole = _ids(language_model, prompt + target)
    n = whole.shape[1]
    mask = [0] * (n - 2) + [1, 1]  # the two target tokens, as Sequence Salience marks them
    (out,) = salience.predict([{"prompt": prompt, "target": target, "target_mask": mask}])
    (tokens,) = models["_tiny_tokenizer"].predict([{"prompt": prompt, "target": target}])
    assert out["tokens"] == tokens["tokens"] and len(out["tokens"]) == n
    assert {"grad_l2", "grad_dot_input"} <= set(out)  # LIT's own, next to ours
    nd = NormDecomposition(language_model.model)
    expected = sum(nd.attribute(whole, target=int(whole[0, t]), target_position=t - 1)[0]
                   for t in (n - 2, n - 1))
    np.testing.assert_allclose(out[components.LM_FIELD], expected.numpy(), atol=1e-5)
    np.testing.assert_allclose(out[components.LM_FIELD_AFTER_FIRST][1:], expected[1:].numpy(), atol=1e-5)
    assert out[components.LM_FIELD_AFTER_FIRST][0] == 0
    (nothing_marked,) = salience.predict([{"prompt": prompt, "target": ""}])  # the next token
    predicted = int(language_model.model(ids).logits[0, -1].argmax())
    np.testing.assert_allclose(nothing_marked[components.LM_FIELD],
                               nd.attribute(ids, target=predicted)[0].numpy(), atol=1e-5)


def test_datasets_from_files_and_defaults(classifier, language_model, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [{"text": "the cat", "label": 2},
                                                       {"text": "a dog"}, {"text": "  "}]),
                    encoding="utf-8")
    dataset = ffb_lit.lit_dataset(classifier, rows)
    assert dataset.examples == [{"text": "the cat", "label": "LABEL_2"}, {"text": "a dog", "label": ""}]
    assert set(dataset.spec()) == {"text", "label"}
    assert ffb_lit.lit_dataset(classifier, rows, limit=1).examples == dataset.examples[:1]
    prompts = ffb_lit.lit_dataset(language_model)
    assert prompts.examples[0] == {"prompt": ffb_lit.DEFAULT_TEXTS[0], "target": ""}
    assert len(prompts.examples) == len(ffb_lit.DEFAULT_TEXTS)


def test_the_application_answers_lit_requests(classifier):
    """LIT's own request handlers, through its WSGI app: the page's metadata lists our methods
    first among the salience methods, and an interpretation request returns our values."""
    from werkzeug.test import Client

    app = ffb_lit.build_app(classifier, None, name="tiny")
    client = Client(app)
    info = json.loads(client.get("/get_info").get_data())
    interpreters = info["models"]["tiny"]["interpreters"]
    assert components.NORM_DECOMPOSITION in interpreters and components.LAYER_MAPS in interpreters
    assert "LIME" in interpreters and "Grad L2 Norm" in interpreters
    order = [interpreters.index(name) for name in (components.NORM_DECOMPOSITION, "Grad L2 Norm",
                                                   "LIME", components.LAYER_MAPS)]
    assert order == sorted(order)  # the Salience Maps module lists them in this order
    assert info["layouts"].keys() == {"captum_ffb"}
    examples = json.loads(client.post("/get_dataset?dataset_name=data", json={}).get_data())
    first = examples[0]  # as the page sends it: with its id
    inputs = {"inputs": [first],
              "config": {components.TARGET_INFO_KEY: {"field": "probas", "index": 1}}}
    answer = client.post(f"/get_interpretations?model=tiny&dataset_name=data&interpreter="
                         f"{components.NORM_DECOMPOSITION}&do_predict=1", json=inputs)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    (result,) = json.loads(answer.get_data())
    ids = _ids(classifier, first["data"]["text"])
    expected = NormDecomposition(classifier.model).attribute(ids, target=1)[0]
    np.testing.assert_allclose(result["text"]["salience"], expected.numpy(), atol=1e-5)


def test_a_base_model_without_a_head_is_refused(tmp_path):
    from tests.models import save_tiny

    loaded = load_model(save_tiny("bert", tmp_path / "base"), show_progress=False)
    with pytest.raises(ValueError, match="a base model has no classes to explain"):
        ffb_lit.lit_models(loaded)


def test_an_error_answer_holds_no_traceback(classifier):
    """LIT appends the Python traceback (with the server's file paths) to an error's body; the
    page gets the first line only."""
    from werkzeug.test import Client

    client = Client(ffb_lit.build_app(classifier, None, name="tiny"))
    answer = client.post("/get_interpretations?model=tiny&dataset_name=data&interpreter=nonsense",
                         json={"inputs": [], "config": {}})
    assert answer.status_code == 500
    body = answer.get_data(as_text=True)
    assert body.startswith("Uncaught error:") and "\n" not in body
    assert "Traceback" not in body and ".py" not in body
    assert int(answer.headers["Content-Length"]) == len(answer.get_data())
