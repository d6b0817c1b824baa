"""Views of a tokens × components table: the heat map and the offline HTML fragment."""

import json
import re

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure

from captum_ffb import NormDecomposition
from captum_ffb.components.table import ComponentAttribution
from captum_ffb.explained.readouts import NextToken
from captum_ffb.viz import components_html, plot_components
from captum_ffb.viz.components import NAMED_COLUMNS_UP_TO, column_groups
from tests.models import tiny_task_model, token_ids

matplotlib.use("Agg")

TOKENS = ["the", "cat", "sat", "on", "<b>", "mat", "because"]


@pytest.fixture(scope="module")
def tables():
    """The tiny Llama's next-token logit split at the sublayer and head granularities."""
    nd = NormDecomposition(tiny_task_model("llama"))
    ids = token_ids(1, len(TOKENS))
    out = {}
    for granularity in ("sublayer", "head"):
        table = nd.attribute_components(ids, target=NextToken(3, len(TOKENS) - 1), granularity=granularity)
        table.tokens = [list(TOKENS)]
        out[granularity] = table
    return out


def _deep_head_table(blocks: int = 30, heads: int = 9, n: int = 12) -> ComponentAttribution:
    """A made-up head-granularity table as wide as a 30-block model's (hundreds of columns)."""
    names = ["embeddings"] + [
        f"block.{b}.{part}" for b in range(blocks)
        for part in [*(f"attention.head.{h}" for h in range(heads)), "attention.bias", "ff"]
    ] + ["output_head"]
    values = torch.randn(1, n, len(names), generator=torch.Generator().manual_seed(0))
    bias = torch.zeros(1, len(names))
    return ComponentAttribution(values, bias, names, values.sum((1, 2)), torch.zeros(1), "head")


def _heat_map(figure):
    (ax,) = [ax for ax in figure.axes if ax.images and ax.get_ylabel() == "input token"]
    return ax, ax.images[0]


def test_a_column_per_component_and_a_row_per_token(tables):
    table = tables["sublayer"]
    figure = plot_components(table, title="Explained: the next token")
    assert isinstance(figure, Figure)
    ax, image = _heat_map(figure)
    torch.testing.assert_close(torch.as_tensor(image.get_array().data), table.contributions[0].float())
    assert [t.get_text() for t in ax.get_xticklabels()] == [*table.components[:-1], "output head"]
    assert table.components[-1] == "output_head" and ax.get_xlabel() == "component (sublayer)"
    assert [t.get_text() for t in ax.get_yticklabels()] == TOKENS
    # a symmetric diverging scale centred on zero, with its colour bar
    low, high = image.get_clim()
    assert low == pytest.approx(-high) and high == pytest.approx(float(table.contributions[0].abs().max()))
    assert any(ax.get_ylabel() == "direct effect on the read-out" for ax in figure.axes)
    title = figure.texts[0].get_text()
    assert title.startswith("Explained: the next token\n")
    assert f"value {float(table.value[0]):.4g}" in title
    assert f"Σ bias {float(table.bias[0].sum()):.4g}" in title and f"delta {float(table.delta[0]):.1e}" in title


def test_a_regular_expression_keeps_some_components(tables):
    table = tables["sublayer"]
    ax, image = _heat_map(plot_components(table, components=r"\.ff$"))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["block.0.ff", "block.1.ff"]
    torch.testing.assert_close(torch.as_tensor(image.get_array().data),
                               table.contributions[0][:, [2, 4]].float())
    assert "2 of 6 components shown" in ax.figure.texts[0].get_text()
    with pytest.raises(ValueError, match="no component matches"):
        plot_components(table, components="nothing")


def test_token_labels_are_indices_without_tokens(tables):
    table = tables["sublayer"]
    bare = ComponentAttribution(table.contributions, table.bias, table.components, table.value,
                                table.delta, table.granularity)
    ax, _ = _heat_map(plot_components(bare))  # the view lives in viz (the data object draws nothing)
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(j) for j in range(len(TOKENS))]
    bare.tokens = [TOKENS[:3]]
    with pytest.raises(ValueError, match="3 token labels for 7 positions"):
        plot_components(bare)
    with pytest.raises(TypeError, match="ComponentAttribution"):
        plot_components(table.contributions)


def test_head_granularity_names_every_head_of_a_small_model(tables):
    table = tables["head"]
    assert len(table.components) <= NAMED_COLUMNS_UP_TO
    ax, image = _heat_map(plot_components(table))
    shown = [name if name != "output_head" else "output head" for name in table.components]  # not an attention head
    assert [t.get_text() for t in ax.get_xticklabels()] == shown
    assert image.get_array().shape == (len(TOKENS), len(table.components))


def test_hundreds_of_columns_are_named_by_block():
    table = _deep_head_table()
    assert len(table.components) == 2 + 30 * 11
    ax, image = _heat_map(plot_components(table))
    assert image.get_array().shape == (12, len(table.components))
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["embeddings", *(str(b) for b in range(30)), "output head"]  # the blocks by number
    assert ax.get_xlabel().startswith("block (each block: its attention heads, then its FF)")
    ticks = list(ax.get_xticks())
    assert ticks[:2] == [0, 6] and ticks[-1] == len(table.components) - 1  # a block's middle
    assert len(ax.lines) == 31  # a line before each block and before the head
    # a regular expression brings the names back
    ax, _ = _heat_map(plot_components(table, components=r"^block\.3\."))
    assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["block.3.attention.head.0",
                                                                 "block.3.attention.head.1"]


def test_column_groups():
    names = ["embeddings", "block.0.attention", "block.0.ff", "block.1.norm1", "block.10.ff", "output_head"]
    assert column_groups(names) == [(0, 1, "embeddings"), (1, 3, "block 0"), (3, 4, "block 1"),
                                    (4, 5, "block 10"), (5, 6, "output_head")]


def _embedded(fragment):
    found = re.search(r'<script id="cmp-data" type="application/json">(.*?)</script>', fragment, re.S)
    return json.loads(found.group(1))


@pytest.mark.parametrize("granularity", ["sublayer", "head"])
def test_html_fragment_carries_the_table_and_the_top_entries(tables, granularity):
    table = tables[granularity]
    fragment = components_html(table)
    data = _embedded(fragment)
    assert data["components"] == table.components and data["labels"] == TOKENS
    torch.testing.assert_close(torch.tensor(data["values"]), table.contributions[0].float())
    for name in table.components:
        assert name in fragment
    entries = re.findall(r"<li>(.*?)</li>", fragment)
    assert len(entries) == 10
    for entry, (j, name, value) in zip(entries, table.top(10)):
        assert name in entry and f"{value:+.4g}" in entry
        assert (TOKENS[j] if TOKENS[j] != "<b>" else "&lt;b&gt;") in entry
    assert f"{float(table.value[0]):.4g}" in fragment
    # offline and escaped: no address, no raw tag from a token
    assert not re.search(r"https?:|src=|href=", fragment)
    assert "<b>" not in fragment


def test_html_fragment_of_a_wide_table_names_the_blocks():
    table = _deep_head_table()
    data = _embedded(components_html(table, top=3))
    assert data["named"] is False
    assert [label for _, _, label in data["groups"]] == ["embeddings", *(f"block {b}" for b in range(30)), "output_head"]
