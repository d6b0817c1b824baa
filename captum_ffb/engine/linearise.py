r"""The one-backward-pass route: the model run with its coefficients frozen.

With the real attention probabilities, norm scales, activation coefficients and MoE routing
weights held fixed, a Transformer is an affine map of its first block's input vectors
(docs/concepts.md, "How it works"). This module runs the model's own forward pass with every such
coefficient detached, so that the gradient of a target with respect to the first block's
input is the frozen map's; ``⟨∂target/∂x_j, x_j⟩`` is then token ``j``'s contribution.

Every replacement is *value-preserving*: a module's output ``z`` becomes
``z.detach() + J (u − u.detach())``, where ``u`` is what it read and ``J`` the rule's frozen
linear map. Its value is the real output exactly, so the pass computes the model's real
output; only the gradients change. Attention keeps the model's own implementation (sdpa,
eager, ...) with the queries and keys detached, so no probabilities are stored. Attention
rules that credit the scores (:class:`~captum_ffb.rules.IGAttention`,
:class:`~captum_ffb.rules.AttnLRPAttention`) add their own zero-valued gradient replacement
(:meth:`~captum_ffb.rules.ScoreCreditingAttention.linearised`) to the real output, and the
query/key norms inside the attention are frozen like the others.

The frozen maps come from the rules: :meth:`~captum_ffb.rules.LayerNorm.frozen_scale`,
:meth:`~captum_ffb.rules.IGActivation.slope`, :meth:`~captum_ffb.rules.GatedIGActivation.slopes`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.architectures.activations import activation_function
from captum_ffb.architectures.moe import MoEAdapter
from captum_ffb.architectures.spec import ArchitectureSpec, Projection
from captum_ffb.engine.block import (
    attention_method,
    config_of,
    is_present,
    norm_parameters,
    projection_columns,
    resolve,
)
from captum_ffb.engine.capture import computes_probabilities_inline, inner_norms
from captum_ffb.engine.frozen import ACTIVE, FrozenCoefficients, frozen_value
from captum_ffb.engine.head import element_wise_rule
from captum_ffb.engine.passes import (
    ModelPass,
    attention_function,
    eager_attention,
    register_attention,
)
from captum_ffb.engine.rows import AttentionRows
from captum_ffb.engine.score_path import inner_norm_rule
from captum_ffb.rules import Attention, Linear, Residual
from captum_ffb.rules.attention_scores import allowed_keys

_FROZEN_PREFIX = "captum_ffb_frozen_"
_SCORED_PREFIX = "captum_ffb_scored_"
_originals: dict[str, Callable] = {}
#: The attention rule whose gradient replacement the scored implementations add.
_scoring_rule: contextvars.ContextVar[Any] = contextvars.ContextVar("captum_ffb_scoring_rule", default=None)


def _scored_output(rule: Any, output: Tensor, query: Tensor, key: Tensor, value: Tensor, mask: Any,
                   scaling: float, softcap: float | None, transposed: bool) -> Tensor:
    shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    allowed = allowed_keys(mask if isinstance(mask, Tensor) else None, shape, query.device)
    change = rule.linearised(query, key, value, allowed, scaling, softcap)
    if transposed:
        change = change.transpose(1, 2)
    return output.detach() + change.to(output.dtype)


def _scored_implementation(original: str) -> str:
    """Register (once) an attention implementation that runs ``original`` on detached
    inputs for the value and adds the scoring rule's gradient replacement; its masks are
    explicit (eager) so that the allowed keys are known."""

    def scored(module, query, key, value, attention_mask, **kwargs):
        function = attention_function(module, original)
        output, weights = function(module, query.detach(), key.detach(), value.detach(), attention_mask, **kwargs)
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = getattr(module, "scaling", None) or query.shape[-1] ** -0.5
        output = _scored_output(_scoring_rule.get(), output, query, key, value, attention_mask,
                                float(scaling), kwargs.get("softcap"), transposed=True)
        return output, weights

    return register_attention(_SCORED_PREFIX + original, scored)


def _weighted_values(weights: Tensor, value: Tensor) -> Tensor:
    """``weights @ value`` over grouped keys and values ``(B, H, n, d_head)``.

    A key–value head's query heads are laid along the rows of one product (no copy of the
    values per query head), and the product is taken transposed, ``(vᵀ wᵀ)ᵀ``: its gradient
    with respect to the values is then ``gᵀ w``, which a batched backward (many cotangents
    ``g`` at once) runs as one product with the cotangents along its rows, where ``wᵀ g``
    copies the weights once per cotangent."""
    batch, heads, n, m = weights.shape
    groups = heads // value.shape[1]
    w = weights.to(value.dtype).reshape(batch, value.shape[1], groups * n, m)
    mixed = torch.matmul(value.transpose(-1, -2), w.transpose(-1, -2)).transpose(-1, -2)
    return mixed.reshape(batch, heads, n, value.shape[-1])


def _frozen_eager(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any,
                  **kwargs: Any) -> tuple[Tensor, Tensor]:
    """The module's eager attention with its probabilities frozen (queries and keys
    detached), its output ``(B, n, H, d_head)`` mixed from the values by
    :func:`_weighted_values`: the same numbers, with a gradient a batched backward runs
    without copying the probabilities. The eager function computes the probabilities alone
    (on values of no width); one that cannot, or whose output is not ``weights @ value``,
    runs as it is."""
    eager = eager_attention(module)
    try:
        empty, weights = eager(module, query.detach(), key.detach(), value.detach()[..., :0], attention_mask,
                               **kwargs)
    except (RuntimeError, ValueError, IndexError):
        empty, weights = None, None
    if empty is None or weights is None or weights.dim() != 4 or value.dim() != 4 \
            or weights.shape[1] % value.shape[1]:
        return eager(module, query.detach(), key.detach(), value, attention_mask, **kwargs)
    mixed = _weighted_values(weights, value).transpose(1, 2)
    if mixed.shape[:-1] != empty.shape[:-1]:  # an eager function that is not ``weights @ value``
        return eager(module, query.detach(), key.detach(), value, attention_mask, **kwargs)
    return mixed.contiguous().to(empty.dtype), weights


def _kept_weights(kept: Any) -> Tensor:
    """A recorded call's probabilities (kept, or computed again from its queries and keys)."""
    return kept.full() if isinstance(kept, AttentionRows) else kept


