"""Perturbing token sequences by relevance: orderings, the three perturbations, a scorer.

Conventions shared by every function here:

* A batch is ``input_ids`` ``(B, n)`` with ``attention_mask`` ``(B, n)`` (1 for real tokens,
  0 for padding); an attribution is ``(B, n)``, one relevance per input position.
* ``protected`` ``(B, n)`` bool marks positions that are never perturbed and never counted
  (special tokens such as [CLS]/[SEP]/BOS). Padding is always protected, whatever the mask
  says. ``n_tokens`` is the number of unprotected positions of each row.
* Orderings are deterministic: a *stable* sort of the relevance, so equal relevances keep
  their position order (the earlier position comes first) in most-relevant-first and in
  least-relevant-first order alike. Protected positions come last, in position order.
* ``where`` ``(B, n)`` bool marks the positions a perturbation acts on.

A *scorer* is any callable ``score_fn(input_ids, attention_mask, zeroed) -> Tensor`` where
``zeroed`` is ``None`` or a ``(B, n)`` bool mask of positions whose input embeddings must be
set to zero. It returns the model's target score per row, ``(B,)``, or a row of class scores
``(B, C)`` from which the metrics pick a target class. :func:`embedding_scorer` builds one
for a Hugging Face model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from captum_ffb.engine.passes import run_model
from captum_ffb.engine.positions import position_ids, real_positions

__all__ = [
    "PERTURBATIONS",
    "PerturbedBatch",
    "ScoreFn",
    "embedding_scorer",
    "last_token",
    "perturb",
    "protected_mask",
    "random_attribution",
    "rank_positions",
    "relevance_order",
    "remove_tokens",
    "replace_tokens",
    "tokens_for_fractions",
    "top_k_mask",
    "zero_embeddings",
]

#: The type of a scorer, ``score_fn(input_ids, attention_mask, zeroed) → (B,)`` scores with
#: ``zeroed`` the ``(B, n)`` positions whose embeddings are zeroed (or ``None``).
ScoreFn = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]
#: How a token is taken out: removed, replaced by a token, or its embedding zeroed.
PERTURBATIONS = ("remove", "replace", "zero_embedding")
ROUNDINGS = ("floor", "ceil", "round")


@dataclass(frozen=True)
class PerturbedBatch:
    """What a scorer is called with after a perturbation.

    Attributes:
        input_ids (Tensor): ``(B, m)`` token ids (``m < n`` after ``remove``).
        attention_mask (Tensor): ``(B, m)``, 1 for real tokens.
        zeroed (Tensor or None): ``(B, m)`` bool, positions whose input embeddings are
                    zeroed; ``None`` for the perturbations that change the ids.
    """

    input_ids: Tensor
    attention_mask: Tensor
    zeroed: Tensor | None = None


def check_batch(input_ids: Tensor, attention_mask: Tensor) -> None:
    """Raise ``ValueError`` unless the ids are ``(B, n)`` and the mask has their shape."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, n), got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} differs from input_ids "
            f"shape {tuple(input_ids.shape)}"
        )


def _check_where(where: Tensor, attention_mask: Tensor) -> Tensor:
    if where.shape != attention_mask.shape:
        raise ValueError(
            f"where shape {tuple(where.shape)} differs from input shape {tuple(attention_mask.shape)}"
        )
    where = where.to(device=attention_mask.device, dtype=torch.bool)
    if (where & (attention_mask == 0)).any():
        raise ValueError("where marks padding positions (attention_mask 0); padding is never perturbed")
    return where


def protected_mask(input_ids: Tensor, attention_mask: Tensor,
                   special_ids: Iterable[int] = ()) -> Tensor:
    """Positions never to perturb: padding, and every token whose id is in ``special_ids``.

    Args:
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens, 0 for padding.
        special_ids (Iterable[int]): ids to protect, e.g. ``tokenizer.all_special_ids``.

    Returns:
        Tensor: ``(B, n)`` bool, True where a position is protected.
    """
    check_batch(input_ids, attention_mask)
    protected = attention_mask == 0
    ids = sorted({int(i) for i in special_ids})
    if ids:
        protected = protected | torch.isin(input_ids, torch.tensor(ids, device=input_ids.device))
    return protected


def protected_or_padding(attention_mask: Tensor, protected: Tensor | None) -> Tensor:
    """``(B, n)`` bool: ``protected`` (checked against the mask's shape) or padding."""
    padding = attention_mask == 0
    if protected is None:
        return padding
    if protected.shape != attention_mask.shape:
        raise ValueError(
            f"protected shape {tuple(protected.shape)} differs from input shape "
            f"{tuple(attention_mask.shape)}"
        )
    return protected.to(device=attention_mask.device, dtype=torch.bool) | padding


