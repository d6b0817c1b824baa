r"""Presence attribution: what removing each group of a context would do to the answer.

Removing a group of tokens from a causal LM's prompt takes its keys away from every later
token's attention. Give group ``g`` a presence ``t_g ∈ [0, 1]`` and add ``log t_g`` to the
attention logits of its keys for every query outside the group, in every layer:
``t_g = 1`` is the model's own pass and ``t_g = 0`` the pass without the group (its tokens
still hold their positions). The value ``f(t)`` is then a smooth function of the presences,
and a group's attribution is Integrated Gradients along ``t = s·1``, ``s`` from 0 to 1:

    a_g = ∫₀¹ ∂f/∂t_g (s·1) ds ≈ (1/m) Σ_k ∂f/∂t_g (s_k·1),   s_k = (k + ½)/m,

so that ``Σ_g a_g = f(1) − f(0)`` (the value with every group minus the value with none)
up to the ``m``-step midpoint rule's residual, which is reported. Each step is one forward
and one backward pass, whatever the number of groups; ``m = 2`` (the default, chosen on
questions held out from the evaluation, ``results/context/``) takes the gradients with every
group a quarter and three quarters present. It answers the question ablation methods
(leave-one-out, ContextCite) answer, and it is not a decomposition of the value into token
terms.

The presences ride on a custom 4D attention mask, which the model must apply as given in
every layer: a model whose own pass differs from the pass at ``t = 1`` (checked the first time
a model is seen: a sliding window, a chunked or bidirectional mask), that attends within a
window or chunks shorter than the prompt (by its configuration, every time), or whose
attention refuses a 4D mask is refused.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from captum_ffb._private import effective_attention_implementation
from captum_ffb.engine.head import output_logits
from captum_ffb.engine.passes import ModelPass, run_model
from captum_ffb.explained.readouts import AnswerLogProbability, NextToken, ReadOut
from captum_ffb.long_context.blocks import BlockPlan, Unsupported, block_plan, presences_by_blocks

__all__ = ["PresenceResult", "mask_bytes", "presence_attribution", "prompt_value"]


@dataclass
class PresenceResult:
    """Groups' presence attributions.

    Attributes:
        contributions (Tensor): ``(G,)`` each group's attribution (float64, on the CPU).
        value (float): the explained value in the model's own pass.
        without (float): its value with every group absent (the reference).
        delta (float): the completeness residual ``|Σ contributions + without − value|``.
        unit (int, optional): the explained token, where it is one token's logit.
    """

    contributions: Tensor
    value: float
    without: float
    delta: float
    unit: int | None = None


def presence_attribution(model: Any, ids: Tensor, token_groups: list[int], n_groups: int,
                         readout: ReadOut, steps: int = 2, ends: bool = True, blocks: bool = True
                         ) -> PresenceResult:
    """The presence attributions of ``n_groups`` groups of the tokens of ``ids``.

    Args:
        model: a Hugging Face causal LM (its forward takes a 4D float ``attention_mask``).
        ids (Tensor): ``(1, n)`` the tokens fed to the model (an answer's included but its last).
        token_groups (list[int]): each token's group; negative for tokens in no group.
        n_groups (int): the number of groups.
        readout (ReadOut): what is explained: a :class:`~captum_ffb.explained.readouts.NextToken`
                    (``token`` ``None``: the predicted one) or an
                    :class:`~captum_ffb.explained.readouts.AnswerLogProbability` with its
                    positions (its log-probability itself, not a linear read of it).
        steps (int): midpoints of the path's rule (``2``: gradients at ``t = ¼`` and ``¾``;
                    ``1``: one at ``t = ½``).
        ends (bool): run the passes at the path's ends, the model's own and the one without
                    the groups (``False``: skipped once the model is known to apply the mask
                    as given and the token is named; ``value``, ``without`` and ``delta`` are
                    then NaN, for a caller that has the value from another pass).
        blocks (bool): the gradients' passes attend by blocks of queries
                    (:mod:`~captum_ffb.long_context.blocks`: memory linear in the prompt's
                    length, the same numbers) where each group is one run of tokens and the
                    model attends through transformers' ``sdpa``, checked against the mask on
                    the first use with each model (one pass more); ``False``: always the
                    ``n × n`` mask, whose attention weights (:func:`mask_bytes`) are kept for
                    the backward pass.

    Returns:
        PresenceResult: the attributions, the value with and without the groups, the residual.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not isinstance(ends, bool):
        raise TypeError(f"ends must be True or False, got {type(ends).__name__}")
    if not isinstance(blocks, bool):
        raise TypeError(f"blocks must be True or False, got {type(blocks).__name__}")
    n = ids.shape[1]
    if len(token_groups) != n:
        raise ValueError(f"{len(token_groups)} token groups for {n} tokens")
    _check_full_attention(model, n)
    device = ids.device
    groups = torch.tensor(token_groups, device=device)
    read = _Reader(model, readout, n)
    value = without = math.nan
    unnamed = isinstance(readout, NextToken) and readout.token is None
    if ends or unnamed or not _checked(model):
        with torch.no_grad():
            own = read.forward(ids)
            readout = read.resolve(own)
            value = float(read.value(own))
            without = _without(read, ids, groups, n_groups, value)
    total = torch.zeros(n_groups, dtype=torch.float64, device=device)
    plan = block_plan(groups) if blocks else None
    for k in range(steps):
        s = (k + 0.5) / steps
        log_presence = torch.full((n_groups,), math.log(s), dtype=torch.float64, device=device,
                                  requires_grad=True)
        out = _presence_pass(read, ids, groups, log_presence, plan)
        (grad,) = torch.autograd.grad(read.value(out).sum(), log_presence)
        total += grad / s  # ∂f/∂t = ∂f/∂log t / t
    contributions = (total / steps).detach().cpu()
    delta = abs(float(contributions.sum()) + without - value)
    unit = int(readout.token) if isinstance(readout, NextToken) else None
    return PresenceResult(contributions, value, without, delta, unit)


