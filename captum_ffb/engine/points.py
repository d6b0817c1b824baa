r"""Named stream points: where each writer adds to the residual stream and where it reads it,
named once from the spec, with one id for one writer everywhere.

A **writer** of the residual stream is an attention sublayer, a cross-attention (a decoder
block of an encoder–decoder) or an FF block; its **parts** are the heads of an attention and
the neurons (or experts) of an FF; its id (:mod:`captum_ffb.core.vocabulary`) is the same in the
component tables, the graphs' nodes, patching and the views. The writers of a block, and
their order, are its chain's residual stream (``Chain.stream``);
the modules are the spec's. :func:`stream_points` binds them once per model, and every
feature reads them from there: the whole-model engine, the component tables, the graphs,
the score splits and patching.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from captum_ffb.architectures.paths import has_path, resolve
from captum_ffb.architectures.spec import ArchitectureSpec
from captum_ffb.core.vocabulary import part_id, writer_id
from captum_ffb.engine.block import watched_modules
from captum_ffb.engine.chains import Chain

__all__ = ["Read", "StreamPoints", "Writer", "block_points", "read_modules", "stream_points"]

# --------------------------------------------------------------------------- the points
@dataclass(frozen=True)
class Read:
    """Where a writer reads the residual stream: the (first) input of ``module``.

    Attributes:
        id (str): ``block.<l>.read.attention``, ``block.<l>.read.ff`` (one for two writers of
                    a parallel block that read through one norm), ``block.<l>.read.cross``.
        layer (int): its block.
        module (nn.Module): a Pre-LN writer's norm, else the writer's first module.
    """

    id: str
    layer: int
    module: nn.Module


@dataclass(frozen=True)
class Writer:
    """One writer of the residual stream.

    Attributes:
        id (str): its id (:func:`~captum_ffb.core.vocabulary.writer_id`).
        layer (int): its block (an encoder–decoder's decoder blocks numbered after the
                    encoder's).
        kind (str): ``"attention"``, ``"cross_attention"`` or ``"ff"``.
        module (nn.Module): the module whose output is what it adds to the stream (with a
                    post-norm where the family has one).
        read (str): the id of the :class:`Read` it reads.
        parts (nn.Module, optional): the module whose input holds its parts (an attention's
                    output projection: the heads; a dense FF's down projection: the
                    neurons); ``None`` where it has none.
        n_heads (int): an attention's heads.
        segment (int): the players it writes over (0: the tokens or an encoder–decoder's
                    source; 1: its target).
    """

    id: str
    layer: int
    kind: str
    module: nn.Module
    read: str
    parts: nn.Module | None
    n_heads: int
    segment: int = 0

    def part(self, k: int) -> str:
        """The id of its part ``k`` (a head, a neuron)."""
        return part_id(self.layer, self.kind, k)


@dataclass
class StreamPoints:
    """The writers and reads of a model, in stream order (the encoder's first).

    Attributes:
        writers (list[Writer]): every writer.
        reads (list[Read]): every read (one per distinct module read).
        n_blocks (list[int]): the blocks of each stack (``[L]``, or ``[L_enc, L_dec]``).
    """

    writers: list[Writer]
    reads: list[Read]
    n_blocks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_id = {writer.id: writer for writer in self.writers}

    def writer(self, layer: int, kind: str) -> Writer:
        """The writer ``kind`` of block ``layer`` (a ``ValueError`` naming the blocks)."""
        found = self._by_id.get(writer_id(layer, kind))
        if found is None:
            raise ValueError(f"no {kind} writer in block {layer} (the model has {sum(self.n_blocks)} blocks)")
        return found

    def of_segment(self, segment: int) -> list[Writer]:
        """The writers of one stack (0: the tokens or the encoder; 1: the decoder)."""
        return [writer for writer in self.writers if writer.segment == segment]

    def read_stack(self) -> list[Writer]:
        """The writers of the stack whose output is read (the decoder's of an encoder–decoder)."""
        return self.of_segment(len(self.n_blocks) - 1)


def read_modules(block: nn.Module, spec: ArchitectureSpec, pre_norm: bool) -> dict[str, nn.Module | None]:
    """Writer kind → the module whose input is the stream that writer reads: a Pre-LN writer's
    norm, else its first module (a Post-LN attention module, the FF's input projection, the
    module around a gated FF's two input projections, a mixture of experts)."""

    def module(path: str | None) -> nn.Module | None:
        return resolve(block, path) if path and has_path(block, path) else None

    found: dict[str, nn.Module | None] = {}
    found["attention"] = (module(spec.norm1) if pre_norm else None) or module(spec.attention)
    ff = module(spec.norm2) if pre_norm else None
    if ff is None:
        if spec.moe is not None and has_path(block, spec.moe.module):
            ff = resolve(block, spec.moe.module)
        elif spec.ff_gate is not None:  # the module around the two input projections
            parent = spec.ff_in.path.rsplit(".", 1)[0] if "." in spec.ff_in.path else ""
            ff = resolve(block, parent) if parent else None
        else:
            ff = module(spec.ff_in.path)
    found["ff"] = ff
    return found


def _read_id(layer: int, reads: dict[str, nn.Module | None], kind: str) -> str:
    """The read a writer reads (one id for two writers that share a module)."""
    shared = [other for other, module in reads.items() if module is reads[kind]]
    return f"block.{layer}.read.{shared[0]}"


def block_points(block: nn.Module, spec: ArchitectureSpec, chain: Chain, layer: int, n_heads: int,
                 segment: int = 0) -> tuple[list[Writer], list[Read]]:
    """One block's writers, in its chain's stream order, and the reads they read."""
    roles = watched_modules(block, spec)
    pre_norm = chain.name in ("pre_ln", "parallel")
    found = read_modules(block, spec, pre_norm)
    if not any(step.kind == "write" for step in chain.stream):
        raise ValueError(f"the {chain.name!r} block type declares no residual stream (Chain.stream): its "
                         "writers cannot be named")
    reads: dict[str, Read] = {}
    writers = []
    for step in chain.stream:
        if step.kind != "write":
            continue
        kind = step.name
        if kind == "attention":
            module, parts = roles.get("attention_post_norm") or roles["attn_out"], roles["attn_out"]
            read = _read_id(layer, found, "attention")
            reads.setdefault(read, Read(read, layer, found["attention"]))
        elif kind == "cross_attention":
            module, parts = roles["cross_out"], None
            read = f"block.{layer}.read.cross"
            reads.setdefault(read, Read(read, layer, roles["cross_value"]))
        else:
            dense = roles.get("router") is None
            module, parts = roles["ff"], roles.get("ff_out") if dense else None
            read = _read_id(layer, found, "ff")
            if found["ff"] is not None:
                reads.setdefault(read, Read(read, layer, found["ff"]))
        writers.append(Writer(writer_id(layer, kind), layer, kind, module, read, parts, n_heads, segment))
    return writers, list(reads.values())


def stream_points(stacks: Sequence[tuple[Sequence[nn.Module], Any]], family: ArchitectureSpec, config: Any
                  ) -> StreamPoints:
    """Every writer and read of a model: ``stacks`` is ``[(blocks, chain_for)]`` in stream
    order (an encoder–decoder's encoder first, its decoder blocks numbered after), with
    ``chain_for(spec)`` the chain of a block's layout."""
    writers: list[Writer] = []
    reads: list[Read] = []
    first = 0
    for segment, (blocks, chain_of) in enumerate(stacks):
        decoder = segment == 1
        n_heads = int((getattr(config, "decoder_attention_heads", None) if decoder else None)
                      or getattr(config, "num_attention_heads", 1) or 1)
        for offset, block in enumerate(blocks):
            spec = family.for_block(block)
            found_writers, found_reads = block_points(block, spec, chain_of(spec), first + offset, n_heads, segment)
            writers += found_writers
            reads += found_reads
        first += len(blocks)
    return StreamPoints(writers, reads, [len(blocks) for blocks, _ in stacks])