def relevance_order(attributions: Tensor, protected: Tensor, *,
                    descending: bool = True) -> tuple[Tensor, Tensor]:
    """Positions sorted by relevance, protected positions last.

    Args:
        attributions (Tensor): ``(B, n)`` relevance per position.
        protected (Tensor): ``(B, n)`` bool, positions left out of the order (put last).
        descending (bool): most relevant first (MoRF) if True, least relevant first (LeRF)
                    otherwise. Ties keep position order either way (stable sort).

    Returns:
        tuple[Tensor, Tensor]: the ``(B, n)`` order (position indices) and the ``(B,)``
        number of unprotected positions ``n_tokens``; ``order[:, :n_tokens]`` are the
        unprotected positions.
    """
    if attributions.dim() != 2:
        raise ValueError(f"attributions must be (batch, n), got shape {tuple(attributions.shape)}")
    if protected.shape != attributions.shape:
        raise ValueError(
            f"protected shape {tuple(protected.shape)} differs from attributions shape "
            f"{tuple(attributions.shape)}"
        )
    protected = protected.to(device=attributions.device, dtype=torch.bool)
    values = attributions.detach().to(torch.float64)
    if not torch.isfinite(values[~protected]).all():
        raise ValueError("attributions must be finite at every unprotected position")
    key = -values if descending else values
    key = key.masked_fill(protected, float("inf"))
    order = torch.sort(key, dim=1, stable=True).indices
    return order, (~protected).sum(dim=1)


def rank_positions(attributions: Tensor, protected: Tensor, *,
                   descending: bool = True) -> tuple[Tensor, Tensor]:
    """The rank of every position in :func:`relevance_order` (0 = first perturbed).

    Args:
        attributions (Tensor): ``(B, n)`` relevance per position.
        protected (Tensor): ``(B, n)`` bool; protected positions get ranks ``≥ n_tokens``.
        descending (bool): most relevant first if True.

    Returns:
        tuple[Tensor, Tensor]: ``(B, n)`` ranks and ``(B,)`` ``n_tokens``.
    """
    order, n_tokens = relevance_order(attributions, protected, descending=descending)
    ranks = torch.empty_like(order)
    steps = torch.arange(order.shape[1], device=order.device).expand_as(order)
    ranks.scatter_(1, order, steps)
    return ranks, n_tokens


def top_k_mask(attributions: Tensor, protected: Tensor, k: int | Tensor, *,
               descending: bool = True) -> Tensor:
    """The ``k`` most (or least) relevant unprotected positions of every row.

    Args:
        attributions (Tensor): ``(B, n)`` relevance per position.
        protected (Tensor): ``(B, n)`` bool, positions never chosen.
        k (int or Tensor): how many positions, one number or ``(B,)``; clipped to
                    ``n_tokens``.
        descending (bool): the most relevant if True, the least relevant otherwise.

    Returns:
        Tensor: ``(B, n)`` bool, True at the chosen positions.
    """
    ranks, _ = rank_positions(attributions, protected, descending=descending)
    k = torch.as_tensor(k, device=ranks.device)
    if (k < 0).any():
        raise ValueError("k must be non-negative")
    k = k.reshape(-1, 1) if k.dim() else k
    return (ranks < k) & ~protected.to(device=ranks.device, dtype=torch.bool)


