"""``LayerNormDecomposition``: exact token-to-token maps of Transformer layers, as a Captum
layer attribution."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from captum.attr import LayerAttribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_ffb._deprecation import keyword_only
from captum_ffb.architectures import get_architecture
from captum_ffb.core.decomposition import Decomposition, ScratchArena
from captum_ffb.engine import (
    DEFAULT_MEMORY_BUDGET,
    Block,
    LayerResult,
    Outputs,
    capture_layers,
    chain_for,
    find_blocks,
    find_model,
    model_type_of,
    reference,
    resolve_rules,
    row_chunks,
    run_block,
)
from captum_ffb.engine.block import config_of, has_path
from captum_ffb.engine.capture import forward_arguments
from captum_ffb.engine.locking import serialized
from captum_ffb.engine.requests import check_call, check_forward_kwargs
from captum_ffb.engine.whole import check_finite_inputs

ScopeArg = str | Sequence[str] | None



_ORDER = ("inputs", "additional_forward_args", "scope", "return_convergence_delta", "internal_batch_size",
          "forward_kwargs", "relative_delta", "input_decomposition")


class LayerNormDecomposition(LayerAttribution):
    r"""Exact decomposition of Transformer layers into per-token vectors (Kobayashi et al.).

    Each output vector of a layer is written as ``y_i = Σ_j F_i(x_j) + b_i`` over the layer's
    input vectors, through attention, residuals, norms and the feed-forward block (whose
    activation is decomposed with Integrated Gradients in closed form). The attribution map
    is ``M[b, i, j] = ‖F_i(x_j)‖₂``, read at one of the paper's *scopes*:

    * Post-LN (BERT, RoBERTa, ...): ``Atb``, ``AtbFf``, ``AtbFfRes``, ``AtbFfResLn``;
    * Pre-LN (GPT-2, OPT, Llama, ...): ``Atb``, ``AtbLn``, ``AtbLnFf``, ``AtbLnFfRes``, and on
      request ``AtbLnFfResLn`` (the norm that reads the layer's output applied to it);
    * parallel blocks (GPT-J, GPT-NeoX, Phi): ``Atb``, ``LnFf``, ``AtbLnFfRes``.

    The decomposition is built from per-module rules chosen by role; ``rules`` replaces any
    of them (see :mod:`captum_ffb.rules`). The convergence delta is the completeness
    residual: the largest absolute difference between ``Σ_j F_i(x_j) + b_i`` and the tensor
    the model really computed at that scope.

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
        rules (dict, optional): role → rule replacing the default rule of that role, e.g.
                    ``{"activation": IGActivation(route="captum")}``; the roles of this
                    model's chain are in :attr:`roles`.

    Examples::

        >>> from captum_ffb import LayerNormDecomposition
        >>> from captum_ffb.explained.models import load_model
        >>> loaded = load_model()                      # all-MiniLM-L6-v2, offline
        >>> enc = loaded.tokenizer(["The cat sat on the mat."], return_tensors="pt")
        >>> lnd = LayerNormDecomposition(loaded.model, loaded.model.encoder.layer[2])
        >>> maps, delta = lnd.attribute(
        ...     enc.input_ids, forward_kwargs={"attention_mask": enc.attention_mask},
        ...     return_convergence_delta=True)
        >>> maps.shape                                 # (1, n, n): ‖F_i(x_j)‖
    """

    @keyword_only(3, ("forward_func", "layer", "device_ids", "model_type", "memory_budget", "dtype",
                      "show_progress", "rules"))
    def __init__(
        self,
        forward_func: Callable | nn.Module,
        layer: nn.Module | Sequence[nn.Module],
        device_ids: list[int] | None = None,
        *,
        rules: Mapping[str, Callable] | None = None,
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
        self._layers: list[nn.Module] = layers
        self._model = find_model(forward_func)
        _refuse_meta(self._model, layers)
        if self._model is not None:
            members = {id(m) for m in self._model.modules()}
            for index, module in enumerate(layers):
                if id(module) not in members:
                    raise ValueError(
                        f"layer {index} ({type(module).__name__}) is not part of the model "
                        f"{type(self._model).__name__}"
                    )
        self.model_type = model_type or model_type_of(self._model, *layers)
        family = get_architecture(self.model_type)
        self.spec = family.for_block(layers[0])
        if any(family.for_block(module) is not self.spec for module in layers[1:]):
            raise ValueError("the layers mix encoder and decoder blocks; give blocks of one stack")
        self._config = config_of(self._model, *layers)
        if self._config is not None:
            family.check_config(self._config)  # once, where the blocks are bound
        self.chain = chain_for(self.spec, self._config)
        for module in layers:
            self._check_block(module)
        self._user_rules = dict(rules or {})
        self.rules = self._rules(None)
        if memory_budget <= 0:
            raise ValueError("memory_budget must be a positive number of bytes")
        self.memory_budget = int(memory_budget)
        self.dtype = dtype
        self.show_progress = show_progress
        self._arena = ScratchArena()

    # ------------------------------------------------------------------ public API
    @property
    def scopes(self) -> tuple[str, ...]:
        """The scope names of this model's chain, from attention only to the whole layer."""
        return self.chain.scopes

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles this model's chain calls (the keys ``rules`` may replace)."""
        return tuple(sorted(self.chain.roles(self.spec)))

    def has_convergence_delta(self) -> bool:
        return True

    def release_memory(self) -> None:
        """Free the scratch buffers kept between calls (at most about ``memory_budget``)."""
        self._arena.clear()

    @log_usage()
    @serialized
    @keyword_only(1, _ORDER)
    def attribute(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        *,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
        scope: ScopeArg = None,
        rules: Mapping[str, Callable] | None = None,
        return_convergence_delta: bool = False,
        internal_batch_size: int | None = None,
        relative_delta: bool = False,
        input_decomposition: Decomposition | None = None,
    ) -> Any:
        r"""Token-to-token maps ``(batch, n, n)``: ``[b, i, j] = ‖F_i(x_j)‖`` at ``scope``.

        Args:
            inputs (Tensor or tuple[Tensor, ...]): the model's positional inputs (token ids),
                        or its input embeddings ``(batch, n, d)`` (passed as ``inputs_embeds``).
            additional_forward_args (Any, optional): further positional arguments.
            scope (str or list[str], optional): a scope name (default: the whole layer) or a
                        list of names, which returns a dict ``name → maps`` from one pass.
            rules (dict, optional): role → rule for this call (over the instance's).
            return_convergence_delta (bool): also return the completeness residual ``(batch,)``
                        per scope (a dict for a list of scopes).
            internal_batch_size (int, optional): output rows per chunk; by default chosen so
                        a chunk fits ``memory_budget``.
            forward_kwargs (dict, optional): keyword arguments of the model's forward, e.g.
                        ``{"attention_mask": mask}``; with a 2-D ``attention_mask`` padded
                        positions get zero rows and columns.
            relative_delta (bool): divide each delta by the largest ``|value|`` of the real
                        tensor (useful where hidden states reach large magnitudes).
            input_decomposition (Decomposition, optional): a decomposition of the layer's
                        input over any players (``terms (batch, n, P, d)``), to start from
                        instead of the identity (one layer only): the maps are then
                        ``(batch, n, P)`` over those players. This is how blocks chain.

        Returns:
            maps, or ``(maps, delta)``; a list of those for a list of layers.
        """
        return self._answer(
            "maps", inputs, additional_forward_args, forward_kwargs, scope, internal_batch_size,
            return_convergence_delta, relative_delta, input_decomposition, rules,
        )

    @log_usage()
    @serialized
    @keyword_only(1, _ORDER)
    def decompose(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        *,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
        scope: ScopeArg = None,
        rules: Mapping[str, Callable] | None = None,
        return_convergence_delta: bool = False,
        internal_batch_size: int | None = None,
        relative_delta: bool = False,
        input_decomposition: Decomposition | None = None,
    ) -> Any:
        r"""The decomposition itself (vectors and bias) at ``scope``; see :meth:`attribute`.

        Returns:
            a dense :class:`~captum_ffb.core.decomposition.Decomposition` with terms ``(batch, n, n, d)`` (a dict
            for a list of scopes; a list for a list of layers), with deltas if asked.
        """
        return self._answer(
            "decompositions", inputs, additional_forward_args, forward_kwargs, scope,
            internal_batch_size, return_convergence_delta, relative_delta, input_decomposition, rules,
        )

    @serialized
    @keyword_only(1, ("inputs", "additional_forward_args", "forward_kwargs", "scope", "maps", "decompositions",
                      "convergence_delta", "relative_delta", "internal_batch_size"))
    def iter_layers(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        *,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
        scope: ScopeArg = None,
        maps: bool = False,
        decompositions: bool = True,
        convergence_delta: bool = False,
        relative_delta: bool = False,
        internal_batch_size: int | None = None,
    ) -> Iterator[tuple[int, LayerResult]]:
        r"""One forward pass for all layers, then ``(layer position, LayerResult)`` one layer
        at a time, so that only one layer's decompositions are held at once.

        Args:
            inputs, additional_forward_args, forward_kwargs, scope, internal_batch_size:
                        see :meth:`attribute`.
            maps (bool): compute the maps.
            decompositions (bool): keep the dense decompositions.
            convergence_delta (bool): compute the completeness residuals.
            relative_delta (bool): make them relative (see :meth:`attribute`).

        A scope a layer cannot give (``AtbLnFfResLn`` after the last layer of a model
        without a final norm) is missing from that layer's result.
        """
        names, _ = self._scope_names(scope)
        outputs = Outputs(maps=maps, decompositions=decompositions, delta=convergence_delta,
                          relative=relative_delta)
        blocks = self._capture(inputs, additional_forward_args, forward_kwargs, names, strict=False)
        yield from self._run(blocks, names, internal_batch_size, outputs)

    @serialized
    def compute_convergence_delta(
        self,
        attributions: Decomposition | Sequence[Decomposition],
        inputs: Tensor | tuple[Tensor, ...],
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
        scope: str | None = None,
        relative: bool = False,
    ) -> Tensor | list[Tensor]:
        r"""The completeness residual of given decompositions against the model's own tensors.

        Runs one forward pass on ``inputs`` and compares ``Σ_j F_i(x_j) + b_i`` of each
        decomposition with the real tensor at ``scope`` (Captum's convergence delta).

        Args:
            attributions (Decomposition or list[Decomposition]): one per layer, as returned
                        by :meth:`decompose`.
            inputs, additional_forward_args, forward_kwargs: the inputs they were made from.
            scope (str, optional): the scope they decompose (default: the whole layer).
            relative (bool): divide by the largest ``|value|`` of the real tensor.

        Returns:
            ``(batch,)`` residuals (a list for a list of layers).
        """
        names, _ = self._scope_names(scope)
        given = list(attributions) if self._returns_list else [attributions]
        if len(given) != len(self._layers):
            raise ValueError(f"expected {len(self._layers)} decompositions, got {len(given)}")
        blocks = self._capture(inputs, additional_forward_args, forward_kwargs, names)
        out = [
            dec.completeness_residual(reference(block, self.chain, names[0]), relative=relative)
            for dec, block in zip(given, blocks)
        ]
        return out if self._returns_list else out[0]

    # ------------------------------------------------------------------ internals
    def _answer(
        self,
        kind: str,
        inputs: Any,
        additional_forward_args: Any,
        forward_kwargs: dict[str, Any] | None,
        scope: ScopeArg,
        internal_batch_size: int | None,
        with_delta: bool,
        relative_delta: bool,
        start: Decomposition | None,
        rules: Mapping[str, Callable] | None = None,
    ) -> Any:
        """Run, then shape the answer as Captum does: ``kind`` is ``"maps"`` or
        ``"decompositions"``; one value per scope (a dict for a list of scopes), with its
        delta if asked, in a list for a list of layers."""
        names, single = self._scope_names(scope)
        if start is not None and len(self._layers) != 1:
            raise ValueError("input_decomposition starts one layer; give a single layer")
        outputs = Outputs(maps=kind == "maps", decompositions=kind == "decompositions",
                          delta=with_delta, relative=relative_delta)
        blocks = self._capture(inputs, additional_forward_args, forward_kwargs, names)
        out = []
        for _, result in self._run(blocks, names, internal_batch_size, outputs, start, self._rules(rules)):
            values = getattr(result, kind)
            value = values[names[0]] if single else dict(values)
            if with_delta:
                value = (value, result.delta[names[0]] if single else dict(result.delta))
            out.append(value)
        return out if self._returns_list else out[0]

    def _check_block(self, module: nn.Module) -> None:
        spec = self.spec
        paths = [spec.attention, spec.value.path, spec.attention_output.path]
        if spec.has_cross_attention:
            paths += [spec.cross_attention, spec.cross_value.path, spec.cross_output.path]
        paths += [p for p in (spec.norm1, spec.norm2, spec.attention_post_norm, spec.ff_post_norm)
                  if p is not None]
        moe = spec.moe
        if moe is not None and has_path(module, moe.experts):
            paths += [moe.module, moe.router]
        else:
            paths += [spec.ff_in.path, spec.activation, spec.ff_out.path]
            if spec.ff_gate is not None:
                paths.append(spec.ff_gate.path)
        paths += [p for p in (spec.cross_norm,) if p is not None]
        for path in paths:
            if not has_path(module, path):
                raise ValueError(
                    f"{type(module).__name__} is not a {self.model_type} Transformer block "
                    f"(no {path!r}); pass one block, e.g. the first of the model's layer list"
                )

    def _check_finite(self, module: nn.Module, x: Tensor, given: Any) -> None:
        """A one-line ValueError when ``module``'s input ``x`` holds NaN or inf, named by its
        layer index (the input embeddings for the first block)."""
        if bool(torch.isfinite(x).all()):
            return
        index, embedding = None, None
        if self._model is not None:
            try:
                index = next((k for k, b in enumerate(find_blocks(self._model, self.spec)) if b is module), None)
            except ValueError:
                pass
            try:
                embedding = self._model.get_input_embeddings()
            except (AttributeError, NotImplementedError):
                pass
        what = "the input embeddings" if index == 0 else \
            f"the input of layer {index if index is not None else type(module).__name__}"
        check_finite_inputs(x, given, embedding, what, first=index == 0)

    def _rules(self, rules: Mapping[str, Callable] | None) -> dict[str, Callable]:
        """The paper's rules, the instance's replacements, then this call's."""
        return resolve_rules(self.chain, self.spec, {**self._user_rules, **(rules or {})},
                             f"a {self.model_type} block")

    def _scope_names(self, scope: ScopeArg) -> tuple[list[str], bool]:
        if scope is None:
            return [self.chain.output_scope], True
        single = isinstance(scope, str)
        names = [scope] if single else list(scope)
        if not names:
            raise ValueError("scope must name at least one scope")
        self.chain.check_scopes(names)
        return names, single

    def _capture(self, inputs: Any, additional_forward_args: Any, forward_kwargs: dict[str, Any] | None,
                 scopes: list[str], strict: bool = True) -> list[Block]:
        extra = set(scopes) & set(self.chain.extra_scopes)
        args = forward_arguments(inputs, additional_forward_args)
        kwargs = check_forward_kwargs(forward_kwargs)
        if self._model is not None:  # the request, checked before the pass
            kwargs = check_call(self._model, args, kwargs)
        blocks, _ = capture_layers(
            self.forward_func, self._model, self._layers, self.spec, args,
            None, kwargs, dtype=self.dtype, with_next_norms=bool(extra),
        )
        for module, block in zip(self._layers, blocks):
            self._check_finite(module, block.capture.inputs, args[0])
        if extra and strict:
            missing = [k for k, block in enumerate(blocks) if block.next_norm is None]
            if missing:
                raise ValueError(
                    f"scope {sorted(extra)[0]!r} needs the norm that reads the layer's output; "
                    "none was found for this layer (pass the model itself as forward_func, and "
                    "note that the family may have no such norm)"
                )
        return blocks

    def _run(
        self,
        blocks: list[Block],
        scopes: list[str],
        internal_batch_size: int | None,
        outputs: Outputs,
        start: Decomposition | None = None,
        rules: Mapping[str, Callable] | None = None,
    ) -> Iterator[tuple[int, LayerResult]]:
        if internal_batch_size is not None and internal_batch_size < 1:
            raise ValueError("internal_batch_size must be a positive number of rows")
        players = None if start is None else start.n_in
        chunks = [row_chunks(block, internal_batch_size, self.memory_budget, players) for block in blocks]
        progress = _progress(sum(len(c) for c in chunks), self.show_progress)
        try:
            for index, (block, rows) in enumerate(zip(blocks, chunks)):
                with torch.no_grad():  # the Captum route turns gradients back on where needed
                    result = run_block(block, self.chain, rules or self.rules, scopes, rows, outputs,
                                       start, self._arena, progress)
                yield index, result
        finally:
            if progress is not None:
                progress.close()


def _refuse_meta(model: nn.Module | None, layers: Sequence[nn.Module]) -> None:
    """A one-line ValueError when the weights are on the meta device (shapes, no values)."""
    owners = [model] if model is not None else list(layers)
    if any(p.device.type == "meta" for owner in owners for p in owner.parameters()):
        name = type(owners[0]).__name__
        raise ValueError(f"{name}'s weights are on the meta device (not loaded): load them "
                         "(from_pretrained without device_map='meta'), then explain")


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="decomposing", unit="chunk")
