"""``LayerNormDecomposition``: exact token-to-token maps of Transformer layers, as a Captum
layer attribution."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from captum.attr import LayerAttribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_ffb.architectures import (
    Block,
    Chain,
    ChainOptions,
    get_architecture,
    get_chain,
)
from captum_ffb.architectures.block import resolve
from captum_ffb.architectures.spec import ArchitectureSpec, Projection
from captum_ffb.capture import capture_blocks, forward_arguments, token_mask_of
from captum_ffb.decomposition import Decomposition, ScratchArena, stack_rows, using_arena

ScopeArg = str | Sequence[str] | None

#: Memory the row chunks may take when ``internal_batch_size`` is not given (bytes).
DEFAULT_MEMORY_BUDGET = 1 << 30


@dataclass
class LayerResult:
    """Everything computed for one layer: maps, deltas and (optionally) decompositions."""

    chain: Chain
    maps: dict[str, Tensor] = field(default_factory=dict)
    delta: dict[str, Tensor] = field(default_factory=dict)
    decompositions: dict[str, Decomposition] = field(default_factory=dict)


def _find_model(forward_func: Callable) -> nn.Module | None:
    if isinstance(forward_func, nn.Module):
        return forward_func
    owner = getattr(forward_func, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def _model_type_of(model: nn.Module | None, layers: Sequence[nn.Module]) -> str | None:
    for root in ([model] if model is not None else []) + list(layers):
        for module in root.modules():
            model_type = getattr(getattr(module, "config", None), "model_type", None)
            if model_type:
                return model_type
    return None


def _config_of(model: nn.Module | None, layers: Sequence[nn.Module]) -> Any:
    for root in ([model] if model is not None else []) + list(layers):
        for module in root.modules():
            config = getattr(module, "config", None)
            if config is not None:
                return config
    return None


class LayerNormDecomposition(LayerAttribution):
    r"""Exact decomposition of Transformer layers into per-token vectors (Kobayashi et al.).

    Each output vector of a layer is written as ``y_i = Σ_j F_i(x_j) + b_i`` over the layer's
    input vectors, through attention, residuals, norms and the feed-forward block (whose
    activation is decomposed with Integrated Gradients in closed form). The attribution map
    is ``M[b, i, j] = ‖F_i(x_j)‖₂``, read at one of the paper's *scopes*:

    * Post-LN (BERT, RoBERTa, ...): ``Atb``, ``AtbFf``, ``AtbFfRes``, ``AtbFfResLn``;
    * Pre-LN (GPT-2, OPT, Llama, ...): ``Atb``, ``AtbLn``, ``AtbLnFf``, ``AtbLnFfRes``.

    The convergence delta is the completeness residual: the largest absolute difference
    between ``Σ_j F_i(x_j) + b_i`` and the tensor the model really computed at that scope.

    Args:
        forward_func (Callable or nn.Module): the model, or a function that runs it.
        layer (nn.Module or list[nn.Module]): one Transformer block of a supported model, or a
                    list of blocks (then ``attribute`` returns a list, also for a list of one).
        device_ids (list[int], optional): as in Captum; unused.
        model_type (str, optional): the architecture to use when it cannot be read from
                    ``forward_func``'s config.
        memory_budget (int): bytes the row chunks may take when ``internal_batch_size`` is
                    not given. The FF's hidden terms are written into scratch buffers that
                    are kept between calls (mapped memory is reused, which is faster);
                    :meth:`release_memory` frees them.
        dtype (torch.dtype): the precision of the decomposition (float32 by default; a
                    half-precision model is decomposed in float32).
        show_progress (bool): show a progress bar over layers and row chunks.
    """

    def __init__(
        self,
        forward_func: Callable,
        layer: nn.Module | Sequence[nn.Module],
        device_ids: list[int] | None = None,
        model_type: str | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        dtype: torch.dtype = torch.float32,
        show_progress: bool = False,
    ) -> None:
        self._returns_list = isinstance(layer, (list, tuple, nn.ModuleList))
        layers = list(layer) if self._returns_list else [layer]
        if not layers or not all(isinstance(m, nn.Module) for m in layers):
            raise TypeError("layer must be a Transformer block module or a list of them")
        super().__init__(forward_func, layer, device_ids)
        self._layers = layers
        self._model = _find_model(forward_func)
        if self._model is not None:
            members = {id(m) for m in self._model.modules()}
            for index, module in enumerate(layers):
                if id(module) not in members:
                    raise ValueError(
                        f"layer {index} ({type(module).__name__}) is not part of the model "
                        f"{type(self._model).__name__}"
                    )
        self.model_type = model_type or _model_type_of(self._model, layers)
        self.spec: ArchitectureSpec = get_architecture(self.model_type)
        self.chain: Chain = get_chain(self.spec.chain_name(_config_of(self._model, layers)))
        for module in layers:
            self._check_block(module)
        self.memory_budget = int(memory_budget)
        self._arena = ScratchArena()
        self.dtype = dtype
        self.show_progress = show_progress

    # ------------------------------------------------------------------ public API
    @property
    def scopes(self) -> tuple[str, ...]:
        """The scope names of this model's chain, from attention only to the whole layer."""
        return self.chain.scopes

    def has_convergence_delta(self) -> bool:
        return True

    def release_memory(self) -> None:
        """Free the scratch buffers kept between calls (at most about ``memory_budget``)."""
        self._arena.clear()

    @log_usage()
    def attribute(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        additional_forward_args: Any = None,
        scope: ScopeArg = None,
        return_convergence_delta: bool = False,
        internal_batch_size: int | None = None,
        forward_kwargs: dict[str, Any] | None = None,
        activation_route: str = "closed_form",
        method: str = "gausslegendre",
        n_steps: int = 50,
        relative_delta: bool = False,
    ) -> Any:
        r"""Token-to-token maps ``(batch, n, n)``: ``[b, i, j] = ‖F_i(x_j)‖`` at ``scope``.

        Args:
            inputs (Tensor or tuple[Tensor, ...]): the model's positional inputs (token ids).
            additional_forward_args (Any, optional): further positional arguments.
            scope (str or list[str], optional): a scope name (default: the whole layer) or a
                        list of names, which returns a dict ``name → maps`` from one pass.
            return_convergence_delta (bool): also return the completeness residual ``(batch,)``
                        per scope (a dict for a list of scopes).
            internal_batch_size (int, optional): output rows per chunk; by default chosen so
                        a chunk fits ``memory_budget``.
            forward_kwargs (dict, optional): keyword arguments of the model's forward, e.g.
                        ``{"attention_mask": mask}``; with a 2-D ``attention_mask`` padded
                        positions get zero rows and columns.
            activation_route (str): ``"closed_form"`` (exact, default) or ``"captum"``
                        (Captum's ``IntegratedGradients`` per output row, for checking).
            method (str): Captum's integration method for the ``"captum"`` route.
            n_steps (int): Captum's number of steps for the ``"captum"`` route.
            relative_delta (bool): divide each delta by the largest ``|value|`` of the real
                        tensor (useful where hidden states reach large magnitudes).

        Returns:
            maps, or ``(maps, delta)``; a list of those for a list of layers.
        """
        return self._answer(
            "maps", inputs, additional_forward_args, forward_kwargs, scope, internal_batch_size,
            ChainOptions(activation_route, method, n_steps), return_convergence_delta,
            relative_delta,
        )

    def decompose(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        additional_forward_args: Any = None,
        scope: ScopeArg = None,
        return_convergence_delta: bool = False,
        internal_batch_size: int | None = None,
        forward_kwargs: dict[str, Any] | None = None,
        activation_route: str = "closed_form",
        method: str = "gausslegendre",
        n_steps: int = 50,
        relative_delta: bool = False,
    ) -> Any:
        r"""The decomposition itself (vectors and bias) at ``scope``; see :meth:`attribute`.

        Returns:
            a dense :class:`~captum_ffb.Decomposition` with terms ``(batch, n, n, d)`` (a dict
            for a list of scopes; a list for a list of layers), with deltas if asked.
        """
        return self._answer(
            "decompositions", inputs, additional_forward_args, forward_kwargs, scope,
            internal_batch_size, ChainOptions(activation_route, method, n_steps),
            return_convergence_delta, relative_delta,
        )

    def _answer(
        self,
        kind: str,
        inputs: Any,
        additional_forward_args: Any,
        forward_kwargs: dict[str, Any] | None,
        scope: ScopeArg,
        internal_batch_size: int | None,
        options: ChainOptions,
        with_delta: bool,
        relative_delta: bool,
    ) -> Any:
        """Run, then shape the answer as Captum does: ``kind`` is ``"maps"`` or
        ``"decompositions"``; one value per scope (a dict for a list of scopes), with its
        delta if asked, in a list for a list of layers."""
        names, single = self._scope_names(scope)
        outputs = _Outputs(maps=kind == "maps", decompositions=kind == "decompositions",
                           delta=with_delta, relative=relative_delta)
        results = self._run(inputs, additional_forward_args, forward_kwargs, names,
                            internal_batch_size, options, outputs)
        out = []
        for result in results:
            values = getattr(result, kind)
            value = values[names[0]] if single else dict(values)
            if with_delta:
                value = (value, result.delta[names[0]] if single else dict(result.delta))
            out.append(value)
        return out if self._returns_list else out[0]

    # ------------------------------------------------------------------ internals
    def _check_block(self, module: nn.Module) -> None:
        spec = self.spec
        paths = [spec.attention, spec.value.path, spec.attention_output.path, spec.norm1, spec.norm2]
        paths += [p for p in (spec.attention_post_norm, spec.ff_post_norm) if p is not None]
        moe = spec.moe
        if moe is not None and _has(module, moe.experts):
            paths += [moe.module, moe.router]
        else:
            paths += [spec.ff_in.path, spec.activation, spec.ff_out.path]
            if spec.ff_gate is not None:
                paths.append(spec.ff_gate.path)
        for path in paths:
            if not _has(module, path):
                raise ValueError(
                    f"{type(module).__name__} is not a {self.model_type} Transformer block "
                    f"(no {path!r}); pass one block, e.g. the first of the model's layer list"
                )

    def _scope_names(self, scope: ScopeArg) -> tuple[list[str], bool]:
        if scope is None:
            return [self.chain.scopes[-1]], True
        single = isinstance(scope, str)
        names = [scope] if single else list(scope)
        if not names:
            raise ValueError("scope must name at least one scope")
        unknown = [name for name in names if name not in self.chain.scopes]
        if unknown:
            raise ValueError(
                f"unknown scope {unknown[0]!r} for a {self.chain.name} model; choose from "
                f"{', '.join(self.chain.scopes)}"
            )
        return names, single

    def watched_modules(self, module: nn.Module) -> dict[str, nn.Module]:
        """Role → module of the block ``module`` whose real input and output the chain and
        the deltas need (for :func:`captum_ffb.capture.capture_blocks`)."""
        spec = self.spec
        roles = {
            "norm1": spec.norm1,
            "norm2": spec.norm2,
            "attn_out": spec.attention_output.path,
            "attention_post_norm": spec.attention_post_norm,
            "ff_post_norm": spec.ff_post_norm,
            "ff_in": _path(spec.ff_in),
            "ff_gate": _path(spec.ff_gate),
            "ff_out": _path(spec.ff_out),
            "activation": spec.activation,
            "ff": spec.ff_output or _path(spec.ff_out),
        }
        if spec.moe is not None and _has(module, spec.moe.experts):
            roles.update(ff=spec.moe.module, router=spec.moe.router,
                         shared_expert_gate=spec.moe.shared_expert_gate)
        if spec.ff_post_norm is not None:
            roles["ff"] = spec.ff_post_norm  # the FF branch ends with its post-norm
        return {
            role: resolve(module, path)
            for role, path in roles.items()
            if path is not None and _has(module, path)
        }

    def _run(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        additional_forward_args: Any,
        forward_kwargs: dict[str, Any] | None,
        scopes: list[str],
        internal_batch_size: int | None,
        options: ChainOptions,
        outputs: _Outputs,
    ) -> list[LayerResult]:
        args = forward_arguments(inputs, additional_forward_args)
        kwargs = dict(forward_kwargs or {})
        if internal_batch_size is not None and internal_batch_size < 1:
            raise ValueError("internal_batch_size must be a positive number of rows")

        training = [module.training for module in self._layers]
        for module in self._layers:
            module.eval()  # dropout would make the captured tensors random
        try:
            captures = capture_blocks(
                lambda: self.forward_func(*args, **kwargs),
                self._layers,
                [self.watched_modules(module) for module in self._layers],
                [[resolve(module, self.spec.attention)] for module in self._layers],
                owners=[self._model] if self._model is not None else [],
            )
        finally:
            for module, mode in zip(self._layers, training):
                module.train(mode)

        token_mask = token_mask_of(kwargs.get("attention_mask"), captures[0].inputs)
        blocks = [
            Block(module, self.spec, capture, dtype=self.dtype, token_mask=token_mask)
            for module, capture in zip(self._layers, captures)
        ]
        chunks = [_row_chunks(block, internal_batch_size, self.memory_budget) for block in blocks]
        progress = _progress(sum(len(c) for c in chunks), self.show_progress)
        try:
            with torch.no_grad():  # the Captum route turns gradients back on where it needs them
                return [
                    self._run_block(block, scopes, rows, options, outputs, progress)
                    for block, rows in zip(blocks, chunks)
                ]
        finally:
            if progress is not None:
                progress.close()

    def _run_block(
        self,
        block: Block,
        scopes: list[str],
        chunks: list[slice],
        options: ChainOptions,
        outputs: _Outputs,
        progress: Any,
    ) -> LayerResult:
        chain = self.chain
        wanted = set(scopes)
        last = max(chain.scopes.index(name) for name in scopes)
        parts: dict[str, list[Decomposition]] = {name: [] for name in scopes}
        maps: dict[str, list[Tensor]] = {name: [] for name in scopes}
        deltas: dict[str, list[Tensor]] = {name: [] for name in scopes}
        scales: dict[str, list[Tensor]] = {name: [] for name in scopes}
        references = {name: _reference(block, chain, name) for name in scopes} if outputs.delta else {}

        state = chain.mix(block, options)
        # A chunk's dense tensors die with it unless decompositions are kept: reuse buffers.
        arena = None if outputs.decompositions else self._arena
        for rows in chunks:
            offset = rows.start
            if arena is not None:
                arena.reset()
            with using_arena(arena):
                for position, (name, decomposition) in enumerate(chain.local(block, state, rows, options)):
                    if name in wanted:
                        if outputs.maps:
                            maps[name].append(decomposition.maps(row_offset=offset))
                        if outputs.delta:
                            real = references[name][:, rows]
                            deltas[name].append(decomposition.completeness_residual(real, row_offset=offset))
                            if outputs.relative:
                                scales[name].append(_row_scale(real, block.token_mask, offset))
                        if outputs.decompositions:
                            parts[name].append(decomposition.dense())
                    if position >= last:
                        break
            if progress is not None:
                progress.update(1)

        result = LayerResult(chain)
        for name in scopes:
            if outputs.maps:
                result.maps[name] = torch.cat(maps[name], dim=1)
            if outputs.delta:
                delta = torch.stack(deltas[name]).amax(dim=0)
                if outputs.relative:
                    scale = torch.stack(scales[name]).amax(dim=0)
                    delta = delta / scale.clamp_min(torch.finfo(scale.dtype).tiny)
                result.delta[name] = delta
            if outputs.decompositions:
                result.decompositions[name] = stack_rows(parts[name])
        return result


