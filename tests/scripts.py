"""Load a script of the repository (``results/…``, ``benchmarks/…``) as a module, to test it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """The script at ``relative`` (to the repository root), executed as a fresh module; its
    ``if __name__ == "__main__"`` block does not run."""
    path = ROOT / relative
    name = "script_" + "_".join(Path(relative).with_suffix("").parts).replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