def tokens_for_fractions(n_tokens: Tensor, fractions: Sequence[float],
                         rounding: str = "floor") -> Tensor:
    """How many tokens ``fraction × n_tokens`` is, rounded, per row and fraction.

    The product is taken in float64, as in the reference implementations (so that, as in
    DecompX, ``floor(0.7 × 90)`` is 62, not 63).

    Args:
        n_tokens (Tensor): ``(B,)`` number of unprotected tokens.
        fractions (Sequence[float]): fractions in ``[0, 1]``.
        rounding (str): ``"floor"``, ``"ceil"`` or ``"round"`` (half up).

    Returns:
        Tensor: ``(B, S)`` long, clipped to ``[0, n_tokens]``.
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    values = torch.as_tensor(list(fractions), dtype=torch.float64)
    if values.dim() != 1 or not ((values >= 0) & (values <= 1)).all():
        raise ValueError("fractions must be a sequence of numbers in [0, 1]")
    n = n_tokens.to("cpu", torch.float64).reshape(-1, 1)
    product = n * values.reshape(1, -1)
    if rounding == "floor":
        counts = torch.floor(product)
    elif rounding == "ceil":
        counts = torch.ceil(product)
    else:
        counts = torch.floor(product + 0.5)
    return torch.minimum(counts, n).to(torch.long)


def random_attribution(like: Tensor, *, generator: torch.Generator | None = None,
                       seed: int | None = None) -> Tensor:
    """A random attribution (uniform in ``[0, 1)``) with the shape of ``like``.

    Ties have probability zero, so every ordering of a row is equally likely.

    Args:
        like (Tensor): a tensor whose shape to copy, e.g. ``input_ids``.
        generator (torch.Generator, optional): the random source.
        seed (int, optional): seeds a fresh CPU generator (ignored when ``generator`` is
                    given).

    Returns:
        Tensor: float32, on the CPU.
    """
    if generator is None:
        generator = torch.Generator()
        generator.manual_seed(0 if seed is None else int(seed))
    return torch.rand(tuple(like.shape), generator=generator)


def resolve_padding_side(attention_mask: Tensor, padding_side: str | None) -> str:
    """``padding_side`` checked, or the batch's side read from its mask (``"right"`` if none)."""
    if padding_side is not None:
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        return padding_side
    real = attention_mask != 0
    if real.shape[1] == 0:
        return "right"
    left = (~real[:, 0] & real[:, -1]).any()
    right = (real[:, 0] & ~real[:, -1]).any()
    if left and right:
        raise ValueError("batch mixes left and right padding; pass padding_side")
    return "left" if left else "right"


def remove_tokens(input_ids: Tensor, attention_mask: Tensor, where: Tensor, *,
                  pad_token_id: int = 0, padding_side: str | None = None) -> PerturbedBatch:
    """Delete the marked tokens; the rows shrink and are padded again.

    The kept tokens stay in order. The result is as wide as its longest row and padded on
    the original side: ``padding_side`` if given, else left when some row starts with
    padding, else right.

    Args:
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        where (Tensor): ``(B, n)`` bool, tokens to delete (never padding).
        pad_token_id (int): the id written into new padding.
        padding_side (str, optional): ``"left"`` or ``"right"``.

    Returns:
        PerturbedBatch: the shrunk ids and mask, ``zeroed=None``.
    """
    check_batch(input_ids, attention_mask)
    where = _check_where(where, attention_mask)
    side = resolve_padding_side(attention_mask, padding_side)
    keep = (attention_mask != 0) & ~where
    lengths = keep.sum(dim=1)
    batch = input_ids.shape[0]
    width = int(lengths.max()) if batch else 0
    slot = keep.long().cumsum(dim=1) - 1
    if side == "left":
        slot = slot + (width - lengths).unsqueeze(1)
    rows = torch.arange(batch, device=input_ids.device).unsqueeze(1).expand_as(keep)
    ids = input_ids.new_full((batch, width), pad_token_id)
    mask = attention_mask.new_zeros((batch, width))
    ids[rows[keep], slot[keep]] = input_ids[keep]
    mask[rows[keep], slot[keep]] = 1
    return PerturbedBatch(ids, mask, None)


def replace_tokens(input_ids: Tensor, attention_mask: Tensor, where: Tensor,
                   token_id: int) -> PerturbedBatch:
    """Replace the marked tokens by ``token_id`` (``[MASK]``, unk, or any id).

    Args:
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        where (Tensor): ``(B, n)`` bool, tokens to replace (never padding).
        token_id (int): the replacement id.

    Returns:
        PerturbedBatch: the new ids, the same mask, ``zeroed=None``.
    """
    check_batch(input_ids, attention_mask)
    where = _check_where(where, attention_mask)
    if token_id is None:
        raise ValueError("replace needs a token_id")
    return PerturbedBatch(input_ids.masked_fill(where, int(token_id)), attention_mask, None)


def zero_embeddings(input_ids: Tensor, attention_mask: Tensor, where: Tensor) -> PerturbedBatch:
    """Keep the ids and mark the positions whose input embeddings the scorer zeroes.

    Args:
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        where (Tensor): ``(B, n)`` bool, positions to zero (never padding).

    Returns:
        PerturbedBatch: the same ids and mask, ``zeroed=where``.
    """
    check_batch(input_ids, attention_mask)
    where = _check_where(where, attention_mask)
    return PerturbedBatch(input_ids, attention_mask, where.clone())


