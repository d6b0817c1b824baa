"""Where a model keeps its blocks and norms, read from its family's spec."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from captum_ffb.architectures import get_architecture, model_type_of, supported_architectures  # noqa: F401  (re-exported)
from captum_ffb.architectures.spec import ArchitectureSpec
from captum_ffb.engine.block import has_path, resolve


def find_model(forward_func: Callable | nn.Module) -> nn.Module | None:
    """The ``nn.Module`` behind ``forward_func`` (itself, or the owner of a bound method)."""
    if isinstance(forward_func, nn.Module):
        return forward_func
    owner = getattr(forward_func, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def base_model_of(model: nn.Module) -> nn.Module:
    """The bare Transformer under a task model (``model.base_model`` in transformers)."""
    base = getattr(model, "base_model", None)
    return base if isinstance(base, nn.Module) else model


def _search_blocks(model: nn.Module, spec: ArchitectureSpec) -> nn.ModuleList | None:
    """The longest ``ModuleList`` whose first element has the spec's modules."""
    paths = [spec.attention, spec.value.path, spec.attention_output.path]
    best: nn.ModuleList | None = None
    for module in model.modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        if all(has_path(module[0], path) for path in paths):
            if best is None or len(module) > len(best):
                best = module
    return best


def find_blocks(model: nn.Module, spec: ArchitectureSpec | None = None) -> nn.ModuleList:
    """The model's list of Transformer blocks, where its family's spec says it is.

    Args:
        model (nn.Module): a base model or a task model (``*ForCausalLM``, ...).
        spec (ArchitectureSpec, optional): the family's spec; read from the config by default.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    spec = spec or get_architecture(model_type)
    found = None
    if spec.blocks is not None:
        for root in (base_model_of(model), model):
            if has_path(root, spec.blocks):
                found = resolve(root, spec.blocks)
                break
    if found is None:
        found = _search_blocks(model, spec)
    if not isinstance(found, nn.ModuleList) or len(found) == 0:
        raise ValueError(
            f"found no {model_type} Transformer blocks in {type(model).__name__}; supported: "
            f"{', '.join(supported_architectures())}"
        )
    return found


def final_norm_of(model: nn.Module, spec: ArchitectureSpec) -> nn.Module | None:
    """The norm after the last block (``None`` when the family or the config has none)."""
    if spec.final_norm is None:
        return None
    for root in (base_model_of(model), model):
        if has_path(root, spec.final_norm):
            module = resolve(root, spec.final_norm)
            return module if isinstance(module, nn.Module) else None
    return None


def next_norms(model: nn.Module | None, spec: ArchitectureSpec, layers: Sequence[nn.Module]) -> list[nn.Module | None]:
    """For each of ``layers``, the norm that reads its output: the next block's first norm,
    or the model's final norm after the last block (``None`` where there is none, or when
    the model is not known)."""
    if model is None:
        return [None] * len(layers)
    try:
        blocks = list(find_blocks(model, spec))
    except ValueError:
        return [None] * len(layers)
    out: list[nn.Module | None] = []
    for layer in layers:
        index = next((k for k, b in enumerate(blocks) if b is layer), None)
        if index is None:
            out.append(None)
        elif index + 1 < len(blocks):
            following = blocks[index + 1]
            norm1 = spec.for_block(following).norm1  # the following block's layout (Falcon's)
            out.append(resolve(following, norm1) if has_path(following, norm1) else None)
        else:
            out.append(final_norm_of(model, spec))
    return out

