r"""What an estimator of patching effects is (:class:`Estimator`), the state every estimator
reads (:class:`Shared`: the two recorded passes and their differences, recorded once for all
of them) and the registry of estimators by name.

An estimator is one class, registered with :func:`register_estimator`; once its module is
imported, :func:`~captum_ffb.patching.patches.patch_estimates` and
:func:`~captum_ffb.patching.patches.check_estimators` take its name (and, with ``edges``,
the edges' patcher). A minimal one::

    @register_estimator
    class Zero(Estimator):
        name = "zero"
        citation = "none: a control"
        cost = "2 (the shared clean and corrupted forward passes)"

        def passes(self, shared):
            return 2

        def estimate(self, shared):
            return Estimate({w.id: torch.zeros(w.n, shared.parts(w)) for w in shared.tape.writers})
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor

from captum_ffb.core.keys import NodeId
from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.tape import Covectors, GraphTape, RecordedWriter
from captum_ffb.patching.estimators.recorded import Differences, Recorded, differences, record

__all__ = ["EAP_IG_STEPS", "Estimate", "Estimator", "Shared", "computation_order", "estimator_aliases",
           "estimator_names", "get_estimator", "record_shared", "register_estimator", "unregister_estimator"]

#: EAP-IG's steps (Hanna et al. use m = 5).
EAP_IG_STEPS = 5


# --------------------------------------------------------------------------- the shared state
@dataclass(kw_only=True)
class Shared:
    """What every estimator reads, recorded once for all of them.

    Attributes:
        engine (BoundModel): the model.
        request (Request): the (clean) input and what is explained.
        granularity (str): the graph's (``"head"``, ``"sublayer"`` or ``"neuron"``).
        clean (Recorded): the real model's pass on the input (with the options the estimators
                    asked for: AtP*'s probes and GradDrop's gate).
        corrupted (Recorded): the real model's forward pass on the corrupted input.
        diff (Differences): ``clean − corrupted`` at every writer.
        steps (int): EAP-IG's interpolation steps.
        rules (Mapping, optional): the frozen model's rules (the engine's when ``None``).
        tape (GraphTape, optional): the graph's own frozen pass (node estimates only).
        found (Covectors, optional): its covectors.
        nodes (dict): the graph's nodes: node id → its index (node estimates only).
        exact_above (float): where the ``"+exact"`` estimators patch for real (κ above it).
        verify_top (int): the components of each kind a ``"+verify"`` estimator patches for real.
        corrupted_seconds, clean_seconds (float): the seconds of the two shared passes.
        results (dict): estimator name → its :class:`Estimate`, as the estimators finish.
        memo (dict): work shared between estimators, by key → ``(value, seconds)`` (:meth:`once`).
    """

    engine: BoundModel
    request: Request
    granularity: str
    clean: Recorded
    corrupted: Recorded
    diff: Differences
    steps: int = EAP_IG_STEPS
    rules: Mapping[str, Callable] | None = None
    tape: GraphTape | None = None
    found: Covectors | None = None
    nodes: dict[NodeId, int] = field(default_factory=dict)
    exact_above: float = float("inf")
    verify_top: int = 0
    corrupted_seconds: float = 0.0
    clean_seconds: float = 0.0
    results: dict[str, Estimate] = field(default_factory=dict)
    memo: dict[str, tuple[Any, float]] = field(default_factory=dict)

    @property
    def blocks(self) -> int:
        """The blocks whose writers the passes recorded."""
        return len({w.layer for w in self.clean.tape.writers})

    @property
    def positions(self) -> int:
        return self.request.read_mask.shape[1]

    def parts(self, writer: RecordedWriter) -> int:
        """The columns of a writer's node estimates: its parts (heads, neurons), or 1."""
        return 1 if writer.parts is None else self.diff.parts[writer.id].shape[1]

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, run the first time ``key`` is asked for and kept (with its seconds)."""
        if key not in self.memo:
            tic = time.perf_counter()
            value = compute()
            self.memo[key] = (value, time.perf_counter() - tic)
        return self.memo[key][0]

    def spent(self, key: str) -> float:
        """The seconds :meth:`once` spent on ``key`` (0 when it did not run)."""
        return self.memo[key][1] if key in self.memo else 0.0


def record_shared(engine: BoundModel, request: Request, corrupted: Request, granularity: str,
                  estimators: Sequence[Estimator] = (), **options: Any) -> Shared:
    """The corrupted and clean passes recorded once (the clean one with what ``estimators``
    ask of it: :attr:`Estimator.clean_pass`), their differences and ``options`` (the other
    fields of :class:`Shared`)."""
    asked = {key: True for estimator in estimators for key, on in estimator.clean_pass.items() if on}
    tic = time.perf_counter()
    corrupted_run = record(engine, corrupted, granularity, grad=False)
    middle = time.perf_counter()
    clean = record(engine, request, granularity, **asked)
    diff = differences(clean, corrupted_run)
    return Shared(engine=engine, request=request, granularity=granularity, clean=clean, corrupted=corrupted_run,
                  diff=diff, corrupted_seconds=middle - tic, clean_seconds=time.perf_counter() - middle, **options)


# --------------------------------------------------------------------------- the protocol
@dataclass
class Estimate:
    """One estimator's numbers.

    Attributes:
        nodes (dict): writer id → ``(n, parts)`` each node's estimated effect (one column for
                    a whole writer, one per head or neuron).
        components (dict, optional): component id → its effect, for an estimator whose
                    components are not the sum of their nodes (patched at every position at
                    once); ``None``: the sum.
    """

    nodes: dict[str, Tensor]
    components: dict[str, float] | None = None


class Estimator(ABC):
    """An estimator of what activation patching measures, ``output(clean) − output(clean
    with a node's output taken from the corrupted run)``, for every node of a graph at once.

    Attributes:
        name (str): what ``estimators=`` calls it.
        citation (str): the paper it implements (authors, year, title, arXiv id).
        cost (str): its model passes, as a formula of the graph's size (:meth:`passes`
                    computes them).
        edges (bool): whether it also estimates the graph's edges (:meth:`estimate_edges`).
        linear (bool): ``⟨G, o − o^c⟩`` with a covector ``G`` (it then has a ``"+exact"``
                    variant).
        requires (tuple): estimators computed before it (whose results it reads).
        part_of (str, optional): the estimator it is computed with: asking for this one asks
                    for that one (an alias), and that one always reports this one too.
        variant_of (str, optional): the estimator it is a variant of.
        clean_pass (dict): what the shared clean pass must record for it (options of
                    :func:`~captum_ffb.patching.estimators.record`).
    """

    name: ClassVar[str]
    citation: ClassVar[str]
    cost: ClassVar[str]
    edges: ClassVar[bool] = False
    linear: ClassVar[bool] = False
    requires: ClassVar[tuple[str, ...]] = ()
    part_of: ClassVar[str | None] = None
    variant_of: ClassVar[str | None] = None
    clean_pass: ClassVar[Mapping[str, bool]] = {}

    @abstractmethod
    def passes(self, shared: Shared) -> float:
        """The forward and backward passes of the whole model it ran (the shared ones included)."""

    @abstractmethod
    def estimate(self, shared: Shared) -> Estimate:
        """Every writer's node estimates (and the components', where not their sum)."""

    def seconds(self, own: float, shared: Shared, done: Mapping[str, float]) -> float:
        """Its seconds from ``own`` (the time of :meth:`estimate`) and the shared passes' (or
        the seconds ``done`` of the estimators it builds on)."""
        return shared.corrupted_seconds + own

    def estimate_edges(self, shared: Shared, links: Sequence[Any]) -> Tensor:
        """``(k,)`` each link's estimated path-patching effect (estimators with ``edges``)."""
        raise NotImplementedError(f"{self.name} does not estimate edges")


