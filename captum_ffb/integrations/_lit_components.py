"""The LIT models, dataset and interpreters of :mod:`captum_ffb.integrations.lit`.

Importing this module imports lit-nlp (an optional dependency); go through
:mod:`captum_ffb.integrations.lit`, which says how to install it when it is missing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any, TypeVar

import numpy as np
import torch
from lit_nlp import app as lit_app
from lit_nlp.api import components as lit_components
from lit_nlp.api import dataset as lit_dataset
from lit_nlp.api import dtypes, layout
from lit_nlp.api import model as lit_model
from lit_nlp.api import types as lit_types
from lit_nlp.components import core
from lit_nlp.examples.prompt_debugging.constants import INPUT_SPEC as PROMPT_SPEC

from captum_ffb.attr import NormDecomposition
from captum_ffb.engine.passes import ModelPass, run_model
from captum_ffb.explain import explain_text
from captum_ffb.explained.models import LoadedModel
from captum_ffb.explained.readouts import NextToken, default_readout
from captum_ffb.integrations._lit_offline import OfflineFonts
from captum_ffb.texts.text import display_tokens, text_maps

JsonDict = dict[str, Any]
Method = TypeVar("Method", bound=Callable[..., Any])

#: The config key through which LIT's "Salience Maps" module passes the class to explain.
TARGET_INFO_KEY = "_salience_target"
#: Our interpreters' names in LIT.
NORM_DECOMPOSITION = "NormDecomposition"
LAYER_MAPS = "Layer maps (NormDecomposition)"
#: The salience field with ``value = Σ tokens + bias`` and the token share.
OUTPUT_FIELD = "value = Σ tokens + bias"
#: How the contributions are shown: as they are, or as shares of their absolute sum.
RAW, SHARES = "logit units", "shares of Σ|c|"
VALUES_KEY = "Values"
LAYER_KEY, SCOPE_KEY, NORMALIZE_KEY = "Layer", "Scope", "Rows as shares"
#: The causal LMs' salience fields, next to LIT's ``grad_l2`` and ``grad_dot_input``.
LM_FIELD = "norm_decomposition"
LM_FIELD_AFTER_FIRST = "norm_decomposition_after_first"
#: The bundled sentiment head's two classes (class 1: positive, the head's logit ``z``).
SENTIMENT_LABELS = ("negative", "positive")

#: One model call at a time: LIT's server answers requests in threads, and the decomposition
#: hooks the model's attention while it records a forward pass.
MODEL_LOCK = threading.RLock()


def one_at_a_time(method: Method) -> Method:
    """``method`` run under :data:`MODEL_LOCK`."""

    @wraps(method)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with MODEL_LOCK:
            return method(*args, **kwargs)

    return locked  # type: ignore[return-value]


def unwrap(model: lit_model.Model) -> lit_model.Model:
    """The model under LIT's wrappers (its prediction cache)."""
    while isinstance(model, lit_model.ModelWrapper):
        model = model.wrapped
    return model


def _text_of(example: JsonDict) -> str:
    """An example's whole text: a classifier's ``text``, or a causal LM's prompt and target."""
    if "text" in example:
        return example["text"]
    return example["prompt"] + (example.get("target") or "")


# ---------------------------------------------------------------------------------------
# models


def class_labels(loaded: LoadedModel) -> list[str]:
    """The class names of a sequence classifier (its ``id2label``), or the bundled sentiment
    head's two; a one-line ValueError for any other model."""
    if loaded.task == "sequence_classification":
        config = loaded.model.config
        return [str(config.id2label.get(k, k)) for k in range(config.num_labels)]
    if loaded.task == "base" and default_readout(loaded.model) is not None:
        return list(SENTIMENT_LABELS)
    if loaded.task == "base":
        raise ValueError("a base model has no classes to explain: LIT needs a sequence "
                         "classifier, a causal LM or the bundled all-MiniLM-L6-v2")
    raise ValueError(f"a classifier is needed here; this model is a {loaded.task}")


