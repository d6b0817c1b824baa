"""The query/key path of a block's attention, for rules that credit the scores.

The capture keeps what the attention function read (queries after rotary embeddings and
query norms, keys, mask, scaling, soft-capping) and how the attention module was called.
Queries and keys are linear in the attention's input once the query/key norms' scales are
frozen (rotary embeddings are a per-position linear map): :func:`score_path` gives that map
by calling the attention module again on other vectors, with the real call's position
arguments, the inner norms frozen at their real scales, and an attention function that only
keeps the queries and keys (so no attention is computed).

:func:`inner_norm_rule` says how such a norm is frozen; the one-backward-pass route freezes
the same norms (:mod:`captum_ffb.engine.linearise`).
"""

from __future__ import annotations

import contextvars
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.block import Block, attention_method, norm_parameters, resolve
from captum_ffb.engine.capture import AttentionCall, inner_norms
from captum_ffb.engine.passes import ModelPass, register_attention
from captum_ffb.rules import LayerNorm, RMSNorm
from captum_ffb.rules.attention_scores import ScorePath, allowed_keys

PROJECTING_IMPLEMENTATION = "captum_ffb_projecting"
#: Where :func:`install_projecting`'s attention puts the ``(query, key)`` pairs it is given (a list set
#: by the caller; ``None``: nowhere).
kept_queries_keys: contextvars.ContextVar[list | None] = contextvars.ContextVar("captum_ffb_projecting",
                                                                             default=None)
#: Bytes one replay of the attention module's projections may take.
_REPLAY_BYTES = 256 * 2**20


def inner_norm_rule(module: nn.Module) -> LayerNorm | RMSNorm:
    """The rule of a norm inside an attention module: LayerNorm or RMSNorm, by its class."""
    name = type(module).__name__
    if isinstance(module, nn.LayerNorm) or ("LayerNorm" in name and "RMS" not in name):
        return LayerNorm()
    return RMSNorm()


def _keep_queries_keys(module, query, key, value, attention_mask, **kwargs):
    store = kept_queries_keys.get()
    if store is not None:
        store.append((query, key))
    out = query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
    return out, None


def install_projecting(run: ModelPass, module: nn.Module, method: str | None) -> None:
    """Install on ``run`` an attention (implementation, or the spec's method) that only keeps
    the queries and keys it is given (in :data:`kept_queries_keys`) and computes no attention."""

    def keep(owner: nn.Module, original: Any):
        def method(query, key, value, *args, **kwargs):
            store = kept_queries_keys.get()
            if store is not None:
                store.append((query, key))
            return query.new_zeros(*query.shape[:-1], value.shape[-1]), None

        return method

    run.attention(register_attention(PROJECTING_IMPLEMENTATION, _keep_queries_keys), [module])
    run.method([module], method, keep)


def expand_batch(value: Any, batch: int, copies: int) -> Any:
    """Repeat each batch row ``copies`` times (tensors of 2 or more dimensions whose first
    dimension is the batch; tuples element-wise); caches and masks become ``None``."""
    if type(value).__name__.endswith("Cache"):
        return None
    if isinstance(value, tuple):
        return tuple(expand_batch(v, batch, copies) for v in value)
    if isinstance(value, Tensor) and value.dim() >= 2 and value.shape[0] == batch:
        return value.repeat_interleave(copies, dim=0)
    return value


def _frozen_norm_hook(module: nn.Module, real: Tensor, block: Block, copies: int):
    rule = inner_norm_rule(module)
    weight, bias, eps = norm_parameters(module, block.spec, block.config)
    scale = rule.frozen_scale(real.to(torch.float32), eps).repeat_interleave(copies, dim=0)

    def hook(mod, args, output):
        x = args[0]
        if rule.centres:
            x = x - x.mean(dim=-1, keepdim=True)
        out = x * scale[..., None].to(x.dtype)
        if weight is not None:
            out = out * weight.detach().to(x.dtype)
        if bias is not None:
            out = out + bias.detach().to(x.dtype)
        return out

    return hook