#: The models (and their attention implementations) seen to apply a presence mask as given.
_CHECKED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _checked(model: Any) -> bool:
    """Whether ``model`` (with its attention implementation) was seen to apply a presence mask
    as given."""
    implementation = str(effective_attention_implementation(getattr(model, "config", None)))
    return implementation in _CHECKED.get(model, set())


def mask_bytes(model: Any, n: int) -> int:
    """The bytes of the attention weights a pass of ``model`` with a presence mask that needs a
    gradient keeps for the backward pass at ``n`` tokens: ``n²`` per head and layer (0 where
    its configuration does not say its heads and layers)."""
    config = getattr(model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    if not isinstance(layers, int) or not isinstance(heads, int):
        return 0
    return layers * heads * n * n * next(model.parameters()).element_size()


#: Per model and attention implementation: whether the block attention gave the mask's value.
_BLOCKS: weakref.WeakKeyDictionary[Any, dict[str, bool]] = weakref.WeakKeyDictionary()


def _presence_pass(read: _Reader, ids: Tensor, groups: Tensor, log_presence: Tensor, plan: BlockPlan | None) -> Any:
    """One pass with gradients at the presences ``exp(log_presence)``: by blocks where
    ``plan`` is given and the model's attention takes them (its value compared with the mask's
    on the first use with each model), else through the ``n × n`` mask."""
    dtype = next(read.model.parameters()).dtype
    implementation = str(effective_attention_implementation(getattr(read.model, "config", None)))
    verdicts = _BLOCKS.get(read.model, {})
    if plan is not None and verdicts.get(implementation) is not False:
        calls: list[int] = []
        try:
            out = read.forward(ids, grad=True, blocks=(plan, log_presence, calls))
        except Unsupported:
            out = None
        if out is not None and calls and (verdicts.get(implementation) or _same_as_mask(read, ids, groups, log_presence, out)):
            _BLOCKS.setdefault(read.model, {})[implementation] = True
            return out
        _BLOCKS.setdefault(read.model, {})[implementation] = False
    return read.forward(ids, _log_mask(groups, log_presence[None], dtype), grad=True)


def _same_as_mask(read: _Reader, ids: Tensor, groups: Tensor, log_presence: Tensor, out: Any) -> bool:
    """Whether the block attention's pass ``out`` gives the value the mask's pass gives."""
    dtype = next(read.model.parameters()).dtype
    with torch.no_grad():
        masked = float(read.value(read.forward(ids, _log_mask(groups, log_presence.detach()[None], dtype)))[0])
    found = float(read.value(out)[0].detach())
    tolerance = (1e-4 if dtype in (torch.float32, torch.float64) else 2e-2) * (1 + abs(masked))
    return abs(found - masked) <= tolerance


def _without(read: _Reader, ids: Tensor, groups: Tensor, n_groups: int, value: float) -> float:
    """The value with every group absent. The first time a model (with its attention
    implementation) is seen, the same pass with every group present is checked against its own
    value: a model that does not apply the mask as given is refused."""
    model, n = read.model, ids.shape[1]
    dtype = next(model.parameters()).dtype
    implementation = str(effective_attention_implementation(getattr(model, "config", None)))
    checked = _checked(model)
    ends = torch.zeros(1 if checked else 2, n_groups, dtype=torch.float64, device=ids.device)
    if not checked:
        ends[0] = 1.0  # every group present, then none
    try:
        rows = read.forward(ids.expand(len(ends), n), _presence_mask(groups, ends, dtype))
    except (TypeError, ValueError, IndexError, RuntimeError) as error:
        raise ValueError(f"{type(model).__name__} does not take a custom 4D attention mask ({error}): presence "
                         "attribution needs one") from error
    found = [float(v) for v in read.value(rows)]
    if not checked:
        tolerance = (1e-4 if dtype in (torch.float32, torch.float64) else 2e-2) * (1 + abs(value))
        if not abs(found[0] - value) <= tolerance:
            raise ValueError(f"{type(model).__name__} does not apply a custom attention mask as given (its own pass "
                             f"gives {value:.6g}, the pass with every group present {found[0]:.6g}): presence "
                             "attribution needs one mask over full attention in every layer")
        _CHECKED.setdefault(model, set()).add(implementation)
    return found[-1]


def _presence_mask(groups: Tensor, presences: Tensor, dtype: torch.dtype) -> Tensor:
    """``(B, 1, n, n)`` the additive mask of presences ``(B, G)`` in ``{0, 1}``."""
    return _log_mask(groups, torch.where(presences > 0, 0.0, -math.inf).to(presences), dtype)


def _log_mask(groups: Tensor, log_presence: Tensor, dtype: torch.dtype) -> Tensor:
    """``(B, 1, n, n)``: causal, and ``log t_g`` on group ``g``'s keys for queries outside it
    (the most negative number of ``dtype`` where a key is masked)."""
    n, floor = groups.shape[0], torch.finfo(dtype).min
    inside = groups >= 0
    per_key = torch.where(inside, log_presence[:, groups.clamp_min(0)], log_presence.new_zeros(()))  # (B, n)
    same = (groups[:, None] == groups[None, :]) & inside[:, None]
    bias = torch.where(same, log_presence.new_zeros(()), per_key[:, None, :]).clamp_min(floor)  # (B, n, n)
    causal = torch.ones(n, n, dtype=torch.bool, device=groups.device).triu(1)
    bias = bias.masked_fill(causal, floor)
    return bias[:, None].to(dtype)


def prompt_value(model: Any, ids: Tensor, readout: ReadOut) -> float:
    """The explained value in the model's own pass on ``ids`` ``(1, n)``: a
    :class:`~captum_ffb.explained.readouts.NextToken`'s logit (its token named) or an
    :class:`~captum_ffb.explained.readouts.AnswerLogProbability`'s log-probability (its
    positions given, in ``ids``)."""
    read = _Reader(model, readout, ids.shape[1])
    with torch.no_grad():
        return float(read.value(read.forward(ids))[0])


class _Reader:
    """The model's passes with only the explained positions' logits (``logits_to_keep``, where
    the model takes it), and the read-out's value in them."""

    def __init__(self, model: Any, readout: ReadOut, n: int) -> None:
        if not isinstance(readout, (NextToken, AnswerLogProbability)):
            raise TypeError(f"presence attribution explains a token's logit or an answer's log-probability, not a "
                            f"{type(readout).__name__}")
        self.model, self.readout, self.n = model, readout, n
        self.keep = 1
        if isinstance(readout, AnswerLogProbability):
            if readout.positions is None:
                raise ValueError("an answer's log-probability is read where its tokens are fed: give its positions")
            self.keep = n - min(readout.positions)
        self.kept = self._shifted(readout)
        self.takes_keep = True

    def _shifted(self, readout: ReadOut) -> ReadOut:
        if isinstance(readout, AnswerLogProbability):
            return replace(readout, positions=tuple(p - (self.n - self.keep) for p in readout.positions))
        return readout

    def forward(self, ids: Tensor, mask: Tensor | None = None, grad: bool = False,
                blocks: tuple[BlockPlan, Tensor, list[int]] | None = None) -> Any:
        """One pass of the model (through the pass runner; ``grad``: with the inputs'
        gradients; ``blocks``: a plan, the log-presences and a list of calls, to attend by
        blocks)."""
        kwargs = {} if mask is None else {"attention_mask": mask}
        if self.takes_keep:
            try:
                return self._run(ids, grad, blocks, logits_to_keep=self.keep, **kwargs)
            except TypeError as error:  # a model without it: every position's logits
                if "logits_to_keep" not in str(error):
                    raise
                self.takes_keep = False
        return self._run(ids, grad, blocks, **kwargs)

    def _run(self, ids: Tensor, grad: bool, blocks: tuple[BlockPlan, Tensor, list[int]] | None, **kwargs: Any) -> Any:
        if blocks is None:
            return run_model(self.model, ids, grad=grad, **kwargs)
        plan, log_presence, calls = blocks
        with ModelPass(self.model, grad=grad) as run, presences_by_blocks(run, plan, log_presence) as seen:
            out = run.run(ids, **kwargs)
        calls.extend(seen)
        return out

    def resolve(self, outputs: Any) -> ReadOut:
        """The read-out with its predicted token named (``NextToken(None)``)."""
        self.readout = _resolved(self.readout, outputs)
        self.kept = self._shifted(self.readout)
        return self.readout

    def value(self, outputs: Any) -> Tensor:
        """``(B,)`` the explained value in each row of ``outputs``."""
        kept = output_logits(outputs).shape[1] == self.keep and self.keep < self.n
        return _scalar(self.kept if kept else self.readout, outputs)


def _resolved(readout: ReadOut, outputs: Any) -> ReadOut:
    """The read-out with its predicted token named (``NextToken(None)``)."""
    if isinstance(readout, NextToken) and readout.token is None:
        return NextToken(int(output_logits(outputs)[0, -1].argmax()))
    return readout


def _scalar(readout: ReadOut, outputs: Any) -> Tensor:
    """``(B,)`` the explained value in each row of ``outputs``."""
    logits = output_logits(outputs)
    mask = torch.ones(logits.shape[:2], dtype=torch.long, device=logits.device)
    if isinstance(readout, AnswerLogProbability):
        return readout.log_probability(outputs, mask)
    return readout.value(outputs, mask)


def _check_full_attention(model: Any, n: int) -> None:
    """``ValueError`` for a model whose attention is windowed or chunked within ``n`` tokens."""
    config = getattr(model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    if config is None:
        return
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    windowed = any(kind != "full_attention" for kind in layer_types) or (
        not layer_types and getattr(config, "use_sliding_window", True) is not False)
    if isinstance(window, int) and window < n and windowed:
        raise ValueError(f"{type(model).__name__} attends within a window of {window} tokens and the prompt has {n}: "
                         "presence attribution needs full attention in every layer")
    chunk = getattr(config, "attention_chunk_size", None)
    if isinstance(chunk, int) and chunk < n:
        raise ValueError(f"{type(model).__name__} attends within chunks of {chunk} tokens and the prompt has {n}: "
                         "presence attribution needs full attention in every layer")
