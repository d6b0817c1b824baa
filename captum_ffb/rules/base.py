"""What every rule shares: its role, whether it is linear in the players, the role registry.

A *rule* maps a decomposition of a module's input (and the real tensors the forward pass
captured for that module) to a decomposition of its output. Chains call rules by *role*;
a user replaces the rule of a role by passing ``rules={role: rule}`` to an attribution.

Roles and the call signature a chain uses for each:

============================  ==================================================================
role                          call
============================  ==================================================================
``"linear"``                  ``rule(decomposition, weight, bias)``
``"attention"``               ``rule(value_input, probs, value_weight, value_bias,
                              output_weight, output_bias)``
``"residual"``                ``rule(branch, skip)``
``"norm"``                    ``rule(decomposition, real_input, weight, bias, eps)``
``"activation"``              ``rule(decomposition, fn, pre_activation)``
``"gated_activation"``        ``rule(gate, up, fn, real_gate, real_up)``
============================  ==================================================================

Any callable object with the role's signature can stand in for a rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

#: Every role a chain may call, with the call signature (see the module documentation).
ROLES: dict[str, str] = {
    "linear": "rule(decomposition, weight, bias)",
    "attention": "rule(value_input, probs, value_weight, value_bias, output_weight, output_bias)",
    "residual": "rule(branch, skip)",
    "norm": "rule(decomposition, real_input, weight, bias, eps)",
    "activation": "rule(decomposition, fn, pre_activation)",
    "gated_activation": "rule(gate, up, fn, real_gate, real_up)",
}


class Rule:
    r"""Base class of the rules: a callable from decomposition(s) to a decomposition.

    Attributes:
        role (str): the role the rule plays in a chain (a key of ``ROLES``).
        linear_in_players (bool): whether the rule is a fixed linear map of the terms once
                    the real tensors are given (true for every rule whose coefficients come
                    from the forward pass). Only such rules allow propagating groups of
                    players separately and the one-backward-pass route; a rule that
                    looks at all players together (Shapley values, numeric IG over the
                    players) is not.
    """

    role: ClassVar[str] = ""
    linear_in_players: ClassVar[bool] = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = getattr(self, "__dataclass_fields__", None)
        if not fields:
            return f"{type(self).__name__}()"
        args = ", ".join(f"{name}={getattr(self, name)!r}" for name in fields)
        return f"{type(self).__name__}({args})"


def is_linear_in_players(rule: Callable) -> bool:
    """Whether ``rule`` declares itself linear in the players (see :class:`Rule`).

    A plain callable that does not say so is treated as not linear.
    """
    return bool(getattr(rule, "linear_in_players", False))


def check_rules(rules: Mapping[str, Callable] | None, roles: Iterable[str], where: str) -> dict[str, Callable]:
    r"""Validate a user's ``{role: rule}`` mapping against the roles a chain uses.

    Args:
        rules (Mapping, optional): role → rule.
        roles (Iterable[str]): the roles the chain (for this model) calls.
        where (str): what uses them, for the error message (e.g. ``"a llama block"``).

    Returns:
        a plain dict of the given rules.

    Raises:
        ValueError: a key that is not a role of this chain, or a rule built for another role.
        TypeError: a value that is not callable.
    """
    if rules is None:
        return {}
    if not isinstance(rules, Mapping):
        raise TypeError(f"rules must be a mapping role → rule, got {type(rules).__name__}")
    used = sorted(roles)
    out: dict[str, Callable] = {}
    for role, rule in rules.items():
        if role not in used:
            hint = ""
            if role == "activation" and "gated_activation" in used:
                hint = " (its feed-forward is gated: pass the rule as 'gated_activation')"
            elif role == "gated_activation" and "activation" in used:
                hint = " (its feed-forward has an element-wise activation: use 'activation')"
            known = "" if role in ROLES else f"; every role: {', '.join(ROLES)}"
            raise ValueError(
                f"unknown role {role!r} for {where}{hint}; its roles are {', '.join(used)}{known}"
            )
        if not callable(rule):
            raise TypeError(f"the rule for {role!r} is not callable: {rule!r}")
        declared = getattr(rule, "role", "")
        if isinstance(rule, Rule) and declared and declared != role:
            raise ValueError(
                f"{type(rule).__name__} is a {declared!r} rule and cannot play {role!r}"
            )
        out[role] = rule
    return out


class TimedRule:
    """Wraps any rule and adds up the seconds spent in it (itself a rule of the same role).

    Examples::

        >>> timed = TimedRule(IGActivation())
        >>> LayerNormDecomposition(model, layer, rules={"activation": timed}).attribute(ids)
        >>> timed.seconds, timed.calls
    """

    def __init__(self, rule: Callable) -> None:
        self.rule = rule
        self.role = getattr(rule, "role", "")
        self.linear_in_players = is_linear_in_players(rule)
        self.seconds = 0.0
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.rule(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def __getattr__(self, name: str) -> Any:  # slope, slopes, frozen_scale, ... of the rule
        return getattr(self.__dict__["rule"], name)
