"""Element-wise coefficient work as one kernel where the device pays for many.

The rules' frozen coefficients (an activation's mean value and slopes, a norm's scale) are
chains of element-wise operations over ``n × d_ff`` tensors. Run eagerly each operation is
its own pass over memory: on a CPU the matrix products hide them, on a GPU they dominate a
whole-model attribution. :func:`fused` compiles such a function with ``torch.compile`` (one
generated kernel per chain; float64 intermediates stay in registers) and falls back to the
eager function, with one warning, where compilation fails. The numbers are the eager ones to
rounding: compiling reorders nothing a rule depends on.

When to compile is read from the environment variable ``CAPTUM_FFB_COMPILE``:
``"auto"`` (default: on CUDA tensors only, where it pays; a CPU compilation costs seconds up
front and saves little), ``"always"`` or ``"never"``.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

#: The environment variable that chooses when coefficient functions are compiled.
COMPILE_VARIABLE = "CAPTUM_FFB_COMPILE"
#: Its values.
COMPILE_MODES = ("auto", "always", "never")

def compile_mode() -> str:
    """The compile mode from ``CAPTUM_FFB_COMPILE`` (``"auto"`` when unset).

    Raises:
        ValueError: for a value other than ``auto``, ``always`` or ``never``.
    """
    mode = os.environ.get(COMPILE_VARIABLE, "auto").strip().lower() or "auto"
    if mode not in COMPILE_MODES:
        raise ValueError(f"{COMPILE_VARIABLE} must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    return mode


def _wants_compile(device: torch.device) -> bool:
    mode = compile_mode()
    return mode == "always" or (mode == "auto" and device.type == "cuda")


def fused(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run as one compiled kernel where :func:`compile_mode` asks for it, else eagerly.

    ``fn`` takes tensors first (the first one's device decides) and computes no gradient.
    The compiled function is built on first use and kept; if building or running it fails,
    the eager function is used from then on and one warning says why.
    """
    state: dict[str, Any] = {"compiled": None, "failed": False}

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        first = next((a for a in args if isinstance(a, Tensor)), None)
        with torch.no_grad():
            if first is None or state["failed"] or not _wants_compile(first.device):
                return fn(*args, **kwargs)
            try:
                if state["compiled"] is None:
                    state["compiled"] = torch.compile(fn, dynamic=True)
                return state["compiled"](*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - any compiler failure falls back to eager
                state["failed"] = True
                warnings.warn(f"captum_ffb: {fn.__qualname__} runs eagerly ({type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''}); set "
                              f"{COMPILE_VARIABLE}=never to skip compiling", RuntimeWarning, stacklevel=2)
                return fn(*args, **kwargs)

    call.eager = fn  # type: ignore[attr-defined]
    return call
