"""Contributions as Captum ``VisualizationDataRecord``\\ s, for ``visualize_text``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from captum.attr import LLMAttributionResult, visualization
from torch import Tensor

from captum_ffb.viz._common import cpu_view, display_tokens, escape


def _scaled(row: Tensor, normalize: bool) -> Tensor:
    """``row / max|row|`` (Captum's colours span [-1, 1]); an all-zero row stays zero."""
    if not normalize:
        return row
    peak = float(row.abs().max()) if row.numel() else 0.0
    return row / peak if peak > 0 else row


def _shown(tokens: Sequence[str]) -> list[str]:
    """Tokens as read (BPE space markers removed), HTML-escaped: ``visualize_text`` pastes
    them into its page as they are."""
    return [escape(t) for t in display_tokens([str(t) for t in tokens])]


def _per_row(value: Any, rows: int, name: str, default: Any) -> list[Any]:
    if value is None:
        return [default] * rows
    if isinstance(value, Tensor):
        value = value.reshape(-1).tolist()
    if isinstance(value, (str, int, float)):
        return [value] * rows
    value = list(value)
    if len(value) != rows:
        raise ValueError(f"{name} has {len(value)} entries for {rows} rows")
    return value


#: What a record shows where neither the caller nor an LLM result gives a value.
_DEFAULTS: dict[str, Any] = {"pred_prob": math.nan, "pred_class": "", "true_class": "",
                             "attr_class": "", "convergence_delta": math.nan}


def _result_rows(result: LLMAttributionResult) -> tuple[Tensor, list[list[str]], dict[str, Any]]:
    """An LLM result's rows (``token_attr``, else ``seq_attr`` as one row), each row's
    tokens, and what it gives each row: the output token as the classes, its probability and
    its convergence delta."""
    per_token = result.token_attr is not None
    matrix = result.token_attr if per_token else result.seq_attr[None]
    shown = display_tokens(list(result.output_tokens) if per_token else ["sequence"])
    given = {
        "pred_prob": result.output_probs if per_token else None,
        "pred_class": shown, "true_class": shown, "attr_class": shown,
        "convergence_delta": getattr(result, "convergence_delta", None),
    }
    return matrix, [_shown(result.input_tokens)] * matrix.shape[0], given


def _tensor_rows(attributions: Any, tokens: Sequence[str] | Sequence[Sequence[str]] | None,
                 ) -> tuple[Tensor, list[list[str]]]:
    """Contributions ``(n,)`` or ``(batch, n)`` as rows, and each row's tokens (one list for
    every row, or one per row; a shorter list leaves the padded tail out)."""
    if not isinstance(attributions, Tensor):
        raise TypeError(
            f"attributions must be a Tensor or an LLMAttributionResult, got {type(attributions).__name__}"
        )
    matrix = attributions.detach()
    if matrix.dim() == 1:
        matrix = matrix[None]
    if matrix.dim() != 2:
        raise ValueError(f"attributions must be (n,) or (batch, n), got shape {tuple(matrix.shape)}")
    rows = matrix.shape[0]
    if tokens is None:
        raise ValueError("give the tokens of the attributed positions")
    tokens = list(tokens)
    nested = len(tokens) > 0 and not isinstance(tokens[0], str)
    row_tokens = [_shown(t) for t in tokens] if nested else [_shown(tokens)] * rows
    if len(row_tokens) != rows:
        raise ValueError(f"tokens has {len(row_tokens)} rows for {rows} rows of attributions")
    for k, words in enumerate(row_tokens):
        if len(words) > matrix.shape[1]:
            raise ValueError(f"row {k} has {len(words)} tokens for {matrix.shape[1]} attributions")
    return matrix, row_tokens


@cpu_view
def to_visualization_records(
    attributions: Tensor | LLMAttributionResult,
    tokens: Sequence[str] | Sequence[Sequence[str]] | None = None,
    pred_prob: float | Sequence[float] | Tensor | None = None,
    pred_class: str | Sequence[str] | None = None,
    true_class: str | Sequence[str] | None = None,
    attr_class: str | Sequence[str] | None = None,
    convergence_delta: float | Sequence[float] | Tensor | None = None,
    normalize: bool = True,
) -> list[visualization.VisualizationDataRecord]:
    r"""Contributions as Captum ``VisualizationDataRecord``\ s: pass the list to
    ``visualization.visualize_text`` (``from captum.attr import visualization``).

    From an ``LLMAttributionResult`` (e.g. :class:`~captum_ffb.attr.LLMNormAttribution`'s),
    one record per output token: its ``token_attr`` row over the input features, the output
    token as predicted, true and attributed class, its ``output_probs`` entry as probability
    and, for a :class:`~captum_ffb.attr.NormLLMAttributionResult`, its convergence delta. A
    result without ``token_attr`` gives one record of ``seq_attr``.

    From a tensor (``NormDecomposition.attribute()``'s ``(batch, n)`` or one row ``(n,)``),
    one record per row; ``tokens`` gives each row's tokens (one list for every row, or one list
    per row; a shorter list leaves the padded tail out).

    ``word_attributions`` are divided by the row's largest magnitude when ``normalize`` (the
    colours span [-1, 1]); ``attr_score`` is the row's raw sum. Tokens and class names are
    HTML-escaped (``visualize_text`` pastes them into its page as they are).

    Args:
        attributions (Tensor or LLMAttributionResult): the contributions.
        tokens (list[str] or list[list[str]], optional): the tokens (tensors only).
        pred_prob, pred_class, true_class, attr_class, convergence_delta: one value for every
                    row or one per row (tensors; an LLM result fills them itself).
        normalize (bool): scale each row to a largest magnitude of 1.

    Returns:
        list[VisualizationDataRecord]

    Examples::

        >>> from captum.attr import visualization
        >>> from captum_ffb.viz import to_visualization_records
        >>> result = LLMNormAttribution(NormDecomposition(model), tokenizer).attribute(inp)
        >>> visualization.visualize_text(to_visualization_records(result))
        >>> contributions = NormDecomposition(classifier).attribute(ids, target=1)
        >>> visualization.visualize_text(to_visualization_records(
        ...     contributions, tokenizer.convert_ids_to_tokens(ids[0]), attr_class="positive"))
    """
    if isinstance(attributions, LLMAttributionResult):
        if tokens is not None:
            raise ValueError("an LLMAttributionResult carries its tokens: leave tokens out")
        matrix, row_tokens, given = _result_rows(attributions)
    else:
        matrix, row_tokens = _tensor_rows(attributions, tokens)
        given = {}
    asked = {"pred_prob": pred_prob, "pred_class": pred_class, "true_class": true_class,
             "attr_class": attr_class, "convergence_delta": convergence_delta}
    rows = matrix.shape[0]
    per_row = {
        name: _per_row(value if value is not None else given.get(name), rows, name, _DEFAULTS[name])
        for name, value in asked.items()
    }
    matrix = matrix.detach().float().cpu()
    records = []
    for k in range(rows):
        row = matrix[k, : len(row_tokens[k])]
        records.append(visualization.VisualizationDataRecord(
            word_attributions=_scaled(row, normalize),
            pred_prob=float(per_row["pred_prob"][k]),
            pred_class=escape(per_row["pred_class"][k]),
            true_class=escape(per_row["true_class"][k]),
            attr_class=escape(per_row["attr_class"][k]),
            attr_score=float(row.sum()),
            raw_input_ids=row_tokens[k],
            convergence_score=float(per_row["convergence_delta"][k]),
        ))
    return records


__all__ = ["to_visualization_records"]
