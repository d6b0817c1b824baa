import math

import pytest
import torch

from captum_ffb.viz import bertviz_view, to_bertviz, to_captum, to_inseq


def test_bertviz_tensors_are_row_normalised_scopes_as_heads(bert_maps):
    attention = to_bertviz(bert_maps)
    n = len(bert_maps.tokens)
    assert len(attention) == len(bert_maps.layers)
    for layer, tensor in zip(bert_maps.layers, attention):
        assert tensor.shape == (1, len(bert_maps.scopes), n, n) and tensor.dtype == torch.float32
        assert tensor.min() >= 0 and tensor.max() <= 1
        torch.testing.assert_close(tensor.sum(-1), torch.ones(1, len(bert_maps.scopes), n))
        for head, scope in enumerate(bert_maps.scopes):
            m = bert_maps.maps[layer][scope]
            torch.testing.assert_close(tensor[0, head], m / m.sum(-1, keepdim=True))
    chosen = to_bertviz(bert_maps, layers=1, scopes=["AtbFf", "Atb"])
    assert len(chosen) == 1 and chosen[0].shape[1] == 2
    torch.testing.assert_close(chosen[0][0, 1], attention[1][0, 0])


def test_bertviz_views_render(bert_maps):
    pytest.importorskip("bertviz")
    for view in ("head", "model"):
        page = bertviz_view(bert_maps, view=view, html_action="return").data
        assert '"mat"' in page and "[CLS]" in page
    with pytest.raises(ValueError, match="view must be"):
        bertviz_view(bert_maps, view="neuron")


def test_inseq_encoder_output_renders(bert_maps):
    pytest.importorskip("inseq")
    from inseq import FeatureAttributionOutput

    out = to_inseq(bert_maps, layer=1)
    assert isinstance(out, FeatureAttributionOutput)
    assert out.info["scopes"] == list(bert_maps.scopes) and out.info["layer"] == 1
    for seq, scope in zip(out.sequence_attributions, bert_maps.scopes):
        assert [t.token for t in seq.source] == bert_maps.tokens
        assert seq.target_attributions is None
        torch.testing.assert_close(seq.source_attributions, bert_maps.maps[1][scope].T)
    page = out.show(display=False, return_html=True)
    assert "mat" in page and page.count("Source Saliency Heatmap") == len(bert_maps.scopes)


def test_inseq_causal_output_masks_the_future(gpt2_maps):
    pytest.importorskip("inseq")
    out = to_inseq(gpt2_maps, layer=0, scopes="AtbLnFf")
    (seq,) = out.sequence_attributions
    grid = seq.target_attributions  # [j, i]
    n = len(gpt2_maps.tokens)
    assert seq.source_attributions is None and grid.shape == (n, n)
    for i in range(n):
        for j in range(n):
            value = float(grid[j, i])
            if j > i:
                assert math.isnan(value)
            else:
                assert value == pytest.approx(float(gpt2_maps.maps[0]["AtbLnFf"][i, j]))
    assert "Target Saliency Heatmap" in out.show(display=False, return_html=True)


def test_captum_result_plots(bert_maps):
    from captum.attr import LLMAttributionResult

    result = to_captum(bert_maps, layer=0, scope="AtbFf")
    assert isinstance(result, LLMAttributionResult)
    torch.testing.assert_close(result.token_attr, bert_maps.maps[0]["AtbFf"])
    torch.testing.assert_close(result.seq_attr, bert_maps.maps[0]["AtbFf"].sum(0))
    assert result.input_tokens == result.output_tokens == bert_maps.tokens
    fig, ax = result.plot_token_attr(show=False)
    assert [t.get_text() for t in ax.get_xticklabels()] == bert_maps.tokens
    default = to_captum(bert_maps, layer=-1)  # the whole layer of the last computed layer
    torch.testing.assert_close(default.token_attr, bert_maps.maps[1]["AtbFfResLn"])
    import matplotlib.pyplot as plt

    plt.close("all")


def test_export_errors(bert_maps):
    with pytest.raises(ValueError, match="unknown scope"):
        to_captum(bert_maps, layer=0, scope="AtbLn")
    with pytest.raises(ValueError, match="layer 3 was not computed"):
        to_bertviz(bert_maps, layers=[3])
    with pytest.raises(TypeError, match="expected TextMaps"):
        to_bertviz(bert_maps.maps)