def _frozen_implementation(original: str, kernel: str | None = None) -> str:
    """Register (once) an attention implementation that runs ``original`` with the queries
    and keys detached, under its own name; return that name. With ``kernel`` (``"sdpa"``), a
    recording pass computes the output with that kernel on ``original``'s masks and keeps
    what computes the probabilities (:class:`~captum_ffb.engine.rows.AttentionRows`), not
    the probabilities."""

    def frozen(module, query, key, value, attention_mask, **kwargs):
        store = ACTIVE.get()
        if store is None:
            if original == "eager":
                return _frozen_eager(module, query, key, value, attention_mask, **kwargs)
            function = attention_function(module, original)
            return function(module, query.detach(), key.detach(), value, attention_mask, **kwargs)
        # a recorded (or replayed) frozen model: the probabilities of the recorded pass
        if store.replaying:
            weights = _kept_weights(store.value("attention", module, lambda: None))
            return _weighted_values(weights, value).transpose(1, 2).contiguous(), weights
        output = None
        if kernel is not None:  # the model's own kernel: the probabilities computed again where asked
            try:
                output, weights = attention_function(module, kernel)(module, query.detach(), key.detach(), value,
                                                                     attention_mask, **kwargs)
            except (RuntimeError, ValueError, TypeError):
                output = None
        if output is None and original == "eager":
            output, weights = _frozen_eager(module, query, key, value, attention_mask, **kwargs)
        elif output is None:
            output, weights = attention_function(module, original)(module, query.detach(), key.detach(), value,
                                                                   attention_mask, **kwargs)
        kept = AttentionRows(module, eager_attention(module), query.detach(), key.detach(), attention_mask,
                             dict(kwargs), value, output, None if weights is None else weights.detach())
        store.value("attention", module, lambda: kept)
        if store.scores is not None:
            scaling = kwargs.get("scaling")
            scaling = scaling if scaling is not None else getattr(module, "scaling", None) or query.shape[-1] ** -0.5
            store.scores[id(module)] = (query, key, float(scaling), attention_mask)
        return output, weights

    name = _FROZEN_PREFIX + original + ("" if kernel is None else "_via_" + kernel)
    return register_attention(name, frozen, mask=original)


