"""Views of an encoder–decoder's explanation (``Seq2SeqExplanation``):
a heat map of target tokens × [source | target prefix] contributions with each token's
source share, and an offline HTML table of the same."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from captum_ffb.explained.results import ExplainedOutput as Seq2SeqExplanation
from captum_ffb.viz._common import cpu_view, css, diverging, escape, ink, page
from captum_ffb.viz.figures import figure_class, require_matplotlib


@cpu_view
def plot_seq2seq(explanation: Seq2SeqExplanation, source_tokens: Sequence[str],
                 prefix_tokens: Sequence[str], target_tokens: Sequence[str], title: str = "") -> Any:
    r"""A heat map: one row per explained target token, one column per player (the source's
    tokens, a gap, then the target prefix's), coloured by the signed contribution on a
    diverging scale centred on zero; each row is labelled with its source share.

    Args:
        explanation (Seq2SeqExplanation): from :meth:`NormDecomposition.explain_target` or
                    :meth:`~captum_ffb.NormDecomposition.explain_generation`.
        source_tokens, prefix_tokens (list[str]): the players' labels.
        target_tokens (list[str]): the explained tokens' labels.
        title (str): the figure's title.
    """
    import torch

    require_matplotlib()
    if not isinstance(explanation, Seq2SeqExplanation):
        raise TypeError(f"expected a Seq2SeqExplanation, got {type(explanation).__name__}")
    steps, n_source = explanation.source.shape
    if len(source_tokens) != n_source or len(prefix_tokens) != explanation.target.shape[1]:
        raise ValueError("give one label per source token and per target-prefix token")
    gap = torch.full((steps, 1), float("nan"))
    matrix = torch.cat([explanation.source, gap, explanation.target], dim=1).float()
    bound = float(matrix.nan_to_num(0).abs().max()) or 1.0
    labels = list(source_tokens) + [""] + list(prefix_tokens)
    width = max(4.0, 0.32 * len(labels) + 2.5)
    figure = figure_class()(figsize=(width, max(2.2, 0.32 * steps + 1.6)))
    ax = figure.add_subplot(1, 1, 1)
    image = ax.imshow(matrix.numpy(), cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto",
                      interpolation="nearest")
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
    shares = explanation.source_share.tolist()
    ax.set_yticks(range(steps), [f"{token}  ({share:.0%} source)" for token, share in zip(target_tokens, shares)],
                  fontsize=8)
    ax.axvline(n_source, color="black", linewidth=0.8)
    ax.set_xlabel("source tokens | target prefix")
    ax.set_ylabel("explained target token")
    figure.colorbar(image, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=7)
    ax.set_title(title or "contributions to each target token's logit", fontsize=10)
    figure.tight_layout()
    return figure


def _cell(value: float, bound: float) -> str:
    colour = diverging(value, bound)
    return (f'<td style="background:{css(colour)};color:{ink(colour)}" title="{escape(f"{value:+.4f}")}">'
            f'{escape(f"{value:+.3f}")}</td>')


@cpu_view
def seq2seq_html(explanation: Seq2SeqExplanation, source_tokens: Sequence[str], prefix_tokens: Sequence[str],
                 target_tokens: Sequence[str], title: str = "") -> str:
    """A self-contained HTML page: one row per explained token (logit, source share, delta)
    and its contribution from every source and target-prefix token, coloured by sign."""
    bound = float(max(explanation.source.abs().max(), explanation.target.abs().max())) or 1.0
    head = "".join(f"<th>{escape(t)}</th>" for t in source_tokens)
    head += '<th class="gap"></th>' + "".join(f"<th>{escape(t)}</th>" for t in prefix_tokens)
    rows = []
    for step, token in enumerate(target_tokens):
        cells = "".join(_cell(float(v), bound) for v in explanation.source[step])
        cells += '<td class="gap"></td>' + "".join(_cell(float(v), bound) for v in explanation.target[step])
        rows.append(
            f"<tr><th>{escape(token)}</th><td>{escape(f'{float(explanation.value[step]):.4f}')}</td>"
            f"<td>{escape(f'{float(explanation.source_share[step]):.1%}')}</td>"
            f"<td>{escape(f'{float(explanation.delta[step]):.1e}')}</td>{cells}</tr>")
    body = f"""<p>Each explained token's logit is exactly Σ source + Σ target prefix + bias (delta: the
completeness residual). Source share: Σ source / logit. Red raises the logit, blue lowers it.</p>
<table><thead><tr><th>token</th><th>logit</th><th>source share</th><th>delta</th>{head}</tr></thead>
<tbody>{''.join(rows)}</tbody></table>"""
    return page(title or "Source and target-prefix contributions", body, style=_STYLE)


#: The table's own rule: a gap between the source's columns and the prefix's.
_STYLE = """
.gap { border: none; background: none; width: 8px; }
"""
