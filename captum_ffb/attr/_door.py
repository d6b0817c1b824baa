"""The door of the whole-model attributions: each call's request checked once
(:mod:`captum_ffb.engine.requests`), and what is explained turned into what the head reads
(a read-out, a text target read by the tokenizer)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from captum_ffb.engine import forward_arguments
from captum_ffb.engine.players import REFERENCES
from captum_ffb.engine.requests import (
    check_call,
    check_forward_kwargs,
    check_index,
    leading_space_hint,
    text_input_ids,
    vocabulary_size,
)
from captum_ffb.engine.whole import HeadTarget, Request
from captum_ffb.explained.readouts import (
    ClassLogit,
    NextToken,
    ReadOut,
    head_target_of,
    with_token_ids,
)


class Door:
    """What :class:`~captum_ffb.attr.NormDecomposition` does before it asks its engine: the
    request, the rules, the reference, the target (the instance has ``model``, ``engine``,
    ``reference``, ``tokenizer`` and ``_user_rules``)."""

    def _request(self, inputs: Any, additional_forward_args: Any, forward_kwargs: Any,
                 reference: Any = None, name: str = "inputs") -> Request:
        """A call checked once before any pass: token ids in the vocabulary and within a
        learned position table, masks of their shape with a real token per row, an
        encoder–decoder's target of the source's batch, a token id as reference within the
        vocabulary (:mod:`captum_ffb.engine.requests`)."""
        args = forward_arguments(inputs, additional_forward_args)
        kwargs = check_call(self.model, args, check_forward_kwargs(forward_kwargs), name)
        check_reference(reference, self.model)
        return self.engine.request(args, kwargs)

    def request(self, inputs: Any, target: Any = None, *, additional_forward_args: Any = None,
                forward_kwargs: dict[str, Any] | None = None, reference: Any = None,
                target_position: Any = None, name: str = "inputs") -> Request:
        r"""One call checked once at the door, with what it explains resolved: the request the
        engine takes (:class:`~captum_ffb.engine.bound.Request`).

        Args:
            inputs, additional_forward_args, forward_kwargs, reference: as in ``attribute``
                        (``reference=None``: the instance's).
            target (int, str, Tensor, ReadOut or HeadTarget, optional): what is explained;
                        ``None`` (or a read-out that names no unit, ``NextToken()``): the
                        model's prediction, read from one pass of the model.
            target_position (int or Tensor, optional): the position read.
            name (str): the inputs' name in messages.

        Returns:
            Request: with ``reference`` and ``target`` set.
        """
        reference = self.reference if reference is None else reference
        request = self._request(inputs, additional_forward_args, forward_kwargs, reference, name)
        request.reference = reference
        request.target = self._resolved(target, target_position, request)
        return request

    def _resolved(self, target: Any, position: Any, request: Request, outputs: Any = None) -> HeadTarget:
        """The head target of ``target`` for ``request``: the model's prediction where
        ``target`` is ``None`` or a read-out naming no unit (read from ``outputs``, the model's
        output on the request, or from one real pass)."""
        if isinstance(target, HeadTarget):
            return target
        if self._predicts(target):
            if target is None:
                if self.engine.task == "base":
                    raise ValueError(f"{type(self.model).__name__} is a base model: it predicts nothing to "
                                     "explain; give a Direction target")
                target = NextToken(None, position) if self.engine.task != "sequence_classification" \
                    else ClassLogit()
                position = None
            outputs = self.engine.predict(request) if outputs is None else outputs
            target = self._text_free(target).resolve(outputs, request.read_mask.long())
        elif isinstance(target, str) and self.tokenizer is not None and self.engine.task == "causal_lm":
            self._hint_leading_space(target, position, request, outputs)
        return self._target(target, position, request.read_mask)

    def _hint_leading_space(self, text: str, position: Any, request: Request, outputs: Any) -> None:
        """Warn when a target text without its leading space (``"Paris"``) is not the model's
        prediction but its spaced form (``" Paris"``) is (one more pass of the model, in that
        case only)."""
        if text[:1].isspace() or len(self.tokenizer.encode(" " + text, add_special_tokens=False)) != 1:
            return
        outputs = self.engine.predict(request) if outputs is None else outputs
        predicted = NextToken(None, position).resolve(outputs, request.read_mask.long()).token
        hint = leading_space_hint(self.tokenizer, text, predicted)
        if hint is not None:
            warnings.warn(hint, UserWarning, stacklevel=5)

    def _passes(self, target: Any, position: Any, request: Request, captures: bool) -> tuple[HeadTarget, Any]:
        """Which passes of the model a call runs, decided here for every method: the explained
        target and the capture the call needs (``captures``; else ``None``). A prediction is read
        from the capture where the call captures anyway; only a call that captures nothing runs
        a real pass of its own to predict."""
        captured = self.engine.capture(request) if captures else None
        outputs = None if captured is None else captured.output
        return self._resolved(target, position, request, outputs=outputs), captured

    @staticmethod
    def _predicts(target: Any) -> bool:
        """Whether ``target`` names the model's prediction (``None``, or a read-out naming no
        unit): resolving it needs the model's output."""
        open_readout = isinstance(target, ReadOut) and (getattr(target, "token", 0) is None
                                                        or getattr(target, "index", 0) is None
                                                        or target.needs_outputs)
        return target is None or open_readout

    def _rules(self, rules: Mapping[str, Callable] | None) -> dict[str, Callable]:
        """The whole-model defaults, the instance's replacements, then this call's."""
        if rules is not None and not isinstance(rules, Mapping):
            raise TypeError(f"rules must be a mapping role → rule (e.g. rules={{'attention': AttnLRPAttention()}}), "
                            f"got {type(rules).__name__}")
        return self.engine.rules({**self._user_rules, **(rules or {})})

    def _reference_of(self, reference: Any, baselines: Any) -> Any:
        if baselines is not None and reference is not None:
            raise ValueError("give reference= or baselines= (Captum's name for it), not both")
        chosen = reference if reference is not None else baselines
        return self.reference if chosen is None else chosen

    def _target(self, target: Any, position: Any, read_mask: Tensor) -> HeadTarget:
        """The head target of ``target`` (an index, its text, one per row, or a read-out)."""
        return head_target_of(self._text_free(target), self.engine.head, read_mask, self.engine.dtype, position,
                              type(self.model).__name__)

    def _text_input(self, inputs: Any, name: str = "inputs") -> Any:
        return text_input_ids(self.tokenizer, inputs, name, self.model)

    def _text_free(self, target: Any) -> Any:
        return with_token_ids(target, self._token_id)

    def _token_id(self, text: str) -> int:
        return int(self.engine.token_ids(self.tokenizer, text, one=True)[0])

    def _target_tokens(self, target: Any, device: torch.device) -> Tensor:
        """A forced target's tokens ``(T,)``, from ids or (with a tokenizer) its text."""
        if isinstance(target, str):
            target = self.engine.token_ids(self.tokenizer, target)
        units = None if self.engine.head.output is None else int(self.engine.head.output.weight.shape[0])
        tokens = target if isinstance(target, Tensor) else torch.as_tensor(target, device=device)
        tokens = check_index(tokens, "target", units).reshape(-1).long()
        if tokens.numel() == 0:
            raise ValueError("target has no tokens")
        return tokens.to(device)


