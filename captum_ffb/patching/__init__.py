"""Patching as a feature: real activation and path patching, and the estimates of their
effects for every node and edge of a graph (:mod:`~captum_ffb.patching.patches`), the real
model's passes they run (``real.py``), and the estimators, one registered class each
(:mod:`~captum_ffb.patching.estimators`)."""
