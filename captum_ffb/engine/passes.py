r"""The pass runner: the one way into a model.

Every run of a model by the library — a plain prediction, a recorded pass (``engine.capture``),
a frozen pass and its replays (``engine.linearise``), a patched pass, a block run again,
generation — happens inside a :class:`ModelPass`. It is the only code that puts hooks on a model's
modules, switches its attention implementation, replaces an attention method or the softmax, and
around each run it owns:

* **the model's lock** (``captum_ffb.model_lock``, re-entrant): a pass holds it
  from entry to exit, so two calls on one model run one after the other;
* **the model's state**: eval mode (dropout would make the numbers random), no key/value cache,
  the parameters' gradients off when only the inputs' are asked for; all restored at exit;
* **hook lifetime**: everything installed through the pass is removed when it ends, on error too;
* **scope**: a hook, an attention implementation or a replaced method acts only inside the pass
  that installed it. A forward run elsewhere meanwhile — code of another thread that holds no
  lock, or a nested pass of this thread — goes through the model untouched, so it can neither
  corrupt this pass's records nor be corrupted by them.

The mode of a pass is what is installed on it: nothing (a real pass), recorders (a recorded
pass), value-preserving replacements (a frozen pass), coefficients handed back (a replayed
pass), replaced outputs (a patched pass).
"""

from __future__ import annotations

import contextvars
import inspect
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb._deprecation import moved_names
from captum_ffb._private import (
    get_attention_implementation,
    has_attention_implementation,
    model_eager_attention,
    set_attention_implementation,
)
from captum_ffb.engine.locking import model_lock

__all__ = ["ModelPass", "active_pass", "attention_function", "eager_attention", "first_block_input",
           "register_attention", "run_model"]

#: The pass running in this thread (``None``: no pass; the model runs untouched).
_CURRENT: contextvars.ContextVar[ModelPass | None] = contextvars.ContextVar("captum_ffb_pass", default=None)
#: Per config (by id), the stack of ``(pass, implementation chosen, implementation before it)``
#: of the passes that switched its attention implementation.
_SWITCHED: dict[int, list[tuple[ModelPass, str, str | None]]] = defaultdict(list)
_SWITCHED_GUARD = threading.Lock()
_REGISTERED: dict[str, Callable] = {}


def active_pass() -> ModelPass | None:
    """The pass running in this thread, or ``None``."""
    return _CURRENT.get()


# --------------------------------------------------------------------------- attention implementations
def _generic_eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Plain eager attention with grouped-query support, for modules without their own."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


def eager_attention(module: nn.Module) -> Callable:
    """The eager attention function of ``module``'s own modeling file, or a generic one."""
    return model_eager_attention(module) or _generic_eager_attention


