r"""The evaluation tasks: what is explained, how it is scored, which tokens may be perturbed.

A task turns texts into :class:`Example` rows (token ids, which positions are players, a gold
label when there is one) and defines, for a batch, the model's **class logits** ``(B, C)`` and
**class probabilities** ``(B, C)``. The explained output of every example is the logit of the
class the model predicts on the unperturbed input; the protocols follow that class.

* ``next-token`` (a causal LM): the classes are the vocabulary; the logits and probabilities
  are read at the last real position.
* ``sentiment`` on a causal LM: the snippet inside a prompt (:data:`~captum_ffb.evaluation.
  data.SENTIMENT_TEMPLATE`); with ``d = logit(positive) − logit(negative)`` at the prompt's last
  position, the class logits are ``(−d, d)`` (class 1 = positive) and the probabilities
  ``(1 − σ(d), σ(d))``. Only the snippet's tokens are players: the prompt is never perturbed.
* ``sentiment`` on a sequence classifier: its own logits and softmax.
* ``sentiment`` on a base model the bundled head fits (all-MiniLM-L6-v2: a BERT of its
  width) or with a read-out given: the head's logit ``z`` on the mean-pooled last hidden
  state; class logits ``(−z, z)``, probabilities ``(1 − σ(z), σ(z))``.

Each is a read-out (:mod:`captum_ffb.explained.readouts`: :class:`~captum_ffb.explained.readouts.NextToken`,
:class:`~captum_ffb.explained.readouts.PromptContrast`, :class:`~captum_ffb.explained.readouts.ClassLogit`,
:class:`~captum_ffb.explained.readouts.BinaryDirection`) that computes the class logits and names the
decomposition's target.

Special tokens ([CLS], [SEP], BOS) and padding are never players. Causal LMs are left-padded
(positions counted from the attention mask), the others right-padded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captum_ffb.engine.passes import run_model
from captum_ffb.engine.positions import pad_sequences, position_ids
from captum_ffb.explained.models import LoadedModel
from captum_ffb.explained.readouts import ClassLogit, NextToken, PromptContrast, ReadOut

#: The evaluation tasks :class:`EvaluationTask` knows.
EVALUATION_TASKS = ("next-token", "sentiment")
#: The kinds that explain a causal LM's next token (read at the last position); ``evidence``
#: is :class:`~captum_ffb.evaluation.evidence.EvidenceTask`'s, a contrast of two next tokens.
NEXT_TOKEN_KINDS = ("next-token", "evidence")


@dataclass(frozen=True)
class Example:
    """One input: ``ids`` (tokens), ``players`` (True where a token may be perturbed and is
    attributed), ``label`` (gold class or None) and ``index`` (its position in the data)."""

    ids: tuple[int, ...]
    players: tuple[bool, ...]
    label: int | None
    index: int


@dataclass
class Batch:
    """Padded examples: ``input_ids``, ``attention_mask`` and ``protected`` ``(B, n)``,
    ``labels`` ``(B,)`` (−1 where unknown), ``index`` ``(B,)``."""

    input_ids: Tensor
    attention_mask: Tensor
    protected: Tensor
    labels: Tensor
    index: Tensor


class EvaluationTask:
    r"""A model, what of it is explained (a read-out, :mod:`captum_ffb.explained.readouts`), and how
    texts become examples.

    Args:
        loaded (LoadedModel): the model and tokenizer.
        kind (str): ``"next-token"`` or ``"sentiment"`` (one of :attr:`kinds`: a subclass takes
                    its own, :class:`~captum_ffb.evaluation.evidence.EvidenceTask` ``"evidence"``).
        template (str, optional): a causal LM's sentiment prompt with ``{text}``.
        labels (tuple[str, str], optional): its ``(positive, negative)`` label tokens.
        readout (ReadOut, optional): a base model's read-out with classes (e.g. a
                    :class:`~captum_ffb.explained.readouts.BinaryDirection`); by default the bundled
                    sentiment head where the model fits it.
        keep_first (bool): the first position of every example is never a player (a
                    control for the attention sink of causal LMs).
    """

    #: The kinds this class takes (a subclass names its own).
    kinds: tuple[str, ...] = EVALUATION_TASKS

    def __init__(self, loaded: LoadedModel, kind: str, template: str | None = None,
                 labels: tuple[str, str] | None = None, readout: ReadOut | None = None,
                 keep_first: bool = False) -> None:
        from captum_ffb.attr import NormDecomposition
        from captum_ffb.evaluation.data import SENTIMENT_LABELS, SENTIMENT_TEMPLATE, label_token_ids
        from captum_ffb.explained.readouts import default_readout

        if kind not in self.kinds:
            raise ValueError(f"unknown task {kind!r}; choose from {', '.join(self.kinds)}")
        self.loaded, self.kind, self.keep_first = loaded, kind, keep_first
        self.model = loaded.model
        parameter = next(self.model.parameters(), None)
        #: the model's device: batches are made there
        self.device = parameter.device if parameter is not None else torch.device("cpu")
        self.tokenizer = loaded.tokenizer
        self.nd = NormDecomposition(self.model)
        self.causal = self.nd.task == "causal_lm"
        self.template = None
        if readout is not None and self.nd.task != "base":
            raise ValueError("a read-out is chosen for a base model; a model with a head "
                             "explains its next token or class")
        if kind in NEXT_TOKEN_KINDS:
            if not self.causal:
                raise ValueError(f"the {kind} task needs a causal LM (a *ForCausalLM model)")
            readout = NextToken()
        elif self.causal:
            self.template = template or SENTIMENT_TEMPLATE
            if "{text}" not in self.template:
                raise ValueError("the sentiment template needs a {text} slot")
            readout = PromptContrast(*label_token_ids(self.tokenizer, labels or SENTIMENT_LABELS))
        elif self.nd.task == "sequence_classification":
            readout = ClassLogit()
        elif readout is None:
            readout = default_readout(self.model)
            if readout is None:
                raise ValueError("sentiment on a base model needs the bundled all-MiniLM-L6-v2 "
                                 "(its sentiment head), a sequence classifier or a causal LM")
        #: what is explained: the logit of the class each example predicts, read by this
        self.readout: ReadOut = readout
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))
        self.padding_side = "left" if self.causal else "right"

    # -- examples ------------------------------------------------------------------------

    @property
    def replacement_id(self) -> int:
        """The id that replaces a token in the [MASK] protocol: ``[MASK]``, else ``unk``, else
        the padding id (a causal LM has no mask token)."""
        for name in ("mask_token_id", "unk_token_id"):
            value = getattr(self.tokenizer, name, None)
            if value is not None:
                return int(value)
        return self.pad_id

    def example(self, text: str, label: int | None, index: int) -> Example:
        """Tokenise one text into an :class:`Example`."""
        tok = self.tokenizer
        if self.template is not None:
            before, after = self.template.split("{text}", 1)
            if before.endswith(" "):
                before, text = before[:-1], " " + text
            pieces = [(before, False), (text, True), (after, False)]
            ids: list[int] = []
            players: list[bool] = []
            for k, (piece, is_player) in enumerate(pieces):
                if not piece:
                    continue
                part = tok(piece, add_special_tokens=k == 0)["input_ids"]
                special = set(tok.all_special_ids)
                ids += part
                players += [is_player and t not in special for t in part]
        else:
            encoded = tok(text, return_special_tokens_mask=True)
            ids = list(encoded["input_ids"])
            players = [not s for s in encoded["special_tokens_mask"]]
        if self.keep_first and players:
            players[0] = False
        return Example(tuple(int(i) for i in ids), tuple(players), label, index)

    def batch(self, examples: list[Example]) -> Batch:
        """Pad ``examples`` (left for causal LMs, right otherwise)."""
        ids, mask = pad_sequences([e.ids for e in examples], self.pad_id, self.padding_side)
        players, _ = pad_sequences([[int(p) for p in e.players] for e in examples], 0, self.padding_side)
        protected = players == 0
        labels = torch.tensor([-1 if e.label is None else e.label for e in examples])
        index = torch.tensor([e.index for e in examples])
        return Batch(*(t.to(self.device) for t in (ids, mask, protected, labels, index)))

    # -- scores --------------------------------------------------------------------------

    def forward(self, attention_mask: Tensor, input_ids: Tensor | None = None,
                inputs_embeds: Tensor | None = None) -> Any:
        """The model's outputs (position ids from the mask for causal LMs)."""
        kwargs: dict[str, Any] = {"attention_mask": attention_mask}
        if self.causal:
            kwargs["position_ids"] = position_ids(attention_mask)
            kwargs["logits_to_keep"] = 1  # left padding: the last position is the read-out
        if input_ids is not None:
            kwargs["input_ids"] = input_ids
        else:
            kwargs["inputs_embeds"] = inputs_embeds
        return run_model(self.model, grad=torch.is_grad_enabled(), inputs_only=False, **kwargs)

    def class_logits(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        """``(B, C)`` the logit of every class (see the module docstring)."""
        return self.readout.class_logits(outputs, attention_mask)

    def class_probabilities(self, logits: Tensor) -> Tensor:
        """``(B, C)`` from :meth:`class_logits`: a softmax; binary tasks ``(1 − σ, σ)``."""
        return self.readout.class_probabilities(logits)

    def scorer(self, kind: str):
        """A scorer ``(input_ids, attention_mask, zeroed) -> (B, C)`` for the metrics:
        ``"probabilities"`` or ``"logits"``; ``zeroed`` positions get a zero input embedding
        (:func:`~captum_ffb.evaluation.perturbation.embedding_scorer`)."""
        from captum_ffb.evaluation.perturbation import embedding_scorer

        def read(outputs: Any, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
            logits = self.class_logits(outputs, attention_mask)
            return self.class_probabilities(logits) if kind == "probabilities" else logits

        extra = {"logits_to_keep": 1} if self.causal else {}
        return embedding_scorer(self.model, read, positions_from_mask=self.causal, **extra)

    def target_score(self, inputs_embeds: Tensor, attention_mask: Tensor, target: Tensor) -> Tensor:
        """``(B,)`` the logit of class ``target`` per row, from input embeddings (for Captum)."""
        logits = self.class_logits(self.forward(attention_mask, inputs_embeds=inputs_embeds),
                                   attention_mask)
        return logits.gather(1, target.view(-1, 1)).squeeze(1)

    def decomposition_target(self, target: Tensor) -> tuple[ReadOut, Tensor]:
        """The ``NormDecomposition`` target for the logit of class ``target`` per row and
        a ``(B,)`` sign to multiply the contributions by."""
        return self.readout.for_class(target)

    def predict(self, batch: Batch) -> Tensor:
        """``(B,)`` the class each example's unperturbed input predicts."""
        with torch.no_grad():
            outputs = self.forward(batch.attention_mask, input_ids=batch.input_ids)
            return self.class_logits(outputs, batch.attention_mask).argmax(-1)