def frozen_attention(run: ModelPass, methods: Mapping[str, Sequence[nn.Module]], scoring_rule: Any = None,
                     eager: bool = False, kernel: bool = False) -> None:
    """Run the pass's model with its attention's queries and keys detached (or, with a
    ``scoring_rule``, with that rule's gradient replacement).

    Args:
        run (ModelPass): the pass (its model's and owners' configs choose the attention
                    implementation).
        methods (Mapping): for attention modules that compute their probabilities in a method
                    of their own (see ``ArchitectureSpec.attention_method``): name → modules.
        scoring_rule (ScoreCreditingAttention, optional): an attention rule that credits the
                    scores (set in :data:`_scoring_rule` by :func:`linearise`).
        eager (bool): freeze the eager implementation whatever the models run (their masks
                    too): for attention code that computes its probabilities inline and
                    adds the mask itself (Falcon runs its own eager code under any
                    implementation name but "sdpa").
        kernel (bool): with ``eager``, an sdpa model's outputs still computed by sdpa (on the
                    eager masks): a recording pass that keeps no probabilities.
    """

    def replacement(current: str | None) -> str | None:
        original = "eager" if eager else (current or "eager")
        if original.startswith((_FROZEN_PREFIX, _SCORED_PREFIX)):
            return None
        if scoring_rule is not None:
            return _scored_implementation(original)
        own = kernel and current == "sdpa" and original != "sdpa"  # eager only for the recording
        return _frozen_implementation(original, "sdpa" if own else None)

    def detach_qk(module: nn.Module, original: Callable) -> Callable:
        def method(query, key, value, *args, **kwargs):
            store = ACTIVE.get()
            if scoring_rule is None and store is not None and store.replaying:
                weights = _kept_weights(store.value("attention", module, lambda: None))
                return _weighted_values(weights, value), weights
            if scoring_rule is None:
                output, weights = original(query.detach(), key.detach(), value, *args, **kwargs)
                if store is not None:
                    store.value("attention", module, weights.detach)
                    if store.scores is not None:
                        scale = getattr(module, "scale_attn", None)
                        store.scores[id(module)] = (query, key, 1.0 / float(scale) if scale is not None
                                                    else query.shape[-1] ** -0.5,
                                                    args[0] if args else kwargs.get("attention_mask"))
                return output, weights
            output, weights = original(query.detach(), key.detach(), value.detach(), *args, **kwargs)
            mask = args[0] if args else kwargs.get("attention_mask")
            scale = getattr(module, "scale_attn", None)
            scaling = 1.0 / float(scale) if scale is not None else query.shape[-1] ** -0.5
            return _scored_output(scoring_rule, output, query, key, value, mask, scaling, None,
                                  transposed=False), weights

        return method

    run.attention(replacement)
    for name, owners in methods.items():
        run.method(owners, name, detach_qk)


def _delta(u: Tensor) -> Tensor:
    """``u − u.detach()``: zero in value, the identity for gradients."""
    return u - u.detach()


