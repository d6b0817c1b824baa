r"""The frozen model's coefficients, kept to run it again: interventions in the frozen model.

The backward route freezes every coefficient of a rule at its value in the pass being run
(:func:`~captum_ffb.engine.linearise.linearise`). To ask what the *frozen* model does when
something is changed — a writer's output removed, one writer's input edited, an activation
patched from another run — the coefficients must stay those of the clean run: a
:class:`FrozenCoefficients` records them (attention probabilities, norm scales, activation
coefficients, routing weights, a final soft-capping's slope) during one linearised pass and
hands the same values back, in the same order, to every replayed pass
(``linearise(..., coefficients=recorded.replayed())``). A replayed pass is the frozen model
of the recorded one, exactly: linear in whatever the edits change. An attention call is kept
as what computes its probabilities (:class:`~captum_ffb.engine.rows.AttentionRows`: its
queries, keys and values, ``O(n·d)``), and they are computed again where a replay or a
product needs them.
"""

from __future__ import annotations

import contextvars
from collections import defaultdict
from collections.abc import Callable
from typing import Any

#: The store the running linearised pass records into or replays from (``None``: neither).
ACTIVE: contextvars.ContextVar[FrozenCoefficients | None] = contextvars.ContextVar(
    "captum_ffb_frozen_coefficients", default=None)


class FrozenCoefficients:
    """The coefficients of one linearised pass, in the order its modules computed them."""

    def __init__(self, values: dict[tuple[Any, ...], Any] | None = None, replaying: bool = False,
                 scores: bool = False) -> None:
        self.values: dict[tuple[Any, ...], Any] = {} if values is None else values
        self.replaying = replaying
        self._calls: dict[tuple[str, int], int] = defaultdict(int)
        #: with ``scores``: attention module → ``(query, key, scaling, mask)`` as its attention
        #: function read them, the queries and keys with their graphs (a score's split over
        #: the writers)
        self.scores: dict[int, tuple[Any, Any, float, Any]] | None = {} if scores else None

    def replayed(self) -> FrozenCoefficients:
        """A store that hands these coefficients back (a fresh count of calls)."""
        return FrozenCoefficients(self.values, replaying=True)

    def value(self, kind: str, owner: Any, compute: Callable[[], Any]) -> Any:
        """The coefficient ``kind`` of ``owner`` at this call: computed and kept when recording,
        the kept one when replaying."""
        key = (kind, id(owner))
        call = self._calls[key]
        self._calls[key] += 1
        if self.replaying:
            try:
                return self.values[(*key, call)]
            except KeyError:
                raise ValueError(f"the replayed pass computes a {kind} coefficient the recorded pass did not "
                                 "(run it on the same inputs)") from None
        found = compute()
        self.values[(*key, call)] = found
        return found


def frozen_value(kind: str, owner: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, or the running store's coefficient for it (see :class:`FrozenCoefficients`)."""
    store = ACTIVE.get()
    return compute() if store is None else store.value(kind, owner, compute)
