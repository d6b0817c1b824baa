r"""Old calls kept working for one release: positional arguments past the ones a method takes
by position, and parameters that were renamed, each with a ``DeprecationWarning`` that says
what to write instead.
"""

from __future__ import annotations

import functools
import inspect
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