class _FrozenElementWise(torch.autograd.Function):
    """``value + Σ_k c_k ⊙ (u_k − u_k.detach())`` in one step: the value forward, ``c_k ⊙ grad``
    to each ``u_k`` backward (no pass over the zero-valued deltas). A coefficient may be kept
    as factors (a norm's per-row scale and its weight): their product is formed in the
    backward only, once per call, not kept for it."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, counts: tuple[int, ...], *tensors: Tensor) -> Tensor:  # type: ignore[override]
        factors: list[Tensor] = []
        dtypes = []
        at = 0
        for count in counts:  # each u followed by its coefficient's factors
            dtypes.append(tensors[at].dtype)
            factors += tensors[at + 1:at + 1 + count]
            at += 1 + count
        ctx.save_for_backward(*factors)
        ctx.counts, ctx.dtypes = counts, dtypes
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        grads: list[Tensor | None] = [None, None]
        saved = ctx.saved_tensors
        at, index = 0, 2
        for count, dtype in zip(ctx.counts, ctx.dtypes):
            coefficient = saved[at]
            for factor in saved[at + 1:at + count]:
                coefficient = coefficient * factor
            grads.append((grad * coefficient).to(dtype) if ctx.needs_input_grad[index] else None)
            grads += [None] * count
            at, index = at + count, index + 1 + count
        return tuple(grads)


def frozen_element_wise(value: Tensor, *pairs: tuple[Tensor, Tensor | tuple[Tensor, ...]]) -> Tensor:
    """``value.detach() + Σ c ⊙ (u − u.detach())`` for pairs ``(u, c)``, with the coefficients
    ``c`` (broadcast to ``u``'s shape; a tuple: the product of its factors) fixed: the
    value-preserving form of an element-wise frozen map, computed without forming the
    deltas."""
    counts, flat = [], []
    for u, c in pairs:
        factors = c if isinstance(c, tuple) else (c,)
        counts.append(len(factors))
        flat += [u, *(f.detach() for f in factors)]
    return _FrozenElementWise.apply(value.detach(), tuple(counts), *flat)


@dataclass
class FrozenRules:
    """The frozen linear maps the backward route takes from the rules (by role)."""

    norm: Any
    activation: Any
    gated_activation: Any
    attention: Any = None

    @classmethod
    def of(cls, rules: Mapping[str, Callable]) -> FrozenRules:
        """Check the rules allow the backward route, and keep the three that carry maps (and
        an attention rule that credits the scores)."""
        scoring = rules.get("attention")
        scoring = scoring if getattr(scoring, "credits_scores", False) and \
            callable(getattr(scoring, "linearised", None)) else None
        for role, kind in (("attention", Attention), ("linear", Linear), ("residual", Residual)):
            rule = rules.get(role)
            if role == "attention" and scoring is not None:
                continue
            if rule is not None and not isinstance(getattr(rule, "rule", rule), kind):
                raise ValueError(
                    f"route='backward' runs the model's own {role}; a replaced {role!r} rule "
                    "needs route='forward'"
                )
        needs = {"norm": "frozen_scale", "activation": "slope", "gated_activation": "slopes"}
        for role, method in needs.items():
            rule = rules.get(role)
            if rule is None:
                continue
            if not getattr(rule, "linear_in_players", False):
                raise ValueError(
                    f"the {role!r} rule {type(rule).__name__} is not linear in the players; "
                    "use route='forward'"
                )
            if not callable(getattr(rule, method, None)):
                raise ValueError(
                    f"route='backward' needs the {role!r} rule's frozen linear map (a "
                    f"{method!r} method); {type(rule).__name__} has none: use route='forward'"
                )
        return cls(rules.get("norm"), element_wise_rule(rules), rules.get("gated_activation"), scoring)


@dataclass
class _Call:
    """How a block was called in the first run of a recomputing pass (to run it again)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    keyword: bool

    def hidden(self) -> Tensor:
        return self.kwargs["hidden_states"] if self.keyword else self.args[0]

    def with_hidden(self, hidden: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.keyword:
            return self.args, {**self.kwargs, "hidden_states": hidden}
        return (hidden, *self.args[1:]), self.kwargs


@dataclass
class Linearisation:
    """The frozen model of one pass (value-preserving replacements of its coefficients).

    Build with :func:`linearise`; ``inputs`` then holds the first block's input, a leaf that
    requires grad, and ``outputs`` the watched modules' outputs with their graphs. For an
    encoder–decoder, ``inputs`` is the decoder's first block's input and ``source_inputs``
    the encoder's. :meth:`gradients` takes the gradients of explained values with respect
    to them (block by block when the pass recomputes its blocks).
    """

    inputs: Tensor | None = None
    source_inputs: Tensor | None = None
    inline: bool = False
    outputs: dict[str, Tensor] = field(default_factory=dict)
    run: ModelPass | None = None
    blocks: Sequence[nn.Module] = ()
    #: with recomputation: each block's call, and the last block's output (a leaf)
    calls: dict[int, _Call] = field(default_factory=dict)
    last: Tensor | None = None
    sweeping: bool = False
    #: with separate blocks: each block's output (its graph starting at its input) and the
    #: input each block read (``inputs``, then a leaf in place of the previous block's output)
    block_outputs: list[Tensor] = field(default_factory=list)
    block_inputs: list[Tensor] = field(default_factory=list)

    @property
    def leaves(self) -> list[Tensor]:
        """The players' streams: ``[source_inputs, inputs]`` or ``[inputs]``."""
        return [self.inputs] if self.source_inputs is None else [self.source_inputs, self.inputs]

    def gradients(self, values: Sequence[Tensor]) -> list[list[Tensor]]:
        """For each ``(B,)`` value, the gradient of its sum with respect to :attr:`leaves`.

        Without recomputation, one backward pass of the frozen model each. With it, the
        blocks kept nothing for the backward pass: each value's gradient at the last block's
        output is pulled back block by block, every block run again (with its coefficients
        computed from its recorded input) once for all the values.
        """
        if not self.calls:
            return [list(torch.autograd.grad(value.sum(), self.leaves, retain_graph=k + 1 < len(values)))
                    for k, value in enumerate(values)]
        cotangents = [torch.autograd.grad(value.sum(), self.last, retain_graph=True)[0] for value in values]
        self.sweeping = True
        try:
            for index in reversed(range(len(self.blocks))):
                call = self.calls[index]
                hidden = call.hidden().detach().requires_grad_(True)
                args, kwargs = call.with_hidden(hidden)
                output = _first_tensor(self.run.call(self.blocks[index], *args, **kwargs))
                cotangents = [torch.autograd.grad(output, hidden, c, retain_graph=k + 1 < len(cotangents))[0]
                              for k, c in enumerate(cotangents)]
        finally:
            self.sweeping = False
        return [[c] for c in cotangents]


def _first_tensor(output: Any) -> Tensor:
    return output[0] if isinstance(output, tuple) else output


def _frozen_here() -> bool:
    """Whether a value-preserving replacement has work to do: a replayed pass (whose values
    are the frozen map's), or gradients being recorded (in the first run of a recomputing
    pass the blocks run without them: their replacements would change nothing)."""
    return torch.is_grad_enabled() or _replaying()


def _fixed_probabilities(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """An inline softmax's output detached (the recorded one in a replayed pass)."""
    return lambda probabilities: frozen_value("softmax", module, probabilities.detach)


def _replaying() -> bool:
    store = ACTIVE.get()
    return store is not None and store.replaying


def _norm_hook(module: nn.Module, spec: ArchitectureSpec, config: Any, rule: Any):
    weight, bias, eps = norm_parameters(module, spec, config)

    def hook(mod, args, kwargs, output):
        if not _frozen_here():
            return None
        x = args[0] if args else next(iter(kwargs.values()))
        real = x.detach()
        scale = frozen_value("norm", mod, lambda: rule.frozen_scale(real.to(torch.float32), eps)).to(x.dtype)
        replay = _replaying()  # the recorded frozen map on the whole input, not value-preserving
        centres = getattr(rule, "centres", False)
        if not replay and not centres:  # one product per gradient; the scale and weight kept apart
            factors = (scale[..., None].to(x.dtype),) if weight is None else \
                (scale[..., None].to(x.dtype), weight.detach().to(x.dtype))
            return frozen_element_wise(output, (x, factors))
        delta = x if replay else _delta(x)
        if centres:
            delta = delta - delta.mean(dim=-1, keepdim=True)
        delta = delta * scale[..., None]
        if weight is not None:
            delta = delta * weight.detach()
        if replay:
            return (delta if bias is None else delta + bias.detach()).to(output.dtype)
        return output.detach() + delta.to(output.dtype)

    return hook


def _keep_output(store: dict[str, Tensor], key: str, copy: bool = False):
    def hook(module, args, output):
        kept = output[0] if isinstance(output, tuple) else output
        # with ``copy``, a copy in the graph: some blocks add to a writer's output in place
        # (Falcon adds the attention's output to its MLP's)
        store[key] = kept.clone() if copy else kept

    return hook


def _keep_input(store: dict[str, Tensor], key: str):
    def hook(module, args):
        if key not in store and args:
            store[key] = args[0]

    return hook


def _activation_between(store: dict[str, Tensor], key: str, fn: Callable[[Tensor], Tensor], rule: Any,
                        columns: Any = slice(None)):
    """A pre-hook on the module after an element-wise activation: its input ``g(S)`` becomes
    ``g(S).detach() + (S − S.detach()) ⊙ slope``, with ``S`` the previous module's output."""

    def hook(module, args):
        z = args[0]
        s = store.pop(key)[..., columns]
        if not _frozen_here():
            return None
        slope = frozen_value("activation", module, lambda: rule.slope(fn, s.detach().to(torch.float32))).to(z.dtype)
        if _replaying():  # the frozen map, linear in the pre-activation
            return (s * slope, *args[1:])
        return (frozen_element_wise(z, (s, slope)), *args[1:])

    return hook


def _gated_between(store: dict[str, Tensor], gate_key: str, up_key: str, fn: Callable, rule: Any,
                   gate_columns: Any = slice(None), up_columns: Any = slice(None)):
    """A pre-hook on the down projection of a gated FF: ``g(A) ⊙ B`` becomes its value plus
    ``c_A ⊙ ΔA + c_B ⊙ ΔB``."""

    def hook(module, args):
        z = args[0]
        a = store[gate_key][..., gate_columns]
        b = store[up_key][..., up_columns]
        store.pop(gate_key)
        store.pop(up_key, None)  # kept no longer than needed (the values, not the graph)
        if not _frozen_here():
            return None
        coeff_a, coeff_b = frozen_value("gated", module, lambda: rule.slopes(
            fn, a.detach().to(torch.float32), b.detach().to(torch.float32)))
        if _replaying():  # the frozen map: c_A ⊙ A + c_B ⊙ B
            return (a * coeff_a.to(z.dtype) + b * coeff_b.to(z.dtype), *args[1:])
        return (frozen_element_wise(z, (a, coeff_a.to(z.dtype)), (b, coeff_b.to(z.dtype))), *args[1:])

    return hook


def _detach_output(module, args, output):
    def detached() -> Any:
        if isinstance(output, tuple):
            return tuple(o.detach() if isinstance(o, Tensor) and o.is_floating_point() else o for o in output)
        return output.detach()

    return frozen_value("fixed", module, detached)


def _experts_hook(moe: MoEAdapter, rule: Any):
    """Σ_e w_e ⊙ expert_e(x), linearised: each expert's gated activation frozen, the routing
    weights (detached by the router hook) fixed."""
    fn = moe.activation

    def hook(module, args, kwargs, output):
        if not _frozen_here():
            return None
        x, top_index, top_weights = moe.experts_arguments(args, kwargs)
        replay = _replaying()
        dx = x if replay else _delta(x)
        real = x.detach()
        weights = moe.dense_routing(top_weights.detach(), top_index, x.dtype)
        extra = torch.zeros_like(real)
        for expert in torch.nonzero(weights.abs().sum(0)).flatten().tolist():
            w_gate, w_up, w_down = (weight.detach() for weight in moe.expert_weights(expert))
            coeff_a, coeff_b = frozen_value(f"expert {expert}", module, lambda g=w_gate, u=w_up: rule.slopes(
                fn, (real @ g).float(), (real @ u).float()))
            hidden = (dx @ w_gate) * coeff_a.to(x.dtype) + (dx @ w_up) * coeff_b.to(x.dtype)
            extra = extra + (hidden @ w_down) * weights[:, expert, None]
        return extra if replay else output.detach() + extra

    return hook


def _projection_columns(projection: Projection, module: nn.Module, config: Any) -> Any:
    width = module.weight.shape[0] if isinstance(module, nn.Linear) else module.weight.shape[1]
    return projection_columns(projection, config, width)[0]


@dataclass
class _Hooks:
    """Puts the hooks of one :func:`linearise` on the model, into ``state``."""

    run: ModelPass
    spec: ArchitectureSpec
    config: Any
    frozen: FrozenRules
    state: Linearisation

    def leaf_input(self, first_block: nn.Module, name: str = "inputs") -> None:
        """The first block's input becomes a leaf that requires grad (``state.<name>``)."""
        state = self.state

        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            if getattr(state, name) is not None:
                return None
            leaf = hidden.detach().requires_grad_(True)
            setattr(state, name, leaf)
            if args:
                return (leaf, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": leaf}

        self.run.before(first_block, hook, with_kwargs=True)

    def inline_attention(self, block: nn.Module, method: str | None) -> None:
        """Attention modules computing their probabilities inline (no attention interface,
        no spec method; cross-attention too): their softmax's output detached (and the
        model run with the eager masks, ``state.inline``)."""
        spec = self.spec
        modules = [(resolve(block, spec.attention), method)]
        if spec.has_cross_attention:
            modules.append((resolve(block, spec.cross_attention), None))
        for module, own in modules:
            if computes_probabilities_inline(module, own):
                if self.frozen.attention is not None:
                    raise ValueError(
                        f"{getattr(self.config, 'model_type', 'this model')}'s attention computes its "
                        "probabilities inline, without transformers' attention interface, so its queries "
                        "and keys cannot be read: rules that credit them are not available; use the "
                        "frozen-attention rules (the default)")
                self.state.inline = True
                self.run.softmax(module, _fixed_probabilities(module))

    def norm(self, module: nn.Module | None, rule: Any = None) -> None:
        """Freeze a norm's scale (the norm rule's, or ``rule``'s)."""
        if module is not None:
            hook = _norm_hook(module, self.spec, self.config, self.frozen.norm if rule is None else rule)
            self.run.after(module, hook, with_kwargs=True)

    def block(self, block: nn.Module, index: int | str) -> None:
        """Freeze one block's norms (and its attention's query/key norms when the scores are
        credited) and its feed-forward."""
        spec = self.spec.for_block(block)
        if spec is not self.spec:  # a decoder block, or the family's other FF layout
            replace(self, spec=spec).block(block, index)
            return
        for role in spec.norm_roles():
            if is_present(block, getattr(spec, role)):
                self.norm(resolve(block, getattr(spec, role)))
        store = ACTIVE.get()
        if self.frozen.attention is not None or (store is not None and store.scores is not None):
            for inner in inner_norms(resolve(block, spec.attention)).values():
                self.norm(inner, inner_norm_rule(inner))
        moe = MoEAdapter.of(block, spec)
        if moe is not None:
            self.mixture_of_experts(moe, f"{index}:")
        else:
            self.dense_feed_forward(block, f"{index}:")

    def mixture_of_experts(self, moe: MoEAdapter, key: str) -> None:
        """Routing weights (and the shared expert's gate) fixed, experts linearised."""
        store, gated = self.state.outputs, self.frozen.gated_activation
        self.run.after(moe.router, _detach_output)
        self.run.after(moe.experts, _experts_hook(moe, gated), with_kwargs=True)
        shared = moe.shared_expert
        if shared is not None:
            self.run.after(shared.gate, _keep_output(store, key + "shared_gate"))
            self.run.after(shared.up, _keep_output(store, key + "shared_up"))
            self.run.before(shared.down, _gated_between(
                store, key + "shared_gate", key + "shared_up", shared.activation, gated))
            self.run.after(moe.shared_expert_gate, _detach_output)

    def dense_feed_forward(self, block: nn.Module, key: str) -> None:
        """The activation between the FF's projections linearised (gated or element-wise)."""
        spec, config, store = self.spec, self.config, self.state.outputs
        ff_in = resolve(block, spec.ff_in.path)
        ff_out = resolve(block, spec.ff_out.path)
        fn = resolve(block, spec.activation)
        up_columns = _projection_columns(spec.ff_in, ff_in, config)
        self.run.after(ff_in, _keep_output(store, key + "up"))
        if spec.ff_gate is None:
            self.run.before(ff_out, _activation_between(store, key + "up", fn, self.frozen.activation, up_columns))
            return
        gate = resolve(block, spec.ff_gate.path)
        gate_columns = _projection_columns(spec.ff_gate, gate, config)
        if gate is not ff_in:
            self.run.after(gate, _keep_output(store, key + "gate"))
        gate_key = key + ("gate" if gate is not ff_in else "up")
        self.run.before(ff_out, _gated_between(
            store, gate_key, key + "up", fn, self.frozen.gated_activation, gate_columns, up_columns))

    def head(self, head_steps: Sequence[tuple[str, Any]]) -> None:
        """The head's element-wise activations linearised between its dense layers."""
        store = self.state.outputs
        previous: nn.Module | None = None
        for position, (kind, item) in enumerate(head_steps):
            if kind == "linear":
                self.run.after(item, _keep_output(store, f"head:{position}"))
                previous = item
            elif kind == "norm":  # a norm inside the head (ModernBERT's): its scale frozen
                self.norm(item)
            elif kind == "activation":
                following = next((m for k, m in head_steps[position + 1:] if k in ("linear", "norm")), None)
                if previous is None or following is None:
                    raise ValueError("a head activation must sit between a dense layer and a dense layer or norm")
                fn = item if callable(item) else activation_function(item)
                self.run.before(following, _activation_between(store, f"head:{position - 1}", fn,
                                                               self.frozen.activation))

    def watch(self, modules: Mapping[str, nn.Module], inputs: Mapping[str, nn.Module]) -> None:
        """Keep the outputs of ``modules`` and the first inputs of ``inputs`` (with their
        graphs) by name."""
        for name, module in modules.items():
            self.run.after(module, _keep_output(self.state.outputs, name, copy=True))
        for name, module in inputs.items():
            self.run.before(module, _keep_input(self.state.outputs, name))


    def recompute(self, blocks: Sequence[nn.Module]) -> None:
        """Keep no block's tensors for the backward pass: in the first run each block runs
        without gradients (its call recorded, its output handed on as a leaf), and
        :meth:`Linearisation.gradients` runs each block again, last first, to pull the
        gradients back through it. Each block is run again by this code, in this thread, as
        a whole: nothing depends on a recomputation saving what the first run saved."""
        state = self.state
        state.blocks = list(blocks)
        last = len(blocks) - 1

        def enter(index: int):
            def hook(module, args, kwargs):
                if state.sweeping:
                    return None
                state.calls[index] = _Call(tuple(args), dict(kwargs), not args)
                torch.set_grad_enabled(False)
                return None

            return hook

        def leave(index: int):
            def hook(module, args, kwargs, output):
                if state.sweeping:
                    return None
                torch.set_grad_enabled(True)
                hidden = _first_tensor(output).detach().requires_grad_(True)
                if index == last:
                    state.last = hidden
                return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

            return hook

        for index, block in enumerate(blocks):
            self.run.before(block, enter(index), with_kwargs=True)
            self.run.after(block, leave(index), with_kwargs=True)

    def separate_blocks(self, blocks: Sequence[nn.Module]) -> None:
        """Each block's graph on its own: a block's output (kept, with its graph) is handed on
        as a new leaf, so a gradient can be pulled back through one block at a time
        (``state.block_outputs[l]`` with respect to ``state.block_inputs[l]``)."""
        state = self.state
        count = len(blocks)

        def hook(module, args, kwargs, output):
            if not state.block_inputs:
                state.block_inputs.append(state.inputs)
            hidden = _first_tensor(output)
            state.block_outputs.append(hidden)
            if len(state.block_outputs) == count:  # the last block's output goes on as it is
                return None
            leaf = hidden.detach().requires_grad_(True)
            state.block_inputs.append(leaf)
            return (leaf, *output[1:]) if isinstance(output, tuple) else leaf

        for block in dict.fromkeys(blocks):  # a block shared by several layers (ALBERT) once
            self.run.after(block, hook, with_kwargs=True)


@contextlib.contextmanager
def linearise(
    run: ModelPass,
    spec: ArchitectureSpec,
    blocks: Sequence[nn.Module],
    rules: Mapping[str, Callable],
    final_norm: nn.Module | None = None,
    head_steps: Sequence[tuple[str, Any]] = (),
    watch: Mapping[str, nn.Module] | None = None,
    *,
    watch_inputs: Mapping[str, nn.Module] | None = None,
    recompute: bool = False,
    separate_blocks: bool = False,
    source: tuple[ArchitectureSpec, Sequence[nn.Module], nn.Module | None] | None = None,
    coefficients: FrozenCoefficients | None = None,
    eager_attention: bool = False,
) -> Iterator[Linearisation]:
    r"""Freeze the model's coefficients for the runs of the pass ``run`` made inside the context.

    Args:
        run (ModelPass): a pass with gradients (``ModelPass(model, grad=True)``), entered.
        spec (ArchitectureSpec): the family's spec.
        blocks (Sequence[nn.Module]): its blocks, in order (the first one's input becomes a
                    leaf that requires grad).
        rules (Mapping): role → rule (the frozen maps come from them).
        final_norm (nn.Module, optional): the norm after the last block.
        head_steps (Sequence): the head's layers after the final norm, as
                    ``("linear", module)`` and ``("activation", fn)`` pairs (``fn`` a function
                    or its name in :data:`~captum_ffb.architectures.activations.ACTIVATIONS`),
                    in order.
        watch (Mapping, optional): name → module whose output to keep (with its graph).
        watch_inputs (Mapping, optional): name → module whose first input to keep (with its
                    graph), in ``outputs`` too.
        recompute (bool): keep no block's intermediate tensors for the backward pass and run
                    each block again during it instead (:meth:`_Hooks.recompute`): memory of
                    one block instead of all, for about one more forward pass; take the
                    gradients with :meth:`Linearisation.gradients`.
        separate_blocks (bool): each block's graph starts at a leaf of its own
                    (:meth:`_Hooks.separate_blocks`), for backward sweeps that carry many
                    cotangents block by block.
        source (tuple, optional): for an encoder–decoder, the encoder's ``(spec, blocks,
                    final norm)``: frozen too, its first block's input the leaf
                    ``source_inputs`` (``blocks`` and ``final_norm`` are then the decoder's).
        coefficients (FrozenCoefficients, optional): record every coefficient of this pass
                    into it, or (``coefficients.replayed()``) run the frozen model of a
                    recorded pass: its coefficients, applied to whatever this pass computes
                    (see :mod:`captum_ffb.engine.frozen`; attention runs eager to record).
        eager_attention (bool): run the frozen attention eagerly, its probabilities
                    materialised, whatever the model runs: their product with the values is
                    then the whole backward pass through attention, which a batched backward
                    (many cotangents at once) runs as one product, where a fused kernel's
                    backward runs once per cotangent.

    Yields:
        Linearisation
    """
    frozen = _frozen_rules(run, rules, coefficients, recompute, separate_blocks, source)
    state = Linearisation(run=run)
    hooks = _Hooks(run, spec, config_of(run.model), frozen, state)
    token = ACTIVE.set(coefficients)
    scoring = _scoring_rule.set(frozen.attention)
    try:
        methods = _hook_stacks(hooks, blocks, source)
        hooks.norm(final_norm)
        hooks.head(head_steps)
        hooks.watch(watch or {}, watch_inputs or {})
        if recompute:
            hooks.recompute(blocks)
        if separate_blocks:
            hooks.separate_blocks(blocks)
        frozen_attention(run, methods, frozen.attention,
                         eager=state.inline or coefficients is not None or eager_attention,
                         kernel=not (state.inline or eager_attention))
        yield state
    finally:
        _scoring_rule.reset(scoring)
        ACTIVE.reset(token)


def _frozen_rules(run: ModelPass, rules: Mapping[str, Callable], coefficients: FrozenCoefficients | None,
                  recompute: bool, separate_blocks: bool, source: Any) -> FrozenRules:
    """The frozen maps of ``rules``, once :func:`linearise`'s options are checked together
    (``ValueError`` for a pass without gradients or options that exclude each other)."""
    if not run.grad:
        raise ValueError("a frozen model's pass runs with gradients: ModelPass(model, grad=True)")
    frozen = FrozenRules.of(rules)
    if coefficients is not None and (recompute or frozen.attention is not None):
        raise ValueError("a recorded frozen model keeps frozen probabilities and every block's tensors "
                         "(no rule that credits the scores, no recomputation)")
    if separate_blocks and (recompute or source is not None):
        raise ValueError("separate blocks are for one stack whose blocks keep their tensors")
    if recompute and source is not None:
        raise ValueError("an encoder–decoder's frozen pass keeps its blocks' tensors (no recomputation)")
    return frozen


def _hook_stacks(hooks: _Hooks, blocks: Sequence[nn.Module],
                 source: tuple[ArchitectureSpec, Sequence[nn.Module], nn.Module | None] | None,
                 ) -> dict[str, list[nn.Module]]:
    """The leaf inputs and every block's hooks, of the stack and of an encoder–decoder's
    encoder (``source``, its blocks keyed ``source.<index>``); returns the attention modules
    by attention method, for :func:`frozen_attention`."""
    methods: dict[str, list[nn.Module]] = {}
    hooks.leaf_input(blocks[0])
    stacks = [(hooks, blocks, "")]
    if source is not None:
        source_spec, source_blocks, source_norm = source
        source_hooks = replace(hooks, spec=source_spec)
        source_hooks.leaf_input(source_blocks[0], "source_inputs")
        source_hooks.norm(source_norm)
        stacks.append((source_hooks, source_blocks, "source."))
    for stack_hooks, stack_blocks, prefix in stacks:
        for index, block in enumerate(stack_blocks):
            attention = resolve(block, stack_hooks.spec.attention)
            method = attention_method(attention, stack_hooks.spec)
            if method is not None:
                methods.setdefault(method, []).append(attention)
            stack_hooks.inline_attention(block, method)
            stack_hooks.block(block, f"{prefix}{index}")
    return methods
