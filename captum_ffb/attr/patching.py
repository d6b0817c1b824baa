r"""Activation patching: the field's ground truth for what a component does.

For each component ``A`` (an attention sublayer or one of its heads, an FF block) one forward
pass of the real model runs on the clean input with ``A``'s output replaced, at every
position, by its output in the corrupted run; the effect is
``output(inputs) − output(inputs, A patched)``. One pass per component: what the graph's
patching estimates (:mod:`captum_ffb.patching.patches`) estimate from two passes.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from captum_ffb._deprecation import REMOVED_IN
from captum_ffb.core.vocabulary import FEATURE_GRANULARITIES, check_granularity, component_of
from captum_ffb.explained.readouts import with_token_ids

__all__ = ["PATCHING_GRANULARITIES", "PatchingResult", "activation_patching", "component_id"]

#: what one patched pass replaces: each attention sublayer or each head, and each FF block
PATCHING_GRANULARITIES = FEATURE_GRANULARITIES["patching"]


def component_id(kind: str, layer: int, part: int = -1) -> str:
    """A component's id: ``block.<l>.attention``, ``block.<l>.attention.head.<h>``,
    ``block.<l>.ff`` (:func:`~captum_ffb.core.vocabulary.component_of`; a graph node's id without
    its position)."""
    return component_of(kind, layer, part)


class _Effects(dict):
    """Component id → effect; an id of before 0.4 (``block.3.head.2``) is read with a
    ``DeprecationWarning``."""

    def _renamed(self, key: Any) -> Any:
        if isinstance(key, str) and not dict.__contains__(self, key):
            parts = key.split(".")
            if len(parts) == 4 and parts[0] == "block" and parts[2] == "head":
                new = component_of("head", int(parts[1]), int(parts[3]))
                if dict.__contains__(self, new):
                    warnings.warn(f"component id {key!r} is {new!r} now; the old ids stop working in "
                                  f"{REMOVED_IN}", DeprecationWarning, stacklevel=3)
                    return new
        return key

    def __getitem__(self, key: Any) -> float:
        return dict.__getitem__(self, self._renamed(key))

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, self._renamed(key))

    def get(self, key: Any, default: Any = None) -> Any:
        return dict.get(self, self._renamed(key), default)


@dataclass
class PatchingResult:
    """Real activation patching of every component.

    Attributes:
        effects (dict): component id (:func:`component_id`) → ``output(inputs) −
                    output(inputs with the component patched from the corrupted run)``.
        clean (float): the explained value on the inputs.
        corrupted (float): on the corrupted inputs.
    """

    effects: dict[str, float]
    clean: float
    corrupted: float

    def of(self, kind: str) -> dict[str, float]:
        """The effects of one kind of component (``"head"``, ``"attention"``, ``"ff"``)."""
        if kind == "head":
            return {k: v for k, v in self.effects.items() if ".head." in k}
        return {k: v for k, v in self.effects.items() if k.split(".")[2] == kind and ".head." not in k}


def activation_patching(model: Any, inputs: Tensor | str, corrupted_inputs: Tensor | str | None = None,
                        target: Any = None,
                        granularity: str = "head", *, forward_kwargs: Mapping[str, Any] | None = None,
                        batch_size: int = 16, show_progress: bool = True, tokenizer: Any = None,
                        baseline_inputs: Tensor | None = None) -> PatchingResult:
    r"""Patch each component's output from the corrupted run, one forward pass per component.

    Args:
        model (nn.Module, LoadedModel or NormDecomposition): a Hugging Face model (or one
                    loaded with its tokenizer, bound already, a TransformerLens bridge or an
                    nnsight model of one).
        inputs (Tensor or str): ``(1, n)`` the clean token ids, or the text (read by the
                    tokenizer).
        corrupted_inputs (Tensor or str): ``(1, n)`` the corrupted ones, or the text (same
                    length in tokens; ``baseline_inputs``, its name before 0.4, is read with a
                    warning).
        target (int, str, ReadOut, optional): what is explained, as in ``attribute``: a token
                    id, or its text (``" Mary"``, one token; also inside ``NextToken`` and
                    ``Contrast``) read by the tokenizer; ``None``: the clean prediction.
        granularity (str): ``"head"`` (each head and each FF block) or ``"sublayer"``.
        forward_kwargs (dict, optional): further arguments of the model's forward.
        batch_size (int): patched passes run together (each row of a batch the input with its
                    own patch).
        show_progress (bool): a progress bar over the patched passes.
        tokenizer (optional): reads a text target or text inputs (by default the model's own:
                    a ``LoadedModel``'s, a ``NormDecomposition``'s, a bridge's or nnsight's).

    Returns:
        PatchingResult: one effect per component.
    """
    from captum_ffb.attr.norm_decomposition import NormDecomposition
    from captum_ffb.engine.locking import model_lock
    from captum_ffb.engine.requests import check_count, text_input_ids
    from captum_ffb.patching import patches
    from captum_ffb.patching.patches import corrupted_like

    if baseline_inputs is not None:
        if corrupted_inputs is not None:
            raise TypeError("activation_patching() got baseline_inputs= and corrupted_inputs=: give "
                            "corrupted_inputs= only")
        warnings.warn(f"activation_patching(): baseline_inputs= is now corrupted_inputs= (the old name stops "
                      f"working in {REMOVED_IN})", DeprecationWarning, stacklevel=2)
        corrupted_inputs = baseline_inputs
    if corrupted_inputs is None:
        raise TypeError("activation_patching() needs corrupted_inputs (a corrupted prompt of the inputs' length)")
    check_count(batch_size, "batch_size")
    check_granularity(granularity, "patching")
    nd = model if isinstance(model, NormDecomposition) else NormDecomposition(model, tokenizer=tokenizer)
    reader = tokenizer if tokenizer is not None else nd.tokenizer
    nd.engine.refuse_two_stacks("activation patching")
    inputs, corrupted_inputs = (text_input_ids(reader, text, name, nd.model, "activation_patching(..., tokenizer=...)")
                                for text, name in ((inputs, "inputs"), (corrupted_inputs, "corrupted_inputs")))
    target = with_token_ids(target, lambda text: _one_token(nd, reader, text))
    forward_kwargs = dict(forward_kwargs or {})
    request = nd.request(inputs, target, forward_kwargs=forward_kwargs)
    if request.batch_size != 1:
        raise ValueError("inputs: activation patching runs one input at a time (a batch of 1)")
    corrupted = nd.request(corrupted_like(corrupted_inputs, request), request.target, forward_kwargs=forward_kwargs,
                           name="corrupted_inputs")
    with model_lock(nd.model):  # one call at a time on the model, as every attribution
        effects, clean, corrupted_value = patches.activation_patching(nd.engine, request, corrupted, granularity,
                                                                      batch_size, show_progress)
    return PatchingResult(_Effects(effects), clean, corrupted_value)


def _one_token(nd: Any, tokenizer: Any, text: str) -> int:
    """A text target's one token id (a one-line error without a tokenizer, or for more than one token)."""
    if tokenizer is None:
        raise TypeError(f"target {text!r} is text: give activation_patching(..., tokenizer=...) to read it, or its "
                        "token id")
    return int(nd.engine.token_ids(tokenizer, text, one=True)[0])
