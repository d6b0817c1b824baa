"""The known-answer evaluation: the evidence data, its scores, the position controls, and a
hand-built model whose prediction depends on one known token."""

from __future__ import annotations

import csv

import pytest
import torch

from captum_ffb.evaluation import evidence as ev
from captum_ffb.evaluation.evidence import (
    EvidenceExample,
    EvidenceRow,
    EvidenceTask,
    evidence_example,
    read_evidence,
    reciprocal_ranks,
)
from captum_ffb.evaluation.evidence.task import as_example
from captum_ffb.evaluation.methods import METHODS
from captum_ffb.explained.models import LoadedModel
from tests.models import causal_tokenizer, induction_gpt2


def test_the_bundled_subsets_and_their_split():
    names = ev.bundled_subsets()
    assert "ioi" in names and len(names) == 7
    for name in names:
        total = sum(1 for _ in csv.DictReader(open(ev.EVIDENCE_DIR / f"{name}.csv", newline="")))
        selection = read_evidence([name], split="selection")
        heldout = read_evidence(name, split="heldout")
        assert len(selection) + len(heldout) == total == len(read_evidence([name], split="all"))
        assert all(row.row % 5 == 0 for row in selection) and all(row.row % 5 for row in heldout)
    assert len(read_evidence(None, n=3)) == 3 * len(names)
    assert (ev.EVIDENCE_DIR / "README.md").read_text().count("Apache License 2.0") == 1


def test_data_errors_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown evidence subset 'nope'"):
        read_evidence("nope,ioi")
    bad = tmp_path / "bad.csv"
    bad.write_text("one_prefix_prefix,target\nthe cat,cat\n")
    with pytest.raises(ValueError, match=r"bad.csv: missing columns one_prefix_word_good, "
                                         r"one_prefix_word_bad; an evidence CSV needs"):
        read_evidence(str(bad))
    with pytest.raises(FileNotFoundError):
        read_evidence(str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match="unknown split"):
        read_evidence(None, split="train")
    own = tmp_path / "own.csv"
    own.write_text("one_prefix_prefix,one_prefix_word_good,one_prefix_word_bad,target\n"
                   "the cat sat on the,mat,dog,cat\n")
    (row,) = read_evidence(str(own), split="selection")  # a file of one's own is read whole
    assert row == EvidenceRow("own", 0, "the cat sat on the", "mat", "dog", "cat")


def test_examples_tokenise_the_evidence_and_the_contrast():
    tok = causal_tokenizer()
    row = EvidenceRow("own", 0, "the cat sat on the", "mat", "dog", "cat")
    example, why = evidence_example(tok, row)
    assert why is None and example.evidence == (1,) and example.distance == 3
    assert example.good == tok.convert_tokens_to_ids("mat") and example.bad == tok.convert_tokens_to_ids("dog")
    assert evidence_example(tok, EvidenceRow("own", 1, "the cat sat", "mat", "mat", "cat"))[1] == \
        "the good and bad words start with the same token"
    assert evidence_example(tok, EvidenceRow("own", 2, "the cat sat", "mat", "dog", "bird"))[1] == \
        "the evidence word is not in the prefix"
    assert evidence_example(tok, EvidenceRow("own", 3, "cat", "mat", "dog", "cat"))[1] == \
        "every token of the prefix is evidence"


def test_a_word_merged_with_its_neighbour_is_a_one_line_error():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "the": 1, "cat,": 2, "sat": 3, "mat": 4, "dog": 5},
                                      unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<unk>")
    with pytest.raises(ValueError, match=r"^own row 7: the tokenizer merges the evidence word 'cat' "
                                         r"with its neighbours \(token 'cat,'\)$"):
        evidence_example(tok, EvidenceRow("own", 7, "the cat, sat", "mat", "dog", "cat"))


