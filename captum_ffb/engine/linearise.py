r"""The one-backward-pass route: the model run with its coefficients frozen.

With the real attention probabilities, norm scales, activation coefficients and MoE routing
weights held fixed, a Transformer is an affine map of its first block's input vectors
(METHOD.md, "Whole model"). This module runs the model's own forward pass with every such
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
    _columns,
    attention_method,
    config_of,
    is_present,
    norm_parameters,
    resolve,
)
from captum_ffb.engine.capture import (
    attention_function,
    attention_implementation,
    computes_probabilities_inline,
    eager_attention,
    inner_norms,
    patched_attention_methods,
    softmax_hooks,
)
from captum_ffb.engine.frozen import ACTIVE, FrozenCoefficients, frozen_value
from captum_ffb.engine.head import element_wise_rule
from captum_ffb.engine.scores import inner_norm_rule
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
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    name = _SCORED_PREFIX + original
    if name in _originals:
        return name

    def scored(module, query, key, value, attention_mask, **kwargs):
        function = attention_function(module, original)
        output, weights = function(module, query.detach(), key.detach(), value.detach(), attention_mask, **kwargs)
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = getattr(module, "scaling", None) or query.shape[-1] ** -0.5
        output = _scored_output(_scoring_rule.get(), output, query, key, value, attention_mask,
                                float(scaling), kwargs.get("softcap"), transposed=True)
        return output, weights

    AttentionInterface.register(name, scored)
    AttentionMaskInterface.register(name, eager_mask)
    _originals[name] = scored
    return name


def _weighted_values(weights: Tensor, value: Tensor) -> Tensor:
    """``weights @ value`` over grouped keys and values ``(B, H, n, d_head)``."""
    groups = weights.shape[1] // value.shape[1]
    if groups > 1:
        value = value.repeat_interleave(groups, dim=1)
    return torch.matmul(weights.to(value.dtype), value)


def _frozen_implementation(original: str) -> str:
    """Register (once) an attention implementation that runs ``original`` with the queries
    and keys detached, under its own name; return that name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = _FROZEN_PREFIX + original
    if name in _originals:
        return name

    def frozen(module, query, key, value, attention_mask, **kwargs):
        store = ACTIVE.get()
        if store is None:
            function = attention_function(module, original)
            return function(module, query.detach(), key.detach(), value, attention_mask, **kwargs)
        # a recorded (or replayed) frozen model: the probabilities of the recorded pass
        if store.replaying:
            weights = store.value("attention", module, lambda: None)
            return _weighted_values(weights, value).transpose(1, 2).contiguous(), weights
        output, weights = eager_attention(module)(module, query.detach(), key.detach(), value, attention_mask,
                                                  **kwargs)
        store.value("attention", module, weights.detach)
        if store.scores is not None:
            scaling = kwargs.get("scaling")
            scaling = scaling if scaling is not None else getattr(module, "scaling", None) or query.shape[-1] ** -0.5
            store.scores[id(module)] = (query, key, float(scaling))
        return output, weights

    AttentionInterface.register(name, frozen)
    masks = ALL_MASK_ATTENTION_FUNCTIONS
    AttentionMaskInterface.register(name, masks.get(original, masks["eager"]))
    _originals[name] = frozen
    return name


