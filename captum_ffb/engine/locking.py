r"""One call at a time per model: the lock every attribution takes while it hooks and runs a
model.

A decomposition records a forward pass with hooks on the model's modules, switches the
model's attention implementation for the length of a pass and keeps per-call state on its
blocks; two calls interleaved on one model would read each other's tensors. Every public
method of :class:`~captum_ffb.attr.NormDecomposition`,
:class:`~captum_ffb.attr.LayerNormDecomposition` and
:class:`~captum_ffb.attr.LLMNormAttribution` therefore holds the model's lock
(:func:`model_lock`) for its whole call: concurrent calls on one model run one after the
other and give the results of sequential calls; calls on different models run in parallel.

Code of your own that runs the same model in another thread while an attribution may be
running (a server answering other requests with it) should hold the same lock::

    with model_lock(model):
        logits = model(ids).logits
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from torch import nn

Method = TypeVar("Method", bound=Callable[..., Any])

_locks: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """The re-entrant lock of ``model`` (one per model object, made on first use)."""
    with _guard:
        lock = _locks.get(model)
        if lock is None:
            lock = _locks[model] = threading.RLock()
        return lock


def _lock_of(owner: Any) -> Any:
    """The lock of an attribution's model (its ``model``, or ``_model``), or a no-op."""
    for name in ("model", "_model"):
        model = getattr(owner, name, None)
        if isinstance(model, nn.Module):
            return model_lock(model)
    return contextlib.nullcontext()


def serialized(method: Method) -> Method:
    """``method`` of an attribution run under its model's lock; a generator method holds it
    until the generator is exhausted or closed."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def locked_iterator(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            with _lock_of(self):
                yield from method(self, *args, **kwargs)

        return locked_iterator  # type: ignore[return-value]

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _lock_of(self):
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]
