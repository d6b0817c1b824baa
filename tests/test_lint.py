"""The code is ruff clean: CI runs only the README's test line, so lint is a test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the [dev] extra)")
    done = subprocess.run([ruff, "check", "captum_ffb", "tests", "benchmarks", "results"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