def perturb(input_ids: Tensor, attention_mask: Tensor, where: Tensor, perturbation: str, *,
            token_id: int | None = None, pad_token_id: int = 0,
            padding_side: str | None = None) -> PerturbedBatch:
    """Apply one of ``PERTURBATIONS`` to the marked positions.

    Args:
        input_ids (Tensor): ``(B, n)`` token ids.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.
        where (Tensor): ``(B, n)`` bool, positions to perturb (never padding).
        perturbation (str): ``"remove"``, ``"replace"`` or ``"zero_embedding"``.
        token_id (int, optional): the replacement id (``"replace"`` only).
        pad_token_id (int): the padding id (``"remove"`` only).
        padding_side (str, optional): ``"left"`` or ``"right"`` (``"remove"`` only).

    Returns:
        PerturbedBatch: what to call the scorer with.
    """
    if perturbation == "remove":
        return remove_tokens(input_ids, attention_mask, where, pad_token_id=pad_token_id,
                             padding_side=padding_side)
    if perturbation == "replace":
        return replace_tokens(input_ids, attention_mask, where, token_id)
    if perturbation == "zero_embedding":
        return zero_embeddings(input_ids, attention_mask, where)
    raise ValueError(f"perturbation must be one of {PERTURBATIONS}, got {perturbation!r}")


def last_token(values: Tensor, attention_mask: Tensor) -> Tensor:
    """The entry at each row's last real position, for left or right padding.

    Args:
        values (Tensor): ``(B, n, ...)``, e.g. logits or hidden states.
        attention_mask (Tensor): ``(B, n)``, 1 for real tokens.

    Returns:
        Tensor: ``(B, ...)``.
    """
    if values.shape[:2] != attention_mask.shape:
        raise ValueError(
            f"values shape {tuple(values.shape)} does not start with the mask shape "
            f"{tuple(attention_mask.shape)}"
        )
    last = real_positions(attention_mask.to(values.device) != 0, "last")
    return values[torch.arange(values.shape[0], device=values.device), last]


def embedding_scorer(model: nn.Module, target_fn: Callable[..., Tensor], *,
                     positions_from_mask: bool = False, **forward_kwargs) -> ScoreFn:
    """A scorer for a Hugging Face model that zeroes input embeddings on request.

    The scorer looks the ids up in ``model.get_input_embeddings()``, sets the rows marked
    ``zeroed`` to zero, calls ``model(inputs_embeds=..., attention_mask=...)`` under
    ``torch.no_grad()`` and returns ``target_fn(outputs, input_ids, attention_mask)``.
    Only the token embedding is zeroed: position and segment embeddings that the model
    adds itself stay.

    Args:
        model (nn.Module): a Hugging Face model (any head, or none).
        target_fn (Callable): ``(outputs, input_ids, attention_mask) -> (B,)`` target
                    scores, or ``(B, C)`` class scores (e.g. ``outputs.logits.softmax(-1)``).
        positions_from_mask (bool): also pass ``position_ids = cumsum(attention_mask) - 1``
                    so that left padding does not shift absolute positions (GPT-2, OPT
                    style). Leave False for models whose positions carry an offset
                    (RoBERTa).
        **forward_kwargs: further constant keyword arguments of every forward call.

    Returns:
        Callable: ``score_fn(input_ids, attention_mask, zeroed=None) -> Tensor``.
    """
    if not callable(getattr(model, "get_input_embeddings", None)):
        raise ValueError(f"{type(model).__name__} has no get_input_embeddings(); pass a Hugging Face model")
    embed = model.get_input_embeddings()
    if embed is None:
        raise ValueError("model has no input embeddings (get_input_embeddings() is None)")
    if positions_from_mask and "position_ids" not in inspect.signature(model.forward).parameters:
        raise ValueError(f"{type(model).__name__}.forward takes no position_ids")

    def score_fn(input_ids: Tensor, attention_mask: Tensor, zeroed: Tensor | None = None) -> Tensor:
        check_batch(input_ids, attention_mask)
        with torch.no_grad():
            embeds = embed(input_ids)
            if zeroed is not None:
                if zeroed.shape != input_ids.shape:
                    raise ValueError(
                        f"zeroed shape {tuple(zeroed.shape)} differs from input_ids shape "
                        f"{tuple(input_ids.shape)}"
                    )
                embeds = embeds.masked_fill(zeroed.to(embeds.device, torch.bool).unsqueeze(-1), 0.0)
            kwargs = dict(forward_kwargs)
            if positions_from_mask:
                kwargs["position_ids"] = position_ids(attention_mask)
            outputs = run_model(model, inputs_embeds=embeds, attention_mask=attention_mask, **kwargs)
            return target_fn(outputs, input_ids, attention_mask)

    return score_fn
