"""Additive decompositions of a sequence of vectors over the tokens of a layer input.

A decomposition of vectors ``z_1 … z_n`` is a pair ``(F, b)`` with ``F[i, j]`` the part of
``z_i`` owed to input token ``j`` and ``b[i]`` the part owed to no token, such that
``z_i = Σ_j F[i, j] + b[i]`` (completeness).

Three storage forms share one interface, so that rules never need to know which one they
hold and the cheap forms are kept for as long as the mathematics allows:

* :class:`Decomposition`: dense terms ``(B, n_out, n_in, d)``.
* :class:`TokenwiseDecomposition`: ``F[i, j] = δ_ij v_i`` (a layer input, or anything computed
  token by token from it), stored as ``(B, n, d)``.
* ``FactoredDecomposition``: ``F[i, j] = Σ_k mix[k, i, j] · basis[k, j]``, the form that
  attention produces (one component per head); linear maps touch only the ``n·K`` basis
  vectors instead of the ``n²`` terms.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "Decomposition",
    "FactorGroup",
    "FactoredDecomposition",
    "TokenwiseDecomposition",
    "as_matrix",
    "no_terms",
]


def _apply_matrix(vectors: Tensor, weight: Tensor) -> Tensor:
    """``vectors @ weight`` over the last dimension, keeping a transposed layout cheap.

    Dense terms are often a ``transpose(1, 2)`` view of a contiguous buffer; multiplying
    in the buffer's own layout avoids copying ``n²`` vectors before the product.
    """
    if vectors.dim() == 4 and not vectors.is_contiguous():
        swapped = vectors.transpose(1, 2)
        if swapped.is_contiguous():
            out = _output((*swapped.shape[:-1], weight.shape[1]), swapped)
            return torch.matmul(swapped, weight, out=out).transpose(1, 2)
    out = _output((*vectors.shape[:-1], weight.shape[1]), vectors) if vectors.is_contiguous() else None
    return torch.matmul(vectors, weight, out=out)


class ScratchArena:
    """Buffers for the dense tensors of one row chunk, reused by the next chunk and call.

    Fresh multi-megabyte tensors cost page faults on every allocation; while an arena is
    active (``using_arena``), the dense operations of this module write their results
    into its buffers instead, the k-th request of a chunk getting the k-th buffer. Only for
    results that die with the chunk: the engine activates it when no decomposition is kept.
    """

    def __init__(self) -> None:
        self.buffers: list[Tensor] = []
        self.position = 0

    def reset(self) -> None:
        """Start a new chunk: buffers are handed out again from the first."""
        self.position = 0

    def empty(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        numel = math.prod(shape)
        if self.position < len(self.buffers):
            buffer = self.buffers[self.position]
            if buffer.numel() < numel or buffer.dtype != like.dtype or buffer.device != like.device:
                buffer = self.buffers[self.position] = torch.empty(numel, dtype=like.dtype, device=like.device)
        else:
            buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
            self.buffers.append(buffer)
        self.position += 1
        return buffer[:numel].view(shape)

    def clear(self) -> None:
        self.buffers.clear()
        self.position = 0


_ARENA: contextvars.ContextVar[ScratchArena | None] = contextvars.ContextVar("captum_ffb_arena", default=None)


@contextlib.contextmanager
def using_arena(arena: ScratchArena | None) -> Iterator[None]:
    """Let the dense operations write into ``arena`` (``None``: allocate normally)."""
    token = _ARENA.set(arena)
    try:
        yield
    finally:
        _ARENA.reset(token)


def _dense_like(terms: Tensor) -> Tensor | None:
    """An arena buffer laid out like ``terms`` (kept in its transposed layout if it has one)."""
    if _ARENA.get() is None:
        return None
    if terms.dim() == 4 and not terms.is_contiguous() and terms.transpose(1, 2).is_contiguous():
        return _output(terms.transpose(1, 2).shape, terms).transpose(1, 2)
    return _output(terms.shape, terms)


def _output(shape: tuple[int, ...], like: Tensor) -> Tensor | None:
    """A buffer for a dense result from the active arena, or ``None`` (a fresh tensor)."""
    arena = _ARENA.get()
    return None if arena is None else arena.empty(tuple(shape), like)


def as_matrix(x: Tensor | float, like: Tensor) -> Tensor:
    """Cast ``x`` to a tensor on the device and dtype of ``like``."""
    return torch.as_tensor(x, device=like.device, dtype=like.dtype)


class Decomposition:
    r"""Dense decomposition: ``terms`` of shape ``(B, n_out, n_in, d)``, ``bias`` ``(B, n_out, d)``.

    Args:
        terms (Tensor): ``terms[b, i, j]`` is the part of output vector ``i`` owed to input
                    token ``j``.
        bias (Tensor): the part of each output vector owed to no token (biases, β).
        token_mask (Tensor, optional): ``(B, n_out)``, 1 for real tokens, 0 for padding. Maps
                    are zeroed on padded rows, and on padded columns when the players are
                    the tokens themselves.
        player_mask (Tensor, optional): ``(B, n_in)``, 1 for the players that take part.
                    Needed only when the players are not the tokens (groups of tokens);
                    by default the token mask stands for it when the sizes match.

    Examples::

        >>> dec = LayerNormDecomposition(model, layer).decompose(ids)
        >>> dec.terms.shape                          # (B, n, n, d): F_i(x_j)
        >>> dec.maps()                               # (B, n, n): ‖F_i(x_j)‖
        >>> dec.completeness_residual(real_output)   # (B,): max |Σ_j F_i(x_j) + b_i − y_i|
    """

    def __init__(
        self,
        terms: Tensor,
        bias: Tensor,
        token_mask: Tensor | None = None,
        player_mask: Tensor | None = None,
    ) -> None:
        if terms.dim() != 4 or bias.dim() != 3:
            raise ValueError(
                "terms must be (batch, n_out, n_in, d) and bias (batch, n_out, d); got "
                f"{tuple(terms.shape)} and {tuple(bias.shape)}"
            )
        if terms.shape[:2] != bias.shape[:2] or terms.shape[-1] != bias.shape[-1]:
            raise ValueError(
                f"terms {tuple(terms.shape)} and bias {tuple(bias.shape)} do not match"
            )
        self._terms = terms
        self.bias = bias
        self.token_mask = token_mask
        self._player_mask = player_mask

    # ----------------------------------------------------------------- shape and views
    @property
    def player_mask(self) -> Tensor | None:
        """``(B, n_in)``: which players take part (``None``: all)."""
        if getattr(self, "_player_mask", None) is not None:
            return self._player_mask
        mask = self.token_mask
        if mask is not None and mask.shape[-1] == self.n_in:
            return mask
        return None

    @property
    def terms(self) -> Tensor:
        """Dense terms ``(B, n_out, n_in, d)`` (materialised for the compact forms)."""
        return self._terms

    @property
    def batch_size(self) -> int:
        return self.bias.shape[0]

    @property
    def n_out(self) -> int:
        return self.bias.shape[1]

    @property
    def n_in(self) -> int:
        return self.terms.shape[2]

    @property
    def dim(self) -> int:
        return self.bias.shape[-1]

    def _new(self, terms: Tensor, bias: Tensor) -> Decomposition:
        """A dense decomposition with these masks."""
        return Decomposition(terms, bias, self.token_mask, self._player_mask)

    def dense(self) -> Decomposition:
        """This decomposition with its terms materialised."""
        return self._new(self.terms, self.bias)

    def rows(self, index: slice | Tensor) -> Decomposition:
        """The decomposition of the output vectors ``index`` only (the token mask keeps
        describing the full sequence: pass ``row_offset`` to ``maps()``)."""
        return self._new(self.terms[:, index], self.bias[:, index])

    def features(self, index: slice) -> Decomposition:
        """The decomposition of the features ``index`` of every vector (a slice of the last
        dimension: the output columns of one part of a wider linear map)."""
        return self._new(self.terms[..., index], self.bias[..., index])

    # ----------------------------------------------------------------- readouts
    def total(self) -> Tensor:
        """``Σ_j terms[:, i, j] + bias[:, i]``, shape ``(B, n_out, d)``."""
        return self.terms.sum(dim=2) + self.bias

    def maps(self, row_offset: int = 0) -> Tensor:
        """The map ``M[b, i, j] = ‖terms[b, i, j]‖₂``, padding rows and columns zeroed.

        Args:
            row_offset (int): index of this decomposition's first output row in the full
                        sequence (for row chunks), used to find padded rows.
        """
        maps = torch.linalg.vector_norm(self.terms, dim=-1)
        return self._mask_maps(maps, row_offset)

    def _mask_maps(self, maps: Tensor, row_offset: int) -> Tensor:
        if self.token_mask is not None:
            rows = self.token_mask.to(maps.dtype)[:, row_offset : row_offset + maps.shape[1]]
            maps = maps * rows[:, :, None]
        players = self.player_mask
        if players is not None:
            maps = maps * players.to(maps.dtype)[:, None, :]
        return maps

    def completeness_residual(
        self, target: Tensor, relative: bool = False, row_offset: int = 0
    ) -> Tensor:
        """Largest deviation of :meth:`total` from ``target`` per batch element, ``(B,)``.

        Args:
            target (Tensor): the real vectors ``(B, n_out, d)`` the decomposition explains.
            relative (bool): divide by the largest ``|target|`` of the batch element.
            row_offset (int): see ``maps()``; padded rows are left out.
        """
        diff = (self.total() - target.to(self.bias.dtype)).abs().amax(dim=-1)
        scale = target.abs().amax(dim=-1).to(diff.dtype)
        if self.token_mask is not None:
            rows = self.token_mask[:, row_offset : row_offset + diff.shape[1]].to(diff.dtype)
            diff = diff * rows
            scale = scale * rows
        residual = diff.amax(dim=1)
        if relative:
            residual = residual / scale.amax(dim=1).clamp_min(torch.finfo(diff.dtype).tiny)
        return residual

    # ----------------------------------------------------------------- algebra
    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Decomposition:
        """Decomposition of ``z W + c``: terms ``F W``, bias ``b W + c``.

        Args:
            weight (Tensor): ``(d_in, d_out)``.
            bias (Tensor, optional): ``(d_out,)``.
        """
        return self._new(_apply_matrix(self.terms, weight), self._bias_linear(weight, bias))

    def _bias_linear(self, weight: Tensor, bias: Tensor | None) -> Tensor:
        out = self.bias @ weight
        return out if bias is None else out + bias

    def center(self) -> Decomposition:
        """Subtract from every vector its mean over the feature dimension (a linear map)."""
        terms = self.terms
        return self._new(
            terms - terms.mean(dim=-1, keepdim=True), self.bias - self.bias.mean(dim=-1, keepdim=True)
        )

    def center_scale(self, rows: Tensor, features: Tensor | None = None) -> Decomposition:
        """``center()`` then ``scale(rows, features)``: the LayerNorm steps, with one
        temporary fewer for dense terms."""
        factor = rows[..., None] if features is None else rows[..., None] * features
        terms = self.terms
        centred = torch.sub(terms, terms.mean(dim=-1, keepdim=True), out=_dense_like(terms))
        centred.mul_(factor[:, :, None, :])
        bias = (self.bias - self.bias.mean(dim=-1, keepdim=True)) * factor
        return self._new(centred, bias)

    def scale_rows(self, scale: Tensor) -> Decomposition:
        """Multiply every vector of output row ``i`` by ``scale[:, i]``.

        Args:
            scale (Tensor): ``(B, n_out)`` (one number per row) or ``(B, n_out, d)``.
        """
        per_row = scale if scale.dim() == 3 else scale[..., None]
        return self._new(self.terms * per_row[:, :, None, :], self.bias * per_row)

    def scale_features(self, gamma: Tensor) -> Decomposition:
        """Multiply every vector element-wise by ``gamma`` ``(d,)``."""
        return self._new(self.terms * gamma, self.bias * gamma)

    def scale(self, rows: Tensor, features: Tensor | None = None) -> Decomposition:
        """``scale_rows(rows)`` then ``scale_features(features)``, in one pass over the terms.

        Args:
            rows (Tensor): ``(B, n_out)``, one number per output row.
            features (Tensor, optional): ``(d,)``.
        """
        factor = rows[..., None] if features is None else rows[..., None] * features
        terms = torch.mul(self.terms, factor[:, :, None, :], out=_dense_like(self.terms))
        return self._new(terms, self.bias * factor)

    def add_bias(self, beta: Tensor) -> Decomposition:
        """Add a vector owed to no token (β of a norm, a constant)."""
        return self._new(self.terms, self.bias + beta)

    def __add__(self, other: Decomposition) -> Decomposition:
        if not isinstance(other, Decomposition):
            return NotImplemented
        _check_same_shape(self, other)
        terms = torch.add(self.terms, other.terms, out=_dense_like(self.terms))
        return self._new(terms, self.bias + other.bias)

    # ----------------------------------------------------------------- constructors
    @staticmethod
    def identity(x: Tensor, token_mask: Tensor | None = None) -> TokenwiseDecomposition:
        """The identity decomposition of a layer input ``x`` ``(B, n, d)``."""
        return TokenwiseDecomposition(x, torch.zeros_like(x), token_mask)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch={self.batch_size}, n_out={self.n_out}, "
            f"n_in={self.n_in}, d={self.dim})"
        )


def _check_same_shape(a: Decomposition, b: Decomposition) -> None:
    if (a.batch_size, a.n_out, a.n_in, a.dim) != (b.batch_size, b.n_out, b.n_in, b.dim):
        raise ValueError(f"cannot add decompositions of different shapes: {a} and {b}")


class TokenwiseDecomposition(Decomposition):
    r"""Decomposition whose only terms are on the diagonal: ``F[i, j] = δ_ij vectors[i]``.

    Args:
        vectors (Tensor): ``(B, n, d)``.
        bias (Tensor): ``(B, n, d)``.
        token_mask (Tensor, optional): see :class:`Decomposition`.
    """

    def __init__(self, vectors: Tensor, bias: Tensor, token_mask: Tensor | None = None) -> None:
        if vectors.shape != bias.shape or vectors.dim() != 3:
            raise ValueError(
                f"vectors and bias must both be (batch, n, d); got {tuple(vectors.shape)} "
                f"and {tuple(bias.shape)}"
            )
        self.vectors = vectors
        self.bias = bias
        self.token_mask = token_mask
        self._player_mask = None

    @property
    def terms(self) -> Tensor:
        return torch.diag_embed(self.vectors.transpose(1, 2)).permute(0, 2, 3, 1)

    @property
    def n_in(self) -> int:
        return self.vectors.shape[1]

    def factored(self) -> FactoredDecomposition:
        """The same decomposition as one factored component with an identity mix."""
        batch, n, _ = self.vectors.shape
        eye = torch.eye(n, device=self.vectors.device, dtype=self.vectors.dtype)
        mix = eye.expand(batch, 1, n, n)
        return FactoredDecomposition(mix, self.vectors[:, None], self.bias, self.token_mask)

    def rows(self, index: slice | Tensor) -> Decomposition:
        if isinstance(index, slice) and index == slice(None):
            return self
        return self.factored().rows(index)

    def features(self, index: slice) -> TokenwiseDecomposition:
        return TokenwiseDecomposition(self.vectors[..., index], self.bias[..., index], self.token_mask)

    def total(self) -> Tensor:
        return self.vectors + self.bias

    def maps(self, row_offset: int = 0) -> Tensor:
        return self.factored().maps(row_offset)

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> TokenwiseDecomposition:
        return TokenwiseDecomposition(
            self.vectors @ weight, self._bias_linear(weight, bias), self.token_mask
        )

    def center_scale(self, rows: Tensor, features: Tensor | None = None) -> TokenwiseDecomposition:
        return self.center().scale(rows, features)

    def center(self) -> TokenwiseDecomposition:
        v = self.vectors
        return TokenwiseDecomposition(
            v - v.mean(dim=-1, keepdim=True),
            self.bias - self.bias.mean(dim=-1, keepdim=True),
            self.token_mask,
        )

    def scale_rows(self, scale: Tensor) -> TokenwiseDecomposition:
        per_row = scale if scale.dim() == 3 else scale[..., None]
        return TokenwiseDecomposition(
            self.vectors * per_row, self.bias * per_row, self.token_mask
        )

    def scale_features(self, gamma: Tensor) -> TokenwiseDecomposition:
        return TokenwiseDecomposition(
            self.vectors * gamma, self.bias * gamma, self.token_mask
        )

    def scale(self, rows: Tensor, features: Tensor | None = None) -> TokenwiseDecomposition:
        factor = rows[..., None] if features is None else rows[..., None] * features
        return TokenwiseDecomposition(self.vectors * factor, self.bias * factor, self.token_mask)

    def add_bias(self, beta: Tensor) -> TokenwiseDecomposition:
        return TokenwiseDecomposition(self.vectors, self.bias + beta, self.token_mask)

    def __add__(self, other: Decomposition) -> Decomposition:
        if isinstance(other, TokenwiseDecomposition):
            _check_same_shape(self, other)
            return TokenwiseDecomposition(
                self.vectors + other.vectors, self.bias + other.bias, self.token_mask
            )
        if isinstance(other, FactoredDecomposition):
            return self.factored() + other
        return super().__add__(other)


@dataclass(frozen=True)
class FactorGroup:
    """Components ``k`` of a factored decomposition that share one storage shape.

    ``basis[k, j] = coeff[k, j] @ proj[k]`` when ``proj`` is given (low rank: attention heads
    keep their ``d_head``-wide values and ``W_O^h`` apart, so a later linear map touches only
    the ``d_head × d`` projections); otherwise ``basis = coeff``.

    Attributes:
        mix (Tensor): ``(B, K, n_out, n_in)``.
        coeff (Tensor): ``(B, K, n_in, r)``.
        proj (Tensor, optional): ``(K, r, d)``.
    """

    mix: Tensor
    coeff: Tensor
    proj: Tensor | None = None

    def basis(self) -> Tensor:
        """``(B, K, n_in, d)``."""
        if self.proj is None:
            return self.coeff
        batch, k, n, r = self.coeff.shape
        # One product per component over all batch rows (no copy of proj per batch element).
        flat = self.coeff.transpose(0, 1).reshape(k, batch * n, r)
        return torch.matmul(flat, self.proj).reshape(k, batch, n, -1).transpose(0, 1)

    def vectors_map(self, fn) -> FactorGroup:
        """Apply a linear map ``fn`` of the vectors (acting on their last dimension)."""
        if self.proj is None:
            return FactorGroup(self.mix, fn(self.coeff))
        return FactorGroup(self.mix, self.coeff, fn(self.proj))

    def total(self) -> Tensor:
        """``Σ_k Σ_j mix[k, :, j] basis[k, j]`` ``(B, n_out, d)``."""
        mixed = torch.matmul(self.mix, self.coeff)  # (B, K, n_out, r)
        if self.proj is None:
            return mixed.sum(dim=1)
        return torch.einsum("bkir,krd->bid", mixed, self.proj)


def _cheaper_form(group: FactorGroup, weight: Tensor) -> FactorGroup:
    """The group in whichever form makes ``basis @ weight`` (and its later use) cheaper.

    A low-rank group costs ``K·r·d_in·d_out`` for the map plus ``B·K·n·r·d_out`` to form its
    basis later; a materialised one ``B·K·n·r·d_in`` now plus ``B·K·n·d_in·d_out``. Short
    single sequences favour materialising, batches and long sequences the low rank.
    """
    if group.proj is None:
        return group
    batch, k, n, r = group.coeff.shape
    d_in, d_out = weight.shape
    low_rank = k * r * d_in * d_out + batch * k * n * r * d_out
    materialised = batch * k * n * r * d_in + batch * k * n * d_in * d_out
    return group if low_rank <= materialised else FactorGroup(group.mix, group.basis())


class FactoredDecomposition(Decomposition):
    r"""Decomposition ``F[i, j] = Σ_k mix[k, i, j] · basis[k, j]``.

    The components are held in one or more :class:`FactorGroup` (attention heads in low-rank
    form, the residual's identity, …). Linear maps, centring and feature scales act on the
    bases only, row scales on the mixes; the dense terms are formed only when asked for, and
    row chunks of one decomposition share the materialised bases.

    Args:
        mix (Tensor): ``(B, K, n_out, n_in)`` coefficients (attention probabilities, scaled).
        basis (Tensor): ``(B, K, n_in, d)`` one vector per component and input token, or the
                    ``(B, K, n_in, r)`` coefficients of a low-rank basis with ``proj``.
        bias (Tensor): ``(B, n_out, d)``.
        token_mask (Tensor, optional): see :class:`Decomposition`.
        proj (Tensor, optional): ``(K, r, d)``: the basis is ``basis @ proj``.
        player_mask (Tensor, optional): see :class:`Decomposition`.
    """

    def __init__(
        self,
        mix: Tensor,
        basis: Tensor,
        bias: Tensor,
        token_mask: Tensor | None = None,
        proj: Tensor | None = None,
        player_mask: Tensor | None = None,
    ) -> None:
        if mix.dim() != 4 or basis.dim() != 4 or mix.shape[1] != basis.shape[1]:
            raise ValueError(
                "mix must be (batch, K, n_out, n_in) and basis (batch, K, n_in, d); got "
                f"{tuple(mix.shape)} and {tuple(basis.shape)}"
            )
        self._init([FactorGroup(mix, basis, proj)], bias, token_mask, {}, player_mask)

    def _init(
        self,
        groups: list[FactorGroup],
        bias: Tensor,
        token_mask: Tensor | None,
        cache: dict,
        player_mask: Tensor | None = None,
    ) -> None:
        self.groups = groups
        self.bias = bias
        self.token_mask = token_mask
        self._player_mask = player_mask
        self._cache = cache  # shared by the row chunks of one decomposition

    @classmethod
    def from_groups(
        cls,
        groups: list[FactorGroup],
        bias: Tensor,
        token_mask: Tensor | None = None,
        cache: dict | None = None,
        player_mask: Tensor | None = None,
    ) -> FactoredDecomposition:
        """A factored decomposition made of several component groups."""
        out = cls.__new__(cls)
        out._init(groups, bias, token_mask, {} if cache is None else cache, player_mask)
        return out

    def _with(self, groups: list[FactorGroup], bias: Tensor, cache: dict | None = None) -> FactoredDecomposition:
        return FactoredDecomposition.from_groups(groups, bias, self.token_mask, cache, self._player_mask)

    # ------------------------------------------------------------------ views
    @property
    def mix(self) -> Tensor:
        """All components' mixes ``(B, K, n_out, n_in)``."""
        mixes = [g.mix.expand(self.batch_size, -1, -1, -1) for g in self.groups]
        return mixes[0] if len(mixes) == 1 else torch.cat(mixes, dim=1)

    @property
    def basis(self) -> Tensor:
        """All components' basis vectors ``(B, K, n_in, d)``."""
        bases = [g.basis().expand(self.batch_size, -1, -1, -1) for g in self.groups]
        return bases[0] if len(bases) == 1 else torch.cat(bases, dim=1)

    def _basis_by_token(self) -> Tensor:
        """Basis vectors as ``(B, n_in, K, d)``, contiguous, made once per decomposition."""
        if "by_token" not in self._cache:
            # Written component by component: no temporary as large as the result.
            first = self.groups[0].coeff
            width = self.dim if self.groups[0].proj is None else self.groups[0].proj.shape[-1]
            out = torch.empty(self.batch_size, self.n_in, self.n_components, width,
                              dtype=first.dtype, device=first.device)
            k = 0
            for group in self.groups:
                for c in range(group.coeff.shape[1]):
                    coeff = group.coeff[:, c]  # (B or 1, n_in, r)
                    out[:, :, k] = coeff if group.proj is None else coeff @ group.proj[c]
                    k += 1
            self._cache["by_token"] = out
        return self._cache["by_token"]

    @property
    def terms(self) -> Tensor:
        return self._dense_terms()

    def _dense_terms(self) -> Tensor:
        # Contract over components with token j as a batch index: (B, n_in, n_out, d),
        # returned as a (B, n_out, n_in, d) view so later products need no copy.
        # Contiguous operands: BLAS is several times slower on strided views.
        mix = self.mix.permute(0, 3, 2, 1).contiguous()  # (B, n_in, n_out, K)
        basis = self._basis_by_token()
        out = _output((self.batch_size, self.n_in, mix.shape[2], basis.shape[-1]), basis)
        return torch.matmul(mix, basis, out=out).transpose(1, 2)

    @property
    def n_in(self) -> int:
        return self.groups[0].mix.shape[-1]

    @property
    def n_components(self) -> int:
        return sum(g.mix.shape[1] for g in self.groups)

    @property
    def dim(self) -> int:
        return self.bias.shape[-1]

    # ------------------------------------------------------------------ algebra
    def rows(self, index: slice | Tensor) -> FactoredDecomposition:
        groups = [FactorGroup(g.mix[:, :, index], g.coeff, g.proj) for g in self.groups]
        return self._with(groups, self.bias[:, index], cache=self._cache)

    def features(self, index: slice) -> FactoredDecomposition:
        groups = [FactorGroup(g.mix, g.coeff[..., index]) if g.proj is None
                  else FactorGroup(g.mix, g.coeff, g.proj[..., index]) for g in self.groups]
        return self._with(groups, self.bias[..., index])

    def total(self) -> Tensor:
        return sum(g.total() for g in self.groups) + self.bias

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> FactoredDecomposition:
        groups = [_cheaper_form(g, weight).vectors_map(lambda v: v @ weight) for g in self.groups]
        return self._with(groups, self._bias_linear(weight, bias))

    def center_scale(self, rows: Tensor, features: Tensor | None = None) -> FactoredDecomposition:
        return self.center().scale(rows, features)

    def center(self) -> FactoredDecomposition:
        groups = [g.vectors_map(lambda v: v - v.mean(dim=-1, keepdim=True)) for g in self.groups]
        return self._with(groups, self.bias - self.bias.mean(dim=-1, keepdim=True))

    def scale_rows(self, scale: Tensor) -> Decomposition:
        if scale.dim() == 3:  # a per-feature row scale does not factor: materialise
            return self.dense().scale_rows(scale)
        groups = [FactorGroup(g.mix * scale[:, None, :, None], g.coeff, g.proj) for g in self.groups]
        return self._with(groups, self.bias * scale[..., None])

    def scale_features(self, gamma: Tensor) -> FactoredDecomposition:
        groups = [g.vectors_map(lambda v: v * gamma) for g in self.groups]
        return self._with(groups, self.bias * gamma)

    def scale(self, rows: Tensor, features: Tensor | None = None) -> FactoredDecomposition:
        out = self.scale_rows(rows)
        return out if features is None else out.scale_features(features)

    def add_bias(self, beta: Tensor) -> FactoredDecomposition:
        return self._with(self.groups, self.bias + beta, cache=self._cache)

    def __add__(self, other: Decomposition) -> Decomposition:
        if isinstance(other, TokenwiseDecomposition):
            other = other.factored()
        if isinstance(other, FactoredDecomposition):
            _check_same_shape(self, other)
            return self._with(self.groups + other.groups, self.bias + other.bias)
        return self.dense() + other


def stack_rows(parts: Sequence[Decomposition]) -> Decomposition:
    """Concatenate row chunks of one decomposition back into a dense decomposition."""
    if len(parts) == 1:
        return parts[0].dense()
    return Decomposition(
        torch.cat([p.terms for p in parts], dim=1),
        torch.cat([p.bias for p in parts], dim=1),
        parts[0].token_mask,
        getattr(parts[0], "_player_mask", None),
    )


def no_terms(like: Decomposition, bias: Tensor) -> FactoredDecomposition:
    """A decomposition of ``bias`` ``(B, n_out, d)`` with every token term zero, over the
    same rows and players as ``like`` (stored compactly: one zero component)."""
    batch, n_out, width = bias.shape
    zero = bias.new_zeros(1, 1, 1, 1)
    mix = zero.expand(batch, 1, n_out, like.n_in)
    basis = zero.expand(batch, 1, like.n_in, width)
    return FactoredDecomposition(mix, basis, bias, like.token_mask,
                                 player_mask=getattr(like, "_player_mask", None))
