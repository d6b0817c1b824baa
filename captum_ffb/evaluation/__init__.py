"""Evaluation of attributions: faithfulness measures and side-by-side runs of peer methods."""
