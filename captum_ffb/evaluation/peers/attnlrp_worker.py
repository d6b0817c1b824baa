r"""AttnLRP relevances from the real ``lxt`` package, for a Llama-family model.

Runs INSIDE the peer environment made by ``setup_lxt.sh`` (next to this file; transformers
4.53, lxt 2.1), never in the main one: ``captum_ffb.evaluation.peers.attnlrp_relevance`` starts
it as a standalone script, in a subprocess. It ships inside the captum_ffb package only so that
an installed package has it: it imports nothing from captum_ffb (that environment has none) and
only numpy at module level.

Input (``.json`` or ``.npz``), a list of examples, each with ``input_ids`` (token ids),
``target_position`` (int; negative counts from the end) and a target: ``target_id`` (the logit
of that token at that position) or ``contrast`` ``[a, b]`` (``logit(a) - logit(b)``).

* JSON: ``{"examples": [{"input_ids": [...], "target_position": -1, "target_id": 7}, ...]}``
* npz: ``input_ids`` (all ids, concatenated), ``lengths``, ``target_position``, ``target_a``,
  ``target_b`` (``-1`` where the target is the single logit ``target_a``).

Output ``.npz``: ``relevance`` (float32, the examples' relevances concatenated; split it with
``lengths``), ``lengths``, ``target_value`` (the target as the patched model computed it),
``target_position`` (resolved, non-negative), ``seconds`` (per example: forward + backward;
model loading and a short warm-up pass excluded), ``peak_rss_bytes`` (the process's peak
resident memory after each example, so non-decreasing), ``load_seconds`` (loading and warm-up)
and ``meta`` (a JSON string: versions, threads, model file); with ``--save-logits`` also
``logits`` (examples × vocabulary: the logits at each target position).

The relevance of input position ``i`` is ``(inputs_embeds * grad)[i].sum()`` after
backpropagating the target through the model patched by ``lxt.efficient.monkey_patch``
(AttnLRP rules; eager attention; float32).

    python attnlrp_worker.py MODEL_DIR INPUT OUTPUT [--gguf-file F] [--threads 2] [--save-logits]
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import resource
import sys
import time
import types
import warnings
from pathlib import Path

import numpy as np


def read_examples(path: Path) -> list[dict]:
    """The examples of a ``.json`` or ``.npz`` input file, as dicts (see the module docstring)."""
    path = Path(path)
    if path.suffix == ".npz":
        data = np.load(path)
        ends = np.cumsum(data["lengths"])
        starts = ends - data["lengths"]
        examples = []
        for i, (start, end) in enumerate(zip(starts, ends)):
            example = {"input_ids": data["input_ids"][start:end].tolist(),
                       "target_position": int(data["target_position"][i])}
            a, b = int(data["target_a"][i]), int(data["target_b"][i])
            if b < 0:
                example["target_id"] = a
            else:
                example["contrast"] = [a, b]
            examples.append(example)
        return examples
    with open(path) as handle:
        data = json.load(handle)
    return data["examples"] if isinstance(data, dict) else data


def target_tokens(example: dict) -> tuple[int, int | None]:
    """``(a, b)``: the target is ``logit(a)``, or ``logit(a) - logit(b)`` when ``b`` is given."""
    if "contrast" in example:
        a, b = example["contrast"]
        return int(a), int(b)
    return int(example["target_id"]), None


def _stub_module(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attributes)
    return module


def import_lxt_monkey_patch():
    """``lxt.efficient.monkey_patch``, imported without torchvision or open_clip.

    lxt 2.1 imports its ViT patches unconditionally; they need ``torchvision`` (its
    ``vision_transformer.nn``) but language models do not. Transformers is asked first whether
    torchvision is there, so that its cached answer stays "no"; stand-in modules then serve the
    import and are removed again afterwards.
    """
    import torch
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()
    stand_ins = {
        "torchvision": _stub_module("torchvision"),
        "torchvision.models": _stub_module("torchvision.models"),
        "torchvision.models.vision_transformer": _stub_module(
            "torchvision.models.vision_transformer", nn=torch.nn),
        "open_clip": _stub_module("open_clip"),
        "open_clip.transformer": _stub_module("open_clip.transformer"),
    }
    stand_ins["torchvision"].models = stand_ins["torchvision.models"]
    stand_ins["torchvision.models"].vision_transformer = stand_ins[
        "torchvision.models.vision_transformer"]
    stand_ins["open_clip"].transformer = stand_ins["open_clip.transformer"]
    added = [name for name in stand_ins if name not in sys.modules]
    for name in added:
        sys.modules[name] = stand_ins[name]
    try:
        with warnings.catch_warnings():  # "zennit is not available": it serves vision models
            warnings.filterwarnings("ignore", message=".*zennit.*")
            from lxt.efficient import monkey_patch
    finally:
        for name in added:
            if sys.modules.get(name) is stand_ins[name]:
                del sys.modules[name]
    return monkey_patch


def find_gguf(model_dir: Path) -> str | None:
    files = sorted(p.name for p in model_dir.glob("*.gguf"))
    return files[0] if files else None


def load_patched_llama(model_dir: Path, gguf_file: str | None):
    """The model in float32 with eager attention, its Llama module patched by lxt first."""
    import torch
    import transformers
    from transformers.models.llama import modeling_llama

    monkey_patch = import_lxt_monkey_patch()
    monkey_patch(modeling_llama)
    kwargs = {"attn_implementation": "eager", "torch_dtype": torch.float32}
    if gguf_file is None and not (model_dir / "config.json").exists():
        gguf_file = find_gguf(model_dir)
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    if model.config.model_type != "llama":
        raise SystemExit(f"attnlrp_worker: expects a Llama-family model, got "
                         f"{model.config.model_type!r}")
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model, gguf_file


def attnlrp_one(model, example: dict) -> tuple[np.ndarray, float, int, np.ndarray]:
    """Relevance per position, the target value, the resolved target position, and the logits
    at that position."""
    import torch

    ids = torch.tensor([example["input_ids"]], dtype=torch.long)
    n = ids.shape[1]
    position = int(example["target_position"])
    if not -n <= position < n:
        raise ValueError(f"target_position {position} outside a sequence of length {n}")
    position %= n
    a, b = target_tokens(example)
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    hidden = model.model(inputs_embeds=embeds, use_cache=False).last_hidden_state
    logits = model.lm_head(hidden[0, position])  # the head is applied to that row only
    target = logits[a] if b is None else logits[a] - logits[b]
    target.backward()
    relevance = (embeds * embeds.grad).sum(-1)[0]
    return (relevance.detach().numpy().astype(np.float32), float(target.detach()), position,
            logits.detach().numpy().astype(np.float32))


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kibibytes


def write_output(path: Path, records: list[dict], load_seconds: float, meta: dict) -> None:
    """Write the per-example ``records`` (keys as in the module docstring) as the output npz."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    relevances = [np.asarray(r["relevance"], dtype=np.float32) for r in records]
    extra = {}
    if records and all(r.get("logits") is not None for r in records):
        extra["logits"] = np.stack([np.asarray(r["logits"], np.float32) for r in records])
    # atomically, beside the destination: a link there is replaced, not followed (this worker
    # runs in the peer's environment, without captum_ffb)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "xb") as handle:
        np.savez(
            handle,
            relevance=np.concatenate(relevances) if relevances else np.zeros(0, np.float32),
            lengths=np.array([len(r) for r in relevances], dtype=np.int64),
            target_value=np.array([r["target_value"] for r in records], dtype=np.float64),
            target_position=np.array([r["target_position"] for r in records], dtype=np.int64),
            seconds=np.array([r["seconds"] for r in records], dtype=np.float64),
            peak_rss_bytes=np.array([r["peak_rss_bytes"] for r in records], dtype=np.int64),
            load_seconds=np.float64(load_seconds),
            meta=np.array(json.dumps(meta)),
            **extra,
        )
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--gguf-file", default=None, help="a .gguf file name in MODEL_DIR")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--save-logits", action="store_true",
                        help="also write each example's logits at its target position")
    args = parser.parse_args(argv)

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    examples = read_examples(args.input)
    start = time.perf_counter()
    model, gguf_file = load_patched_llama(args.model_dir, args.gguf_file)
    if examples:  # one short untimed pass, so that first-call costs do not land on example 0
        attnlrp_one(model, {"input_ids": examples[0]["input_ids"][:4], "target_position": -1,
                            "target_id": target_tokens(examples[0])[0]})
    load_seconds = time.perf_counter() - start

    records = []
    for example in examples:
        start = time.perf_counter()
        relevance, value, position, row = attnlrp_one(model, example)
        records.append({"relevance": relevance, "target_value": value,
                        "target_position": position, "seconds": time.perf_counter() - start,
                        "peak_rss_bytes": peak_rss_bytes(),
                        "logits": row if args.save_logits else None})

    from importlib.metadata import version

    meta = {
        "lxt": version("lxt"), "transformers": transformers.__version__,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "model_dir": str(args.model_dir), "gguf_file": gguf_file,
        "attn_implementation": model.config._attn_implementation, "dtype": "float32",
        "python": sys.version.split()[0], "pid": os.getpid(),
    }
    write_output(args.output, records, load_seconds, meta)
    return 0

if __name__ == "__main__":
    sys.exit(main())