def check_reference(reference: Any, model: Any = None) -> Any:
    """A reference checked at the door: ``None``, one of :data:`REFERENCES`, a token id of the
    vocabulary, or a finite float tensor (a ``TypeError`` or ``ValueError`` naming it)."""
    if reference is None:
        return reference
    if isinstance(reference, str):
        if reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, a token id or a tensor, got {reference!r}")
        return reference
    if isinstance(reference, Tensor):
        if not reference.is_floating_point():
            raise TypeError(f"a reference tensor holds input vectors (floats), got {str(reference.dtype)[6:]}")
        if not bool(torch.isfinite(reference).all()):
            raise ValueError("reference holds non-finite values (NaN or ±inf)")
        return reference
    if isinstance(reference, int) or isinstance(reference, bool):  # a token id (a bool is refused)
        return check_index(reference, "reference", None if model is None else vocabulary_size(model))
    raise TypeError(f"reference must be one of {REFERENCES}, a token id or a tensor, got {type(reference).__name__}")


def one_input(inputs: Any) -> Tensor:
    """One input as a batch of one (token ids ``(1, n)``, or a speech model's features)."""
    source = inputs if isinstance(inputs, Tensor) else torch.as_tensor(inputs, device="cpu")
    source = source[None] if source.dim() == 1 or (source.is_floating_point() and source.dim() == 2) else source
    if source.shape[0] != 1:
        raise ValueError("inputs: explain one input at a time (a batch of 1)")
    return source


def captum_return(attributions: Any, bias: Tensor | None, delta: Tensor | None) -> Any:
    """Captum's return: the attributions, then the bias and the delta where asked."""
    out = [attributions] + [t for t in (bias, delta) if t is not None]
    return out[0] if len(out) == 1 else tuple(out)


def route_of(route: str | None) -> str | None:
    """A component table's route: ``"auto"``, its name for the cheaper one before 0.4, is
    ``None`` now (a ``DeprecationWarning``)."""
    if route == "auto":
        warnings.warn("route='auto' is now route=None (the cheaper route); 'auto' stops working in 0.5",
                      DeprecationWarning, stacklevel=5)
        return None
    return route
