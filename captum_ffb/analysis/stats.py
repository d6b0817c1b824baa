"""The analyses' statistics moved to :mod:`captum_ffb.texts.stats` (one floor down, so that the
baselines share them); importable from here as before."""

from captum_ffb.texts.stats import (  # noqa: F401
    PairTable,
    contextualization_change,
    correlations,
    entry_mask,
    ff_amp_pairs,
    maps_without_dims,
    pair_pmi,
    pearson,
    smallest_dims,
    spearman,
)
