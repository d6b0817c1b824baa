import dataclasses

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure

from captum_ffb.texts.text import ff_amplification
from captum_ffb.viz import plot_maps
from captum_ffb.viz._common import display_token

matplotlib.use("Agg")


def _panels(fig):
    """(title, image array, x tick labels) of every visible panel with a heatmap."""
    out = []
    for ax in fig.axes:
        if ax.get_visible() and ax.images:
            labels = [t.get_text() for t in ax.get_xticklabels()]
            out.append((ax.get_title(), ax.images[0].get_array().data, labels, ax.images[0]))
    return out


def test_one_panel_per_scope_plus_ff_amp(bert_maps):
    fig = plot_maps(bert_maps, layer=1)
    assert isinstance(fig, Figure)
    panels = _panels(fig)
    titles = [p[0] for p in panels]
    assert titles == [f"layer 1: {s}" for s in bert_maps.scopes] + ["layer 1: FF-amp (AtbFf − Atb)"]
    for (_, image, labels, _), scope in zip(panels, bert_maps.scopes):
        assert labels == bert_maps.tokens  # BERT tokens are shown as they are
        torch.testing.assert_close(torch.as_tensor(image), bert_maps.maps[1][scope])
    amp_image, amp_artist = panels[-1][1], panels[-1][3]
    expected = ff_amplification(bert_maps.maps[1]["Atb"], bert_maps.maps[1]["AtbFf"])
    torch.testing.assert_close(torch.as_tensor(amp_image), expected)
    low, high = amp_artist.get_clim()
    assert low == pytest.approx(-high) and high == pytest.approx(float(expected.abs().max()))


def test_every_layer_is_a_row_and_png_is_written(bert_maps, tmp_path):
    fig = plot_maps(bert_maps)
    titles = [p[0] for p in _panels(fig)]
    assert len(titles) == len(bert_maps.layers) * (len(bert_maps.scopes) + 1)
    assert titles[0].startswith("layer 0:") and titles[-1].startswith("layer 1: FF-amp")
    path = tmp_path / "maps.png"
    fig.savefig(path, dpi=40)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pre_ln_uses_its_own_ff_pair_and_cleans_bpe_markers(gpt2_maps):
    titles = [p[0] for p in _panels(plot_maps(gpt2_maps, layer=-1))]
    assert titles[-1] == "layer 1: FF-amp (AtbLnFf − AtbLn)"
    assert display_token("Ġcat") == "cat" and display_token("▁cat") == "cat"
    assert display_token("Ġ") == "␣" and display_token("") == "∅"  # never an empty label


def test_display_token_with_and_without_a_tokenizer():
    from tests.models import byte_level_tokenizer, wordpiece_tokenizer

    assert display_token("##ing") == "ing" and display_token("##") == "##"
    assert display_token("ĊĊ") == "\\n\\n" and display_token("Ġcat", strip=False) == " cat"
    bpe = byte_level_tokenizer()
    assert display_token("Ã©t", bpe) == "ét"  # the byte-level decoder, which the markers lack
    assert display_token("Ġcat", bpe, strip=False) == " cat" and display_token("Ċ", bpe) == "\\n"
    assert display_token("##at", wordpiece_tokenizer()) == "at" and display_token("[CLS]", wordpiece_tokenizer()) == "[CLS]"


def test_options_scopes_no_amp_and_row_normalisation(bert_maps):
    panels = _panels(plot_maps(bert_maps, layer=0, scopes=["AtbFfResLn"], ff_amp=False, normalize="row"))
    assert [p[0] for p in panels] == ["layer 0: AtbFfResLn"]
    rows = torch.as_tensor(panels[0][1]).sum(dim=1)
    torch.testing.assert_close(rows, torch.ones_like(rows))
    # FF-amp is drawn whenever both FF scopes were computed, even if not shown themselves
    assert len(_panels(plot_maps(bert_maps, layer=0, scopes=["Atb", "AtbFfRes"]))) == 3
    partial = dataclasses.replace(bert_maps, scopes=("Atb", "AtbFfRes"))
    assert len(_panels(plot_maps(partial, layer=0))) == 2  # nothing to subtract


def test_exclude_special_sets_the_scale_without_the_first_and_special_tokens(bert_maps):
    """Raw norms, drawn on a scale whose top is the largest value outside the first and the
    special tokens' rows and columns; the colour bar says when cells go past it; the caption
    says so."""
    from captum_ffb.viz.figures import special_positions

    labels = list(bert_maps.tokens)
    special = special_positions(labels)
    assert special[0] == 0 and all(labels[k].startswith("[") for k in special[1:])
    assert special_positions(["a", "<s>", "b", "<|im_end|>", "<", "[]"]) == [0, 1, 3]
    fig = plot_maps(bert_maps, layer=1, scopes=["AtbFf"], ff_amp=False, normalize="exclude-special")
    ((_, image, _, artist),) = _panels(fig)
    matrix = bert_maps.maps[1]["AtbFf"]
    torch.testing.assert_close(torch.as_tensor(image), matrix)  # the values stay raw
    keep = torch.ones(len(labels), dtype=torch.bool)
    keep[special] = False
    assert artist.get_clim()[1] == pytest.approx(float(matrix[keep][:, keep].max()))
    assert "without the first and special tokens" in fig._suptitle.get_text()
    bars = [a for a in fig.axes if a.get_label() == "<colorbar>"]
    assert bars and (float(matrix.max()) > artist.get_clim()[1]) == (bars[0]._colorbar.extend == "max")


def test_long_single_layer_wraps_panels(bert_maps):
    fig = plot_maps(bert_maps, layer=0, ncols=2)
    visible = [ax for ax in fig.axes if ax.get_visible() and ax.images]
    assert len(visible) == 5
    assert sum(1 for ax in fig.axes if not ax.get_visible()) == 1  # 3 × 2 grid, one empty


def test_plain_dict_of_maps(bert_maps):
    maps = {s: bert_maps.maps[0][s] for s in ("Atb", "AtbFf")}
    panels = _panels(plot_maps(maps, tokens=bert_maps.tokens))
    assert [p[0] for p in panels] == ["Atb", "AtbFf", "FF-amp (AtbFf − Atb)"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layer": 7}, "layer 7 was not computed"),
        ({"scopes": ["AtbLn"]}, "unknown scope 'AtbLn'"),
        ({"normalize": "max"}, "normalize must be one of"),
    ],
)
def test_bad_arguments(bert_maps, kwargs, message):
    with pytest.raises(ValueError, match=message):
        plot_maps(bert_maps, **kwargs)


def test_bad_dict_input(bert_maps):
    with pytest.raises(ValueError, match="tokens are required"):
        plot_maps({"Atb": bert_maps.maps[0]["Atb"]})
    with pytest.raises(ValueError, match="expected \\(3, 3\\)"):
        plot_maps({"Atb": bert_maps.maps[0]["Atb"]}, tokens=["a", "b", "c"])
    with pytest.raises(TypeError, match="TextMaps or a non-empty dict"):
        plot_maps([1, 2])
