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
* ``sentiment`` on the bundled all-MiniLM-L6-v2: the bundled head's logit ``z`` on the
  mean-pooled last hidden state; class logits ``(−z, z)``, probabilities ``(1 − σ(z), σ(z))``.

Special tokens ([CLS], [SEP], BOS) and padding are never players. Causal LMs are left-padded
(positions counted from the attention mask), the others right-padded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captum_ffb.attr import Contrast, Direction
from captum_ffb.models import DEFAULT_MODEL, LoadedModel

#: The task names :func:`make_task` knows.
TASKS = ("next-token", "sentiment")


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
    r"""A model, what of it is explained, and how texts become examples.

    Args:
        loaded (LoadedModel): the model and tokenizer.
        kind (str): ``"next-token"`` or ``"sentiment"``.
        template (str, optional): a causal LM's sentiment prompt with ``{text}``.
        labels (tuple[str, str], optional): its ``(positive, negative)`` label tokens.
    """

    def __init__(self, loaded: LoadedModel, kind: str, template: str | None = None,
                 labels: tuple[str, str] | None = None) -> None:
        from captum_ffb.attr import NormDecomposition
        from captum_ffb.evaluation.data import SENTIMENT_LABELS, SENTIMENT_TEMPLATE, label_token_ids

        if kind not in TASKS:
            raise ValueError(f"unknown task {kind!r}; choose from {', '.join(TASKS)}")
        self.loaded, self.kind = loaded, kind
        self.model = loaded.model
        parameter = next(self.model.parameters(), None)
        #: the model's device: batches are made there
        self.device = parameter.device if parameter is not None else torch.device("cpu")
        self.tokenizer = loaded.tokenizer
        self.nd = NormDecomposition(self.model)
        self.head_kind = self.nd.task  # causal_lm, sequence_classification or base
        self.causal = self.head_kind == "causal_lm"
        self.template = self.label_ids = self.head = None
        if kind == "next-token":
            if not self.causal:
                raise ValueError("the next-token task needs a causal LM (a *ForCausalLM model)")
            self.mode = "next_token"
        elif self.causal:
            self.mode = "prompt"
            self.template = template or SENTIMENT_TEMPLATE
            if "{text}" not in self.template:
                raise ValueError("the sentiment template needs a {text} slot")
            self.label_ids = label_token_ids(self.tokenizer, labels or SENTIMENT_LABELS)
        elif self.head_kind == "sequence_classification":
            self.mode = "classifier"
        else:
            from captum_ffb.evaluation.minilm_head import load_minilm_sentiment_head

            head = load_minilm_sentiment_head()
            hidden = getattr(self.model.config, "hidden_size", None)
            if loaded.name != DEFAULT_MODEL and hidden != head.linear.in_features:
                raise ValueError("sentiment on a base model needs the bundled all-MiniLM-L6-v2 "
                                 "(its sentiment head), a sequence classifier or a causal LM")
            self.mode, self.head = "minilm_head", head.to(self.device)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))
        self.padding_side = "left" if self.causal else "right"
        #: the query row that reads the output, for the attention baselines
        self.readout = "last" if self.causal else ("mean" if self.mode == "minilm_head" else "first")

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
        if self.mode == "prompt":
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
        return Example(tuple(int(i) for i in ids), tuple(players), label, index)

    def batch(self, examples: list[Example]) -> Batch:
        """Pad ``examples`` (left for causal LMs, right otherwise)."""
        width = max(len(e.ids) for e in examples)
        ids = torch.full((len(examples), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(examples), width), dtype=torch.long)
        protected = torch.ones((len(examples), width), dtype=torch.bool)
        for row, e in enumerate(examples):
            n = len(e.ids)
            where = slice(width - n, width) if self.padding_side == "left" else slice(0, n)
            ids[row, where] = torch.tensor(e.ids)
            mask[row, where] = 1
            protected[row, where] = ~torch.tensor(e.players)
        labels = torch.tensor([-1 if e.label is None else e.label for e in examples])
        index = torch.tensor([e.index for e in examples])
        return Batch(*(t.to(self.device) for t in (ids, mask, protected, labels, index)))

    # -- scores --------------------------------------------------------------------------

    def forward(self, attention_mask: Tensor, input_ids: Tensor | None = None,
                inputs_embeds: Tensor | None = None) -> Any:
        """The model's outputs (position ids from the mask for causal LMs)."""
        kwargs: dict[str, Any] = {"attention_mask": attention_mask}
        if self.causal:
            kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            kwargs["logits_to_keep"] = 1  # left padding: the last position is the read-out
        if input_ids is not None:
            kwargs["input_ids"] = input_ids
        else:
            kwargs["inputs_embeds"] = inputs_embeds
        return self.model(**kwargs)

    def class_logits(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        """``(B, C)`` the logit of every class (see the module docstring)."""
        if self.mode == "next_token":
            return outputs.logits[:, -1]
        if self.mode == "prompt":
            last = outputs.logits[:, -1]
            d = last[:, self.label_ids[0]] - last[:, self.label_ids[1]]
            return torch.stack([-d, d], dim=-1)
        if self.mode == "classifier":
            return outputs.logits
        from captum_ffb.evaluation.minilm_head import mean_pool

        pooled = mean_pool(outputs.last_hidden_state, attention_mask)
        z = self.head.linear(pooled.to(self.head.linear.weight.dtype)).squeeze(-1)
        return torch.stack([-z, z], dim=-1)

    def class_probabilities(self, logits: Tensor) -> Tensor:
        """``(B, C)`` from :meth:`class_logits`: a softmax; binary tasks ``(1 − σ, σ)``."""
        if self.mode in ("prompt", "minilm_head"):
            p = torch.sigmoid(logits[:, 1])
            return torch.stack([1 - p, p], dim=-1)
        return logits.softmax(-1)

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

    def decomposition_target(self, target: Tensor) -> tuple[Any, Tensor]:
        """The :class:`NormDecomposition` target for the logit of class ``target`` per row and
        a ``(B,)`` sign to multiply the contributions by."""
        ones = torch.ones(target.shape[0], device=target.device)
        if self.mode in ("next_token", "classifier"):
            return target, ones
        if self.mode == "prompt":
            pos, neg = self.label_ids
            positive = torch.where(target == 1, pos, neg)
            negative = torch.where(target == 1, neg, pos)
            return Contrast(positive, negative), ones
        w, b = self.head.linear.weight[0].detach(), float(self.head.linear.bias[0])
        return Direction(w, pooling="mean", bias=b), torch.where(target == 1, 1.0, -1.0)

    def predict(self, batch: Batch) -> Tensor:
        """``(B,)`` the class each example's unperturbed input predicts."""
        with torch.no_grad():
            outputs = self.forward(batch.attention_mask, input_ids=batch.input_ids)
            return self.class_logits(outputs, batch.attention_mask).argmax(-1)
