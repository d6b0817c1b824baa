"""The package's version is the changelog's latest release, and the changelog keeps its form."""

from __future__ import annotations

import re
from pathlib import Path

import captum_ffb

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"


def test_the_version_is_the_latest_release_or_the_next_in_development():
    """A released version is the changelog's latest; with changes under [Unreleased], the
    version is the next minor release's development version (``0.4.0.dev0`` after 0.3.0), so
    that messages naming the next release ("ids before 0.4") read right."""
    text = CHANGELOG.read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, re.M)
    assert releases, "CHANGELOG.md lists no release"
    unreleased = text.split("## [Unreleased]", 1)[1].split(f"## [{releases[0]}]", 1)[0].strip()
    if not unreleased:
        assert captum_ffb.__version__ == releases[0]
    else:
        major, minor, _ = (int(p) for p in releases[0].split("."))
        assert captum_ffb.__version__ == f"{major}.{minor + 1}.0.dev0"


def test_every_release_says_what_changed_in_keep_a_changelog_sections():
    text = CHANGELOG.read_text()
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        sections = re.findall(r"^### (\w+)$", block, re.M)
        assert sections and set(sections) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    assert "whole-model default" in text.split("## [0.2.0]")[0]  # this release's change of default