@contextlib.contextmanager
def frozen_attention(modules: Sequence[nn.Module], methods: Mapping[str, Sequence[nn.Module]],
                     scoring_rule: Any = None, eager: bool = False) -> Iterator[None]:
    """Run the models owning ``modules`` with their attention's queries and keys detached
    (or, with a ``scoring_rule``, with that rule's gradient replacement).

    Args:
        modules (Sequence[nn.Module]): the model (and blocks) whose configs choose the
                    attention implementation.
        methods (Mapping): for attention modules that compute their probabilities in a method
                    of their own (see ``ArchitectureSpec.attention_method``): name → modules.
        scoring_rule (ScoreCreditingAttention, optional): an attention rule that credits the
                    scores.
        eager (bool): freeze the eager implementation whatever the models run (their masks
                    too): for attention code that computes its probabilities inline and
                    adds the mask itself (Falcon runs its own eager code under any
                    implementation name but "sdpa").
    """
    register = _frozen_implementation if scoring_rule is None else _scored_implementation

    def replacement(current: str | None) -> str | None:
        original = "eager" if eager else (current or "eager")
        return None if original.startswith((_FROZEN_PREFIX, _SCORED_PREFIX)) else register(original)

    def detach_qk(module: nn.Module, original: Callable) -> Callable:
        def method(query, key, value, *args, **kwargs):
            store = ACTIVE.get()
            if scoring_rule is None and store is not None and store.replaying:
                weights = store.value("attention", module, lambda: None)
                return _weighted_values(weights, value), weights
            if scoring_rule is None:
                output, weights = original(query.detach(), key.detach(), value, *args, **kwargs)
                if store is not None:
                    store.value("attention", module, weights.detach)
                    if store.scores is not None:
                        scale = getattr(module, "scale_attn", None)
                        store.scores[id(module)] = (query, key, 1.0 / float(scale) if scale is not None
                                                    else query.shape[-1] ** -0.5)
                return output, weights
            output, weights = original(query.detach(), key.detach(), value.detach(), *args, **kwargs)
            mask = args[0] if args else kwargs.get("attention_mask")
            scale = getattr(module, "scale_attn", None)
            scaling = 1.0 / float(scale) if scale is not None else query.shape[-1] ** -0.5
            return _scored_output(scoring_rule, output, query, key, value, mask, scaling, None,
                                  transposed=False), weights

        return method

    token = _scoring_rule.set(scoring_rule)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(attention_implementation(modules, replacement))
            for name, owners in methods.items():
                stack.enter_context(patched_attention_methods(owners, name, detach_qk))
            yield
    finally:
        _scoring_rule.reset(token)


