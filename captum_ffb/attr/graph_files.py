r"""Attribution graphs as files: :meth:`~captum_ffb.attr.AttributionGraph.save` and
:meth:`~captum_ffb.attr.AttributionGraph.load`.

**The format.** One ZIP file in NumPy's ``.npz`` layout (``numpy.load`` reads its arrays):

* ``metadata.json``: ``format`` (:data:`FORMAT`) and ``version`` (:data:`VERSION`), the
  library's version, the granularity, tokens and token ids, what is explained (``target``:
  its kind, units, coefficients, position, texts), the output's label and probability, the
  bias and output node indices, the pruning's thresholds and excluded positions, the
  query–key links, the components patched for real, and ``origin`` (below);
* one ``.npy`` array per field of the graph's numbers: the node table (``kinds`` as indices
  into :data:`~captum_ffb.engine.graph.NODE_KINDS`, ``layers``, ``heads``, ``positions``,
  ``values``), the edges (``sources``, ``targets``: 32-bit where the node count allows,
  ``weights``), the pruning's ``node_mask``, ``edge_mask`` and ``influence``, ``max_nodes``'s
  ``left_out`` and ``computed``, and the patching estimates (``patch_estimates.<estimator>``,
  ``patch_kappa``).

Arrays are written to the archive in chunks (an unpruned graph's millions of edges are never
held as Python objects), compressed by default, and the file replaces an earlier one only
once it is whole.

**Binding.** ``origin`` records what the score splits need beyond the numbers: the model's
family, a fingerprint of its weights (per parameter: name, shape, dtype and three float64
sums), the rules (their ``repr``), the reference, the input (its tensors as arrays
``origin.*``) and the resolved head target. :func:`bind_graph` refuses a model whose weights,
family or rules differ, then records the frozen pass again and checks that it gives the
graph's value.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["FORMAT", "VERSION", "bind_graph", "load_graph", "save_graph", "weights_digest"]

#: The ``format`` field of a graph file's ``metadata.json``.
FORMAT = "captum-ffb-attribution-graph"
#: The format's version (a file of a later version is refused).
VERSION = 1
#: The member holding everything but the arrays.
METADATA = "metadata.json"
#: Elements written per chunk.
CHUNK = 1 << 22
#: Elements summed per chunk by :func:`weights_digest` (a multiple of 1021).
DIGEST_CHUNK = 1021 * 4096
#: The relative tolerance of the weights' fingerprint sums (float64 sums of the same
#: weights on two devices differ in their last digits; one weight edited by more than about
#: this share of the parameter's ``Σ|w|`` is seen).
DIGEST_TOLERANCE = 1e-12


# --------------------------------------------------------------------------- fingerprint
def weights_digest(model: nn.Module) -> list[list[Any]]:
    """A fingerprint of ``model``'s weights that survives a file and another process: per
    parameter ``[name, shape, dtype, Σ w, Σ |w|, Σ w_i·((i mod 1021) − 510)]`` (float64 sums
    of float32 terms; the last one sees weights moved within a parameter). About a second per
    hundred million weights on one CPU thread."""
    rows = []
    patterns: dict[tuple[torch.device, torch.dtype], Tensor] = {}
    for name, parameter in model.named_parameters():
        flat = parameter.detach().reshape(-1)
        if flat.dtype not in (torch.float32, torch.float64):
            flat = flat.float() if flat.is_floating_point() else flat.double()
        key = (flat.device, flat.dtype)
        if key not in patterns:  # the same for every chunk: a chunk starts at a multiple of 1021
            patterns[key] = (torch.arange(DIGEST_CHUNK, device=flat.device) % 1021 - 510).to(flat.dtype)
        sums = torch.zeros(3, dtype=torch.float64, device=flat.device)
        for start in range(0, flat.numel(), DIGEST_CHUNK):
            x = flat[start:start + DIGEST_CHUNK]
            sums += torch.stack([x.sum(dtype=torch.float64), x.abs().sum(dtype=torch.float64),
                                 (x * patterns[key][:x.numel()]).sum(dtype=torch.float64)])
        rows.append([name, list(parameter.shape), str(parameter.dtype).removeprefix("torch."), *sums.tolist()])
    return rows


def _digest_difference(saved: list[list[Any]], found: list[list[Any]]) -> str | None:
    """Where two fingerprints differ, in words (``None``: the same weights)."""
    if len(saved) != len(found):
        return f"{len(found)} parameters, the graph's model had {len(saved)}"
    for was, now in zip(saved, found):
        if was[:3] != now[:3]:
            return f"parameter {now[0]} {now[1]} {now[2]}, the graph's model had {was[0]} {was[1]} {was[2]}"
        scale = max(abs(was[4]), 1e-30)
        tolerance = [DIGEST_TOLERANCE * scale, DIGEST_TOLERANCE * scale, 510 * DIGEST_TOLERANCE * scale]
        if any(abs(a - b) > t for a, b, t in zip(was[3:], now[3:], tolerance)):
            return f"parameter {now[0]} holds other values"
    return None


# --------------------------------------------------------------------------- arrays
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    if dtype in (torch.bfloat16, torch.float16):
        return np.dtype(np.float32)  # NumPy has no bfloat16: widened
    return np.dtype(torch.empty(0, dtype=dtype, device="cpu").numpy().dtype)


def _write_array(archive: zipfile.ZipFile, name: str, tensor: Tensor, dtype: Any = None) -> None:
    """``tensor`` as member ``<name>.npy``, written chunk by chunk."""
    values = tensor.detach()
    chosen = np.dtype(dtype) if dtype is not None else _numpy_dtype(values.dtype)
    header = {"descr": np.lib.format.dtype_to_descr(chosen), "fortran_order": False, "shape": tuple(values.shape)}
    flat = values.reshape(-1)
    with archive.open(f"{name}.npy", "w", force_zip64=True) as handle:
        np.lib.format.write_array_header_1_0(handle, header)
        for start in range(0, flat.numel(), CHUNK):
            chunk = flat[start:start + CHUNK].cpu()
            if chunk.dtype in (torch.bfloat16, torch.float16):
                chunk = chunk.float()
            handle.write(chunk.numpy().astype(chosen, copy=False).tobytes())


def _read_array(archive: zipfile.ZipFile, name: str) -> Tensor:
    with archive.open(f"{name}.npy") as handle:
        return torch.from_numpy(np.lib.format.read_array(handle, allow_pickle=False).copy())


# --------------------------------------------------------------------------- origin
def _plain(value: Any, arrays: dict[str, Tensor], key: str) -> Any:
    """``value`` as JSON, its tensors moved to ``arrays`` (``{"array": name}``); a
    ``TypeError`` for what neither holds."""
    if isinstance(value, Tensor):
        arrays[key] = value.detach().cpu()
        return {"array": key, "dtype": str(value.dtype).removeprefix("torch.")}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return {"list": [_plain(v, arrays, f"{key}.{k}") for k, v in enumerate(value)]}
    raise TypeError(f"{type(value).__name__} is neither a tensor nor a plain value")


def _unplain(value: Any, arrays: Mapping[str, Tensor], device: torch.device | None) -> Any:
    if isinstance(value, dict) and "array" in value:
        tensor = arrays[value["array"]]
        dtype = getattr(torch, value.get("dtype", ""), None)
        tensor = tensor.to(dtype) if isinstance(dtype, torch.dtype) else tensor
        return tensor if device is None else tensor.to(device)
    if isinstance(value, dict) and "list" in value:
        return [_unplain(v, arrays, device) for v in value["list"]]
    return value


def _rules_of(rules: Mapping[str, Any]) -> dict[str, str]:
    return {role: repr(rule) for role, rule in sorted(rules.items())}


def _origin(graph: Any) -> dict[str, Any] | None:
    """What binding needs, from a graph's score splitter (its model, input and rules) or as
    loaded; ``None`` where the graph has neither."""
    scorer = graph.scorer
    if scorer is None or not hasattr(scorer, "request"):
        return graph.origin
    from captum_ffb.engine.passes import weights_fingerprint

    request = scorer.request
    arrays: dict[str, Tensor] = {}
    try:
        inputs = {"args": _plain(list(request.args), arrays, "origin.args"),
                  "kwargs": {k: _plain(v, arrays, f"origin.kwargs.{k}") for k, v in request.kwargs.items()},
                  "reference": _plain(request.reference, arrays, "origin.reference")}
    except TypeError as error:
        return {"unbindable": f"its input holds what a file cannot ({error})"}
    target = {f.name: _plain(getattr(request.target, f.name), arrays, f"origin.target.{f.name}")
              for f in fields(request.target)}
    unchanged = weights_fingerprint(scorer.model) == scorer.fingerprint
    return {"model_type": scorer.engine.model_type, "model_class": type(scorer.model).__name__,
            "fingerprint": weights_digest(scorer.model) if unchanged else None,
            "rules": _rules_of(scorer.rules), **inputs, "target": target, "arrays": arrays}


# --------------------------------------------------------------------------- save
def save_graph(graph: Any, path: str | os.PathLike, compress: bool = True) -> Path:
    """Write ``graph`` (an :class:`~captum_ffb.attr.AttributionGraph`) to ``path`` (one
    ``.npz`` file, this module's format); returns the path.

    Args:
        graph (AttributionGraph): the graph, pruned or not.
        path (str or PathLike): the file (``.npz`` by convention); replaced once whole.
        compress (bool): deflate the arrays (smaller; slower to write and read).
    """
    import captum_ffb
    from captum_ffb.engine.graph import NODE_KINDS
    from captum_ffb.outputs import atomic_open

    d = graph.data
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"{target} is a folder: give a file name (e.g. {target / 'graph.npz'})")
    index_dtype = np.int32 if len(d) < 2 ** 31 else np.int64
    origin = _origin(graph)
    origin_arrays: dict[str, Tensor] = {} if origin is None else origin.get("arrays", {})
    metadata = {
        "format": FORMAT, "version": VERSION, "library": captum_ffb.__version__,
        "granularity": graph.granularity, "tokens": list(graph.tokens), "token_ids": graph.token_ids,
        "output_label": graph.output_label, "probability": graph.probability, "n_source": graph.n_source,
        "bias": int(d.bias), "output": int(d.output), "nodes": len(d), "edges": int(d.weights.numel()),
        "target": None if graph.target is None else {f.name: getattr(graph.target, f.name)
                                                     for f in fields(graph.target)},
        "thresholds": dict(graph.thresholds), "excluded_positions": list(graph.excluded_positions),
        "qk_links": [dict(link) for link in graph.qk_links],
        "patch_estimators": list(graph.patch_estimates), "patch_components": graph.patch_components,
        "patch_seconds": dict(graph.patch_seconds), "patch_passes": dict(graph.patch_passes),
        "edge_estimators": list(graph.edge_patches),
        "origin": None if origin is None else {k: v for k, v in origin.items() if k != "arrays"},
    }
    mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with atomic_open(target, "wb") as handle, zipfile.ZipFile(handle, "w", compression=mode, allowZip64=True) as archive:
        _write_array(archive, "kinds", torch.tensor([NODE_KINDS.index(k) for k in d.kinds], dtype=torch.uint8, device="cpu"))
        for name in ("layers", "heads", "positions"):
            _write_array(archive, name, torch.tensor(getattr(d, name), dtype=torch.int32, device="cpu"))
        _write_array(archive, "values", d.values)
        _write_array(archive, "sources", d.sources, index_dtype)
        _write_array(archive, "targets", d.targets, index_dtype)
        _write_array(archive, "weights", d.weights)
        _write_array(archive, "node_mask", graph.node_mask)
        _write_array(archive, "edge_mask", graph.edge_mask)
        optional = {"influence": graph.influence, "left_out": d.left_out, "computed": d.computed,
                    "patch_kappa": graph.patch_kappa,
                    **{f"patch_estimates.{name}": v for name, v in graph.patch_estimates.items()},
                    **{f"edge_patches.{name}": v for name, v in graph.edge_patches.items()}, **origin_arrays}
        for name, tensor in optional.items():
            if tensor is not None:
                _write_array(archive, name, tensor)
        archive.writestr(METADATA, json.dumps(metadata, ensure_ascii=False, allow_nan=True))
    return target


# --------------------------------------------------------------------------- load
def load_graph(path: str | os.PathLike, graph_class: Any, target_class: Any) -> Any:
    """The graph written to ``path`` by :func:`save_graph`, as ``graph_class`` (its target as
    ``target_class``; :meth:`~captum_ffb.attr.AttributionGraph.load` passes its own classes);
    a ``ValueError`` for a file that is not one."""
    from captum_ffb.engine.graph import NODE_KINDS, GraphData

    source = Path(path)
    try:
        archive = zipfile.ZipFile(source)
    except zipfile.BadZipFile:
        raise ValueError(f"{source} is not a graph file (not a zip archive): write one with graph.save(path)") from None
    with archive:
        names = set(archive.namelist())
        if METADATA not in names:
            raise ValueError(f"{source} is not a graph file of captum_ffb (it has no {METADATA})")
        meta = json.loads(archive.read(METADATA))
        if meta.get("format") != FORMAT:
            raise ValueError(f"{source} is not a graph file of captum_ffb (format {meta.get('format')!r})")
        if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
            raise ValueError(f"{source} is a graph file of version {meta.get('version')} (captum_ffb "
                             f"{meta.get('library')}); this captum_ffb reads versions up to {VERSION}: upgrade it")
        arrays = {name[:-4]: _read_array(archive, name[:-4]) for name in sorted(names) if name.endswith(".npy")}
    try:
        kinds = [NODE_KINDS[int(k)] for k in arrays["kinds"]]
        data = GraphData(kinds, arrays["layers"].tolist(), arrays["heads"].tolist(), arrays["positions"].tolist(),
                         arrays["values"], arrays["sources"].long(), arrays["targets"].long(), arrays["weights"],
                         int(meta["bias"]), int(meta["output"]), arrays.get("left_out"), arrays.get("computed"))
        _check_sizes(data, arrays, meta)
    except (KeyError, IndexError) as error:
        raise ValueError(f"{source} is a damaged graph file (missing or bad {error})") from None
    target = None if meta["target"] is None else target_class(**{
        k: tuple(v) if isinstance(v, list) else v for k, v in meta["target"].items()})
    origin = meta.get("origin")
    if origin is not None:
        origin = {**origin, "arrays": {k: v for k, v in arrays.items() if k.startswith("origin.")}}
    graph = graph_class(
        data, list(meta["tokens"]), meta["output_label"], meta["granularity"], arrays["node_mask"],
        arrays["edge_mask"], influence=arrays.get("influence"),
        patch_estimates={name: arrays[f"patch_estimates.{name}"] for name in meta["patch_estimators"]},
        patch_kappa=arrays.get("patch_kappa"), patch_components=meta["patch_components"],
        thresholds=dict(meta["thresholds"]), qk_links=list(meta["qk_links"]), probability=meta["probability"],
        token_ids=meta["token_ids"], n_source=meta["n_source"], target=target,
        excluded_positions=tuple(meta["excluded_positions"]), origin=origin,
        patch_seconds=dict(meta.get("patch_seconds", {})), patch_passes=dict(meta.get("patch_passes", {})),
        edge_patches={name: arrays[f"edge_patches.{name}"] for name in meta.get("edge_estimators", [])})
    return graph


def _check_sizes(data: Any, arrays: Mapping[str, Tensor], meta: Mapping[str, Any]) -> None:
    n, e = int(meta["nodes"]), int(meta["edges"])
    sized = {"kinds": n, "values": n, "node_mask": n, "sources": e, "targets": e, "weights": e, "edge_mask": e}
    sized.update({name: n for name in arrays if name in ("influence", "left_out", "computed", "patch_kappa")
                  or name.startswith("patch_estimates.")})
    sized.update({name: e for name in arrays if name.startswith("edge_patches.")})
    wrong = [name for name, size in sized.items() if arrays[name].shape != (size,)]
    if wrong or len(data) != n:
        raise IndexError(f"array sizes: {', '.join(wrong) or 'nodes'}")
    if e and (int(data.sources.min()) < 0 or int(max(data.sources.max(), data.targets.max())) >= n
              or int(data.targets.min()) < 0):
        raise IndexError("edge ends outside the node table")
    if not (0 <= data.bias < n and 0 <= data.output < n):
        raise IndexError("bias or output index")


# --------------------------------------------------------------------------- bind
def bind_graph(graph: Any, engine: Any, chosen: Mapping[str, Any]) -> None:
    """Give ``graph`` (loaded, or built on another copy of the model) a score splitter bound to
    ``engine`` (a ``NormDecomposition``'s engine): refused (a ``ValueError``) unless
    its model is of the graph's family with the same weights (:func:`weights_digest`), the
    rules ``chosen`` (by role, the defaults filled in) are the graph's and the frozen pass
    gives the graph's value again."""
    from captum_ffb.engine.graph import graph_pass, players_of
    from captum_ffb.engine.head import HeadTarget
    from captum_ffb.engine.locking import model_lock
    from captum_ffb.engine.score_split import ScoreSplitter

    origin = _origin(graph)
    if origin is None:
        raise ValueError("this graph records no input and no model to bind to (it was saved without its score "
                         "splitter): build it again with attribute_graph")
    if "unbindable" in origin:
        raise ValueError(f"this graph cannot be bound to a model: {origin['unbindable']}")
    if engine.model_type != origin["model_type"]:
        raise ValueError(f"this graph was built on a {origin['model_type']} model ({origin['model_class']}), not "
                         f"a {engine.model_type} one")
    if origin["fingerprint"] is None:
        raise ValueError("this graph's model changed after the graph was built and before it was saved: its "
                         "score splits cannot be bound; build the graph again")
    difference = _digest_difference(origin["fingerprint"], weights_digest(engine.model))
    if difference is not None:
        raise ValueError(f"the weights of this {type(engine.model).__name__} are not those this graph was built on "
                         f"({difference}): its score splits would describe another model; bind the model the "
                         "graph was built on, or build the graph again")
    if _rules_of(chosen) != origin["rules"]:
        other = sorted(set(origin["rules"].items()) ^ set(_rules_of(chosen).items()))
        raise ValueError(f"this graph was built with other rules ({', '.join(f'{r}: {v}' for r, v in other)}): "
                         "give bind(model, rules=...) the rules attribute_graph had")
    device = next(engine.model.parameters()).device
    arrays = origin["arrays"]
    args = tuple(_unplain(origin["args"], arrays, device))
    kwargs = {k: _unplain(v, arrays, device) for k, v in origin["kwargs"].items()}
    reference = _unplain(origin["reference"], arrays, device)
    target = HeadTarget(**{k: _unplain(v, arrays, device) for k, v in origin["target"].items()})
    request = engine.request(args, kwargs)
    request.reference, request.target = reference, target
    with model_lock(engine.model):
        tape = graph_pass(engine, request, target, chosen, graph.granularity)
        players = players_of(engine, request, tape)
    value = float(tape.value.detach().reshape(-1)[0])
    if abs(value - graph.value) > 1e-4 * max(1.0, abs(graph.value)):
        raise ValueError(f"the model gives the explained output {value:.6g}, the graph {graph.value:.6g}: it is "
                         "not the graph's model (or runs in another precision)")
    graph.scorer = ScoreSplitter(engine, request, chosen, graph.granularity, players)
    if graph.origin is None:
        graph.origin = origin
