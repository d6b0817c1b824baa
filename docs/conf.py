"""Sphinx configuration of captum_ffb's documentation site (built offline from docs/)."""

from __future__ import annotations

import shutil
from pathlib import Path

import captum_ffb

#: What the site shows from outside docs/, copied in at each build (not committed: .gitignore):
#: the tutorials (rendered as committed, not run) and the measured results.
_ROOT = Path(__file__).resolve().parents[1]
_COPIED = {
    "tutorials": sorted((_ROOT / "tutorials").glob("*.ipynb")),
    "results": [_ROOT / "benchmarks" / name for name in ("RESULTS.md", "COMPONENTS.md", "ATTRIBUTION.md")],
}
for _folder, _files in _COPIED.items():
    _target = Path(__file__).parent / "_copied" / _folder
    shutil.rmtree(_target, ignore_errors=True)
    _target.mkdir(parents=True)
    for _file in _files:
        _name = _file.name if _file.name != "README.md" else f"{_file.parent.name}.md"
        shutil.copy2(_file, _target / _name)

project = "captum_ffb"
author = "captum_ffb developers"
release = version = captum_ffb.__version__
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "myst_nb",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]
html_theme = "furo"
html_title = f"captum_ffb {release}"
nb_execution_mode = "off"  # the tutorials are rendered as committed, not run again
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = [("Examples", "example")]
# only the explicit ``doctest`` blocks run (docs/examples.md); the docstrings' examples are
# illustrations on real models
doctest_test_doctest_blocks = ""

# Broken cross-references are errors (with -W); what lives outside the package cannot be
# resolved offline (no intersphinx inventories), and napoleon reads "name: description" in
# Returns sections and ", optional" in Args as types: those are not cross-references.
nitpicky = True
nitpick_ignore_regex = [
    ("py:.*", r"(torch|numpy|np|collections|typing|pathlib|os|pandas|pd|gradio|json|PIL|matplotlib|"
              r"transformers|captum|ray|ferret|contextlib|nn|abc|threading|enum)(\..*)?"),
    ("py:.*", r"(Tensor|Path|PathLike|TextTokenInput|TextTemplateInput|optional|iterables?|Figure|Axes|"
              r"tokenizer|callable|PretrainedConfig|LLMAttributionResult|ExplanationEvaluation)"),
    ("py:.*", r"captum_ffb\..*\._\w+(\.\w+)?"),  # private bases (shown by show-inheritance) are not in the reference
    ("py:.*", r".* .*"),
    ("py:.*", r'".*"'),
    ("py:class", r"Fingerprint|Stamp"),  # type aliases of captum_ffb.engine.fingerprint, documented as data
]
