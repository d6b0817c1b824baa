"""The public names of 0.3 (every public module's ``__all__``, or its public definitions, at
commit 3aa1c2d) still import from where they were, the moved ones with one
``DeprecationWarning`` a process that names the new place."""

from __future__ import annotations

import importlib
import json
import subprocess
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


def test_an_old_module_path_warns_once_naming_the_new_place():
    code = ("import warnings\nwarnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    from captum_ffb.engine.graph import GraphData, graph_pass\n"
            "    from captum_ffb.engine.graph import covectors\n"
            "    import captum_ffb.text\n"
            "import json\nprint(json.dumps([str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]))\n"
            "from captum_ffb.graph.build import GraphData as New\n"
            "print(GraphData is New)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    messages, same = done.stdout.strip().splitlines()
    messages = json.loads(messages)
    assert len(messages) == 2, messages
    assert "captum_ffb.engine.graph moved to captum_ffb.engine.tape and captum_ffb.graph.build" in messages[0]
    assert "captum_ffb.text moved to captum_ffb.texts.text" in messages[1] and "0.5" in messages[1]
    assert same == "True"


def test_a_name_that_never_existed_is_still_an_import_error():
    with pytest.raises(ImportError):
        from captum_ffb.engine.graph import no_such_name  # noqa: F401
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("captum_ffb.engine.no_such_module")