def _replay(block: Block, module: nn.Module, call: AttentionCall, hidden: Tensor, copies: int
            ) -> tuple[Tensor, Tensor]:
    """Queries and keys of the attention module on ``hidden`` ``(B · copies, n, d)``."""
    batch = call.query.shape[0]
    original = call.args[0] if call.args else next(iter(call.kwargs.values()))

    def swap(value: Any) -> Any:
        if value is original:
            return hidden
        return expand_batch(value, batch, copies)

    args = tuple(swap(a) for a in call.args)
    kwargs = {k: (None if k in ("attention_mask", "mask") else swap(v)) for k, v in call.kwargs.items()}
    store: list = []
    token = kept_queries_keys.set(store)
    try:
        with ModelPass(module) as run:
            for name, norm in inner_norms(module).items():
                if name in call.norm_inputs:
                    run.after(norm, _frozen_norm_hook(norm, call.norm_inputs[name], block, copies))
            install_projecting(run, module, attention_method(module, block.spec))
            run.call(module, *args, **kwargs)
    finally:
        kept_queries_keys.reset(token)
    if not store:
        raise RuntimeError("the attention module did not call its attention function on replay")
    return store[0]


def score_path(block: Block) -> ScorePath:
    """The query/key path of ``block``'s attention (see the module documentation)."""
    if not block.capture.attention_calls:
        from captum_ffb.engine.capture import computes_probabilities_inline

        module = resolve(block.module, block.spec.attention)
        if computes_probabilities_inline(module, block.spec.attention_method):
            raise ValueError(
                f"{getattr(block.config, 'model_type', 'this model')}'s attention computes its probabilities "
                "inline, without transformers' attention interface, so its queries and keys cannot be "
                "read: rules that credit them (IGAttention, AttnLRPAttention, ...) are not available; "
                "use the frozen-attention rules (the default)"
            )
        raise RuntimeError("the forward pass recorded no queries and keys for this layer")
    call = block.capture.attention_calls[0]
    module = resolve(block.module, block.spec.attention)
    probs = block.capture.probs[0]
    allowed = allowed_keys(call.mask, tuple(probs.shape), probs.device)
    model_dtype = call.query.dtype
    batch = call.query.shape[0]
    zero_cache: dict[str, tuple[Tensor, Tensor]] = {}

    def constants() -> tuple[Tensor, Tensor]:
        if "zero" not in zero_cache:
            zeros = torch.zeros_like(call.args[0] if call.args else next(iter(call.kwargs.values())))
            zero_cache["zero"] = _replay(block, module, call, zeros, 1)
        return zero_cache["zero"]

    def project(vectors: Tensor, affine: bool) -> tuple[Tensor, Tensor]:
        b, n, m, d = vectors.shape
        if m == 0:  # no player (the bias alone): empty queries and keys of the right shapes
            q_real, k_real = block.cast(call.query), block.cast(call.key)
            return (q_real.new_zeros(*q_real.shape[:3], 0, q_real.shape[-1]),
                    k_real.new_zeros(*k_real.shape[:3], 0, k_real.shape[-1]))
        width = max(1, b * n * d * 4 * 12)
        size = max(1, min(m, _REPLAY_BYTES // width))
        queries, keys = [], []
        for first in range(0, m, size):
            part = vectors[:, :, first: first + size]
            k = part.shape[2]
            flat = part.permute(0, 2, 1, 3).reshape(b * k, n, d).to(model_dtype).contiguous()
            q_out, k_out = _replay(block, module, call, flat, k)
            q_out = q_out.to(block.dtype).unflatten(0, (b, k))  # (B, k, H, n, e)
            k_out = k_out.to(block.dtype).unflatten(0, (b, k))
            if not affine:
                q_zero, k_zero = constants()
                q_out = q_out - q_zero.to(block.dtype)[:, None]
                k_out = k_out - k_zero.to(block.dtype)[:, None]
            queries.append(q_out.permute(0, 2, 3, 1, 4))
            keys.append(k_out.permute(0, 2, 3, 1, 4))
        return torch.cat(queries, dim=3), torch.cat(keys, dim=3)

    del batch
    real_input = call.args[0] if call.args else next(iter(call.kwargs.values()))
    return ScorePath(block.cast(call.query), block.cast(call.key), allowed, call.scaling,
                     call.softcap, project, block.cast(real_input))
