"""to_visualization_records: NormDecomposition contributions in Captum's visualize_text."""

from __future__ import annotations

import math
import re

import pytest
import torch
from captum.attr import TextTokenInput, visualization

from captum_ffb import NormDecomposition
from captum_ffb.attr import LLMNormAttribution
from captum_ffb.viz import to_visualization_records
from tests.models import causal_tokenizer, tiny_lm, tiny_task_model, wordpiece_tokenizer


def shown_words(records) -> list[str]:
    """The words of visualize_text's page, in order."""
    pytest.importorskip("IPython")
    page = visualization.visualize_text(records).data
    return re.findall(r'<font color="black"> (.*?)\s*</font>', page)


def test_classifier_rows_render_with_their_tokens():
    model = tiny_task_model("bert", "sequence_classification")
    tokenizer = wordpiece_tokenizer()
    texts = ["the cat sat on the mat", "big red dog"]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    contributions, bias = NormDecomposition(model).attribute(
        batch.input_ids, target=1, forward_kwargs={"attention_mask": batch.attention_mask},
        return_bias=True,
    )
    tokens = [tokenizer.convert_ids_to_tokens(ids[mask.bool()]) for ids, mask in
              zip(batch.input_ids, batch.attention_mask)]
    records = to_visualization_records(contributions, tokens, attr_class="class 1",
                                       pred_prob=[0.25, 0.75])
    assert len(records) == 2 and all(isinstance(r, visualization.VisualizationDataRecord) for r in records)
    with torch.no_grad():
        logits = model(**batch).logits[:, 1]
    for k, record in enumerate(records):
        n = len(tokens[k])
        row = contributions[k, :n]
        assert record.raw_input_ids == tokens[k]
        torch.testing.assert_close(record.word_attributions, row / row.abs().max())
        assert record.attr_score == pytest.approx(float(logits[k] - bias[k]), abs=1e-5)
        assert record.attr_class == "class 1" and record.pred_prob == [0.25, 0.75][k]
        assert math.isnan(record.convergence_score)
    assert shown_words(records) == tokens[0] + tokens[1]
    assert tokens[1] == ["[CLS]", "big", "red", "dog", "[SEP]"]
    raw = to_visualization_records(contributions[0], tokens[0], normalize=False)
    (one,) = raw
    torch.testing.assert_close(one.word_attributions, contributions[0, : len(tokens[0])])


def test_llm_result_gives_one_record_per_output_token():
    tokenizer = causal_tokenizer(bos=True)
    llm_attr = LLMNormAttribution(NormDecomposition(tiny_lm("llama")), tokenizer)
    result = llm_attr.attribute(TextTokenInput("the cat sat on", tokenizer), target="big dog")
    records = to_visualization_records(result)
    assert [r.pred_class for r in records] == ["big", "dog"]
    assert [r.true_class for r in records] == ["big", "dog"]
    for t, record in enumerate(records):
        assert record.raw_input_ids == ["&lt;s&gt;", "the", "cat", "sat", "on"]
        assert record.pred_prob == pytest.approx(float(result.output_probs[t]))
        assert record.convergence_score == pytest.approx(float(result.convergence_delta[t]))
        assert record.attr_score == pytest.approx(float(result.token_attr[t].sum()), abs=1e-6)
        assert float(record.word_attributions.abs().max()) == pytest.approx(1.0)
    # <s> shown as a token, not read as an HTML tag
    assert shown_words(records) == ["&lt;s&gt;", "the", "cat", "sat", "on"] * 2
    page = visualization.visualize_text(records).data
    assert "<s>" not in page and "<b>big</b>" in page and "<b>dog</b>" in page


def test_errors():
    row = torch.tensor([[0.5, -1.0]])
    with pytest.raises(ValueError, match="give the tokens"):
        to_visualization_records(row)
    with pytest.raises(TypeError, match="must be a Tensor or an LLMAttributionResult"):
        to_visualization_records([0.5, -1.0], ["a", "b"])
    with pytest.raises(ValueError, match=r"must be \(n,\) or \(batch, n\)"):
        to_visualization_records(torch.zeros(1, 2, 3), ["a", "b"])
    with pytest.raises(ValueError, match="3 tokens for 2 attributions"):
        to_visualization_records(row, ["a", "b", "c"])
    with pytest.raises(ValueError, match="tokens has 2 rows for 1 rows"):
        to_visualization_records(row, [["a"], ["b"]])
    with pytest.raises(ValueError, match="pred_prob has 2 entries for 1 rows"):
        to_visualization_records(row, ["a", "b"], pred_prob=[0.1, 0.2])
    from captum.attr import LLMAttributionResult

    result = LLMAttributionResult(input_tokens=["a", "b"], output_tokens=["c"], seq_attr=[0.5, -1.0])
    with pytest.raises(ValueError, match="carries its tokens"):
        to_visualization_records(result, ["a", "b"])
    (record,) = to_visualization_records(result)  # no token_attr: one record of seq_attr
    assert record.pred_class == "sequence"
    torch.testing.assert_close(record.word_attributions, torch.tensor([0.5, -1.0]))