def attention_function(module: nn.Module, implementation: str | None) -> Callable:
    """The attention function the implementation ``implementation`` names: the module's own
    eager one for ``"eager"``, ``None`` and names transformers does not know (a generic eager
    function for modules without one)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation is None or implementation == "eager" or implementation not in ALL_ATTENTION_FUNCTIONS:
        return eager_attention(module)
    return ALL_ATTENTION_FUNCTIONS[implementation]


def _chosen_for(module: nn.Module, name: str) -> str | None:
    """Which implementation ``module`` runs when its config names ``name``: ``name`` itself
    inside the pass that chose it; inside another pass that switched the config, that pass's
    choice; anywhere else the implementation the config had before any pass (``None`` for
    eager)."""
    config = getattr(module, "config", None)
    current = _CURRENT.get()
    if config is None:  # a module that does not say its config: any running pass chose it
        return name if current is not None else None
    with _SWITCHED_GUARD:
        entries = list(_SWITCHED.get(id(config), ()))
    mine = next((chosen for owner, chosen, _ in reversed(entries) if owner is current), None)
    if mine is not None:
        return mine
    return entries[0][2] if entries else None


def register_attention(name: str, function: Callable, mask: str | Callable = "eager") -> str:
    """Register (once) ``function`` as the attention implementation ``name`` in transformers'
    ``AttentionInterface``, with the mask function ``mask`` (a registered name, or a function).

    The registered function is scoped: it runs only inside the pass that switched the module's
    config to it (:meth:`ModelPass.attention`); anywhere else — another thread's forward, a
    nested pass — the module runs the implementation its config had before, untouched.
    """
    if name in _REGISTERED:
        return name
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    def scoped(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        chosen = _chosen_for(module, name)
        if chosen != name:
            return attention_function(module, chosen)(module, *args, **kwargs)
        return function(module, *args, **kwargs)

    masks = ALL_MASK_ATTENTION_FUNCTIONS
    AttentionInterface.register(name, scoped)
    AttentionMaskInterface.register(name, mask if callable(mask) else masks.get(mask, masks["eager"]))
    _REGISTERED[name] = function
    return name


def _configs_of(modules: Sequence[nn.Module]) -> list[Any]:
    """The distinct transformers configs reachable from ``modules`` (and their sub-modules)."""
    seen: dict[int, Any] = {}
    for root in modules:
        for module in root.modules():
            config = getattr(module, "config", None)
            if config is not None and has_attention_implementation(config):
                seen.setdefault(id(config), config)
    return list(seen.values())


# --------------------------------------------------------------------------- the softmax
class _SoftmaxDispatch:
    """``torch.nn.functional.softmax`` replaced while any pass needs it: each thread's
    innermost handler sees the results of the softmax calls made in that thread; other
    threads' calls pass through untouched, and the original is back once no pass needs it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._original: Callable | None = None
        self._local = threading.local()

    def _handlers(self) -> list[Callable[[Tensor], Tensor]]:
        handlers = getattr(self._local, "handlers", None)
        if handlers is None:
            handlers = self._local.handlers = []
        return handlers

    def _softmax(self, *args: Any, **kwargs: Any) -> Tensor:
        original = self._original if self._original is not None else torch.softmax
        out = original(*args, **kwargs)
        handlers = self._handlers()
        return handlers[-1](out) if handlers else out

    def push(self, handler: Callable[[Tensor], Tensor]) -> None:
        self._handlers().append(handler)
        with self._lock:
            if self._users == 0:
                self._original = torch.nn.functional.softmax
                torch.nn.functional.softmax = self._softmax
            self._users += 1

    def pop(self) -> None:
        handlers = self._handlers()
        if handlers:
            handlers.pop()
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._original is not None:
                torch.nn.functional.softmax = self._original
                self._original = None


_softmax_dispatch = _SoftmaxDispatch()


def _unpatch(module: nn.Module, name: str, scoped: Callable, live: list[bool], had: bool, original: Callable) -> None:
    """Undo a method replacement: the wrapper passes through from now on, and is taken off
    where nothing was put over it since."""
    live[0] = False
    if vars(module).get(name) is scoped:
        if had:
            setattr(module, name, original)
        else:
            delattr(module, name)


# --------------------------------------------------------------------------- the pass
class _Reached(Exception):
    """Raised by a hook to stop a run where it has what it needs."""


