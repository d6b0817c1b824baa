"""``benchmarks/gpu.py`` — the one command a lent GPU runs — checked on the cpu with tiny shapes
(``--dry-run``): it measures every column and writes its report."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"


def test_the_gpu_script_runs_dry_on_the_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    out = tmp_path / "GPU.md"
    assert module.main(["--dry-run", "--repeat", "1", "--shapes", "smollm2", "--lengths", "16",
                        "--graph-lengths", "8", "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    rows = {row["n"]: row for row in result["rows"]}
    assert set(rows) == {8, 16}
    assert rows[16]["attribute"]["seconds"] > 0 and rows[8]["graph"]["seconds"] > 0
    assert all(row["input_gradient"]["seconds"] > 0 for row in rows.values())
    text = out.read_text()
    assert "| tiny (float32) | float32 | 16 |" in text and "×)" in text
