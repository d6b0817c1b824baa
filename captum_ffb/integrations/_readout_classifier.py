"""A base model read through a two-class read-out, as the Hugging Face-style classifier that
ferret calls (its two modules, :mod:`captum_ffb.integrations.ferret` and the explainer, both
import it from here)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.explained.readouts import BinaryDirection


class ReadOutClassifier(nn.Module):
    r"""A base model read through a two-class read-out, as a Hugging Face sequence classifier.

    With ``z`` the read-out's value (the positive class's logit), the logits are
    ``(−z/2, z/2)``: their softmax is ``(1 − σ(z), σ(z))``, the read-out's own class
    probabilities (``class_probabilities()``), so
    ferret's metrics score the probabilities ``captum-ffb evaluate`` scores. The forward takes
    what ferret passes (``input_ids`` or ``inputs_embeds``, ``attention_mask``,
    ``token_type_ids``, ``output_hidden_states``) and returns ``.logits`` ``(batch, 2)``.

    Args:
        model (nn.Module): a base model (``AutoModel``, no task head).
        readout (BinaryDirection, optional): what is read; by default the bundled sentiment
                    head where the model fits it (all-MiniLM-L6-v2).
        labels (tuple[str, str]): the names of class 0 and class 1 (``config.id2label``).
    """

    def __init__(self, model: nn.Module, readout: BinaryDirection | None = None,
                 labels: tuple[str, str] = ("negative", "positive")) -> None:
        from captum_ffb.architectures.heads import task_of
        from captum_ffb.explained.readouts import default_readout

        super().__init__()
        if task_of(model) != "base":
            raise ValueError(f"{type(model).__name__} has a head of its own: give ferret the "
                             "model itself (a ReadOutClassifier reads a base model)")
        readout = readout if readout is not None else default_readout(model)
        if readout is None:
            raise ValueError("no read-out: give a BinaryDirection (the bundled sentiment head "
                             "fits only all-MiniLM-L6-v2)")
        if not isinstance(readout, BinaryDirection):
            raise TypeError(f"the read-out must be a BinaryDirection, got {type(readout).__name__}")
        self.model, self.readout = model, readout
        self.config = copy.deepcopy(model.config)
        self.config.id2label = dict(enumerate(labels))
        self.config.label2id = {label: k for k, label in enumerate(labels)}

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are."""
        return next(self.model.parameters()).device

    def get_input_embeddings(self) -> nn.Module:
        """The base model's token embedding."""
        return self.model.get_input_embeddings()

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                inputs_embeds: Tensor | None = None, token_type_ids: Tensor | None = None,
                output_hidden_states: bool = False, **kwargs: Any) -> Any:
        """The two-class logits ``(batch, 2)`` as ``.logits`` (and the hidden states asked for)."""
        from transformers.modeling_outputs import SequenceClassifierOutput

        given = input_ids if input_ids is not None else inputs_embeds
        if attention_mask is None:
            attention_mask = torch.ones(given.shape[:2], dtype=torch.long, device=given.device)
        if token_type_ids is not None:  # not every base model takes them
            kwargs["token_type_ids"] = token_type_ids
        outputs = self.model(input_ids=input_ids, inputs_embeds=inputs_embeds,
                             attention_mask=attention_mask,
                             output_hidden_states=output_hidden_states, **kwargs)
        half = self.readout.value(outputs, attention_mask) / 2
        return SequenceClassifierOutput(logits=torch.stack([-half, half], dim=-1),
                                        hidden_states=outputs.hidden_states)


def minilm_sentiment_classifier(loaded: Any = None) -> tuple[ReadOutClassifier, Any]:
    r"""The bundled all-MiniLM-L6-v2 with its bundled sentiment head
    (:func:`~captum_ffb.explained.readouts.minilm_sentiment_readout`) as a two-class
    classifier (class 1 = positive), and its tokenizer.

    Args:
        loaded (LoadedModel, optional): the model already loaded by
                    :func:`~captum_ffb.explained.models.load_model`; loaded here otherwise.
    """
    from captum_ffb.explained.models import load_model

    loaded = loaded if loaded is not None else load_model(show_progress=False)
    return ReadOutClassifier(loaded.model).eval(), loaded.tokenizer
