r"""Read-outs: the scalar of a model's output that is explained.

A read-out knows two things: how to compute its value from the model's outputs
(:meth:`ReadOut.value`, ``(batch,)``; and, where it has classes, the logit of every class,
:meth:`ReadOut.class_logits`), and what the head part of the decomposition chain reads
(:meth:`ReadOut.head_target`: which rows of the output layer, with which coefficients, at
which position or pooling). :class:`~captum_ffb.attr.NormDecomposition` takes any read-out
as its ``target``; the evaluation tasks and ``explain`` are written in terms of them.

* :class:`NextToken`: a causal LM's logit of a token at a position (each row's last real
  position by default); the classes are the vocabulary.
* :class:`ClassLogit`: a sequence classifier's logit of a class.
* :class:`Contrast`: ``logit(positive) − logit(negative)``.
* :class:`Direction`: ``⟨vector, pool(h)⟩ + bias`` on a base model's last hidden state.
* :class:`PromptContrast`: ``d = logit(positive) − logit(negative)`` at a prompt's last
  position, read as two classes ``(−d, d)`` (class 1 = positive).
* :class:`BinaryDirection`: a :class:`Direction` read as two classes ``(−z, z)``, e.g. the
  bundled MiniLM sentiment head (:func:`minilm_sentiment_readout`).

:func:`default_readout` says which read-out a model gets when nobody says; the bundled head's
run-time part (:class:`MiniLMSentimentHead`, :func:`load_minilm_sentiment_head`) lives here
too, its training in ``captum_ffb.evaluation.minilm_head``.

``NextToken(None)`` and ``ClassLogit(None)`` stand for the predicted token or class:
:meth:`ReadOut.resolve` turns them into the one the outputs predict.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional

from captum_ffb.architectures.heads import task_of
from captum_ffb.engine.head import (  # the values read, importable from here as before
    HeadTarget,
    ResolvedHead,
    output_hidden_states,
    output_logits,
)
from captum_ffb.engine.passes import run_model
from captum_ffb.engine.positions import real_positions
from captum_ffb.engine.requests import check_index

#: The poolings a :class:`Direction` takes by name (or a position).
POOLINGS = ("mean", "cls", "first", "last")


def mean_pool(hidden_states: Tensor, attention_mask: Tensor) -> Tensor:
    r"""Mean of ``hidden_states`` over the positions where ``attention_mask`` is 1.

    Args:
        hidden_states (Tensor): ``(batch, n, d)``.
        attention_mask (Tensor): ``(batch, n)``, 1 on real tokens and 0 on padding.

    Returns:
        Tensor of shape ``(batch, d)``.
    """
    if hidden_states.shape[:2] != attention_mask.shape:
        raise ValueError(
            f"hidden states {tuple(hidden_states.shape)} do not match the attention mask "
            f"{tuple(attention_mask.shape)}"
        )
    mask = attention_mask.to(hidden_states.dtype).unsqueeze(-1)
    return (hidden_states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def per_row(value: int | Tensor, batch: int, device: torch.device, what: str) -> Tensor:
    """``value`` as one integer per row ``(batch,)`` (a single one is repeated)."""
    tensor = torch.as_tensor(value, device=device)
    if tensor.is_floating_point():
        raise TypeError(f"{what} must be an integer index (or one per row), got floats")
    if tensor.dim() == 0:
        return tensor.expand(batch).long()
    tensor = tensor.reshape(-1)
    if tensor.numel() != batch:
        raise ValueError(f"{what} has {tensor.numel()} entries for a batch of {batch}")
    return tensor.long()


def checked_positions(position: int | Tensor, token_mask: Tensor) -> Tensor:
    """``position`` as one real position per row ``(batch,)``; negative counts from the end."""
    batch, n = token_mask.shape
    positions = per_row(position, batch, token_mask.device, "target_position")
    positions = torch.where(positions < 0, positions + n, positions)
    if int(positions.min()) < 0 or int(positions.max()) >= n:
        raise ValueError(f"target_position is outside the {n} positions")
    if not bool(token_mask.gather(1, positions[:, None]).all()):
        raise ValueError("target_position points at a padded position")
    return positions


def _rows(values: Tensor, positions: Tensor) -> Tensor:
    """``values[b, positions[b]]`` of a ``(B, n, …)`` tensor."""
    return values[torch.arange(values.shape[0], device=values.device), positions.to(values.device)]


def _logits_at(outputs: Any, attention_mask: Tensor, position: int | Tensor | None) -> Tensor:
    """``(B, units)`` logits at the read position: a classifier's own logits, or a causal LM's
    at ``position`` (each row's last real position by default; the last one kept when the
    model was asked for the last position only)."""
    logits = output_logits(outputs)
    if logits.dim() == 2:
        return logits
    mask = attention_mask.to(logits.device) != 0
    if position is not None:
        return _rows(logits, checked_positions(position, mask))
    if logits.shape[1] != mask.shape[1]:  # logits_to_keep=1 on a left-padded batch
        return logits[:, -1]
    return _rows(logits, real_positions(mask, "last"))


def _unit_target(head: ResolvedHead, indices: Tensor, coefficients: Tensor, token_mask: Tensor,
                 dtype: torch.dtype, position: int | Tensor | None) -> HeadTarget:
    """The head target ``Σ_k coefficients_k · logit(indices_k)`` of a model with a head."""
    if head.task == "base":
        raise ValueError("a base model has no logits: give a Direction target")
    units = head.output.weight.shape[0]
    if int(indices.min()) < 0 or int(indices.max()) >= units:
        bad = int(indices.min()) if int(indices.min()) < 0 else int(indices.max())
        raise ValueError(f"target {bad} is out of range (0 … {units - 1})")
    weight = head.output.weight.detach().to(dtype)[indices]  # (B, K, w)
    bias = head.output.bias
    biases = bias.detach().to(dtype)[indices] if bias is not None else torch.zeros_like(coefficients).to(dtype)
    if head.logits_bias is not None:  # added to every row of logits after the output layer
        biases = biases + head.logits_bias.detach().to(dtype).reshape(-1)[indices]
    if position is not None and head.task not in ("causal_lm", "seq2seq_lm"):
        raise ValueError("target_position is for language models; a classifier reads its own position")
    if position is not None:
        positions = checked_positions(position, token_mask)
    else:
        positions = real_positions(token_mask, head.spec.position)
    return HeadTarget(weight, biases.to(dtype), coefficients.to(dtype), indices, positions)


class ReadOut:
    """What is explained: one scalar per row of the model's outputs."""

    #: the query row the attention baselines read: ``"last"``, ``"first"`` or ``"mean"``
    query_row: str = "last"

    @property
    def needs_outputs(self) -> bool:
        """Whether :meth:`resolve` needs the model's output before the read-out is explained
        (a prediction to name, a log-probability's normaliser to fix)."""
        return False

    def value(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        """The read-out's value ``(B,)`` in the model's ``outputs``."""
        raise NotImplementedError

    def head_target(self, head: ResolvedHead, token_mask: Tensor, dtype: torch.dtype,
                    position: int | Tensor | None = None) -> HeadTarget:
        """What the head's rules read: output rows, coefficients, position or pooling."""
        raise NotImplementedError

    def resolve(self, outputs: Any, attention_mask: Tensor) -> ReadOut:
        """This read-out with a predicted unit made concrete (itself when it names one)."""
        return self

    def class_logits(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        """``(B, C)`` the logit of every class."""
        raise TypeError(f"{type(self).__name__} has no classes")

    def class_probabilities(self, logits: Tensor) -> Tensor:
        """``(B, C)`` from :meth:`class_logits`: a softmax."""
        return logits.softmax(-1)

    def for_class(self, classes: Tensor) -> tuple[ReadOut, Tensor]:
        """The read-out of each row's class logit ``classes`` ``(B,)``, and a ``(B,)`` sign
        to multiply its contributions by."""
        raise TypeError(f"{type(self).__name__} has no classes")


@dataclass(frozen=True)
class NextToken(ReadOut):
    r"""A causal LM's logit of ``token`` at ``position``.

    Args:
        token (int or Tensor, optional): a token id, or one per row ``(batch,)``; ``None``:
                    the predicted one (see :meth:`resolve`).
        position (int or Tensor, optional): the position read; each row's last real
                    position by default (negative counts from the end).
    """

    token: int | Tensor | None = None
    position: int | Tensor | None = None

    def value(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        logits = self.class_logits(outputs, attention_mask)
        return logits.gather(1, per_row(self.token, logits.shape[0], logits.device, "token")[:, None])[:, 0]

    def class_logits(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        return _logits_at(outputs, attention_mask, self.position)

    def resolve(self, outputs: Any, attention_mask: Tensor) -> NextToken:
        if self.token is not None:
            return self
        return NextToken(self.class_logits(outputs, attention_mask).argmax(-1), self.position)

    def head_target(self, head, token_mask, dtype, position=None):
        if head.task == "sequence_classification":
            raise ValueError("NextToken reads a causal LM; give a ClassLogit for a classifier")
        if self.position is not None and position is not None:
            raise ValueError("give the position once: in NextToken or as target_position")
        batch = token_mask.shape[0]
        indices = per_row(self.token, batch, token_mask.device, "target")[:, None]
        ones = torch.ones(batch, 1, device=token_mask.device)
        return _unit_target(head, indices, ones, token_mask, dtype,
                            self.position if position is None else position)

    def for_class(self, classes: Tensor) -> tuple[ReadOut, Tensor]:
        return NextToken(classes, self.position), torch.ones(classes.shape[0], device=classes.device)


@dataclass(frozen=True)
class ClassLogit(ReadOut):
    r"""A sequence classifier's logit of class ``index`` (or a causal LM's of a token, at
    each row's last real position).

    Args:
        index (int or Tensor, optional): a class, or one per row ``(batch,)``; ``None``:
                    the predicted one (see :meth:`resolve`).
    """

    index: int | Tensor | None = None
    query_row = "first"

    def value(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        logits = self.class_logits(outputs, attention_mask)
        return logits.gather(1, per_row(self.index, logits.shape[0], logits.device, "class")[:, None])[:, 0]

    def class_logits(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        return _logits_at(outputs, attention_mask, None)

    def resolve(self, outputs: Any, attention_mask: Tensor) -> ClassLogit:
        if self.index is not None:
            return self
        return ClassLogit(self.class_logits(outputs, attention_mask).argmax(-1))

    def head_target(self, head, token_mask, dtype, position=None):
        batch = token_mask.shape[0]
        indices = per_row(self.index, batch, token_mask.device, "target")[:, None]
        ones = torch.ones(batch, 1, device=token_mask.device)
        return _unit_target(head, indices, ones, token_mask, dtype, position)

    def for_class(self, classes: Tensor) -> tuple[ReadOut, Tensor]:
        return ClassLogit(classes), torch.ones(classes.shape[0], device=classes.device)


@dataclass(frozen=True)
class Contrast(ReadOut):
    r"""A contrastive target ``logit(positive) − logit(negative)`` (a token or a class each).

    Args:
        positive (int or Tensor): the unit whose logit counts positively (one per row as a
                    ``(batch,)`` tensor, or one for all rows).
        negative (int or Tensor): the unit whose logit is subtracted.

    Examples::

        >>> pos, neg = tok.convert_tokens_to_ids(["Ġpositive", "Ġnegative"])
        >>> attributions = NormDecomposition(model).attribute(ids, target=Contrast(pos, neg))
    """

    positive: int | Tensor
    negative: int | Tensor

    def value(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        logits = _logits_at(outputs, attention_mask, None)
        batch, device = logits.shape[0], logits.device
        positive = per_row(self.positive, batch, device, "the positive target")
        negative = per_row(self.negative, batch, device, "the negative target")
        return logits.gather(1, positive[:, None])[:, 0] - logits.gather(1, negative[:, None])[:, 0]

    def head_target(self, head, token_mask, dtype, position=None):
        batch, device = token_mask.shape[0], token_mask.device
        indices = torch.stack([per_row(self.positive, batch, device, "the positive target"),
                               per_row(self.negative, batch, device, "the negative target")], 1)
        same = (indices[:, 0] == indices[:, 1]).nonzero()
        if len(same):
            raise ValueError(f"Contrast: the positive and the negative target are the same unit "
                             f"({int(indices[int(same[0]), 0])}): logit(a) − logit(a) is 0 for every input")
        coefficients = torch.tensor([1.0, -1.0], device=device).expand(batch, 2)
        return _unit_target(head, indices, coefficients, token_mask, dtype, position)


@dataclass(frozen=True)
class Direction(ReadOut):
    r"""A linear read-out of a base model: ``⟨vector, pool(h)⟩ + bias`` (a probe, a sentiment
    head on sentence embeddings).

    Args:
        vector (Tensor): ``(d,)``, or ``(batch, d)`` for one per row.
        pooling (str or int): ``"mean"`` over real tokens, ``"cls"``/``"first"`` (the first
                    real token), ``"last"`` (the last real token), or a position.
        bias (float or Tensor): added to the read-out (the bias player gets it).

    Examples::

        >>> probe = Direction(weight, pooling="mean", bias=0.1)     # e.g. a sentiment head
        >>> NormDecomposition(base_model).attribute(ids, target=probe,
        ...                                         forward_kwargs={"attention_mask": mask})
    """

    vector: Tensor
    pooling: str | int = "mean"
    bias: float | Tensor = 0.0

    @property
    def query_row(self) -> str:  # type: ignore[override]
        return {"mean": "mean", "cls": "first", "first": "first"}.get(self.pooling, "last")

    def pooled(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """The pooled hidden state ``(B, d)``."""
        mask = attention_mask.to(hidden.device) != 0
        if self.pooling == "mean":
            return mean_pool(hidden, attention_mask.to(hidden.device))
        if self.pooling in ("cls", "first", "last"):
            return _rows(hidden, real_positions(mask, "last" if self.pooling == "last" else "first"))
        if isinstance(self.pooling, int):
            return _rows(hidden, checked_positions(self.pooling, mask))
        raise ValueError(f"pooling must be one of {POOLINGS} or a position, got {self.pooling!r}")

    def value(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        hidden = output_hidden_states(outputs)
        vector = torch.as_tensor(self.vector, device=hidden.device)
        pooled = self.pooled(hidden, attention_mask).to(vector.dtype)
        bias = torch.as_tensor(self.bias, device=hidden.device, dtype=vector.dtype)
        if vector.dim() == 1:  # as nn.Linear computes it
            return functional.linear(pooled, vector[None], bias.reshape(1)).squeeze(-1)
        return (pooled * vector).sum(-1) + bias

    def head_target(self, head, token_mask, dtype, position=None):
        if head.task != "base":
            raise ValueError("a Direction reads a base model's hidden states; this model has a "
                             "head: give a class, a token id or a Contrast")
        batch, device = token_mask.shape[0], token_mask.device
        vector = torch.as_tensor(self.vector, device=device).to(dtype)
        vector = vector.expand(batch, -1) if vector.dim() == 1 else vector
        bias = torch.as_tensor(self.bias, device=device, dtype=dtype).expand(batch)
        ones = torch.ones(batch, 1, device=device)
        pooling, positions = None, None
        if self.pooling == "mean":
            weights = token_mask.to(dtype)
            pooling = weights / weights.sum(dim=1, keepdim=True)
        elif self.pooling in ("cls", "first"):
            positions = real_positions(token_mask, "first")
        elif self.pooling == "last":
            positions = real_positions(token_mask, "last")
        elif isinstance(self.pooling, int):
            positions = checked_positions(self.pooling, token_mask)
        else:
            raise ValueError(f"pooling must be one of {POOLINGS} or a position, got {self.pooling!r}")
        return HeadTarget(vector[:, None], bias[:, None], ones, None, positions, pooling)


#: the Gauss–Legendre node counts :func:`~captum_ffb.explained.readouts.normaliser_weights` tries, in turn, until its
#: integral reproduces ``logsumexp(z) − log V`` to ``NORMALISER_TOLERANCE``
NORMALISER_NODES = (32, 64, 128, 256, 512, 1024)
#: how far ``Σ_v w_v z_v`` may miss ``logsumexp(z) − log V`` (relative, at least absolute)
NORMALISER_TOLERANCE = 1e-9


def normaliser_weights(logits: Tensor) -> Tensor:
    r"""``w = ∫₀¹ softmax(s · z) ds`` for each row of ``logits`` ``(B, V)``, in float64: the
    Integrated Gradients of the log-normaliser ``logsumexp`` from the uniform distribution's
    logits (``z = 0``), so that ``Σ_v w_v z_v = logsumexp(z) − log V`` (to
    ``NORMALISER_TOLERANCE``, by Gauss–Legendre quadrature with more nodes until it holds;
    a ValueError where even the most nodes miss it)."""
    import numpy as np

    z = logits.detach().double()
    goal = torch.logsumexp(z, -1) - torch.log(torch.tensor(float(z.shape[-1]), dtype=z.dtype, device=z.device))
    for count in NORMALISER_NODES:
        nodes, weights = np.polynomial.legendre.leggauss(count)
        w = torch.zeros_like(z)
        for x, q in zip(nodes, weights):
            w += float(q) / 2 * torch.softmax(float(x + 1) / 2 * z, -1)
        miss = ((w * z).sum(-1) - goal).abs()
        if bool((miss <= NORMALISER_TOLERANCE * goal.abs().clamp(min=1.0)).all()):
            return w
    raise ValueError(f"the log-normaliser's integral did not converge with {NORMALISER_NODES[-1]} nodes "
                     f"(missed by {float(miss.max()):.2e})")


@dataclass(frozen=True)
class TokenLogProbability(ReadOut):
    r"""A causal LM's log-probability of ``token`` at ``position``, ``log softmax(z)[token]``,
    as an exact linear read-out: ``z_token − Σ_v w_v z_v − log V`` with
    ``w = ∫₀¹ softmax(s·z) ds`` (:func:`~captum_ffb.explained.readouts.normaliser_weights`, fixed by the model's own logits:
    Integrated Gradients of ``logsumexp`` from the uniform distribution's logits). The
    players share ``z_token − Σ_v w_v z_v``; ``−log V``, the log-probability at the uniform
    logits (the reference), is the bias player's (the head target's ``offset``).

    Args:
        token (int): the token's id.
        position (int): the position whose logits predict it.
        weights (Tensor, optional): ``(B, V)`` ``w``; set by :meth:`resolve` from the logits.
    """

    token: int
    position: int
    weights: Tensor | None = None

    @property
    def needs_outputs(self) -> bool:
        """Whether the model's output must fix the normaliser's weights first."""
        return self.weights is None

    def class_logits(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        return _logits_at(outputs, attention_mask, self.position)

    def resolve(self, outputs: Any, attention_mask: Tensor) -> TokenLogProbability:
        if self.weights is not None:
            return self
        return replace(self, weights=normaliser_weights(self.class_logits(outputs, attention_mask)))

    def log_probability(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        """``(B,)`` the log-probability itself, from the model's logits."""
        return torch.log_softmax(self.class_logits(outputs, attention_mask).double(), -1)[:, self.token]

    def value(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        logits = self.class_logits(outputs, attention_mask)
        w = self._weights().to(device=logits.device, dtype=logits.dtype)
        return logits[:, self.token] - (w * logits).sum(-1) - math.log(logits.shape[-1])

    def _weights(self) -> Tensor:
        if self.weights is None:
            raise ValueError("TokenLogProbability needs its normaliser's weights: resolve it on the model's output")
        return self.weights

    def head_target(self, head, token_mask, dtype, position=None):
        if head.task not in ("causal_lm", "seq2seq_lm"):
            raise ValueError("a log-probability reads a language model's next-token logits")
        if head.softcap is not None:
            raise ValueError("a log-probability target needs logits without soft-capping (this model caps its "
                             "logits with tanh, which does not pass through the normaliser's mixture)")
        batch, device = token_mask.shape[0], token_mask.device
        units = head.output.weight.shape[0]
        w = self._weights().to(device=device, dtype=dtype).expand(batch, -1)
        if w.shape[-1] != units:
            raise ValueError(f"the normaliser's weights cover {w.shape[-1]} units; the model has {units}")
        one_hot = torch.zeros_like(w)
        one_hot[:, self.token] = 1.0
        mix = torch.stack([one_hot, w], 1)  # (B, 2, V)
        weight = head.output.weight.detach().to(dtype)
        rows = torch.einsum("bkv,vd->bkd", mix, weight)
        bias = head.output.bias
        full = torch.zeros(units, device=device, dtype=dtype) if bias is None else bias.detach().to(dtype)
        if head.logits_bias is not None:
            full = full + head.logits_bias.detach().to(dtype).reshape(-1)
        biases = torch.einsum("bkv,v->bk", mix, full)
        coefficients = torch.tensor([1.0, -1.0], device=device, dtype=dtype).expand(batch, 2)
        indices = torch.full((batch, 1), int(self.token), device=device, dtype=torch.long)
        positions = checked_positions(self.position, token_mask)
        return HeadTarget(rows, biases, coefficients, indices, positions, mix=mix, offset=-math.log(units))


@dataclass(frozen=True)
class AnswerLogProbability(ReadOut):
    r"""An answer's log-probability after the prompt, teacher-forced: ``Σ_t log p(a_t | prompt,
    a_<t)``, each term a :class:`~captum_ffb.explained.readouts.TokenLogProbability` read where the model predicts ``a_t``.
    A causal LM's target text of several tokens means this; give it to explain a one-token
    answer's log-probability (not its logit).

    Args:
        tokens (str or list[int]): the answer, as text (read with the tokenizer) or token ids.
        positions (tuple[int, ...], optional): where each token is predicted (set when the
                    answer is fed to the model after its prompt).
        weights (Tensor, optional): ``(B, T, V)`` each term's normaliser weights
                    (:func:`~captum_ffb.explained.readouts.normaliser_weights`); set by :meth:`resolve` from the logits.
    """

    tokens: str | tuple[int, ...] | list[int] | Tensor
    positions: tuple[int, ...] | None = None
    weights: Tensor | None = None

    @property
    def needs_outputs(self) -> bool:
        """Whether the model's output must fix the normaliser's weights first."""
        return self.weights is None

    def _read(self) -> tuple[list[int], list[int]]:
        if self.positions is None or isinstance(self.tokens, str):
            raise ValueError("AnswerLogProbability is read after its tokens are fed to the model (give it as "
                             "attribute's or attribute_graph's target)")
        tokens = [int(t) for t in self.tokens]
        if len(tokens) != len(self.positions):
            raise ValueError(f"the answer has {len(tokens)} tokens and {len(self.positions)} positions")
        return tokens, [int(p) for p in self.positions]

    def _logits(self, outputs: Any) -> Tensor:
        """``(B, T, V)`` the logits where each token is predicted."""
        logits = output_logits(outputs)
        _, positions = self._read()
        return logits[:, torch.tensor(positions, device=logits.device)]

    def resolve(self, outputs: Any, attention_mask: Tensor) -> AnswerLogProbability:
        if self.weights is not None:
            return self
        logits = self._logits(outputs)
        weights = normaliser_weights(logits.reshape(-1, logits.shape[-1])).reshape(logits.shape)
        return replace(self, weights=weights)

    def log_probability(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        """``(B,)`` the answer's log-probability, from the model's logits."""
        tokens, _ = self._read()
        logits = torch.log_softmax(self._logits(outputs).double(), -1)
        index = torch.tensor(tokens, device=logits.device)
        return logits[:, torch.arange(len(tokens), device=logits.device), index].sum(-1)

    def value(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        tokens, _ = self._read()
        if self.weights is None:
            raise ValueError("AnswerLogProbability needs its normaliser's weights: resolve it on the model's output")
        logits = self._logits(outputs)
        w = self.weights.to(device=logits.device, dtype=logits.dtype)
        index = torch.tensor(tokens, device=logits.device)
        chosen = logits[:, torch.arange(len(tokens), device=logits.device), index]
        return (chosen - (w * logits).sum(-1) - math.log(logits.shape[-1])).sum(-1)

    def head_target(self, head, token_mask, dtype, position=None):
        tokens, positions = self._read()
        if position is not None:
            raise ValueError("an answer is read where each of its tokens is predicted: leave target_position out")
        if self.weights is None:
            raise ValueError("AnswerLogProbability needs its normaliser's weights: resolve it on the model's output")
        batch, device = token_mask.shape[0], token_mask.device
        terms = [TokenLogProbability(token, where, self.weights[:, t]).head_target(head, token_mask, dtype)
                 for t, (token, where) in enumerate(zip(tokens, positions))]
        return HeadTarget(torch.cat([t.weights for t in terms], 1), torch.cat([t.biases for t in terms], 1),
                          torch.cat([t.coefficients for t in terms], 1),
                          torch.tensor([tokens], device=device).expand(batch, -1),
                          torch.stack([t.positions for t in terms for _ in (0, 1)], 1),
                          mix=torch.cat([t.mix for t in terms], 1), offset=sum(t.offset for t in terms))


class _TwoClasses:
    """A score ``d`` read as two classes: logits ``(−d, d)`` (class 1 = positive) and
    probabilities ``(1 − σ(d), σ(d))``."""

    def class_logits(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        d = self.value(outputs, attention_mask)
        return torch.stack([-d, d], dim=-1)

    def class_probabilities(self, logits: Tensor) -> Tensor:
        p = torch.sigmoid(logits[:, 1])
        return torch.stack([1 - p, p], dim=-1)


@dataclass(frozen=True)
class PromptContrast(_TwoClasses, Contrast):
    r"""A causal LM's verdict on a prompt: ``d = logit(positive) − logit(negative)`` at the
    prompt's last position, as two classes ``(−d, d)`` (class 1 = positive).

    Args:
        positive (int): the positive label's token id.
        negative (int): the negative label's token id.
    """

    def for_class(self, classes: Tensor) -> tuple[ReadOut, Tensor]:
        positive = torch.where(classes == 1, self.positive, self.negative)
        negative = torch.where(classes == 1, self.negative, self.positive)
        return Contrast(positive, negative), torch.ones(classes.shape[0], device=classes.device)


@dataclass(frozen=True)
class BinaryDirection(_TwoClasses, Direction):
    r"""A :class:`Direction` whose value ``z`` is the positive class's logit of a binary
    classifier on a base model: two classes ``(−z, z)`` (e.g. a logistic-regression head)."""

    def for_class(self, classes: Tensor) -> tuple[ReadOut, Tensor]:
        return self, torch.where(classes == 1, 1.0, -1.0)


@dataclass(frozen=True)
class TopLogits(ReadOut):
    r"""A causal LM's most probable next tokens at once: ``Σ_k p_k · logit_k`` over the fewest
    tokens whose probabilities reach ``desired_logit_prob`` (at most ``max_n_logits``), each
    logit weighted by its probability, as circuit-tracer chooses its logit nodes
    (``max_n_logits``, ``desired_logit_prob``). A graph of it has a ``logit`` node per token,
    each receiving the direct edges of its own logit, all summed by the output node.

    Args:
        max_n_logits (int): at most this many tokens (default 10).
        desired_logit_prob (float): the probability mass to reach, in (0, 1] (default 0.95).
        position (int, optional): the position read (the last real one by default).
        tokens (Tensor, optional): ``(batch, K)`` the tokens, chosen by :meth:`resolve`.
        weights (Tensor, optional): ``(batch, K)`` their probabilities (0 where a row needs
                    fewer tokens than another).

    Examples::

        >>> graph = NormDecomposition(model, tokenizer=tok).attribute_graph(ids, TopLogits(5, 0.8))
    """

    max_n_logits: int = 10
    desired_logit_prob: float = 0.95
    position: int | Tensor | None = None
    tokens: Tensor | None = None
    weights: Tensor | None = None

    def __post_init__(self) -> None:
        k, p = self.max_n_logits, self.desired_logit_prob
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 1000:
            raise ValueError(f"max_n_logits must be a number of tokens from 1 to 1000, got {k!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"desired_logit_prob must be a probability in (0, 1], got {p!r}")

    @property
    def needs_outputs(self) -> bool:
        return self.tokens is None

    def class_logits(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        return _logits_at(outputs, attention_mask, self.position)

    def resolve(self, outputs: Any, attention_mask: Tensor) -> TopLogits:
        if self.tokens is not None:
            return self
        probabilities = self.class_logits(outputs, attention_mask).detach().float().softmax(-1)
        top = probabilities.topk(min(self.max_n_logits, probabilities.shape[-1]), dim=-1)
        before = top.values.cumsum(-1) - top.values  # the mass of the tokens before each
        needed = before < self.desired_logit_prob * (1 - 1e-6)
        count = int(needed.sum(-1).max())
        weights = torch.where(needed, top.values, torch.zeros_like(top.values))[:, :count]
        return replace(self, tokens=top.indices[:, :count], weights=weights)

    def value(self, outputs: Any, attention_mask: Tensor) -> Tensor:
        chosen = self.resolve(outputs, attention_mask)
        logits = self.class_logits(outputs, attention_mask)
        return (logits.gather(1, chosen.tokens.to(logits.device)) * chosen.weights.to(logits)).sum(-1)

    def head_target(self, head, token_mask, dtype, position=None):
        if head.task != "causal_lm":
            raise ValueError("TopLogits reads a causal LM's next-token logits")
        if self.tokens is None:
            raise ValueError("TopLogits chooses its tokens from the model's output: resolve it first")
        if self.position is not None and position is not None:
            raise ValueError("give the position once: in TopLogits or as target_position")
        return _unit_target(head, self.tokens.to(token_mask.device), self.weights.to(token_mask.device), token_mask,
                            dtype, self.position if position is None else position)


def with_token_ids(target: Any, token_id: Any) -> Any:
    """``target`` with every text in it (the target itself, a :class:`Contrast`'s or a
    :class:`NextToken`'s token) replaced by ``token_id(text)``."""
    if isinstance(target, str):
        return token_id(target)
    if isinstance(target, Contrast) and (isinstance(target.positive, str) or isinstance(target.negative, str)):
        return replace(target, positive=with_token_ids(target.positive, token_id),
                       negative=with_token_ids(target.negative, token_id))
    if isinstance(target, NextToken) and isinstance(target.token, str):
        return replace(target, token=token_id(target.token))
    return target


def head_target_of(target: Any, head: ResolvedHead, token_mask: Tensor, dtype: torch.dtype,
                   position: int | Tensor | None = None, name: str = "the model") -> HeadTarget:
    """What the head reads for ``target`` (an index, one per row, or a read-out) of a model with
    ``head``: one-line errors for a read-out the model cannot give."""
    task = head.task
    check_index(target, "target")
    if isinstance(target, Direction) and task != "base":
        raise ValueError(f"a Direction reads a base model's hidden states; {name} has a head: "
                         "give a class, a token id or a Contrast")
    if task == "base" and not isinstance(target, Direction):
        raise ValueError(f"{name} is a base model: give a Direction target")
    return as_readout(target, task).head_target(head, token_mask, dtype, position)


def as_readout(target: int | Tensor | ReadOut, task: str) -> ReadOut:
    """A plain target as a read-out: an index (one, or one per row) is a class logit of a
    classifier and a token's logit of a causal LM."""
    if isinstance(target, ReadOut):
        return target
    if task == "base":
        raise ValueError("a base model has no logits: give a Direction target")
    return NextToken(target) if task in ("causal_lm", "seq2seq_lm") else ClassLogit(target)


# ---------------------------------------------------------------------------------------
# the bundled head, and the read-out a model gets by default

#: The bundled sentiment head of all-MiniLM-L6-v2 (trained by
#: ``captum_ffb.evaluation.minilm_head.train_head()``).
ARTEFACT = Path(__file__).resolve().parents[1] / "data" / "minilm_rt_sentiment.json"

POOLING = (
    "mean of the last hidden state over positions with attention_mask == 1 "
    "([CLS] and [SEP] included), no normalisation; logit = weight . pooled + bias"
)


class MiniLMSentimentHead(nn.Module):
    r"""Logistic-regression head on mean-pooled hidden states: ``forward`` gives the logit of
    the positive class.

    Args:
        weight (Tensor): ``(d,)``.
        bias (float): the intercept.
        info (dict, optional): how the head was made (the artefact's other fields).
    """

    def __init__(self, weight: Tensor, bias: float, info: dict[str, Any] | None = None):
        super().__init__()
        if weight.dim() != 1:
            raise ValueError(f"weight must be a vector; got shape {tuple(weight.shape)}")
        self.linear = nn.Linear(weight.shape[0], 1, dtype=weight.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(weight.unsqueeze(0))
            self.linear.bias.fill_(float(bias))
        self.info = dict(info or {})

    def direction(self) -> BinaryDirection:
        """The head as a read-out: a :class:`~captum_ffb.explained.readouts.Direction` with mean pooling and its
        bias, whose value is the positive class's logit (two classes ``(−z, z)``)."""
        return BinaryDirection(self.linear.weight[0].detach(), pooling="mean",
                               bias=float(self.linear.bias.detach()))

    def forward(self, hidden_states: Tensor, attention_mask: Tensor) -> Tensor:
        """The logit ``(batch,)`` from the last hidden state ``(batch, n, d)`` and the mask."""
        pooled = mean_pool(hidden_states, attention_mask).to(self.linear.weight.dtype)
        return self.linear(pooled).squeeze(-1)


def load_minilm_sentiment_head(
    path: str | Path | None = None, dtype: torch.dtype = torch.float32
) -> MiniLMSentimentHead:
    r"""The sentiment head saved by ``train_head()`` (the bundled one by default), in eval
    mode with frozen parameters.

    Args:
        path (str or Path, optional): a JSON artefact; :data:`ARTEFACT` by default.
        dtype (torch.dtype): the parameters' dtype.
    """
    source = Path(path) if path is not None else ARTEFACT
    data = json.loads(source.read_text(encoding="utf-8"))
    missing = {"weight", "bias"} - set(data)
    if missing:
        raise ValueError(f"{source} is not a head artefact: no {', '.join(sorted(missing))}")
    weight = torch.tensor(data["weight"], dtype=torch.float64).to(dtype)
    info = {k: v for k, v in data.items() if k not in ("weight", "bias")}
    head = MiniLMSentimentHead(weight, float(data["bias"]), info).eval()
    head.requires_grad_(False)
    return head


@lru_cache(maxsize=1)
def _bundled_head() -> MiniLMSentimentHead:
    return load_minilm_sentiment_head()


def minilm_sentiment_readout() -> BinaryDirection:
    """The bundled sentiment head as a read-out (see :meth:`MiniLMSentimentHead.direction`)."""
    return _bundled_head().direction()


#: The configuration of all-MiniLM-L6-v2, the encoder the bundled head was trained on.
MINILM_CONFIG = {"model_type": "bert", "hidden_size": 384, "num_hidden_layers": 6,
                 "num_attention_heads": 12, "intermediate_size": 1536, "vocab_size": 30522}


def fits_minilm_head(config: Any) -> bool:
    """Whether a base model with this configuration is one the bundled head reads: a BERT
    shaped as all-MiniLM-L6-v2 (:data:`MINILM_CONFIG`), the encoder it was trained on."""
    return all(getattr(config, key, None) == value for key, value in MINILM_CONFIG.items())


def sentiment_readout_for(model: nn.Module) -> BinaryDirection | None:
    """The bundled sentiment head's read-out when ``model`` is a base model it fits, else
    ``None``."""
    if task_of(model) != "base" or not fits_minilm_head(getattr(model, "config", None)):
        return None
    return minilm_sentiment_readout()


def minilm_sentiment_logit(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    head: MiniLMSentimentHead | None = None,
) -> Tensor:
    r"""The head's positive-class logit for a batch: MiniLM's last hidden state, mean-pooled
    over the real tokens, through the head.

    Args:
        model (nn.Module): all-MiniLM-L6-v2 (``AutoModel``, no task head).
        input_ids (Tensor): ``(batch, n)``.
        attention_mask (Tensor): ``(batch, n)``, 1 on real tokens.
        head (MiniLMSentimentHead, optional): the bundled head by default.

    Returns:
        Tensor of shape ``(batch,)``.
    """
    head = head if head is not None else _bundled_head()
    hidden = run_model(model, grad=torch.is_grad_enabled(), inputs_only=False, input_ids=input_ids,
                       attention_mask=attention_mask).last_hidden_state
    if hidden.shape[-1] != head.linear.in_features:
        raise ValueError(
            f"the model's hidden size {hidden.shape[-1]} is not the head's "
            f"{head.linear.in_features}"
        )
    pooled = mean_pool(hidden, attention_mask)
    return head.linear(pooled.to(head.linear.weight.dtype)).squeeze(-1).to(hidden.dtype)




def default_readout(model: nn.Module) -> ReadOut | None:
    r"""What a model's output is read as when no target is given: the predicted next token of
    a causal LM, the predicted class of a sequence classifier, the bundled sentiment head of
    a base model it fits (all-MiniLM-L6-v2, :func:`fits_minilm_head`), else ``None`` (a base
    model explains only its maps). Every caller asks here.

    Examples::

        >>> default_readout(gpt2_lm)            # NextToken(token=None, position=None)
        >>> default_readout(minilm).bias        # the bundled head's read-out
    """
    task = task_of(model)
    if task in ("causal_lm", "seq2seq_lm"):
        return NextToken()
    if task == "sequence_classification":
        return ClassLogit()
    return sentiment_readout_for(model)