# --------------------------------------------------------------------------- the registry
_REGISTRY: dict[str, Estimator] = {}


def register_estimator(cls: type[Estimator]) -> type[Estimator]:
    """Register ``cls`` (one instance) under its ``name``; returns ``cls`` (a class decorator).
    A ``ValueError`` for a name taken, or a class without a citation or a cost."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or name != name.strip() or name == "default":
        raise ValueError(f"an estimator's name must be a non-empty string other than 'default', got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"an estimator named {name!r} is registered already ({type(_REGISTRY[name]).__name__})")
    for attribute in ("citation", "cost"):
        if not isinstance(getattr(cls, attribute, None), str) or not getattr(cls, attribute).strip():
            raise ValueError(f"estimator {name!r} needs a {attribute} (a non-empty string)")
    named = [*cls.requires, *(n for n in (cls.part_of, cls.variant_of) if n is not None)]
    missing = [n for n in named if n not in _REGISTRY]
    if missing:
        raise ValueError(f"estimator {name!r} names estimators not registered: {', '.join(missing)}")
    _REGISTRY[name] = cls()
    return cls


def unregister_estimator(name: str) -> None:
    """Remove the estimator ``name`` (and nothing else) from the registry."""
    get_estimator(name)
    del _REGISTRY[name]


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name``, or a one-line ``ValueError`` naming them all."""
    if name not in _REGISTRY:
        raise ValueError(f"no patching estimator {name!r}; the estimators are {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def estimator_names() -> tuple[str, ...]:
    """Every registered estimator's name: the linear ones, their variants, then the others
    (each group in the order they were registered)."""
    def group(estimator: Estimator) -> int:
        return 1 if estimator.variant_of is not None else 0 if estimator.linear else 2

    return tuple(sorted(_REGISTRY, key=lambda name: group(_REGISTRY[name])))


def estimator_aliases() -> dict[str, str]:
    """Name → the estimator asked for by it (each estimator computed as part of another)."""
    return {name: e.part_of for name, e in _REGISTRY.items() if e.part_of is not None}


def computation_order(names: Sequence[str]) -> list[Estimator]:
    """The estimators ``names`` and those they require or report with them, in the registry's
    order (each is registered after those it requires), whatever the order of ``names``."""
    order: dict[str, Estimator] = {}

    def add(name: str) -> None:
        if name in order:
            return
        estimator = get_estimator(name)
        for required in estimator.requires:
            add(required)
        order[name] = estimator
        for other, e in _REGISTRY.items():
            if e.part_of == name:
                add(other)

    for name in names:
        add(name)
    registered = list(_REGISTRY)
    return sorted(order.values(), key=lambda e: registered.index(e.name))
