"""The versions of the libraries we hook into that this release was tested with.

``setup.cfg`` declares the same ranges (a test keeps the two equal). CI runs the whole test
suite on the newest versions the ranges admit and a smoke run (every family's layer maps and
whole-model attribution) on the lowest ones (``.ci/constraints-lowest.txt``).

When an installed version changes what a family relies on (a module path, the method that
computes attention), the user gets :class:`UnsupportedVersionError`: one line naming the
family, the installed version and the tested range.
"""

from __future__ import annotations

import importlib.metadata

from packaging.version import Version

#: This release of captum_ffb (``captum_ffb.__version__``; setup.cfg reads it from here).
__version__ = "0.4.0.dev0"
#: distribution → (lowest tested, highest tested) version.
TESTED: dict[str, tuple[str, str]] = {
    "transformers": ("5.0.0", "5.24.0"),
    "torch": ("2.6.0", "2.15.0"),
    "captum": ("0.8.0", "0.9.0"),
}


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (``None`` when it is not installed)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` → ``(2, 13, 0)`` (a pre-release counts as its release)."""
    return Version(version).release


def requirement(distribution: str, lowest: str | None = None) -> str:
    """The requirement that admits the tested range: ``"transformers>=5.0.0,<5.25"`` (from
    ``lowest`` instead of the range's lowest version, when given)."""
    low, high = TESTED[distribution]
    major, minor = release(high)[:2]
    return f"{distribution}>={lowest or low},<{major}.{minor + 1}"


def tested_range(distribution: str) -> str:
    """``"5.0.0 to 5.24.x"``: the tested range of ``distribution`` in words."""
    low, high = TESTED[distribution]
    return f"{low} to {'.'.join(high.split('.')[:2])}.x"


def in_tested_range(distribution: str, version: str | None = None) -> bool:
    """Whether ``version`` (the installed one by default) lies in the tested range (the
    highest tested minor release counts with all its patch releases)."""
    version = installed_version(distribution) if version is None else version
    if version is None:
        return False
    low, high = TESTED[distribution]
    found = release(version)
    return release(low) <= found and found[:2] <= release(high)[:2]


class UnsupportedVersionError(ValueError):
    """A family's modules changed in the installed version of a library we hook into.

    Args:
        family (str): the model family (``config.model_type``).
        change (str): what is no longer where the family's spec expects it.
        distribution (str): the library whose modeling code changed.
        lowest (str, optional): the lowest version the family works with, when it is above
                    the tested range's lowest.
    """

    def __init__(self, family: str | None, change: str, distribution: str = "transformers",
                 lowest: str | None = None) -> None:
        version = installed_version(distribution) or "(not installed)"
        where = "outside" if not in_tested_range(distribution, version) else "inside"
        super().__init__(
            f"{family or 'this model'}: {change} in {distribution} {version} ({where} the tested "
            f"range {tested_range(distribution)}); install a tested version "
            f"(pip install \"{requirement(distribution, lowest)}\") "
            "or report it with the output of `captum-ffb env`"
        )
        self.family = family
        self.distribution = distribution
        self.version = version