@dataclass(frozen=True)
class _Outputs:
    """What a run keeps: maps, convergence deltas (relative or not), decompositions."""

    maps: bool = False
    delta: bool = False
    relative: bool = False
    decompositions: bool = False


def _reference(block: Block, chain: Chain, scope: str) -> Tensor:
    """The real tensor a scope reproduces: the sum of the chain's sources for it."""
    total = None
    for role, which in chain.references[scope]:
        if role == "block":
            value = block.output if which == "output" else block.inputs
        else:
            value = block.real(role, which)
        total = value if total is None else total + value
    return total


def _path(projection: Projection | None) -> str | None:
    return None if projection is None else projection.path


def _has(module: nn.Module, path: str) -> bool:
    try:
        resolve(module, path)
    except ValueError:
        return False
    return True


def _row_scale(reference: Tensor, token_mask: Tensor | None, offset: int) -> Tensor:
    """Largest ``|value|`` of the real tensor per batch element, over real rows."""
    size = reference.abs().amax(dim=-1)
    if token_mask is not None:
        size = size * token_mask[:, offset : offset + size.shape[1]].to(size.dtype)
    return size.amax(dim=1)


def _row_chunks(block: Block, rows_per_chunk: int | None, budget: int) -> list[slice]:
    batch, n, width = block.capture.inputs.shape
    if rows_per_chunk is None:
        ff_width = _ff_width(block)
        item = torch.finfo(block.dtype).bits // 8
        per_row = batch * n * (2 * ff_width + 8 * width) * item
        rows_per_chunk = max(1, min(n, budget // max(per_row, 1)))
    count = math.ceil(n / rows_per_chunk)
    return [slice(i * rows_per_chunk, min(n, (i + 1) * rows_per_chunk)) for i in range(count)]


def _ff_width(block: Block) -> int:
    """Width of the FF hidden layer (of one expert for mixtures of experts)."""
    if block.is_moe:
        return block.expert_weights(0)[0].shape[-1] * 2
    return block.capture.tensors[("ff_in", "output")].shape[-1] * (2 if block.spec.ff_gate else 1)


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="decomposing", unit="chunk")

