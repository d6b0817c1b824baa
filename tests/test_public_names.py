"""The public names of 0.3 (every public module's ``__all__``, or its public definitions, at
commit 3aa1c2d) still import from where they were, the moved ones with one
``DeprecationWarning`` a process that names the new place."""

from __future__ import annotations

import importlib
import json
import sys
import warnings
from pathlib import Path

import pytest

NAMES = json.loads((Path(__file__).parent / "data" / "public_names_3aa1c2d.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("module", sorted(NAMES["modules"]))
def test_every_public_name_of_0_3_still_imports(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        found = importlib.import_module(module)
        missing = [name for name in NAMES["modules"][module] if not hasattr(found, name)]
    assert not missing, f"{module} lost {missing}"


def test_an_old_module_path_warns_once_naming_the_new_place(monkeypatch):
    from captum_ffb import _deprecation
    from captum_ffb.graph.build import GraphData as New

    monkeypatch.setattr(_deprecation, "_warned", set())  # as in a new process
    for old in ("captum_ffb.engine.graph", "captum_ffb.text"):
        monkeypatch.delitem(sys.modules, old, raising=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import captum_ffb.text  # noqa: F401
        from captum_ffb.engine.graph import (  # noqa: F401
            GraphData,
            covectors,  # noqa: F401
            graph_pass,
        )
    messages = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert len(messages) == 2, messages  # one a module, whatever the names taken from it
    graph, text = sorted(messages)
    assert graph.startswith("captum_ffb.engine.graph moved to captum_ffb.engine.tape and captum_ffb.graph.build")
    assert text.startswith("captum_ffb.text moved to captum_ffb.texts.text") and "0.5" in text
    assert GraphData is New


def test_a_name_that_never_existed_is_still_an_import_error():
    with pytest.raises(ImportError):
        from captum_ffb.engine.graph import no_such_name  # noqa: F401
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("captum_ffb.engine.no_such_module")