def _delta(u: Tensor) -> Tensor:
    """``u − u.detach()``: zero in value, the identity for gradients."""
    return u - u.detach()


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
class Linearisation:
    """Hooks that freeze a model's coefficients for one forward pass (value-preserving).

    Build with :func:`linearise`; ``inputs`` then holds the first block's input, a leaf that
    requires grad, and ``outputs`` the watched modules' outputs with their graphs. For an
    encoder–decoder, ``inputs`` is the decoder's first block's input and ``source_inputs``
    the encoder's.
    """

    inputs: Tensor | None = None
    source_inputs: Tensor | None = None
    inline: bool = False
    outputs: dict[str, Tensor] = field(default_factory=dict)
    _handles: list[Any] = field(default_factory=list)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _fixed_probabilities(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """An inline softmax's output detached (the recorded one in a replayed pass)."""
    return lambda probabilities: frozen_value("softmax", module, probabilities.detach)


def _replaying() -> bool:
    store = ACTIVE.get()
    return store is not None and store.replaying


def _norm_hook(module: nn.Module, spec: ArchitectureSpec, config: Any, rule: Any):
    weight, bias, eps = norm_parameters(module, spec, config)

    def hook(mod, args, kwargs, output):
        x = args[0] if args else next(iter(kwargs.values()))
        real = x.detach()
        scale = frozen_value("norm", mod, lambda: rule.frozen_scale(real.to(torch.float32), eps)).to(x.dtype)
        replay = _replaying()  # the recorded frozen map on the whole input, not value-preserving
        delta = x if replay else _delta(x)
        if getattr(rule, "centres", False):
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


def _activation_between(store: dict[str, Tensor], key: str, fn: Callable[[Tensor], Tensor], rule: Any,
                        columns: Any = slice(None)):
    """A pre-hook on the module after an element-wise activation: its input ``g(S)`` becomes
    ``g(S).detach() + (S − S.detach()) ⊙ slope``, with ``S`` the previous module's output."""

    def hook(module, args):
        z = args[0]
        s = store.pop(key)[..., columns]
        slope = frozen_value("activation", module, lambda: rule.slope(fn, s.detach().to(torch.float32))).to(z.dtype)
        if _replaying():  # the frozen map, linear in the pre-activation
            return (s * slope, *args[1:])
        return (z.detach() + _delta(s) * slope, *args[1:])

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
        coeff_a, coeff_b = frozen_value("gated", module, lambda: rule.slopes(
            fn, a.detach().to(torch.float32), b.detach().to(torch.float32)))
        if _replaying():  # the frozen map: c_A ⊙ A + c_B ⊙ B
            return (a * coeff_a.to(z.dtype) + b * coeff_b.to(z.dtype), *args[1:])
        return (z.detach() + _delta(a) * coeff_a.to(z.dtype) + _delta(b) * coeff_b.to(z.dtype), *args[1:])

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
    return _columns(projection, config, width)[0]


def _warm_up(blocks: Sequence[nn.Module], spec: ArchitectureSpec, frozen: FrozenRules) -> None:
    """Compute each activation's coefficients once on a tiny input, so that values the rules
    cache (``g(0)``, ``g'(0)``) exist before a recomputed pass: a recomputed block must save
    the same tensors as the first run of it."""
    probe = torch.zeros(1, 1, 2)
    for block in blocks:
        moe = MoEAdapter.of(block, spec)
        if moe is not None:
            functions = [moe.activation]
            if moe.shared_expert is not None:
                functions.append(moe.shared_expert.activation)
            for fn in functions:
                frozen.gated_activation.slopes(fn, probe, probe)
        elif spec.ff_gate is not None:
            frozen.gated_activation.slopes(resolve(block, spec.activation), probe, probe)
        else:
            frozen.activation.slope(resolve(block, spec.activation), probe)


@dataclass
class _Hooks:
    """Puts the hooks of one :func:`linearise` on the model, into ``state``."""

    spec: ArchitectureSpec
    config: Any
    frozen: FrozenRules
    state: Linearisation

    def add(self, handle: Any) -> None:
        self.state._handles.append(handle)

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

        self.add(first_block.register_forward_pre_hook(hook, with_kwargs=True))

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
                for handle in softmax_hooks(module, _fixed_probabilities(module)):
                    self.add(handle)

    def norm(self, module: nn.Module | None, rule: Any = None) -> None:
        """Freeze a norm's scale (the norm rule's, or ``rule``'s)."""
        if module is not None:
            hook = _norm_hook(module, self.spec, self.config, self.frozen.norm if rule is None else rule)
            self.add(module.register_forward_hook(hook, with_kwargs=True))

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
        self.add(moe.router.register_forward_hook(_detach_output))
        self.add(moe.experts.register_forward_hook(_experts_hook(moe, gated), with_kwargs=True))
        shared = moe.shared_expert
        if shared is not None:
            self.add(shared.gate.register_forward_hook(_keep_output(store, key + "shared_gate")))
            self.add(shared.up.register_forward_hook(_keep_output(store, key + "shared_up")))
            self.add(shared.down.register_forward_pre_hook(_gated_between(
                store, key + "shared_gate", key + "shared_up", shared.activation, gated)))
            self.add(moe.shared_expert_gate.register_forward_hook(_detach_output))

    def dense_feed_forward(self, block: nn.Module, key: str) -> None:
        """The activation between the FF's projections linearised (gated or element-wise)."""
        spec, config, store = self.spec, self.config, self.state.outputs
        ff_in = resolve(block, spec.ff_in.path)
        ff_out = resolve(block, spec.ff_out.path)
        fn = resolve(block, spec.activation)
        up_columns = _projection_columns(spec.ff_in, ff_in, config)
        self.add(ff_in.register_forward_hook(_keep_output(store, key + "up")))
        if spec.ff_gate is None:
            self.add(ff_out.register_forward_pre_hook(
                _activation_between(store, key + "up", fn, self.frozen.activation, up_columns)))
            return
        gate = resolve(block, spec.ff_gate.path)
        gate_columns = _projection_columns(spec.ff_gate, gate, config)
        if gate is not ff_in:
            self.add(gate.register_forward_hook(_keep_output(store, key + "gate")))
        gate_key = key + ("gate" if gate is not ff_in else "up")
        self.add(ff_out.register_forward_pre_hook(_gated_between(
            store, gate_key, key + "up", fn, self.frozen.gated_activation, gate_columns, up_columns)))

    def head(self, head_steps: Sequence[tuple[str, Any]]) -> None:
        """The head's element-wise activations linearised between its dense layers."""
        store = self.state.outputs
        previous: nn.Module | None = None
        for position, (kind, item) in enumerate(head_steps):
            if kind == "linear":
                self.add(item.register_forward_hook(_keep_output(store, f"head:{position}")))
                previous = item
            elif kind == "norm":  # a norm inside the head (ModernBERT's): its scale frozen
                self.norm(item)
            elif kind == "activation":
                following = next((m for k, m in head_steps[position + 1:] if k in ("linear", "norm")), None)
                if previous is None or following is None:
                    raise ValueError("a head activation must sit between a dense layer and a dense layer or norm")
                fn = item if callable(item) else activation_function(item)
                self.add(following.register_forward_pre_hook(
                    _activation_between(store, f"head:{position - 1}", fn, self.frozen.activation)))

    def watch(self, modules: Mapping[str, nn.Module]) -> None:
        """Keep the outputs of ``modules`` (with their graphs) by name."""
        for name, module in modules.items():
            self.add(module.register_forward_hook(_keep_output(self.state.outputs, name, copy=True)))


@contextlib.contextmanager
def _input_gradient_only(model: nn.Module) -> Iterator[None]:
    """Turn off the parameters' gradients inside (only the input's is needed)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    for parameter in parameters:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in parameters:
            parameter.requires_grad_(True)


@contextlib.contextmanager
def _recomputed(blocks: Sequence[nn.Module]) -> Iterator[None]:
    """Run each block under ``torch.utils.checkpoint`` inside (its tensors are recomputed
    during the backward pass instead of kept)."""
    from torch.utils.checkpoint import checkpoint

    patched = []
    try:
        for block in blocks:
            def forward(*args: Any, __original=block.forward, **kwargs: Any) -> Any:
                return checkpoint(__original, *args, use_reentrant=False, **kwargs)

            block.forward = forward  # an instance attribute shadows the class's method
            patched.append(block)
        yield
    finally:
        for block in patched:
            del block.forward


@contextlib.contextmanager
def linearise(
    model: nn.Module,
    spec: ArchitectureSpec,
    blocks: Sequence[nn.Module],
    rules: Mapping[str, Callable],
    final_norm: nn.Module | None = None,
    head_steps: Sequence[tuple[str, Any]] = (),
    watch: Mapping[str, nn.Module] | None = None,
    recompute: bool = False,
    source: tuple[ArchitectureSpec, Sequence[nn.Module], nn.Module | None] | None = None,
    coefficients: FrozenCoefficients | None = None,
) -> Iterator[Linearisation]:
    r"""Freeze the model's coefficients for the forward passes run inside the context.

    Args:
        model (nn.Module): the model.
        spec (ArchitectureSpec): its family's spec.
        blocks (Sequence[nn.Module]): its blocks, in order (the first one's input becomes a
                    leaf that requires grad).
        rules (Mapping): role → rule (the frozen maps come from them).
        final_norm (nn.Module, optional): the norm after the last block.
        head_steps (Sequence): the head's layers after the final norm, as
                    ``("linear", module)`` and ``("activation", fn)`` pairs (``fn`` a function
                    or its name in :data:`~captum_ffb.architectures.activations.ACTIVATIONS`),
                    in order.
        watch (Mapping, optional): name → module whose output to keep (with its graph).
        recompute (bool): keep no block's intermediate tensors for the backward pass and run
                    each block again during it instead (``torch.utils.checkpoint``): memory of
                    one block instead of all, for about one more forward pass.
        source (tuple, optional): for an encoder–decoder, the encoder's ``(spec, blocks,
                    final norm)``: frozen too, its first block's input the leaf
                    ``source_inputs`` (``blocks`` and ``final_norm`` are then the decoder's).
        coefficients (FrozenCoefficients, optional): record every coefficient of this pass
                    into it, or (``coefficients.replayed()``) run the frozen model of a
                    recorded pass: its coefficients, applied to whatever this pass computes
                    (see :mod:`captum_ffb.engine.frozen`; attention runs eager to record).

    Yields:
        Linearisation
    """
    frozen = FrozenRules.of(rules)
    if coefficients is not None and (recompute or frozen.attention is not None):
        raise ValueError("a recorded frozen model keeps frozen probabilities and every block's tensors "
                         "(no rule that credits the scores, no recomputation)")
    state = Linearisation()
    hooks = _Hooks(spec, config_of(model), frozen, state)
    methods: dict[str, list[nn.Module]] = {}
    token = ACTIVE.set(coefficients)
    try:
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
        hooks.norm(final_norm)
        hooks.head(head_steps)
        hooks.watch(watch or {})
        with contextlib.ExitStack() as stack:
            stack.enter_context(_input_gradient_only(model))
            if recompute:
                _warm_up(blocks, spec, frozen)  # cached coefficients: the same work in both passes
                stack.enter_context(_recomputed(blocks))
            owners = [model, *blocks, *(source[1] if source is not None else ())]
            stack.enter_context(frozen_attention(owners, methods, frozen.attention,
                                                 eager=state.inline or coefficients is not None))
            stack.enter_context(torch.enable_grad())
            yield state
    finally:
        ACTIVE.reset(token)
        state.remove()
