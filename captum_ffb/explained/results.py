r"""One result type for explained outputs: :class:`ExplainedOutput`.

Whatever explains outputs — :meth:`~captum_ffb.attr.NormDecomposition.explain`,
``explain_target`` and ``explain_generation`` on every model shape, the LLM wrapper, the
command line, the app and LIT — hands back the same numbers in this one container: one row
per explained output, one column per player in the layout's order (``[source | target]``
for an encoder–decoder, the tokens otherwise), the bias player, the value explained, the
convergence delta, and the shares read from them (:attr:`ExplainedOutput.token_share`, the
source share).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["ExplainedOutput", "first_token_share", "token_share"]


def token_share(contributions: Tensor, values: Tensor) -> Tensor:
    """The token share ``Σ_j c_j / value`` of every row of ``(rows, n)`` contributions and
    ``(rows,)`` values (NaN where a value is 0)."""
    values = values.to(contributions.dtype)
    return contributions.sum(dim=1) / torch.where(values != 0, values, torch.full_like(values, float("nan")))


def first_token_share(contributions: Tensor) -> Tensor:
    """The first-token share ``|c_0| / Σ_j |c_j|`` of every row of ``(rows, n)``
    contributions, ``(rows,)`` (0 where a row is all zeros)."""
    magnitude = contributions.abs()
    total = magnitude.sum(dim=1)
    return torch.where(total > 0, magnitude[:, 0] / total.clamp_min(1e-30), torch.zeros_like(total))


@dataclass
class ExplainedOutput:
    r"""Outputs explained exactly over the players: ``value = Σ_j contributions[:, j] + bias``
    for every row, up to ``delta``.

    Attributes:
        contributions (Tensor): ``(T, P)``: row ``t`` explains output ``t`` (a read-out of
                    one input, or one row of a batch), one column per player in the
                    layout's order (an encoder–decoder's ``[source | target]``); padded
                    positions hold 0.
        bias (Tensor): ``(T,)`` the bias player: the model's own bias terms and what a chosen
                    reference moves there.
        value (Tensor): ``(T,)`` the values explained, as the model computed them.
        delta (Tensor): ``(T,)`` the convergence delta ``|Σ_j c_j + bias − value|``.
        n_source (int): how many of the players are an encoder–decoder's source (0 for a
                    model of one stack).
        readouts (list): the read-outs explained, a predicted unit made concrete.
        tokens (Tensor, optional): ``(T,)`` the token ids explained (a forced or generated
                    target).
        source_ids (Tensor, optional): an encoder–decoder's source token ids ``(n_source,)``
                    (empty for audio).
        target_ids (Tensor, optional): the read stack's input ids ``(n,)`` (an
                    encoder–decoder's decoder input: its start token, then the target but
                    its last token; a causal LM's prompt and the target but its last token).
        outputs (Any): the model's outputs, where one pass recorded them.
        maps (Tensor, optional): ``(batch, blocks, n, n)`` whole-model token-to-token maps.
        forward_contributions (Tensor, optional): ``(T, P)`` the forward route's own
                    contributions (the backward route's check, when asked).
        forward_delta (Tensor, optional): ``(T,)`` their convergence delta.
    """

    contributions: Tensor
    bias: Tensor
    value: Tensor
    delta: Tensor
    n_source: int = 0
    readouts: list[Any] = field(default_factory=list)
    tokens: Tensor | None = None
    source_ids: Tensor | None = None
    target_ids: Tensor | None = None
    outputs: Any = None
    maps: Tensor | None = None
    forward_contributions: Tensor | None = None
    forward_delta: Tensor | None = None

    @classmethod
    def from_answers(cls, answers: list[Any], read_mask: Tensor) -> ExplainedOutput:
        """Several of the engine's answers (:class:`~captum_ffb.engine.whole.Answer`) as one
        result, one row per answer and batch row (answers first); ``read_mask`` ``(B, n)``: the
        read stack's real positions (its players come last in the layout)."""
        contributions = torch.cat([a.contributions for a in answers])
        n_source = contributions.shape[1] - read_mask.shape[1]
        if n_source == 0:
            contributions = contributions * read_mask.repeat(len(answers), 1).to(contributions.dtype)
        real = torch.cat([a.real for a in answers])
        bias = torch.cat([a.bias if a.bias is not None else a.value - a.contributions.sum(-1) for a in answers])
        return cls(contributions, bias, real, (contributions.sum(1) + bias - real).abs(), n_source)

    @property
    def steps(self) -> int:
        """How many outputs are explained."""
        return int(self.contributions.shape[0])

    @property
    def source(self) -> Tensor:
        """``(T, n_source)`` the source players' contributions (empty for one stack)."""
        return self.contributions[:, : self.n_source]

    @property
    def target(self) -> Tensor:
        """``(T, P − n_source)`` the read stack's players' contributions (the target prefix of
        an encoder–decoder; every token of a model of one stack)."""
        return self.contributions[:, self.n_source:]

    @property
    def token_share(self) -> Tensor:
        """``(T,)``: ``Σ_j c_j / value``, how much of each value the tokens own (over 100 %
        where the model's own bias terms are negative; NaN where a value is 0)."""
        return token_share(self.contributions, self.value)

    @property
    def first_token_share(self) -> Tensor:
        """``(T,)``: ``|c_0| / Σ_j |c_j|`` of the read stack's first token (0 where all are 0)."""
        return first_token_share(self.target)

    @property
    def source_share(self) -> Tensor:
        """``(T,)``: ``Σ source / value`` for each explained output (ALTI+'s quantity, here
        exact and with the feed-forward blocks)."""
        return self.source.sum(-1) / self.value

    @property
    def source_magnitude_share(self) -> Tensor:
        """``(T,)``: ``Σ |source| / (Σ |source| + Σ |target|)``, the source's part of the
        tokens' contributions by magnitude, in ``[0, 1]``: readable where large parts cancel
        (a model whose own bias terms are as large as the parts)."""
        source = self.source.abs().sum(-1)
        return source / (source + self.target.abs().sum(-1)).clamp_min(torch.finfo(source.dtype).tiny)

    def table(self, tokenizer: Any = None) -> str:
        """A Markdown table: one row per explained output, its value, the parts, the shares and
        the delta."""
        two = self.n_source > 0
        head = ("| step | token | value | Σ source | Σ target prefix | bias | source share | "
                "source share by magnitude | delta |") if two else \
            "| step | token | value | Σ tokens | bias | token share | delta |"
        lines = [head, "|" + "---:|---|" + "---:|" * (head.count("|") - 3)]
        tokens = self.tokens.tolist() if self.tokens is not None else [None] * self.steps
        for step, token in enumerate(tokens):
            shown = "" if token is None else (tokenizer.convert_ids_to_tokens(int(token)) if tokenizer is not None
                                              else str(token))
            if two:
                lines.append(
                    f"| {step} | {shown} | {self.value[step]:.4f} | {self.source[step].sum():.4f} | "
                    f"{self.target[step].sum():.4f} | {self.bias[step]:.4f} | {self.source_share[step]:.3f} | "
                    f"{self.source_magnitude_share[step]:.3f} | {self.delta[step]:.1e} |")
            else:
                lines.append(
                    f"| {step} | {shown} | {self.value[step]:.4f} | {self.contributions[step].sum():.4f} | "
                    f"{self.bias[step]:.4f} | {self.token_share[step]:.3f} | {self.delta[step]:.1e} |")
        return "\n".join(lines)
