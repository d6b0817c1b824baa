"""Where a model keeps its blocks and norms, read from its family's spec; and the Hugging Face
model behind what a user hands over (:func:`find_model`)."""

from __future__ import annotations

import copy
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from captum_ffb.architectures import get_architecture, model_type_of, supported_architectures  # noqa: F401  (re-exported)
from captum_ffb.architectures.spec import ArchitectureSpec
from captum_ffb.engine.block import has_path, resolve


def find_model(forward_func: Callable | nn.Module | Any) -> nn.Module | None:
    """The Hugging Face ``nn.Module`` behind ``forward_func``: itself, the owner of a bound
    method, the model under a TransformerLens ``TransformerBridge`` (``unbridged``) or
    under an nnsight model (``LanguageModel``, ``TransformersModel``: its ``_module``)."""
    wrapped = _wrapped_model(forward_func)
    if wrapped is not None:
        return wrapped
    if isinstance(forward_func, nn.Module):
        return forward_func
    owner = getattr(forward_func, "__self__", None)
    if owner is not None and not isinstance(owner, nn.Module):
        return _wrapped_model(owner)
    return owner if isinstance(owner, nn.Module) else None


def wrapper_tokenizer(forward_func: Any) -> Any:
    """The tokenizer a TransformerLens bridge or an nnsight model carries (``None`` for
    anything else)."""
    if _library_of(forward_func) in ("transformer_lens", "nnsight"):
        return getattr(forward_func, "tokenizer", None)
    return None


def _library_of(value: Any) -> str:
    return type(value).__module__.split(".", 1)[0]


def _wrapped_model(value: Any) -> nn.Module | None:
    """The Hugging Face model a TransformerLens bridge or an nnsight model wraps (``None`` for
    anything else); a ``ValueError`` for one whose model cannot be read as Hugging Face's."""
    library = _library_of(value)
    if library == "transformer_lens" and isinstance(value, nn.Module) and hasattr(type(value), "original_model"):
        if getattr(value, "compatibility_mode", False):
            raise ValueError("this TransformerBridge is in compatibility mode (its weights folded, it computes "
                             "HookedTransformer's model): explain a bridge without enable_compatibility_mode(), "
                             "or the Hugging Face model itself")
        try:
            original = value.original_model
        except AttributeError:
            raise ValueError("this TransformerBridge holds no local model (a remote driver): explain a bridge "
                             "booted from a Hugging Face model") from None
        return unbridged(value, original)
    if library == "nnsight":
        module = value.__dict__.get("_module", value.__dict__.get("_model"))
        if isinstance(module, nn.Module):
            if value.__dict__.get("dispatched", True) is False:
                raise ValueError("this nnsight model is not dispatched (its weights are not loaded yet): load it "
                                 "with dispatch=True or call its .dispatch() first")
            return module
    return None


#: each bridge's view of its Hugging Face model (one per bridge, so that its lock is one too)
_views: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()
#: the hook tables an ``nn.Module`` keeps (a view gets empty ones of its own)
_HOOK_TABLES = tuple(name for name in vars(nn.Module()) if name.endswith(("hooks", "hooks_with_kwargs",
                                                                          "hooks_always_called")))


def unbridged(bridge: nn.Module, original: nn.Module) -> nn.Module:
    """The Hugging Face model under a TransformerLens 4 ``TransformerBridge``, as Hugging Face
    built it: booting a bridge replaces the model's modules in place by bridge components
    (each keeping the original as ``original_component``, its attention computed by the
    bridge's own code). The view puts the originals back in new module objects that share
    every parameter and buffer with the bridge (nothing is copied; an edit of a weight shows
    in both) and have no hooks of the bridge's; the bridge itself is left as it was."""
    view = _views.get(bridge)
    if view is None:
        view = _views[bridge] = _without_bridges(original)
    return view


def _without_bridges(module: nn.Module) -> nn.Module:
    original = module._modules.get("_original_component")
    if original is not None and _library_of(module) == "transformer_lens":
        return _without_bridges(original)
    children = OrderedDict((name, None if child is None else _without_bridges(child))
                           for name, child in module._modules.items())
    patched = "forward" in vars(module) and \
        getattr(vars(module)["forward"], "__module__", "").startswith("transformer_lens")
    if not patched and all(children[name] is child for name, child in module._modules.items()):
        return module
    view = copy.copy(module)
    view._modules = children
    for table in _HOOK_TABLES:
        setattr(view, table, OrderedDict())
    if patched:
        del view.__dict__["forward"]
    return view


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

