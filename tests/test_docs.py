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


def test_the_site_builds_without_a_warning(built):
    for page in ("index.html", "api/index.html", "encoder_decoder.html", "architectures.html"):
        assert (built / page).exists(), page


def test_the_package_page_lists_every_top_level_name():
    import captum_ffb

    page = (DOCS / "api" / "package.md").read_text(encoding="utf-8")
    missing = [name for name in captum_ffb.__all__ if f"| `{name}` |" not in page]
    assert not missing, missing