class ModelPass:
    r"""One or more runs of a model, with what is installed on it for them.

    Use it as a context manager: entering takes the model's lock and puts the model in eval
    mode; hooks, attention implementations, replaced methods and softmax handlers are then
    installed through it (:meth:`before`, :meth:`after`, :meth:`attention`, :meth:`method`,
    :meth:`softmax`) and the model run with :meth:`run` (or a part of it with :meth:`call`);
    leaving removes everything and restores the model's mode, its parameters' gradient flags
    and the configs' attention implementations.

    Args:
        model (nn.Module): the model (its lock is taken; its configs are the ones switched).
        owners (Sequence[nn.Module]): further modules whose configs the attention
                    implementation switches (blocks of a model not given, a sub-model).
        grad (bool): run with gradients (a frozen pass); ``False``: under ``no_grad``.
        inputs_only (bool): with ``grad``, turn the parameters' gradients off for the pass
                    (only the inputs' are needed: less memory, as in an input-gradient pass).
        forward (Callable, optional): what :meth:`run` calls (default: the model; a user's
                    function around it, as Captum's ``forward_func``).

    Examples::

        >>> with ModelPass(model) as run:
        ...     run.after(model.lm_head, lambda module, args, output: kept.append(output))
        ...     logits = run.run(ids).logits
    """

    def __init__(self, model: nn.Module, owners: Sequence[nn.Module] = (), grad: bool = False,
                 inputs_only: bool = True, forward: Callable[..., Any] | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"a pass runs an nn.Module, got {type(model).__name__}")
        self.model = model
        self.forward = model if forward is None else forward
        self.owners = [model, *owners]
        self.grad = grad
        self.inputs_only = inputs_only
        self._lock = model_lock(model)
        self._entered = False
        self._undo: list[Callable[[], None]] = []
        self._token: contextvars.Token | None = None

    # ------------------------------------------------------------------ entering and leaving
    def __enter__(self) -> ModelPass:
        if self._entered:
            raise RuntimeError("a ModelPass is entered once")
        self._lock.acquire()
        try:
            self._entered = True
            self._token = _CURRENT.set(self)
            modes = [(module, module.training) for module in self._modules()]
            self._undo.append(lambda: [setattr(module, "training", mode) for module, mode in modes])
            for module, _ in modes:
                module.training = False  # eval mode: dropout would make the numbers random
            grad_mode = torch.is_grad_enabled()
            self._undo.append(lambda: torch.set_grad_enabled(grad_mode))
            if self.grad and self.inputs_only:
                frozen = [p for module, _ in modes for p in module.parameters(recurse=False) if p.requires_grad]
                for parameter in frozen:
                    parameter.requires_grad_(False)
                self._undo.append(lambda: [p.requires_grad_(True) for p in frozen])
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._leave()

    def _leave(self) -> None:
        try:
            while self._undo:
                self._undo.pop()()
        finally:
            if self._token is not None:
                _CURRENT.reset(self._token)
                self._token = None
            if self._entered:
                self._entered = False
                self._lock.release()

    def _modules(self) -> list[nn.Module]:
        """Every module of the owners, once."""
        seen: dict[int, nn.Module] = {}
        for owner in self.owners:
            for module in owner.modules():
                seen.setdefault(id(module), module)
        return list(seen.values())

    def _require_entered(self) -> None:
        if not self._entered:
            raise RuntimeError("enter the ModelPass (with ModelPass(model) as run: ...) before using it")

    @property
    def active(self) -> bool:
        """Whether this pass is the one running in this thread."""
        return _CURRENT.get() is self

    # ------------------------------------------------------------------ installing
    def _scoped(self, hook: Callable) -> Callable:
        """``hook``, acting only while this pass runs in this thread."""

        def scoped(*args: Any, **kwargs: Any) -> Any:
            if _CURRENT.get() is not self:
                return None
            return hook(*args, **kwargs)

        return scoped

    def before(self, module: nn.Module, hook: Callable, with_kwargs: bool = False) -> None:
        """A forward pre-hook on ``module`` for this pass (``hook(module, args[, kwargs])``,
        returning replaced arguments or ``None``)."""
        self._require_entered()
        handle = module.register_forward_pre_hook(self._scoped(hook), with_kwargs=with_kwargs)
        self._undo.append(handle.remove)

    def after(self, module: nn.Module, hook: Callable, with_kwargs: bool = False, always: bool = False) -> None:
        """A forward hook on ``module`` for this pass (``hook(module, args[, kwargs], output)``,
        returning a replaced output or ``None``); ``always`` calls it when the module raises."""
        self._require_entered()
        handle = module.register_forward_hook(self._scoped(hook), with_kwargs=with_kwargs, always_call=always)
        self._undo.append(handle.remove)

    def attention(self, implementation: str | Callable[[str | None], str | None],
                  modules: Sequence[nn.Module] = ()) -> None:
        """Run the owners (and ``modules``) with the attention implementation
        ``implementation`` (a name :func:`~captum_ffb.engine.passes.register_attention` registered, or a function of
        each config's current name giving the new one, ``None`` to keep it) for this pass."""
        self._require_entered()
        for config in _configs_of([*self.owners, *modules]):
            current = get_attention_implementation(config)
            chosen = implementation(current) if callable(implementation) else implementation
            if chosen is None:
                continue
            with _SWITCHED_GUARD:
                _SWITCHED[id(config)].append((self, chosen, current))
            set_attention_implementation(config, chosen)
            self._undo.append(lambda config=config, current=current: self._restore(config, current))

    def _restore(self, config: Any, current: str | None) -> None:
        """Undo this pass's switch of ``config``: the config names what the passes still
        running chose (the latest), or the implementation it had before them all."""
        with _SWITCHED_GUARD:
            stack = _SWITCHED.get(id(config), [])
            where = next((k for k in range(len(stack) - 1, -1, -1) if stack[k][0] is self), None)
            if where is None:
                set_attention_implementation(config, current)
                return
            _, _, before = stack.pop(where)
            if where == 0 and stack:  # the next pass inherits the original
                owner, chosen, _ = stack[0]
                stack[0] = (owner, chosen, before)
            set_attention_implementation(config, stack[-1][1] if stack else before)
            if not stack:
                _SWITCHED.pop(id(config), None)

    def method(self, modules: Sequence[nn.Module], name: str | None,
               wrap: Callable[[nn.Module, Callable], Callable]) -> None:
        """Replace ``module.<name>`` by ``wrap(module, original)`` on each module for this pass
        (attention modules that compute their probabilities in a method of their own, such as
        GPT-J's ``_attn`` before transformers 5.24); ``name=None`` does nothing."""
        self._require_entered()
        if name is None:
            return
        for module in modules:
            original = getattr(module, name, None)
            if original is None:
                raise ValueError(f"{type(module).__name__} has no method {name!r}")
            replaced = wrap(module, original)
            live = [True]

            def scoped(*args: Any, __original=original, __replaced=replaced, __live=live, **kwargs: Any) -> Any:
                chosen = __replaced if __live[0] and _CURRENT.get() is self else __original
                return chosen(*args, **kwargs)

            had = name in vars(module)
            setattr(module, name, scoped)  # an instance attribute shadows the class's method
            self._undo.append(lambda module=module, scoped=scoped, live=live, had=had, original=original:
                              _unpatch(module, name, scoped, live, had, original))

    def softmax(self, module: nn.Module, on_output: Callable[[Tensor], Tensor]) -> None:
        """While ``module`` runs in this pass, pass every ``torch.nn.functional.softmax``
        result through ``on_output`` (to record it, or to detach it): for attention modules
        whose modeling file computes the probabilities inline."""
        entered: list[bool] = []

        def enter(mod: nn.Module, args: Any, kwargs: Any) -> None:
            _softmax_dispatch.push(on_output)
            entered.append(True)

        def leave(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if entered:
                entered.pop()
                _softmax_dispatch.pop()

        self.before(module, enter, with_kwargs=True)
        self.after(module, leave, with_kwargs=True, always=True)

    # ------------------------------------------------------------------ running
    def takes(self, name: str) -> bool:
        """Whether the forward :meth:`run` calls takes the keyword ``name``."""
        try:
            forward = self.forward.forward if isinstance(self.forward, nn.Module) else self.forward
            return name in inspect.signature(forward).parameters
        except (TypeError, ValueError):
            return False

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The forward (the model's, by default) on ``args`` and ``kwargs`` in this pass (no
        key/value cache where it takes ``use_cache``; with gradients when the pass was made
        with ``grad``)."""
        self._require_entered()
        if "use_cache" not in kwargs and self.takes("use_cache"):
            kwargs["use_cache"] = False
        with torch.set_grad_enabled(self.grad):
            return self.forward(*args, **kwargs)

    def call(self, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        """A part of the model (a block run again on other hidden states) in this pass."""
        self._require_entered()
        with torch.set_grad_enabled(self.grad):
            return module(*args, **kwargs)

    def input_of(self, module: nn.Module, *args: Any, **kwargs: Any) -> Tensor:
        """The first input (hidden states) ``module`` receives when the forward runs on
        ``args`` and ``kwargs``; the run stops there."""
        found: list[Tensor] = []

        def stop(mod: nn.Module, hook_args: Any, hook_kwargs: Any) -> None:
            found.append((hook_args[0] if hook_args else hook_kwargs["hidden_states"]).detach())
            raise _Reached

        self.before(module, stop, with_kwargs=True)
        try:
            self.run(*args, **kwargs)
        except _Reached:
            pass
        if not found:
            raise RuntimeError(f"the forward did not reach {type(module).__name__}")
        return found[0]

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The model's ``generate`` in this pass (without gradients)."""
        self._require_entered()
        with torch.no_grad():
            return self.model.generate(*args, **kwargs)


def first_block_input(model: nn.Module, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    """The input hidden states of ``block`` when ``model`` runs on ``args`` and ``kwargs`` (a
    real pass of its own, stopped at the block)."""
    with ModelPass(model) as run:
        return run.input_of(block, *args, **kwargs)


def run_model(model: nn.Module, *args: Any, grad: bool = False, inputs_only: bool = True, **kwargs: Any) -> Any:
    """One real run of ``model`` on ``args`` and ``kwargs``: a :class:`ModelPass` with nothing
    installed (the model's lock, eval mode, no key/value cache); with ``grad``, with
    gradients (``inputs_only=False`` keeps the parameters' too)."""
    with ModelPass(model, grad=grad, inputs_only=inputs_only) as run:
        return run.run(*args, **kwargs)


#: Names that moved in 0.4, still importable from here for one release.
__getattr__ = moved_names(__name__, {"weights_fingerprint": "captum_ffb.engine.fingerprint"})
