"""The documentation site builds from docs/ with warnings as errors, and its API reference
covers every public name."""

from __future__ import annotations

from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("sphinx", reason="the site needs the docs extra: pip install 'captum_ffb[docs]'")
    pytest.importorskip("myst_nb")
    from sphinx.cmd.build import build_main

    out = tmp_path_factory.mktemp("site")
    code = build_main(["-b", "html", "-W", "--keep-going", "-q", "-E", str(DOCS), str(out)])
    assert code == 0, "the documentation site has warnings (python -m sphinx -W docs docs/_build)"
    return out


PAGES = ("index", "getting_started", "concepts", "layer_maps", "whole_model", "components", "encoder_decoder",
         "generation_and_tools", "analyses", "faithfulness", "baselines", "integrations", "app", "lit", "ferret",
         "cluster", "models", "architectures", "changelog", "api/index")


def test_the_site_builds_without_a_warning(built):
    missing = [page for page in PAGES if not (built / f"{page}.html").exists()]
    assert not missing, missing


def test_the_readme_is_a_front_page_whose_links_resolve():
    import re

    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    targets = re.findall(r"\]\(((?:docs/)?[\w./-]+\.(?:md|png))\)", readme)
    assert len(targets) >= 15
    broken = [t for t in targets if not (DOCS.parent / t).exists()]
    assert not broken, broken


def test_the_package_page_lists_every_top_level_name():
    import captum_ffb

    page = (DOCS / "api" / "package.md").read_text(encoding="utf-8")
    missing = [name for name in captum_ffb.__all__ if f"| `{name}` |" not in page]
    assert not missing, missing