class ClassifierModel(lit_model.BatchedModel):
    r"""A sequence classifier, or the bundled all-MiniLM-L6-v2 with its sentiment head, as a
    LIT model: class probabilities, tokens, and the input embeddings with the gradients of
    the explained class's logit (for LIT's gradient methods and integrated gradients).

    The class is the input's ``label`` when given (LIT's "Class to explain" sets it), else
    the predicted one.

    Args:
        loaded (LoadedModel): a sequence classifier, or the bundled MiniLM (a base model).
        batch_size (int): examples per forward pass.
    """

    def __init__(self, loaded: LoadedModel, batch_size: int = 16):
        self.loaded = loaded
        self.batch_size = batch_size
        self.readout = default_readout(loaded.model) if loaded.task == "base" else None
        self.labels = class_labels(loaded)

    @classmethod
    def init_spec(cls) -> None:
        return None  # made from a loaded model, not from LIT's "Configure" dialog

    def description(self) -> str:
        head = " with the bundled sentiment head" if self.readout is not None else ""
        return f"{self.loaded.name}{head}"

    def max_minibatch_size(self) -> int:
        return self.batch_size

    def input_spec(self) -> lit_types.Spec:
        return {
            "text": lit_types.TextSegment(),
            "label": lit_types.CategoryLabel(vocab=self.labels, required=False),
            "token_embs": lit_types.TokenEmbeddings(align="tokens", required=False),
        }

    def output_spec(self) -> lit_types.Spec:
        return {
            "tokens": lit_types.Tokens(parent="text", token_prefix=None),
            "probas": lit_types.MulticlassPreds(vocab=self.labels, parent="label"),
            "token_embs": lit_types.TokenEmbeddings(align="tokens"),
            "token_grads": lit_types.TokenGradients(align="tokens", grad_for="token_embs",
                                                    grad_target_field_key="label"),
        }

    def class_logits(self, embeddings: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(batch, classes)`` logits of the model run on input ``embeddings``."""
        outputs = run_model(self.loaded.model, grad=torch.is_grad_enabled(), inputs_only=False,
                            inputs_embeds=embeddings, attention_mask=mask)
        if self.readout is not None:
            return self.readout.class_logits(outputs, mask)
        return outputs.logits

    @one_at_a_time
    def predict_minibatch(self, inputs: list[JsonDict]) -> list[JsonDict]:
        tokenizer = self.loaded.tokenizer
        encoded = tokenizer([ex["text"] for ex in inputs], return_tensors="pt", padding=True,
                            truncation=True, max_length=self.loaded.max_length)
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        device = next(self.loaded.model.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
        with torch.no_grad():
            embeddings = self.loaded.model.get_input_embeddings()(ids)
        real = mask.bool()
        for row, ex in enumerate(inputs):  # integrated gradients passes its own embeddings
            given = ex.get("token_embs")
            if given is not None and len(given) == int(real[row].sum()):
                embeddings[row, real[row]] = torch.as_tensor(np.asarray(given)).to(embeddings)
        embeddings.requires_grad_(True)
        with torch.enable_grad():
            logits = self.class_logits(embeddings, mask)
            chosen = logits.argmax(-1)
            for row, ex in enumerate(inputs):
                if ex.get("label") in self.labels:
                    chosen[row] = self.labels.index(ex["label"])
            picked = logits.gather(1, chosen[:, None]).sum()
            (gradients,) = torch.autograd.grad(picked, embeddings)
        probabilities = (self.readout.class_probabilities(logits) if self.readout is not None
                         else logits.softmax(-1)).detach()
        out = []
        for row in range(len(inputs)):
            pieces = tokenizer.convert_ids_to_tokens(ids[row, real[row]].tolist())
            out.append({
                "tokens": display_tokens(pieces, tokenizer),
                "probas": probabilities[row].cpu().numpy(),
                "token_embs": embeddings[row, real[row]].detach().cpu().numpy(),
                "token_grads": gradients[row, real[row]].cpu().numpy(),
            })
        return out

    @one_at_a_time
    def contributions(self, text: str, class_index: int | None) -> tuple[list[str], torch.Tensor]:
        """The tokens of ``text`` and their exact contributions to the logit of class
        ``class_index`` (the predicted class when ``None``), from
        :func:`~captum_ffb.explain.explain_text`."""
        labels, contributions, _, _ = self.explained(text, class_index)
        return labels, contributions

    @one_at_a_time
    def explained(self, text: str, class_index: int | None) -> tuple[list[str], torch.Tensor, float, float]:
        """As :meth:`contributions`, with the logit and the bias player: ``(tokens,
        contributions, value, bias)``, ``value = Σ contributions + bias``."""
        if self.readout is None:
            explanation = explain_text(text, self.loaded, class_index=class_index, maps=False)
            return (explanation.labels, explanation.contributions[0], float(explanation.values[0]),
                    float(explanation.bias[0]))
        explanation = explain_text(text, self.loaded, maps=False)  # the head's logit z
        chosen = class_index if class_index is not None else int(float(explanation.values[0]) > 0)
        sign = 1.0 if chosen == 1 else -1.0  # class 0's logit is −z
        return (explanation.labels, sign * explanation.contributions[0], sign * float(explanation.values[0]),
                sign * float(explanation.bias[0]))


class GenerationModel(lit_model.BatchedModel):
    r"""A causal LM's greedy continuation of each prompt, as a LIT model: LIT's "Sequence
    Salience" module offers it as a target (its first token is the predicted next token).

    Args:
        loaded (LoadedModel): a causal LM.
        max_new_tokens (int): how many tokens to generate.
    """

    def __init__(self, loaded: LoadedModel, max_new_tokens: int = 16):
        self.loaded = loaded
        self.max_new_tokens = max_new_tokens

    @classmethod
    def init_spec(cls) -> None:
        return None  # made from a loaded model, not from LIT's "Configure" dialog

    def description(self) -> str:
        return f"{self.loaded.name}: greedy continuation of {self.max_new_tokens} tokens"

    def max_minibatch_size(self) -> int:
        return 1

    def input_spec(self) -> lit_types.Spec:
        return dict(PROMPT_SPEC)

    def output_spec(self) -> lit_types.Spec:
        return {"response": lit_types.GeneratedText(parent="target")}

    @one_at_a_time
    def predict_minibatch(self, inputs: list[JsonDict]) -> list[JsonDict]:
        tokenizer, model = self.loaded.tokenizer, self.loaded.model
        out = []
        for ex in inputs:
            ids = tokenizer(ex["prompt"], return_tensors="pt")["input_ids"]
            ids = ids.to(next(model.parameters()).device)
            with ModelPass(model) as run:
                full = run.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=self.max_new_tokens,
                                    pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
            out.append({"response": tokenizer.decode(full[0, ids.shape[1]:], skip_special_tokens=True)})
        return out


class SequenceSalienceModel(lit_model.BatchedModel):
    r"""LIT's salience model for a causal LM (its ``grad_l2`` and ``grad_dot_input``) with
    our contributions added: for the target tokens marked in ``target_mask`` (the tokens
    clicked in "Sequence Salience"), the exact contributions of every token to the sum of
    their logits, each read where it is predicted. ``norm_decomposition_after_first`` shows
    the same with the first position set aside (it often takes most: the attention sink).
    Without a target, the predicted next token is explained.

    Args:
        loaded (LoadedModel): a causal LM.
    """

    def __init__(self, loaded: LoadedModel):
        from lit_nlp.examples.prompt_debugging import transformers_lms  # warns: no TensorFlow

        self.loaded = loaded
        if not hasattr(loaded.model, "framework"):  # LIT reads it; transformers 5 removed it
            loaded.model.framework = "pt"
        self.gradients = transformers_lms.HFSalienceModel(model=loaded.model,
                                                          tokenizer=loaded.tokenizer, batch_size=1)

    @classmethod
    def init_spec(cls) -> None:
        return None  # made from a loaded model, not from LIT's "Configure" dialog

    def description(self) -> str:
        return f"{self.loaded.name}: salience"

    def max_minibatch_size(self) -> int:
        return 1

    def input_spec(self) -> lit_types.Spec:
        return self.gradients.input_spec()

    def output_spec(self) -> lit_types.Spec:
        return self.gradients.output_spec() | {
            LM_FIELD: lit_types.TokenScores(align="tokens"),
            LM_FIELD_AFTER_FIRST: lit_types.TokenScores(align="tokens"),
        }

    def contributions(self, text: str, target_mask: Sequence[float] | None) -> torch.Tensor:
        """``(n,)`` contributions of the tokens of ``text`` (tokenised as LIT's salience
        model does) to the logits of the tokens marked in ``target_mask``."""
        ids = self.loaded.tokenizer(text, return_tensors="pt", add_special_tokens=True)["input_ids"]
        ids = ids.to(next(self.loaded.model.parameters()).device)
        marked = [t for t, m in enumerate(target_mask or []) if m and 1 <= t < ids.shape[1]]
        readouts = ([NextToken(int(ids[0, t]), t - 1) for t in marked] if marked
                    else [NextToken(None, ids.shape[1] - 1)])
        result = NormDecomposition(self.loaded.model).explain(
            ids, readouts, forward_kwargs={"attention_mask": torch.ones_like(ids)})
        return result.contributions.detach().sum(0)

    @one_at_a_time
    def predict_minibatch(self, inputs: list[JsonDict]) -> list[JsonDict]:
        out = list(self.gradients.predict_minibatch(inputs))
        for ex, preds in zip(inputs, out):
            c = self.contributions(_text_of(ex), ex.get("target_mask")).cpu().numpy()
            if len(c) != len(preds["tokens"]):
                raise RuntimeError(f"{len(c)} contributions for {len(preds['tokens'])} tokens")
            after_first = c.copy()
            after_first[0] = 0.0
            preds[LM_FIELD], preds[LM_FIELD_AFTER_FIRST] = c, after_first
        return out


def model_group(loaded: LoadedModel, name: str) -> dict[str, lit_model.Model]:
    """The LIT models of ``loaded`` (see :func:`captum_ffb.integrations.lit.lit_models`)."""
    if loaded.task != "causal_lm":
        return {name: ClassifierModel(loaded)}
    from lit_nlp.examples.prompt_debugging import transformers_lms

    salience = SequenceSalienceModel(loaded)
    tokenizer = transformers_lms.HFTokenizerModel.from_loaded(salience.gradients)
    return {name: GenerationModel(loaded), f"_{name}_salience": salience,
            f"_{name}_tokenizer": tokenizer}


# ---------------------------------------------------------------------------------------
# the dataset


class TextDataset(lit_dataset.Dataset):
    r"""Texts (with their labels, where known) whose fields match our LIT models' inputs:
    ``text`` and ``label`` for a classifier, ``prompt`` (and an empty ``target``) for a
    causal LM.

    Args:
        loaded (LoadedModel): the model.
        texts (list[str]): the texts.
        labels (list[int or None]): class indices (``None``: unknown); ignored for causal LMs.
        description (str): shown by LIT.
    """

    def __init__(self, loaded: LoadedModel, texts: Sequence[str],
                 labels: Sequence[int | None] | None = None, description: str = ""):
        labels = list(labels) if labels is not None else [None] * len(texts)
        self._description = description
        if loaded.task == "causal_lm":
            spec = {"prompt": lit_types.TextSegment(), "target": lit_types.TextSegment(required=False)}
            examples = [{"prompt": t, "target": ""} for t in texts]
        else:
            vocab = class_labels(loaded)
            spec = {"text": lit_types.TextSegment(),
                    "label": lit_types.CategoryLabel(vocab=vocab, required=False)}
            examples = [{"text": t, "label": vocab[y] if y is not None and 0 <= y < len(vocab) else ""}
                        for t, y in zip(texts, labels)]
        super().__init__(spec=spec, examples=examples)

    @classmethod
    def init_spec(cls) -> None:
        return None  # made from a loaded model, not from LIT's "Configure" dialog

    def description(self) -> str:
        return self._description


# ---------------------------------------------------------------------------------------
# interpreters


class NormDecompositionSalience(lit_components.Interpreter):
    """NormDecomposition (captum_ffb): the exact contribution of every token to the logit of
    the class to explain; the contributions and the bias player add up to the logit (the line
    below the tokens: value = Σ tokens + bias, and the token share Σ tokens / value). Shown in
    logit units (settings: or as shares of their absolute sum)."""

    def is_compatible(self, model: lit_model.Model, dataset: lit_dataset.Dataset) -> bool:
        del dataset
        return isinstance(unwrap(model), ClassifierModel)

    def config_spec(self) -> lit_types.Spec:
        return {
            TARGET_INFO_KEY: lit_types.SalienceTargetInfo(),
            VALUES_KEY: lit_types.CategoryLabel(vocab=[RAW, SHARES], default=RAW, required=False),
        }

    def meta_spec(self) -> lit_types.Spec:
        return {"text": lit_types.TokenSalience(autorun=True, signed=True),
                OUTPUT_FIELD: lit_types.TokenSalience(autorun=True, signed=True)}

    def run(self, inputs: list[JsonDict], model: lit_model.Model, dataset: lit_dataset.Dataset,
            model_outputs: list[JsonDict] | None = None,
            config: JsonDict | None = None) -> list[JsonDict] | None:
        del dataset, model_outputs
        classifier = unwrap(model)
        if not isinstance(classifier, ClassifierModel):
            return None
        config = config or {}
        target = config.get(TARGET_INFO_KEY) or {}
        index = target.get("index")
        shares = config.get(VALUES_KEY) == SHARES
        results = []
        for ex in inputs:
            tokens, c, value, bias = classifier.explained(ex["text"], None if index is None else int(index))
            results.append({"text": dtypes.TokenSalience(tokens, (c / c.abs().sum().clamp_min(1e-30) if shares
                                                                  else c).cpu().numpy()),
                            OUTPUT_FIELD: output_line(float(c.sum()), value, bias)})
        return results


def output_line(tokens: float, value: float, bias: float) -> dtypes.TokenSalience:
    """``value = Σ tokens + bias`` and the token share (``Σ tokens / value``) as a line of
    LIT chips, shown under the tokens' (each chip's value is the term's own)."""
    share = "–" if value == 0 else f"{tokens / value:.0%}"
    words = [f"value {value:.4f}", f"= Σ tokens {tokens:.4f}", f"+ bias {bias:.4f}", f"(token share {share})"]
    return dtypes.TokenSalience(words, np.array([value, tokens, bias, 0.0]))


class LayerMapsSalience(lit_components.Interpreter):
    r"""Layer maps (captum_ffb, LayerNormDecomposition): how each token's vector after one
    layer, at one scope, is made of the input tokens, ``‖F_i(x_j)‖``; one row per token i
    (shares of the row by default). Pick the layer and the scope in the settings: the layers
    from the last, the scopes from the whole layer back to the attention block.

    Args:
        loaded (LoadedModel): the model whose layers and scopes are offered.
    """

    def __init__(self, loaded: LoadedModel):
        from captum_ffb.attr import LayerNormDecomposition

        self.loaded = loaded
        # LIT's settings open on each list's first entry: the default goes first
        self.layers = [str(k) for k in reversed(range(len(loaded.blocks)))]
        self.scopes = list(reversed(LayerNormDecomposition(loaded.model, [loaded.blocks[-1]]).scopes))

    def is_compatible(self, model: lit_model.Model, dataset: lit_dataset.Dataset) -> bool:
        del dataset
        inner = unwrap(model)
        return isinstance(inner, (ClassifierModel, GenerationModel)) and inner.loaded is self.loaded

    def config_spec(self) -> lit_types.Spec:
        return {
            LAYER_KEY: lit_types.CategoryLabel(vocab=self.layers, default=self.layers[0],
                                               required=False),
            SCOPE_KEY: lit_types.CategoryLabel(vocab=self.scopes, default=self.scopes[0],
                                               required=False),
            NORMALIZE_KEY: lit_types.Boolean(default=True, required=False),
        }

    def meta_spec(self) -> lit_types.Spec:
        return {"map": lit_types.TokenSalience(autorun=False, signed=False)}

    @one_at_a_time
    def rows(self, text: str, layer: int, scope: str, shares: bool) -> dict[str, dtypes.TokenSalience]:
        """Row ``i`` of the map of ``text`` after ``layer`` at ``scope``, keyed ``"i: token"``."""
        maps = text_maps(text, self.loaded, layers=[layer], scopes=[scope])
        matrix = maps.maps[layer][scope]
        if shares:
            matrix = matrix / matrix.sum(-1, keepdim=True).clamp_min(1e-30)
        tokens = display_tokens(maps.tokens, self.loaded.tokenizer)
        values = matrix.detach().cpu().numpy()
        return {f"{i}: {token}": dtypes.TokenSalience(tokens, values[i])
                for i, token in enumerate(tokens)}

    def run(self, inputs: list[JsonDict], model: lit_model.Model, dataset: lit_dataset.Dataset,
            model_outputs: list[JsonDict] | None = None,
            config: JsonDict | None = None) -> list[JsonDict] | None:
        del model, dataset, model_outputs
        defaults = {k: v.default for k, v in self.config_spec().items()}
        config = {**defaults, **(config or {})}
        layer, scope = int(config[LAYER_KEY]), str(config[SCOPE_KEY])
        shares = config[NORMALIZE_KEY] not in (False, "false", "False", 0)
        return [self.rows(_text_of(ex), layer, scope, shares) for ex in inputs]


# ---------------------------------------------------------------------------------------
# the application

_modules = layout.LitModuleName

CLASSIFIER_LAYOUT = layout.LitCanonicalLayout(
    left={"Examples": [_modules.DataTableModule], "Editor": [_modules.DatapointEditorModule],
          "Prediction": [_modules.ClassificationModule]},
    upper={"Salience": [_modules.SalienceMapModule]},
    layoutSettings=layout.LayoutSettings(leftWidth=35),
    description="captum_ffb: NormDecomposition and the layer maps next to LIT's salience methods.",
)

LANGUAGE_MODEL_LAYOUT = layout.LitCanonicalLayout(
    left={"Examples": [_modules.DataTableModule], "Editor": [_modules.DatapointEditorModule],
          "Layer maps": [_modules.SalienceMapModule]},
    upper={"Sequence salience": [_modules.SequenceSalienceModule]},
    layoutSettings=layout.LayoutSettings(leftWidth=40),
    description="captum_ffb: NormDecomposition next to LIT's gradients; the layer maps.",
)

LAYOUTS = {"captum_ffb": CLASSIFIER_LAYOUT, "captum_ffb_lm": LANGUAGE_MODEL_LAYOUT}


def build_app(loaded: LoadedModel, models: dict[str, lit_model.Model],
              datasets: dict[str, lit_dataset.Dataset]) -> OfflineFonts:
    """LIT's application with our interpreters next to its defaults, its page served without
    outside requests (see :func:`captum_ffb.integrations.lit.build_app`)."""
    import os

    import lit_nlp

    # the Salience Maps module lists the methods in this order: ours first, the maps last
    interpreters = {NORM_DECOMPOSITION: NormDecompositionSalience(),
                    **core.default_interpreters(models), LAYER_MAPS: LayerMapsSalience(loaded)}
    layout_name = "captum_ffb_lm" if loaded.task == "causal_lm" else "captum_ffb"
    client = os.path.join(os.path.dirname(lit_nlp.__file__), "client", "build", "default")
    return OfflineFonts(lit_app.LitApp(models, datasets, interpreters=interpreters,
                                       layouts={layout_name: LAYOUTS[layout_name]},
                                       default_layout=layout_name, client_root=client,
                                       page_title="captum_ffb in LIT"))
