"""The package stands alone: a wheel built from this tree holds every file of ``captum_ffb``,
the AttnLRP peer's worker and setup script among them, and an installed copy finds them."""

from __future__ import annotations

import ast
import configparser
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from captum_ffb.evaluation import peers

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(peers.__file__).resolve().parent


def test_peer_scripts_are_files_of_the_package():
    assert Path(peers.WORKER) == PEERS / "attnlrp_worker.py" and peers.WORKER.is_file()
    assert Path(peers.SETUP_SCRIPT) == PEERS / "setup_lxt.sh" and peers.SETUP_SCRIPT.is_file()
    assert shlex.split(peers.SETUP_COMMAND) == ["bash", str(peers.SETUP_SCRIPT)]


def test_package_data_declares_the_setup_script():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    patterns = config["options.package_data"]["captum_ffb.evaluation.peers"].split()
    assert any(Path("setup_lxt.sh").match(pattern) for pattern in patterns)


def _imported(nodes) -> set[str]:
    """The top-level names of the modules that these statements import."""
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the worker must not import relatively"
            names.add(node.module.split(".")[0])
    return names


def test_worker_is_a_standalone_script():
    """The peer environment has no captum_ffb: the worker imports none of it, only the
    standard library and numpy at module level, and runs as a script by its path."""
    tree = ast.parse(peers.WORKER.read_text(encoding="utf-8"))
    anywhere = _imported(ast.walk(tree))
    assert "captum_ffb" not in anywhere
    assert _imported(tree.body) - set(sys.stdlib_module_names) <= {"numpy", "__future__"}
    done = subprocess.run([sys.executable, "-I", str(peers.WORKER), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "MODEL_DIR" in done.stdout.upper()


def _copy_source(destination: Path) -> Path:
    """What a wheel is built from: the package and the build files, no build leftovers."""
    destination.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, destination / name)
    shutil.copytree(ROOT / "captum_ffb", destination / "captum_ffb",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return destination


def _can_build_wheels() -> bool:
    """setuptools builds wheels itself from 70.1; before that it needs the wheel package."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    from importlib.metadata import version

    major, minor = (int(part) for part in version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, Path]:
    """A wheel built offline from a copy of this tree, and the copy."""
    if not _can_build_wheels():
        pytest.skip("building a wheel offline needs setuptools 70.1 or later, or wheel")
    work = tmp_path_factory.mktemp("wheel")
    source = _copy_source(work / "source")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL")}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(work / "dist"), str(source)],
        capture_output=True, text=True, timeout=600, env=env, cwd=work,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = (work / "dist").glob("captum_ffb-*.whl")
    return built, source


def test_wheel_holds_every_file_of_the_package(wheel):
    built, source = wheel
    with zipfile.ZipFile(built) as archive:
        names = {n for n in archive.namelist() if not n.split("/")[0].endswith(".dist-info")}
    tree = {path.relative_to(source).as_posix() for path in (source / "captum_ffb").rglob("*")
            if path.is_file()}
    assert {"captum_ffb/evaluation/peers/attnlrp_worker.py",
            "captum_ffb/evaluation/peers/setup_lxt.sh"} <= names
    assert names == tree


def test_an_installed_wheel_finds_the_peer_scripts(wheel, tmp_path):
    """Unpacked (a pure-Python wheel's install), imported from outside the tree: the worker
    and the setup script are the installed copies, and the setup hint names the installed
    script."""
    built, _ = wheel
    site = tmp_path / "site"
    with zipfile.ZipFile(built) as archive:
        archive.extractall(site)
    check = (
        "import json; from pathlib import Path; from captum_ffb.evaluation import peers; "
        "print(json.dumps([str(Path(peers.__file__).resolve()), str(peers.WORKER), "
        "peers.WORKER.is_file(), str(peers.SETUP_SCRIPT), peers.SETUP_SCRIPT.is_file(), "
        "peers.SETUP_COMMAND]))"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    import json

    module, worker, worker_ok, script, script_ok, command = json.loads(done.stdout)
    peers_dir = site.resolve() / "captum_ffb" / "evaluation" / "peers"
    assert Path(module).parent == peers_dir
    assert Path(worker) == peers_dir / "attnlrp_worker.py" and worker_ok
    assert Path(script) == peers_dir / "setup_lxt.sh" and script_ok
    assert shlex.split(command) == ["bash", script]
    if peers.attnlrp_available():  # the peer environment's Python runs the installed worker
        ran = subprocess.run([str(peers.lxt_python()), "-I", worker, "--help"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
