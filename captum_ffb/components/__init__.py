"""Component tables as a feature: every writer's (and head's, expert's) share of the explained
value, per token (``captum_ffb.components.sums``), and the table handed back
(:mod:`~captum_ffb.components.table`)."""

from captum_ffb.components.table import ComponentAttribution, FFQuestion

__all__ = ["ComponentAttribution", "FFQuestion"]
