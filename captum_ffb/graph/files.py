r"""Attribution graphs as files: :meth:`~captum_ffb.graph.record.AttributionGraph.save` and
:meth:`~captum_ffb.graph.record.AttributionGraph.load`.

**The format.** One ZIP file in NumPy's ``.npz`` layout (``numpy.load`` reads its arrays):

* ``metadata.json`` (strict JSON: a number that is not one is ``null``): ``format``
  (:data:`FORMAT`) and ``version`` (:data:`VERSION`), the library's version, the granularity,
  tokens and token ids, what is explained (``target``: its kind, units, coefficients, position,
  texts), the output's label and probability, the bias and output node indices, the node and
  edge counts, the pruning's thresholds and excluded positions, the query–key links, the
  patching estimators and the components they patched for real, and ``origin`` (below);
* one ``.npy`` array per field of the graph's numbers: the node table (``kinds`` as indices
  into :data:`~captum_ffb.graph.build.NODE_KINDS`, ``layers``, ``heads``, ``positions``,
  ``values``), the edges (``sources``, ``targets``: 32-bit where the node count allows,
  ``weights``), the pruning's ``node_mask``, ``edge_mask`` and ``influence``, ``max_nodes``'s
  ``left_out`` and ``computed``, and the patching estimates (``patch_estimates.<estimator>``,
  ``patch_kappa``, the edges' ``edge_patches.<estimator>`` computed so far).

Arrays are written to the archive in chunks (an unpruned graph's millions of edges are never
held as Python objects), compressed by default, and the file replaces an earlier one only
once it is whole.

**Reading a file from anyone.** A graph file is data: :func:`load_graph` reads only the members
the format names (others are never decompressed), checks ``metadata.json``'s fields and types
(:data:`MAX_METADATA_BYTES` at most), each array's header (its dtype, and its shape against
the metadata's node and edge counts) before its bytes, the bytes all arrays take together
against what a file of its size can hold (:data:`ARRAY_BYTES_FLOOR` plus
:data:`ARRAY_BYTES_PER_FILE_BYTE` per byte of the file), every checksum, and the node table's
kinds, indices and positions. No pickle, no name from the file used as code or path. Every
failure is one :class:`GraphFileError` (a ``ValueError``) naming the file and the field.

**Binding.** ``origin`` records what the score splits need beyond the numbers: the model's
family, its fingerprint (:mod:`~captum_ffb.engine.fingerprint`: per parameter and buffer, its
name, shape, dtype and SHA-256), the rules (their ``repr``), the reference, the input (its
tensors as arrays ``origin.*``) and the resolved head target. :func:`~captum_ffb.graph.bound.bound_scorer` refuses a
model whose weights, buffers, family or rules differ, then records the frozen pass again and
checks that it gives the graph's value.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from captum_ffb._deprecation import moved_name
from captum_ffb.core.keys import NODE_KINDS
from captum_ffb.core.versions import __version__
from captum_ffb.graph.build import GraphData
from captum_ffb.graph.target import GraphTarget
from captum_ffb.io.files import atomic_open, to_json

__all__ = ["ARRAY_BYTES_FLOOR", "ARRAY_BYTES_PER_FILE_BYTE", "FORMAT", "LENS_TEXTS", "MAX_MEMBERS", "MAX_METADATA_BYTES", "VERSION",
           "GraphFileError", "load_graph", "read_graph", "save_graph"]

#: The ``format`` field of a graph file's ``metadata.json``.
FORMAT = "captum-ffb-attribution-graph"
#: The format's version (a file of a later version is refused). Version 2: the SHA-256
#: fingerprint of parameters and buffers, strict JSON; version 1 files load (without binding).
VERSION = 2
#: The member holding everything but the arrays.
METADATA = "metadata.json"
#: Elements written (and bytes read) per chunk.
CHUNK = 1 << 22
#: The most bytes ``metadata.json`` may take.
MAX_METADATA_BYTES = 64 << 20
#: The most members a graph file may have (a graph writes about thirty).
MAX_MEMBERS = 4096

#: Texts per node and direction a graph file's ``lens`` may hold.
LENS_TEXTS = 20
#: The arrays of a file may take this many bytes in memory, plus
#: :data:`ARRAY_BYTES_PER_FILE_BYTE` per byte of the file.
ARRAY_BYTES_FLOOR = 64 << 20
#: Bytes the arrays may take per byte of the file, beyond :data:`ARRAY_BYTES_FLOOR`: a graph's
#: arrays take 1–3 times their compressed size (the weights do not compress), a hostile file's
#: zeros a thousand times.
ARRAY_BYTES_PER_FILE_BYTE = 16
#: The granularities a graph is built at.
GRANULARITIES = ("sublayer", "head", "neuron")
#: What a graph's output can be.
TARGET_KINDS = ("token", "class", "direction", "answer")
#: The dtypes a tensor of ``origin`` may name.
ORIGIN_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
_INTEGER, _FLOAT, _BOOL = "iu", "f", "b"
#: "read the field from the metadata" (a value given instead is checked as it is)
_FETCH: Any = object()


class GraphFileError(ValueError):
    """A file that is not a graph file of this library, or a damaged one: one line naming the
    file and the field."""


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


# --------------------------------------------------------------------------- origin
# --------------------------------------------------------------------------- save
def save_graph(graph: Any, path: str | os.PathLike, compress: bool = True) -> Path:
    """Write ``graph`` (an :class:`~captum_ffb.graph.record.AttributionGraph`) to ``path`` (one
    ``.npz`` file, this module's format); returns the path.

    Args:
        graph (AttributionGraph): the graph, pruned or not.
        path (str or PathLike): the file, ending in ``.npz``; replaced once whole (a path that
                    is a folder, a device or a pipe is refused).
        compress (bool): deflate the arrays (smaller; slower to write and read).
    """
    if not isinstance(compress, bool):
        raise TypeError(f"compress must be True or False, got {compress!r}")
    d = graph.data
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"{target} is a folder: give a file name (e.g. {target / 'graph.npz'})")
    if target.suffix.lower() != ".npz":
        raise ValueError(f"path {str(target)!r}: a graph file is a .npz archive (e.g. graph.npz); for JSON write "
                         "graph.to_dict(), or save_neuronpedia_graph for Neuronpedia's viewer")
    index_dtype = np.int32 if len(d) < 2 ** 31 else np.int64
    origin = graph.origin
    origin_arrays: dict[str, Tensor] = {} if origin is None else origin.get("arrays", {})
    metadata = {
        "format": FORMAT, "version": VERSION, "library": __version__,
        "granularity": graph.granularity, "tokens": list(graph.tokens), "token_ids": graph.token_ids,
        "output_label": graph.output_label, "probability": graph.probability, "n_source": graph.n_source,
        "bias": int(d.bias), "output": int(d.output), "nodes": len(d), "edges": int(d.weights.numel()),
        "target": None if graph.target is None else {f.name: getattr(graph.target, f.name)
                                                     for f in fields(graph.target)},
        "thresholds": dict(graph.thresholds), "excluded_positions": list(graph.excluded_positions),
        "qk_links": [dict(link) for link in graph.qk_links],
        "lens": [[int(k), list(up), list(down)] for k, (up, down) in sorted(graph.lens.items())],
        "patch_estimators": list(graph.patch_estimates), "patch_components": graph.patch_components,
        "patch_seconds": dict(graph.patch_seconds), "patch_passes": dict(graph.patch_passes),
        "edge_estimators": list(graph.edge_patches),
        "origin": None if origin is None else {k: v for k, v in origin.items() if k != "arrays"},
    }
    text = to_json(metadata, ensure_ascii=False)
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
        archive.writestr(METADATA, text)
    return target


# --------------------------------------------------------------------------- load
def read_graph(path: str | os.PathLike) -> dict[str, Any]:
    """The fields of the graph written to ``path`` by :func:`save_graph` (the keyword arguments
    of :class:`~captum_ffb.graph.record.AttributionGraph`); a :class:`GraphFileError` (a
    ``ValueError``) for a file that is not one, or is damaged."""
    source = Path(path)
    if not source.exists():
        raise FileNotFoundError(f"no graph file at {source}")
    if not source.is_file():
        raise GraphFileError(f"{source} is not a regular file (a folder, a device or a pipe): give a graph file")
    try:
        return _read(source)
    except GraphFileError:
        raise
    except RecursionError:
        raise GraphFileError(f"{source}: metadata.json is nested too deeply to be a graph file's") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, struct.error, NotImplementedError, RuntimeError, OSError,
            ValueError, OverflowError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise GraphFileError(f"{source} is a damaged graph file ({reason})") from None


def load_graph(path: str | os.PathLike, graph_class: Any, target_class: Any = None) -> Any:
    """The graph written to ``path`` as ``graph_class`` (:func:`read_graph`'s fields;
    ``target_class`` is not needed any more)."""
    return graph_class(**read_graph(path))


def _read(source: Path) -> dict[str, Any]:
    size = source.stat().st_size
    with open(source, "rb") as handle:
        _check_member_count(handle, source)
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error) as error:
        raise GraphFileError(f"{source} is not a graph file (not a zip archive: {error}): write one with "
                             "graph.save(path)") from None
    with archive:
        members: dict[str, zipfile.ZipInfo] = {}
        for info in archive.infolist():
            if info.filename in members:
                raise GraphFileError(f"{source} holds two members named {info.filename!r}")
            members[info.filename] = info
        if METADATA not in members:
            raise GraphFileError(f"{source} is not a graph file of captum_ffb (it has no {METADATA})")
        meta = _metadata(archive, members[METADATA], source)
        fields_ = _Fields(meta, source)
        n, e = fields_.counts()
        wanted = _wanted_arrays(fields_, n, e)
        reader = _ArrayReader(archive, members, source, ARRAY_BYTES_FLOOR + ARRAY_BYTES_PER_FILE_BYTE * size)
        arrays = {name: reader.read(name, shape, kinds, required) for name, (shape, kinds, required) in wanted.items()}
        arrays = {name: value for name, value in arrays.items() if value is not None}
        origin = fields_.origin(reader)
    data = _graph_data(source, arrays, fields_, n, e)
    return dict(
        data=data, tokens=fields_.tokens, output_label=fields_.output_label, granularity=fields_.granularity,
        node_mask=arrays["node_mask"], edge_mask=arrays["edge_mask"], influence=arrays.get("influence"),
        patch_estimates={name: arrays[f"patch_estimates.{name}"] for name in fields_.patch_estimators},
        patch_kappa=arrays.get("patch_kappa"), patch_components=fields_.patch_components,
        thresholds=fields_.thresholds, qk_links=fields_.qk_links, probability=fields_.probability,
        token_ids=fields_.token_ids, n_source=fields_.n_source,
        target=None if fields_.target is None else GraphTarget(**fields_.target),
        excluded_positions=fields_.excluded_positions, origin=origin, patch_seconds=fields_.patch_seconds,
        patch_passes=fields_.patch_passes, lens=fields_.lens,
        edge_patches={name: arrays[f"edge_patches.{name}"] for name in fields_.edge_estimators})


def _graph_data(source: Path, arrays: Mapping[str, Tensor], fields_: _Fields, n: int, e: int) -> GraphData:
    """The node table and edges of a file's arrays, checked."""
    kinds_index = arrays["kinds"].long()
    bad = kinds_index[(kinds_index < 0) | (kinds_index >= len(NODE_KINDS))]
    if len(bad):
        raise GraphFileError(f"{source}: kinds holds {int(bad[0])}, not an index of a node kind "
                             f"(0 … {len(NODE_KINDS) - 1})")
    kinds = [NODE_KINDS[k] for k in kinds_index.tolist()]
    layers, heads, positions = (arrays[name].long().tolist() for name in ("layers", "heads", "positions"))
    _check_nodes(source, kinds, layers, heads, positions, fields_)
    sources, targets = arrays["sources"].long(), arrays["targets"].long()
    if e and (int(sources.min()) < 0 or int(targets.min()) < 0 or int(max(sources.max(), targets.max())) >= n):
        raise GraphFileError(f"{source}: sources or targets point outside the {n} nodes")
    return GraphData(kinds, layers, heads, positions, arrays["values"], sources, targets, arrays["weights"],
                     fields_.bias, fields_.output, arrays.get("left_out"), arrays.get("computed"))


def _check_member_count(handle: Any, source: Path) -> None:
    """Refuse an archive whose directory lists more than :data:`MAX_MEMBERS` members before
    :mod:`zipfile` reads them all (its end record, or its ZIP64 end record, says how many)."""
    handle.seek(0, os.SEEK_END)
    end = handle.tell()
    tail_size = min(end, 65536 + 22)
    handle.seek(end - tail_size)
    tail = handle.read(tail_size)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        raise GraphFileError(f"{source} is not a graph file (not a zip archive): write one with graph.save(path)")
    (count,) = struct.unpack("<H", tail[at + 10:at + 12])
    if count == 0xFFFF and at >= 20 and tail[at - 20:at - 16] == b"PK\x06\x07":
        (offset,) = struct.unpack("<Q", tail[at - 12:at - 4])
        if offset + 40 <= end:
            handle.seek(offset)
            record = handle.read(40)
            if record[:4] == b"PK\x06\x06":
                (count,) = struct.unpack("<Q", record[32:40])
    if count > MAX_MEMBERS:
        raise GraphFileError(f"{source} lists {count:,} members; a graph file has at most {MAX_MEMBERS:,}")


def _metadata(archive: zipfile.ZipFile, info: zipfile.ZipInfo, source: Path) -> dict[str, Any]:
    if info.file_size > MAX_METADATA_BYTES:
        raise GraphFileError(f"{source}: metadata.json takes {info.file_size:,} bytes, more than a graph file's "
                             f"{MAX_METADATA_BYTES:,}")
    with archive.open(info) as handle:
        raw = handle.read(MAX_METADATA_BYTES + 1)
    if len(raw) > MAX_METADATA_BYTES:
        raise GraphFileError(f"{source}: metadata.json takes more than {MAX_METADATA_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise GraphFileError(f"{source}: metadata.json is not UTF-8 (byte 0x{raw[error.start]:02x} at "
                             f"position {error.start})") from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as error:
        raise GraphFileError(f"{source}: metadata.json is not JSON ({error.msg} at line {error.lineno}, "
                             f"column {error.colno})") from None
    if not isinstance(meta, dict):
        raise GraphFileError(f"{source}: metadata.json holds a {_json_type(meta)}, not an object")
    return meta


def _json_type(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


class _ArrayReader:
    """Reads the arrays the format names from an archive, each header checked before its
    bytes, all of them within ``budget`` bytes."""

    def __init__(self, archive: zipfile.ZipFile, members: Mapping[str, zipfile.ZipInfo], source: Path,
                 budget: int) -> None:
        self.archive, self.members, self.source, self.budget = archive, members, source, budget

    def read(self, name: str, shape: tuple[int, ...] | None, kinds: str, required: bool = True) -> Tensor | None:
        """The array ``name`` (``None`` where it is not required and absent): its shape must be
        ``shape`` (any, where ``None``), its dtype of the NumPy kinds ``kinds``."""
        info = self.members.get(f"{name}.npy")
        if info is None:
            if required:
                raise GraphFileError(f"{self.source}: the array {name} is missing")
            return None
        with self.archive.open(info) as handle:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                found, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
            elif version in ((2, 0), (3, 0)):
                found, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
            else:
                raise GraphFileError(f"{self.source}: the array {name} has an .npy header of version {version}")
            if dtype.hasobject or dtype.kind not in kinds or dtype.fields is not None or dtype.subdtype is not None:
                raise GraphFileError(f"{self.source}: the array {name} holds {dtype}, not {_kinds_text(kinds)}")
            if shape is not None and tuple(found) != shape:
                raise GraphFileError(f"{self.source}: the array {name} has shape {tuple(found)}, the metadata "
                                     f"says {shape}")
            if fortran and len(found) > 1:
                raise GraphFileError(f"{self.source}: the array {name} is in Fortran order")
            count = math.prod(found)
            nbytes = count * dtype.itemsize
            if nbytes > self.budget:
                raise GraphFileError(f"{self.source}: the array {name} would take {nbytes:,} bytes, more than a "
                                     f"file of its size holds")
            self.budget -= nbytes
            values = np.empty(count, dtype=dtype)
            view = memoryview(values).cast("B")
            done = 0
            while done < nbytes:
                chunk = handle.read(min(CHUNK, nbytes - done))
                if not chunk:
                    raise GraphFileError(f"{self.source}: the array {name} is cut short")
                view[done:done + len(chunk)] = chunk
                done += len(chunk)
            if handle.read(1):  # also checks the member's CRC
                raise GraphFileError(f"{self.source}: the array {name} holds more bytes than its shape")
        if not dtype.isnative:
            values = values.astype(dtype.newbyteorder("="))
        return torch.from_numpy(values.reshape(found))


def _kinds_text(kinds: str) -> str:
    return " or ".join({"i": "integers", "u": "integers", "f": "floats", "b": "booleans"}[k] for k in dict.fromkeys(
        "i" if k == "u" else k for k in kinds))


def _wanted_arrays(f: _Fields, n: int, e: int) -> dict[str, tuple[tuple[int, ...], str, bool]]:
    """Name → (shape, dtype kinds, required) of every array the metadata names."""
    wanted: dict[str, tuple[tuple[int, ...], str, bool]] = {
        "kinds": ((n,), _INTEGER, True), "layers": ((n,), _INTEGER, True), "heads": ((n,), _INTEGER, True),
        "positions": ((n,), _INTEGER, True), "values": ((n,), _FLOAT, True), "node_mask": ((n,), _BOOL, True),
        "sources": ((e,), _INTEGER, True), "targets": ((e,), _INTEGER, True), "weights": ((e,), _FLOAT, True),
        "edge_mask": ((e,), _BOOL, True), "influence": ((n,), _FLOAT, False), "left_out": ((n,), _FLOAT, False),
        "computed": ((n,), _BOOL, False), "patch_kappa": ((n,), _FLOAT, bool(f.patch_estimators))}
    wanted.update({f"patch_estimates.{name}": ((n,), _FLOAT, True) for name in f.patch_estimators})
    wanted.update({f"edge_patches.{name}": ((e,), _FLOAT, True) for name in f.edge_estimators})
    return wanted


def _check_nodes(source: Path, kinds: list[str], layers: list[int], heads: list[int], positions: list[int],
                 f: _Fields) -> None:
    """The node table as a graph builds it: one bias and one output node where the metadata
    says, every token and writer at a position of the input, no node twice."""
    n_tokens = len(f.tokens)
    if kinds.count("bias") != 1 or kinds[f.bias] != "bias":
        raise GraphFileError(f"{source}: bias: node {f.bias} is a {kinds[f.bias]} node, not the graph's one bias node")
    if kinds.count("output") != 1 or kinds[f.output] != "output":
        raise GraphFileError(f"{source}: output: node {f.output} is a {kinds[f.output]} node, not the graph's one "
                             "output node")
    seen = set()
    for k, (kind, layer, head, position) in enumerate(zip(kinds, layers, heads, positions)):
        if kind in ("bias", "output"):
            ok = layer == -1 and head == -1 and position == -1
        elif kind == "token":
            ok = layer == -1 and head == -1 and 0 <= position < n_tokens
        elif kind == "logit":  # one of several outputs: its unit in the part's field
            ok = layer == -1 and head >= 0 and 0 <= position < n_tokens
        else:
            ok = layer >= 0 and head >= -1 and 0 <= position < n_tokens
        if not ok:
            raise GraphFileError(f"{source}: node {k} (a {kind} node) has layer {layer}, part {head} and position "
                                 f"{position}, not those of a {kind} node of a graph of {n_tokens} tokens")
        key = (kind, layer, head, position)
        if key in seen:
            raise GraphFileError(f"{source}: node {k} repeats a {kind} node (layer {layer}, part {head}, position "
                                 f"{position})")
        seen.add(key)


class _Fields:
    """``metadata.json``'s fields, each checked for its type and range (a
    :class:`GraphFileError` naming the field)."""

    def __init__(self, meta: dict[str, Any], source: Path) -> None:
        self.meta, self.source = meta, source
        if meta.get("format") != FORMAT:
            raise GraphFileError(f"{source} is not a graph file of captum_ffb (format {_short(meta.get('format'))})")
        version = meta.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise GraphFileError(f"{source}: version must be a positive integer, got {_short(version)}")
        if version > VERSION:
            raise GraphFileError(f"{source} is a graph file of version {version} (captum_ffb "
                                 f"{_short(meta.get('library'))}); this captum_ffb reads versions up to {VERSION}: "
                                 "upgrade it")
        self.version = version
        self.granularity = self._choice("granularity", GRANULARITIES)
        self.tokens = self._strings("tokens")
        n_tokens = len(self.tokens)
        ids = self._get("token_ids", optional=True)
        self.token_ids = None if ids is None else self._integers("token_ids", ids, low=0)
        if self.token_ids is not None and len(self.token_ids) != n_tokens:
            self._fail("token_ids", f"has {len(self.token_ids)} ids for {n_tokens} tokens")
        self.output_label = self._string("output_label")
        self.probability = self._number("probability", optional=True, low=0.0, high=1.0)
        self.n_source = self._integer("n_source", optional=True, low=0, high=n_tokens)
        self.nodes = self._integer("nodes", low=2)
        self.edges = self._integer("edges", low=0)
        self.bias = self._integer("bias", low=0, high=self.nodes - 1)
        self.output = self._integer("output", low=0, high=self.nodes - 1)
        self.target = self._target(n_tokens)
        thresholds = self._mapping("thresholds")
        self.thresholds = {key: self._number(f"thresholds.{key}", value, optional=True)
                           for key, value in thresholds.items()}
        excluded = self._integers("excluded_positions", self._get("excluded_positions"), low=0, high=n_tokens - 1)
        if sorted(set(excluded)) != excluded:
            self._fail("excluded_positions", "must be sorted positions without repeats")
        self.excluded_positions = tuple(excluded)
        self.qk_links = [self._qk_link(k, link) for k, link in enumerate(self._list("qk_links"))]
        self.patch_estimators = self._names("patch_estimators")
        if self.patch_estimators and "default" not in self.patch_estimators:
            self._fail("patch_estimators", "has no 'default'")
        components = self._mapping("patch_components")
        self.patch_components = {name: {key: self._number(f"patch_components.{name}.{key}", value)
                                        for key, value in self._mapping(f"patch_components.{name}", chosen).items()}
                                 for name, chosen in components.items()}
        self.patch_seconds = self._numbers_by_name("patch_seconds")
        self.patch_passes = self._numbers_by_name("patch_passes")
        self.edge_estimators = self._names("edge_estimators", optional=True)
        self.lens = self._lens()

    # ------------------------------------------------------------------ the pieces
    def counts(self) -> tuple[int, int]:
        return self.nodes, self.edges

    def _fail(self, name: str, problem: str) -> None:
        raise GraphFileError(f"{self.source}: {name} {problem}")

    def _get(self, name: str, optional: bool = False) -> Any:
        if name not in self.meta:
            if optional:
                return None
            self._fail(name, "is missing from metadata.json")
        return self.meta[name]

    def _string(self, name: str, value: Any = _FETCH) -> str:
        value = self._get(name) if value is _FETCH else value
        if not isinstance(value, str):
            self._fail(name, f"must be a string, got a {_json_type(value)}")
        return value

    def _choice(self, name: str, choices: tuple[str, ...]) -> str:
        value = self._string(name)
        if value not in choices:
            self._fail(name, f"must be one of {', '.join(choices)}, got {_short(value)}")
        return value

    def _strings(self, name: str) -> list[str]:
        value = self._list(name)
        if not all(isinstance(v, str) for v in value):
            self._fail(name, "must be a list of strings")
        return list(value)

    def _list(self, name: str, value: Any = _FETCH, optional: bool = False) -> list[Any]:
        value = self._get(name, optional) if value is _FETCH else value
        if value is None and optional:
            return []
        if not isinstance(value, list):
            self._fail(name, f"must be a list, got a {_json_type(value)}")
        return value

    def _mapping(self, name: str, value: Any = _FETCH, optional: bool = False) -> dict[str, Any]:
        value = self._get(name, optional) if value is _FETCH else value
        if value is None and optional:
            return {}
        if not isinstance(value, dict):
            self._fail(name, f"must be an object, got a {_json_type(value)}")
        return value

    def _integer(self, name: str, value: Any = _FETCH, *, optional: bool = False, low: int | None = None,
                 high: int | None = None) -> Any:
        value = self._get(name, optional) if value is _FETCH else value
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(name, f"must be an integer, got {_short(value)}")
        if (low is not None and value < low) or (high is not None and value > high):
            self._fail(name, f"is {value}, outside {low if low is not None else '…'} … "
                             f"{high if high is not None else '…'}")
        return value

    def _integers(self, name: str, value: Any, low: int | None = None, high: int | None = None) -> list[int]:
        return [self._integer(f"{name}[{k}]", v, low=low, high=high) for k, v in enumerate(self._list(name, value))]

    def _number(self, name: str, value: Any = _FETCH, *, optional: bool = False, low: float | None = None,
                high: float | None = None) -> Any:
        value = self._get(name, optional) if value is _FETCH else value
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._fail(name, f"must be a number, got {_short(value)}")
        if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
            self._fail(name, f"is {value}, not a number in {low} … {high}" if low is not None
                       else f"is {value}, not a finite number")
        return value

    def _names(self, name: str, optional: bool = False) -> list[str]:
        names = self._list(name, optional=optional)
        if not all(isinstance(v, str) and re.fullmatch(r"[a-z*+\-]{1,40}", v) for v in names) \
                or len(set(names)) != len(names):
            self._fail(name, "must be a list of distinct estimator names")
        return list(names)

    def _numbers_by_name(self, name: str) -> dict[str, float]:
        found = self._mapping(name, optional=True)
        return {key: self._number(f"{name}.{key}", value, optional=True) for key, value in found.items()}

    def _lens(self) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
        """``lens`` (files before 0.7 have none): ``[node, promoted, suppressed]`` per writer
        node, each node once, at most :data:`LENS_TEXTS` texts of at most 200 characters each."""
        found: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        entries = self._list("lens", optional=True)
        if len(entries) > self.nodes:
            self._fail("lens", f"has {len(entries)} entries for {self.nodes} nodes")
        for k, entry in enumerate(entries):
            name = f"lens[{k}]"
            if not isinstance(entry, list) or len(entry) != 3:
                self._fail(name, "must be [node, promoted, suppressed]")
            node = self._integer(f"{name}[0]", entry[0], low=0, high=self.nodes - 1)
            if node in found:
                self._fail(name, f"repeats node {node}")
            texts = []
            for j in (1, 2):
                words = self._list(f"{name}[{j}]", entry[j])
                if len(words) > LENS_TEXTS or not all(isinstance(w, str) and len(w) <= 200 for w in words):
                    self._fail(f"{name}[{j}]", f"must be at most {LENS_TEXTS} strings of at most 200 characters")
                texts.append(tuple(words))
            found[node] = (texts[0], texts[1])
        return found

    def _qk_link(self, k: int, link: Any) -> dict[str, Any]:
        link = self._mapping(f"qk_links[{k}]", link)
        if set(link) != {"source", "target", "weight", "kind", "head"}:
            self._fail(f"qk_links[{k}]", "must have source, target, weight, kind and head")
        for key in ("source", "target", "kind", "head"):
            self._string(f"qk_links[{k}].{key}", link[key])
        self._number(f"qk_links[{k}].weight", link["weight"])
        return dict(link)

    def _target(self, n_tokens: int) -> dict[str, Any] | None:
        target = self._get("target", optional=True)
        if target is None:
            return None
        target = self._mapping("target", target)
        known = {"kind", "units", "coefficients", "position", "texts", "n_units"}
        if not {"kind", "units", "coefficients"} <= set(target) <= known:
            self._fail("target", f"must have kind, units and coefficients (and at most {', '.join(sorted(known))})")
        kind = self._string("target.kind", target["kind"])
        if kind not in TARGET_KINDS:
            self._fail("target.kind", f"must be one of {', '.join(TARGET_KINDS)}, got {_short(kind)}")
        n_units = self._integer("target.n_units", target.get("n_units"), optional=True, low=1)
        units = self._integers("target.units", target["units"], low=0,
                               high=None if n_units is None else n_units - 1)
        coefficients = [self._number(f"target.coefficients[{k}]", v)
                        for k, v in enumerate(self._list("target.coefficients", target["coefficients"]))]
        if units and len(coefficients) != len(units):
            self._fail("target.coefficients", f"has {len(coefficients)} values for {len(units)} units")
        position = target.get("position")
        position = None if position is None else self._integer("target.position", position, low=0, high=n_tokens - 1)
        texts = target.get("texts")
        if texts is not None:
            texts = self._list("target.texts", texts)
            if not all(isinstance(t, str) for t in texts) or len(texts) != len(units):
                self._fail("target.texts", "must be one string per unit")
        return {"kind": kind, "units": tuple(units), "coefficients": tuple(float(c) for c in coefficients),
                "position": position, "texts": None if texts is None else tuple(texts), "n_units": n_units}

    # ------------------------------------------------------------------ origin
    def origin(self, reader: _ArrayReader) -> dict[str, Any] | None:
        """``origin`` checked, its arrays read (``None``: the graph was saved without it)."""
        origin = self._get("origin", optional=True)
        if origin is None:
            return None
        origin = self._mapping("origin", origin)
        if set(origin) == {"unbindable"}:
            return {"unbindable": self._string("origin.unbindable", origin["unbindable"])}
        needed = {"model_type", "model_class", "fingerprint", "rules", "args", "kwargs", "reference", "target"}
        if set(origin) != needed:
            self._fail("origin", f"must have {', '.join(sorted(needed))}")
        for key in ("model_type", "model_class"):
            self._string(f"origin.{key}", origin[key])
        rules = self._mapping("origin.rules", origin["rules"])
        for role, rule in rules.items():
            self._string(f"origin.rules.{role}", rule)
        fingerprint = origin["fingerprint"]
        if fingerprint is not None:
            fingerprint = self._fingerprint(fingerprint)
        arrays: dict[str, Tensor] = {}
        for key in ("args", "reference"):
            self._check_plain(f"origin.{key}", origin[key], reader, arrays)
        if not isinstance(origin["args"], dict) or "list" not in origin["args"]:
            self._fail("origin.args", "must be a list")
        for key, value in self._mapping("origin.kwargs", origin["kwargs"]).items():
            self._check_plain(f"origin.kwargs.{key}", value, reader, arrays)
        head = self._mapping("origin.target", origin["target"])
        from captum_ffb.engine.head import HeadTarget

        names = {f.name for f in fields(HeadTarget)}
        if set(head) not in (names, names - {"mix", "offset"}):  # files of before 0.5 have neither
            self._fail("origin.target", f"must have {', '.join(f.name for f in fields(HeadTarget))}")
        for key, value in head.items():
            self._check_plain(f"origin.target.{key}", value, reader, arrays)
        return {**origin, "fingerprint": fingerprint, "arrays": arrays}

    def _fingerprint(self, rows: Any) -> list[list[Any]]:
        rows = self._list("origin.fingerprint", rows)
        if self.version < 2:  # sums, not digests: kept for the message binding gives
            return [["version 1"]]
        checked = []
        for k, row in enumerate(rows):
            if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str) and isinstance(row[2], str)
                    and isinstance(row[1], list) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                         for s in row[1])
                    and isinstance(row[3], str) and re.fullmatch(r"[0-9a-f]{64}|meta", row[3])):
                self._fail(f"origin.fingerprint[{k}]", "must be [name, shape, dtype, SHA-256]")
            checked.append(row)
        return checked

    def _check_plain(self, name: str, value: Any, reader: _ArrayReader, arrays: dict[str, Tensor]) -> None:
        """A value :func:`_plain` wrote: plain JSON, a list of such, or a tensor (its array read)."""
        if value is None or isinstance(value, (bool, int, float, str)):
            return
        if isinstance(value, dict) and set(value) == {"list"} and isinstance(value["list"], list):
            for k, item in enumerate(value["list"]):
                self._check_plain(f"{name}[{k}]", item, reader, arrays)
            return
        if isinstance(value, dict) and set(value) == {"array", "dtype"}:
            member, dtype = value["array"], value["dtype"]
            if not (isinstance(member, str) and re.fullmatch(r"origin(\.[A-Za-z0-9_]{1,64}){1,8}", member)):
                self._fail(name, "names no array of origin")
            if dtype not in ORIGIN_DTYPES:
                self._fail(f"{name}.dtype", f"must be one of {', '.join(ORIGIN_DTYPES)}, got {_short(dtype)}")
            if member not in arrays:
                arrays[member] = reader.read(member, None, _INTEGER + _FLOAT + _BOOL)
            return
        self._fail(name, "must be a number, a string, a list or an array")


def _short(value: Any) -> str:
    """A value from a file, quoted and cut short for a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def __getattr__(name: str) -> Any:
    """``bind_graph`` (before 0.4) is :func:`~captum_ffb.graph.bound.bound_scorer` now: binding
    is not a file's business."""
    if name == "bind_graph":
        return moved_name(__name__, name, "captum_ffb.graph.bound", "bound_scorer")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
