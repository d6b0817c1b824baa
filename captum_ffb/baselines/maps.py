"""One call for every baseline's maps of one layer, by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from captum_ffb.baselines.attention import attention_norm_maps, attention_weight_maps
from captum_ffb.baselines.captured import CapturedLayer, capture_layer
from captum_ffb.baselines.gradients import gradient_maps
from captum_ffb.baselines.shapley import shapley_maps

#: Every baseline by name, with a one-line description.
BASELINES: dict[str, str] = {
    "attention_mean": "attention weights, mean over heads",
    "attention_sum": "attention weights, sum over heads",
    "norm": "attention norms ‖Σ_h α f(x)‖ (Kobayashi et al. 2020; b_V owed to no token)",
    "norm_bias": "attention norms with b_V in f(x), as in Kobayashi et al. 2020",
    "saliency": "Captum Saliency: ‖∂y_i/∂x_j‖_F",
    "ixg": "Captum InputXGradient: ‖Σ_e x_j[e] ∂y_i/∂x_j[e]‖",
    "ig": "Captum IntegratedGradients, zero baseline: ‖Σ_e IG_i[j, e]‖",
    "shap_exact": "exact Shapley values over tokens (shap Exact; absent token = zero vector)",
    "shap_permutation": "Shapley values by permutation sampling (shap Permutation)",
    "shap_sampling": "Shapley values by IME sampling (shap Sampling)",
    "shap_kernel": "Kernel SHAP (shap KernelExplainer)",
    "captum_shapley": "Captum ShapleyValueSampling",
}

#: Short names that stand for several baselines or pick one by input size.
ALIASES: dict[str, tuple[str, ...]] = {
    "attention": ("attention_mean", "attention_sum"),
    "gradients": ("saliency", "ixg", "ig"),
    "shap": ("shap",),  # exact up to ``exact_up_to`` tokens, permutation sampling beyond
    # every baseline; shap_exact only up to ``exact_up_to`` tokens (it runs 2^n coalitions)
    "all": tuple(BASELINES),
}

#: Most tokens for which the alias ``"shap"`` means exact Shapley values.
EXACT_UP_TO = 12


def resolve_baselines(names: str | Sequence[str], n_tokens: int, exact_up_to: int = EXACT_UP_TO) -> list[str]:
    r"""Expand aliases (``"attention"``, ``"shap"``, ``"all"``, …) and check the names; keeps
    order. ``"all"`` is every baseline of ``BASELINES``, but leaves ``shap_exact`` out
    beyond ``exact_up_to`` tokens (``shap_permutation`` samples the same values)."""
    if isinstance(names, str):
        names = [part.strip() for part in names.split(",") if part.strip()]
    out: list[str] = []
    for name in names:
        expanded = ALIASES.get(name, (name,))
        for item in expanded:
            if name == "all" and item == "shap_exact" and n_tokens > exact_up_to:
                continue
            if item == "shap":
                item = "shap_exact" if n_tokens <= exact_up_to else "shap_permutation"
            if item not in BASELINES:
                known = ", ".join([*BASELINES, *ALIASES])
                raise ValueError(f"unknown baseline {name!r}; choose from {known}")
            if item not in out:
                out.append(item)
    if not out:
        raise ValueError("no baseline was named")
    return out


def _runner(name: str, options: dict[str, Any]) -> Callable[[CapturedLayer], Tensor]:
    if name.startswith("attention_"):
        return lambda ctx: attention_weight_maps(ctx, name.split("_")[1])
    if name in ("norm", "norm_bias"):
        return lambda ctx: attention_norm_maps(ctx, include_value_bias=name == "norm_bias")
    if name in ("saliency", "ixg", "ig"):
        return lambda ctx: gradient_maps(
            ctx, name, options["route"], options["n_steps"], options["integration"],
            options["batch_size"], options["show_progress"],
        )
    method = {"captum_shapley": "captum"}.get(name, name.removeprefix("shap_"))
    return lambda ctx: shapley_maps(
        ctx, method, options["n_samples"], options["seed"], options["shapley_batch_size"],
        show_progress=options["show_progress"],
    )


def baseline_maps(
    model: nn.Module | CapturedLayer,
    layer: nn.Module | None = None,
    inputs: Tensor | tuple[Tensor, ...] | None = None,
    methods: str | Sequence[str] = ("attention", "norm", "ig", "shap"),
    forward_kwargs: dict[str, Any] | None = None,
    route: str = "forward",
    n_steps: int = 50,
    integration: str = "gausslegendre",
    n_samples: int | None = None,
    seed: int | None = 0,
    batch_size: int = 64,
    shapley_batch_size: int = 256,
    exact_up_to: int = EXACT_UP_TO,
    show_progress: bool = False,
) -> dict[str, Tensor]:
    r"""Token-to-token maps ``(B, n, n)`` of one layer from each named baseline.

    Args:
        model (nn.Module or CapturedLayer): the model, or a context already captured with
                    :func:`~captum_ffb.baselines.capture_layer` (then ``layer`` and
                    ``inputs`` are not needed).
        layer (nn.Module, optional): the Transformer block.
        inputs (Tensor, optional): token ids ``(B, n)``.
        methods (str or list[str]): names from ``BASELINES`` or ``ALIASES``
                    (a comma-separated string works too).
        forward_kwargs (dict, optional): e.g. ``{"attention_mask": mask}``.
        route (str): gradient route, ``"forward"`` or ``"captum"``.
        n_steps (int): IG steps.
        integration (str): IG integration method.
        n_samples (int, optional): budget of the sampling Shapley methods.
        seed (int, optional): seed of the sampling Shapley methods.
        batch_size (int): examples per forward pass of the gradient methods.
        shapley_batch_size (int): coalitions per forward pass of the Shapley methods.
        exact_up_to (int): the alias ``"shap"`` is exact up to this many tokens.
        show_progress (bool): show progress bars.

    Returns:
        dict method name → maps, in the order asked (aliases expanded).
    """
    if isinstance(model, CapturedLayer):
        context = model
    else:
        if layer is None or inputs is None:
            raise ValueError("give the layer and the inputs, or a captured CapturedLayer")
        context = capture_layer(model, layer, inputs, forward_kwargs=forward_kwargs)
    longest = max(len(context.real_tokens(b)) for b in range(context.batch_size))
    names = resolve_baselines(methods, longest, exact_up_to)
    options = dict(
        route=route, n_steps=n_steps, integration=integration, n_samples=n_samples, seed=seed,
        batch_size=batch_size, shapley_batch_size=shapley_batch_size, show_progress=show_progress,
    )
    return {name: _runner(name, options)(context) for name in names}
