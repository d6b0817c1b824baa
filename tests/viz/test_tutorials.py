"""The tutorials in tutorials/ run from top to bottom without errors."""

from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
ON_MINILM = {"01_quick_start.ipynb", "03_scopes_across_layers.ipynb"}


def _notebooks():
    for path in sorted(TUTORIALS.glob("*.ipynb")):
        marks = [pytest.mark.real_weights] if path.name in ON_MINILM else []
        yield pytest.param(path, id=path.stem, marks=marks)


def test_there_are_tutorials():
    assert {p.name for p in TUTORIALS.glob("*.ipynb")} >= ON_MINILM | {"02_pre_ln_gpt2.ipynb"}


@pytest.mark.parametrize("path", list(_notebooks()))
def test_tutorial_runs(path, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    produced = [o for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    images = [o for o in produced if "image/png" in o.get("data", {})]
    assert images, "every tutorial draws at least one figure"
