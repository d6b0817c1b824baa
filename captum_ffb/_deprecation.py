r"""Old calls kept working for one release: positional arguments past the ones a method takes
by position, parameters that were renamed, and modules and names that moved, each with a
``DeprecationWarning`` that says what to write instead.

The moved modules are looked up by name (:data:`MOVED_MODULES`), never imported here: this
module stays on the lowest floor.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

Method = TypeVar("Method", bound=Callable[..., Any])

#: The release in which the old forms stop working.
REMOVED_IN = "0.5"


def keyword_only(positional: int, old_order: Sequence[str] = (), renamed: Mapping[str, str] | None = None
                 ) -> Callable[[Method], Method]:
    r"""A method whose parameters after the first ``positional`` ones (``self`` not counted) are
    keyword-only, still taking the old calls for one release.

    Args:
        positional (int): how many parameters the method takes by position.
        old_order (Sequence[str]): the old signature's parameter names in order (``self`` not
                    counted): a call with more positional arguments is an old call, every
                    argument of it read by these names (then renamed).
        renamed (Mapping[str, str], optional): old name → new name; a new name
                    ``"forward_kwargs.<key>"`` puts the value into ``forward_kwargs``.
    """
    renames = dict(renamed or {})

    def wrap(method: Method) -> Method:
        name = method.__qualname__

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if len(args) > positional:
                if len(args) > len(old_order):
                    raise TypeError(f"{name}() takes at most {len(old_order)} arguments after self, "
                                    f"got {len(args)}")
                names = list(old_order[:len(args)])
                warnings.warn(f"{name}(): pass {', '.join(names[positional:])} by keyword; positional "
                              f"use is deprecated and stops working in {REMOVED_IN}",
                              DeprecationWarning, stacklevel=3)
                for old, value in zip(names, args):
                    if old in kwargs or renames.get(old, old) in kwargs:
                        raise TypeError(f"{name}() got multiple values for {old!r}")
                    kwargs[old] = value
                args = ()
            for old, new in renames.items():
                if old not in kwargs:
                    continue
                value = kwargs.pop(old)
                warnings.warn(f"{name}(): {old}= is now {new.replace('forward_kwargs.', 'forward_kwargs[')}"
                              f"{']' if new.startswith('forward_kwargs.') else '='} (the old name stops "
                              f"working in {REMOVED_IN})", DeprecationWarning, stacklevel=3)
                if new.startswith("forward_kwargs."):
                    key = new.split(".", 1)[1]
                    kwargs["forward_kwargs"] = {**(kwargs.get("forward_kwargs") or {}), key: value}
                    continue
                if new in kwargs:
                    raise TypeError(f"{name}() got {old}= and {new}=: give {new}= only")
                kwargs[new] = value
            return method(self, *args, **kwargs)

        if inspect.isgeneratorfunction(method):  # stays a generator (a lock held while it runs)

            @functools.wraps(method)
            def iterate(self: Any, *args: Any, **kwargs: Any) -> Any:
                yield from call(self, *args, **kwargs)

            return iterate  # type: ignore[return-value]
        return functools.wraps(method)(call)  # type: ignore[return-value]

    return wrap


def renamed_arguments(renamed: Mapping[str, str]) -> Callable[[Method], Method]:
    """A function whose keyword arguments ``renamed`` (old name → new name) were renamed: the
    old names still work for one release, each with a ``DeprecationWarning``."""

    def wrap(function: Method) -> Method:
        name = function.__qualname__

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in renamed.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{name}() got {old}= and {new}=: give {new}= only")
                    warnings.warn(f"{name}(): {old}= is now {new}= (the old name stops working in {REMOVED_IN})",
                                  DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


#: The job runners' keywords renamed in 0.4 (``engine`` named two things: the whole-model
#: engine and where batches run).
BACKEND_RENAMES = {"engine": "backend", "engine_options": "backend_options"}


# --------------------------------------------------------------------------- moved modules
#: The modules that moved in 0.4 (the folders became the features and the floors): old path →
#: the modules that hold its names now, searched in order. The old paths import for one
#: release, each with one ``DeprecationWarning`` a process.
MOVED_MODULES: dict[str, tuple[str, ...]] = {
    "captum_ffb.versions": ("captum_ffb.core.versions",),
    "captum_ffb.vocabulary": ("captum_ffb.core.vocabulary",),
    "captum_ffb.decomposition": ("captum_ffb.core.decomposition",),
    "captum_ffb.outputs": ("captum_ffb.io.files",),
    "captum_ffb.pages": ("captum_ffb.io.pages",),
    "captum_ffb.models": ("captum_ffb.explained.models",),
    "captum_ffb.readouts": ("captum_ffb.explained.readouts",),
    "captum_ffb.results": ("captum_ffb.explained.results",),
    "captum_ffb.text": ("captum_ffb.texts.text",),
    "captum_ffb.corpus": ("captum_ffb.texts.corpus",),
    "captum_ffb.stats": ("captum_ffb.texts.stats",),
    "captum_ffb.context": ("captum_ffb.long_context.attribution",),
    "captum_ffb.attr.graph": ("captum_ffb.graph.record",),
    "captum_ffb.attr.graph_files": ("captum_ffb.graph.files",),
    "captum_ffb.attr.components": ("captum_ffb.components.table",),
    "captum_ffb.baselines.patching": ("captum_ffb.attr.patching",),
    "captum_ffb.baselines.context": ("captum_ffb.baselines.captured",),
    "captum_ffb.engine.graph": ("captum_ffb.engine.tape", "captum_ffb.graph.build", "captum_ffb.engine.autograd"),
    "captum_ffb.engine.score_split": ("captum_ffb.graph.score_split",),
    "captum_ffb.engine.estimators": ("captum_ffb.patching.estimators",),
    "captum_ffb.engine.patching": ("captum_ffb.patching.patches",),
    "captum_ffb.engine.components": ("captum_ffb.components.sums",),
}
#: Names that a move also renamed: old module → {old name: (module, new name)}.
MOVED_NAMES: dict[str, dict[str, tuple[str, str]]] = {
    "captum_ffb.attr.graph_files": {"weights_digest": ("captum_ffb.engine.fingerprint", "weights_fingerprint")},
    "captum_ffb.baselines.context": {"LayerContext": ("captum_ffb.baselines.captured", "CapturedLayer")},
}
_warned: set[str] = set()


def _warn_moved(old: str, new: str) -> None:
    if old in _warned:
        return
    _warned.add(old)
    message = f"{old} moved to {new} in 0.4; the old path stops working in {REMOVED_IN}"
    if sys.version_info >= (3, 12):  # the warning points at the importing line, not importlib
        warnings.warn(message, DeprecationWarning, skip_file_prefixes=(os.path.dirname(importlib.__file__),))
    else:
        warnings.warn(message, DeprecationWarning, stacklevel=3)


def moved_name(old_module: str, name: str, module: str, new_name: str | None = None) -> Any:
    """``name`` of ``old_module``, which now lives in ``module`` (as ``new_name``): the object,
    with one ``DeprecationWarning`` a process for the old path."""
    _warn_moved(f"{old_module}.{name}", f"{module}.{new_name or name}")
    return getattr(importlib.import_module(module), new_name or name)


def moved_names(old_module: str, names: Mapping[str, str | tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the names that left ``old_module`` (``name`` → the module that
    holds it now, or ``(module, new name)`` for one renamed too): each still reachable from the
    old place for one release."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        where = names[name]
        return moved_name(old_module, name, *((where,) if isinstance(where, str) else where))

    return __getattr__


class _MovedModule(types.ModuleType):
    """An old module path: every name looked up in the modules that hold it now."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        renamed = MOVED_NAMES.get(self.__name__, {})
        if name in renamed:
            return moved_name(self.__name__, name, *renamed[name])
        for module in MOVED_MODULES[self.__name__]:
            found = importlib.import_module(module)
            if hasattr(found, name):
                return getattr(found, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted({n for m in MOVED_MODULES[self.__name__] for n in dir(importlib.import_module(m))})


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old module paths of :data:`MOVED_MODULES`."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> types.ModuleType:
        return _MovedModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        _warn_moved(module.__name__, " and ".join(MOVED_MODULES[module.__name__]))


def install_moved_modules() -> None:
    """Let the old module paths of :data:`MOVED_MODULES` import (once per process)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
