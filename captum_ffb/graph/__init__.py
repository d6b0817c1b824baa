"""The attribution graph as a feature: its numbers built from one recorded pass
(:mod:`~captum_ffb.graph.build`), the passive record and its views
(:mod:`~captum_ffb.graph.record`), query–key score splits
(:mod:`~captum_ffb.graph.score_split`) and graph files (:mod:`~captum_ffb.graph.files`)."""

from captum_ffb.graph.record import AttributionGraph, BoundGraph
from captum_ffb.graph.target import GraphTarget, HookSite

__all__ = ["AttributionGraph", "BoundGraph", "GraphTarget", "HookSite"]
