"""The paper's corpus analyses: contextualization change, FF-amp pairs, RES2 norms, LN2
against FF outliers (with the ablation) and PMI, with a resumable corpus runner."""

from captum_ffb.analysis.corpus import Corpus, load_corpus, prepare_sequences
from captum_ffb.analysis.runner import AnalysisConfig, Measure, analyze_corpus, measures_for
from captum_ffb.texts.stats import (
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

__all__ = [
    "AnalysisConfig",
    "Corpus",
    "Measure",
    "PairTable",
    "analyze_corpus",
    "contextualization_change",
    "correlations",
    "entry_mask",
    "ff_amp_pairs",
    "load_corpus",
    "maps_without_dims",
    "measures_for",
    "pair_pmi",
    "pearson",
    "prepare_sequences",
    "smallest_dims",
    "spearman",
]