def test_reciprocal_rank_top1_share_and_ties():
    attributions = torch.tensor([[0.1, 3.0, -2.0, 0.5], [1.0, 1.0, 1.0, 1.0], [0.0, 2.0, 1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])
    evidence = torch.zeros(3, 4, dtype=torch.bool)
    evidence[0, 2] = evidence[0, 3] = True  # the best piece counts: rank 2
    evidence[1, 0] = True  # four-way tie: mean rank 2.5
    evidence[2, 3] = True
    rr, top1, share = reciprocal_ranks(attributions, mask, evidence)
    torch.testing.assert_close(rr, torch.tensor([0.5, 1 / 2.5, 1.0]))
    assert top1.tolist() == [0.0, 0.0, 1.0]
    torch.testing.assert_close(share, torch.tensor([2.5 / 5.6, 0.25, 9 / 12]))


def test_position_controls_on_a_left_padded_batch():
    from captum_ffb.evaluation.tasks import Batch

    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    batch = Batch(torch.ones_like(mask), mask, mask == 0, torch.tensor([-1, -1]), torch.tensor([0, 1]))
    recency = METHODS["recency"].fn(None, batch, None, {})
    assert recency.tolist() == [[0, 0, 1, 2, 3], [1, 2, 3, 4, 5]]
    assert METHODS["previous_token"].fn(None, batch, None, {}).tolist() == [[0, 0, 0, 0, 1], [0, 0, 0, 0, 1]]
    assert METHODS["first_token"].fn(None, batch, None, {}).tolist() == [[0, 0, 1, 0, 0], [1, 0, 0, 0, 0]]


# --- a hand-built model whose prediction depends on one known token --------------------------


@pytest.fixture(scope="module")
def planted():
    """The induction GPT-2 on repeated random sequences: ``a_0 … a_9 a_0 a_1`` predicts
    ``a_2``, copied from its earlier occurrence at position 2 (the evidence); the contrast is
    ``a_2`` against ``a_3``, the token after it."""
    model = induction_gpt2(sharpness=10.0)
    generator = torch.Generator().manual_seed(3)
    examples = []
    for k in range(6):
        tokens = (torch.randperm(15, generator=generator)[:10] + 1).tolist()
        ids = tuple(tokens + tokens[:2])
        examples.append(EvidenceExample("planted", k, ids, tokens[2], tokens[3], (2,)))
    loaded = LoadedModel(model, causal_tokenizer(), "induction", causal_lm=True, task="causal_lm")
    return EvidenceTask(loaded, examples), examples


COMPLETE = ("decomposition", "decomposition_frozen", "decomposition_complete_lrp_attention",
            "decomposition_ig_attention", "decomposition_frozen_mean")


@pytest.mark.parametrize("method", [*COMPLETE, "recency", "previous_token", "random"])
def test_complete_methods_rank_the_planted_evidence_first_and_position_does_not(planted, method):
    task, examples = planted
    batch = task.batch([as_example(e, k) for k, e in enumerate(examples)])
    assert bool((task.values(batch) > 0).all())  # the model copies
    options = {**METHODS[method].options, "seed": 0}
    if method == "decomposition_ig_attention":
        options["n_steps"] = 64
    attr = METHODS[method].fn(task, batch, task.targets(batch.index), options)
    evidence = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    evidence[:, 2] = True
    rr, top1, _ = reciprocal_ranks(attr, batch.attention_mask, evidence)
    if method in COMPLETE:
        assert rr.tolist() == [1.0] * len(examples), method
    else:
        assert float(rr.mean()) < 0.5, (method, rr)


def test_the_default_gives_the_tokens_the_whole_contrast(planted):
    """On a model whose norms and projections have no bias, with the zero reference the
    tokens own the whole explained value."""
    task, examples = planted
    batch = task.batch([as_example(e, k) for k, e in enumerate(examples)])
    target, _ = task.decomposition_target(task.targets(batch.index))
    for reference in ("zero", None):  # the paper's, and the default (centred)
        contributions, bias = task.nd.attribute(batch.input_ids, target=target, reference=reference,
                                                return_bias=True)
        torch.testing.assert_close(contributions.sum(1), task.values(batch), rtol=1e-4, atol=1e-5)
        assert float(bias.abs().max()) < 1e-5


def test_the_task_is_evidence_from_the_start_and_its_target_the_contrast(planted):
    """The kind is set once, before the checks; the methods' target is each row's (good, bad)
    token ids, not the example's index."""
    task, examples = planted
    assert task.kind == "evidence" and task.kinds == ("evidence",)
    batch = task.batch([as_example(e, k) for k, e in enumerate(examples)][::-1][:3])
    target = task.targets(batch.index)
    assert target.tolist() == [[e.good, e.bad] for e in examples[::-1][:3]]
    readout, sign = task.decomposition_target(target)
    assert readout.positive.tolist() == target[:, 0].tolist() and readout.negative.tolist() == target[:, 1].tolist()
    assert sign.tolist() == [1.0, 1.0, 1.0]
    with torch.no_grad():
        logits = task.forward(batch.attention_mask, input_ids=batch.input_ids).logits[:, -1]
    expected = torch.stack([logits[r, g] - logits[r, b] for r, (g, b) in enumerate(target.tolist())])
    torch.testing.assert_close(task.values(batch), expected)
    # Captum repeats the target with the integration steps or perturbations: (B, 2) rows work
    options = {**METHODS["integrated_gradients"].options, "n_steps": 4, "internal_batch_size": 5}
    attr = METHODS["integrated_gradients"].fn(task, batch, target, options)
    assert attr.shape == batch.input_ids.shape and bool(torch.isfinite(attr).all())
    from captum_ffb.evaluation.methods import _captum_forward

    with torch.no_grad():
        embeds = task.model.get_input_embeddings()(batch.input_ids)
        twice = _captum_forward(task)(embeds.repeat(2, 1, 1), batch.attention_mask, target)
    torch.testing.assert_close(twice, expected.repeat(2))
    # only the evidence task takes the kind
    from captum_ffb.evaluation.tasks import EvaluationTask

    with pytest.raises(ValueError, match="unknown task 'evidence'; choose from next-token, sentiment"):
        EvaluationTask(task.loaded, "evidence")


def test_an_evidence_run_end_to_end(tmp_path):
    """evaluate_evidence on a tiny LM: the pairs the model gets right scored, the four files,
    the summary the same as the per-example file, and the same command resuming."""
    from captum_ffb.evaluation.evidence import evaluate_evidence
    from tests.models import WORDS, save_tiny_lm

    model = save_tiny_lm(tmp_path / "lm")
    words = sorted({w for w in WORDS if w.isalpha()})
    generator = torch.Generator().manual_seed(0)
    lines = ["one_prefix_prefix,one_prefix_word_good,one_prefix_word_bad,target"]
    for _ in range(16):
        order = torch.randperm(len(words), generator=generator).tolist()
        prefix = [words[k] for k in order[:5]]
        lines.append(f"{' '.join(prefix)},{words[order[5]]},{words[order[6]]},{prefix[1]}")
    (tmp_path / "pairs.csv").write_text("\n".join(lines) + "\n")
    argv = dict(data=str(tmp_path / "pairs.csv"), methods="decomposition,recency,random", out=tmp_path / "run",
                batch_size=3, show_progress=False)
    summary = evaluate_evidence(str(model), **argv)
    names = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert names == ["examples.csv", "results.csv", "results.json", "results.md", "run"]
    wrong = summary["skipped"].get("the model prefers the bad word", 0)
    assert summary["read"] == 16 and summary["n"] == 16 - wrong > 0
    rows = list(csv.DictReader(open(tmp_path / "run" / "examples.csv", newline="")))
    assert len(rows) == summary["n"] and all(float(r["value"]) > 0 for r in rows)
    for method in ("decomposition", "recency", "random"):
        mrr = sum(float(r[f"{method}.rr"]) for r in rows) / len(rows)
        assert summary["methods"][method]["all"]["mrr"] == pytest.approx(mrr, abs=1e-4)
        assert summary["methods"][method]["all"]["n"] == summary["n"]
    share = summary["methods"]["decomposition"]["token_share"]
    assert share["min"] == pytest.approx(1.0, abs=1e-3) and share["max"] == pytest.approx(1.0, abs=1e-3)
    assert "| `decomposition` |" in (tmp_path / "run" / "results.md").read_text()
    again = evaluate_evidence(str(model), **argv)  # everything on disk: the same numbers
    assert again["methods"] == summary["methods"]
