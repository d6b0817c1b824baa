r"""Token attribution methods side by side, each ``(task, batch, target) -> (B, n)``; ``target``
is what each row explains, as the task's ``decomposition_target`` and ``target_score`` read it:
a class per row, or ``(B, 2)`` good and bad token ids (an evidence run's contrasts).

Every method explains the same scalar: the logit of the class the model predicts (see
:mod:`~captum_ffb.evaluation.tasks`). Signed methods keep their sign (the protocols rank by
value, most relevant = largest); attention-style methods are non-negative.

* ``decomposition``: :class:`~captum_ffb.attr.NormDecomposition`'s default, backward route;
  ``decomposition_no_ff`` with the "FF owed to no token" rules; ``decomposition_linearised``
  with the linearised activation rules (gradient × input inside the FF, not complete).
* ``attention_last`` / ``attention_mean``: the head-averaged attention of the read-out row
  (the last real token for causal LMs, [CLS] for classifiers, the mean over real rows for
  the mean-pooled MiniLM head) in the last layer / averaged over layers.
* ``rollout``: attention rollout (Abnar & Zuidema 2020): ``0.5·A + 0.5·I`` per layer,
  head-averaged, multiplied through the layers. ``norm_rollout``: the same product of the
  layer maps ``‖F_i(x_j)‖`` of the whole block, each row normalised to sum to one.
* Captum on the input embeddings (summed over the hidden dimension, except ``saliency``: the
  gradient's L2 norm): ``saliency``, ``input_x_gradient``, ``integrated_gradients`` (zero
  baseline; its steps batched so that one pass fits ``memory_budget``, the decomposition's
  default of 1 GiB, or holds ``internal_batch_size`` rows), ``feature_ablation``, ``shapley_value_sampling``, ``kernel_shap``, ``lime`` (a
  token removed = its embedding set to zero).
* ``gim``: GIM (Edin et al. 2025, arXiv:2505.17630): the gradient with its three backward
  changes (norms' statistics detached, the softmax's backward at ``temperature`` 2, queries',
  keys' and values' gradients scaled by ¼, ¼ and ½; :mod:`captum_ffb.patching.estimators.gim`'s
  rules, one backward pass) times the first block's input less that of the baseline token
  (a space, else padding, else unknown, as its package chooses) at each position, summed over
  the hidden dimension.
* ``attnlrp``: the real ``lxt`` package in its own environment (Llama family), precomputed by
  the caller and passed in through ``precomputed``.
* ``random``: uniform noise seeded by the example's index.
* ``recency``, ``previous_token``, ``first_token``: position-only controls (no model): the
  latest token first; only the token before the prediction; only the first token.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from captum_ffb.attr import DEFAULT_MEMORY_BUDGET
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.positions import position_ids, real_positions
from captum_ffb.evaluation.tasks import Batch, EvaluationTask

MethodFn = Callable[[EvaluationTask, Batch, Tensor, dict[str, Any]], Tensor]


@dataclass(frozen=True)
class MethodInfo:
    """A method: its function, every option it takes with its default (the only keys
    ``--option`` accepts), and whether it needs the ``lxt`` peer."""

    fn: MethodFn
    options: dict[str, Any] = field(default_factory=dict)
    peer: bool = False
    description: str = ""


def _decomposition(rules: Callable[..., dict[str, Any]] | None) -> MethodFn:
    """A :class:`~captum_ffb.attr.NormDecomposition` method; ``rules(**settings)`` gives the
    rules by role, from the method's options other than ``reference`` (the players' reference
    input, see :meth:`~captum_ffb.attr.NormDecomposition.attribute`)."""
    settings = () if rules is None else tuple(inspect.signature(rules).parameters)

    def run(task: EvaluationTask, batch: Batch, target: Tensor, options: dict[str, Any]) -> Tensor:
        nd_target, sign = task.decomposition_target(target)
        chosen = None
        if rules is not None:  # only the roles this family's chain has
            roles = task.nd.chain.roles(task.nd.spec)
            given = {k: options[k] for k in settings if k in options}
            if "model" in settings:  # rule sets that depend on the family
                given["model"] = task.model
            made = rules(**given)
            chosen = {role: rule for role, rule in made.items() if role in roles}
        with torch.enable_grad():
            c = task.nd.attribute(batch.input_ids, target=nd_target,
                                  forward_kwargs={"attention_mask": batch.attention_mask},
                                  rules=chosen, reference=options.get("reference", "zero"))
        return c.detach() * sign.to(c.device).unsqueeze(1)
    return run


def _frozen_attention_rules() -> dict[str, Any]:
    from captum_ffb.rules import Attention

    return {"attention": Attention()}


def _ig_attention_rules(n_steps: int = 32, exact: bool = False) -> dict[str, Any]:
    from captum_ffb.rules import IGAttention

    return {"attention": IGAttention(n_steps=int(n_steps), exact=bool(exact))}


def _lrp_attention_rules() -> dict[str, Any]:
    from captum_ffb.rules import AttnLRPAttention

    return {"attention": AttnLRPAttention()}


def _complete_lrp_attention_rules() -> dict[str, Any]:
    from captum_ffb.rules import CompleteAttnLRPAttention

    return {"attention": CompleteAttnLRPAttention()}


def _complete_attnlrp_rule_set(model: Any = None) -> dict[str, Any]:
    from captum_ffb.rules import CompleteAttnLRPAttention, attnlrp_rules

    return {**attnlrp_rules(model), "attention": CompleteAttnLRPAttention()}


def _attnlrp_rule_set(model: Any = None) -> dict[str, Any]:
    from captum_ffb.rules import attnlrp_rules

    return attnlrp_rules(model)


def _no_ff_rules() -> dict[str, Any]:
    from captum_ffb.rules import NoTokenActivation, NoTokenGatedActivation

    return {"activation": NoTokenActivation(), "gated_activation": NoTokenGatedActivation()}


def _linearised_rules() -> dict[str, Any]:
    from captum_ffb.rules import LinearisedActivation, LinearisedGatedActivation

    return {"activation": LinearisedActivation(), "gated_activation": LinearisedGatedActivation()}


def _readout(maps: Tensor, task: EvaluationTask, mask: Tensor) -> Tensor:
    """The read-out row of ``(B, n, n)`` maps."""
    real = mask.to(maps.dtype)
    if task.readout.query_row == "mean":
        return (maps * real.unsqueeze(-1)).sum(1) / real.sum(1, keepdim=True)
    row = real_positions(mask, task.readout.query_row)
    return maps[torch.arange(maps.shape[0], device=row.device), row]


def _attentions(task: EvaluationTask, batch: Batch) -> list[Tensor]:
    """Head-averaged attention probabilities of every layer, from an eager forward pass."""
    model = task.model
    kwargs: dict[str, Any] = {"attention_mask": batch.attention_mask,
                              "input_ids": batch.input_ids, "output_attentions": True}
    if task.causal:
        kwargs["position_ids"] = position_ids(batch.attention_mask)
        kwargs["logits_to_keep"] = 1
    with ModelPass(model) as run:
        run.attention("eager")  # the probabilities are returned by the eager implementation
        out = run.run(**kwargs)
    if not out.attentions or out.attentions[0] is None:
        raise RuntimeError(f"{type(model).__name__} returned no attention probabilities")
    real = batch.attention_mask.unsqueeze(1).to(out.attentions[0].dtype)
    return [a.float().mean(1) * real for a in out.attentions]


def _attention_last(task, batch, target, options):
    return _readout(_attentions(task, batch)[-1], task, batch.attention_mask)


def _attention_mean(task, batch, target, options):
    maps = torch.stack(_attentions(task, batch)).mean(0)
    return _readout(maps, task, batch.attention_mask)


def _roll(maps: list[Tensor], mask: Tensor) -> Tensor:
    n = mask.shape[1]
    eye = torch.eye(n, device=mask.device) * mask.unsqueeze(-1).float()
    out = eye.expand(mask.shape[0], n, n)
    for m in maps:
        m = m / m.sum(-1, keepdim=True).clamp_min(1e-12)
        out = m @ out
    return out


def _rollout(task, batch, target, options):
    mask = batch.attention_mask
    eye = torch.eye(mask.shape[1], device=mask.device) * mask.unsqueeze(-1).float()
    maps = [0.5 * a + 0.5 * eye for a in _attentions(task, batch)]
    return _readout(_roll(maps, mask), task, mask)


def _norm_rollout(task, batch, target, options):
    from captum_ffb.attr import LayerNormDecomposition

    lnd = LayerNormDecomposition(task.model, list(task.loaded.blocks))
    scope = lnd.chain.scopes[-1]
    maps = []
    with torch.no_grad():
        for _, result in lnd.iter_layers(batch.input_ids, scope=scope, maps=True, decompositions=False,
                                         forward_kwargs={"attention_mask": batch.attention_mask}):
            maps.append(result.maps[scope].float())
    return _readout(_roll(maps, batch.attention_mask), task, batch.attention_mask)


def _embeds(task: EvaluationTask, batch: Batch) -> Tensor:
    with torch.no_grad():
        return task.model.get_input_embeddings()(batch.input_ids).detach()


def _captum_forward(task: EvaluationTask) -> Callable[..., Tensor]:
    def forward(inputs_embeds: Tensor, attention_mask: Tensor, target: Tensor) -> Tensor:
        repeat = inputs_embeds.shape[0] // attention_mask.shape[0]
        if repeat > 1:  # Captum expands the batch (integration steps, perturbations)
            attention_mask = attention_mask.repeat(repeat, 1)
            target = target.repeat(repeat, *(1,) * (target.dim() - 1))  # (B,) classes or (B, k) rows
        return task.target_score(inputs_embeds, attention_mask, target)
    return forward


def _gradient_method(name: str) -> MethodFn:
    def run(task, batch, target, options):
        import captum.attr as ca

        x = _embeds(task, batch)
        if name != "integrated_gradients":  # Captum would warn that it had to require them
            x.requires_grad_()
        args = (batch.attention_mask, target)
        forward = _captum_forward(task)
        with torch.enable_grad():
            if name == "saliency":
                grads = ca.Saliency(forward).attribute(x, additional_forward_args=args, abs=False)
                return grads.detach().norm(dim=-1)
            if name == "input_x_gradient":
                attr = ca.InputXGradient(forward).attribute(x, additional_forward_args=args)
            else:
                attr = _integrated_gradients(task, forward, x, batch, target, options)
        return attr.detach().sum(-1)
    return run


def ig_rows(model: torch.nn.Module, n_tokens: int, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> int:
    r"""How many rows (one example at one integration step) of Integrated Gradients fit
    ``memory_budget`` bytes: an estimate of what one forward and backward pass over
    ``n_tokens`` tokens keeps per row (float32 activations of every layer, the attention
    probabilities, the output logits).

    Args:
        model (nn.Module): a Hugging Face model (its ``config`` is read).
        n_tokens (int): the padded length of the batch.
        memory_budget (int): bytes the rows of one pass may take.
    """
    config = model.config
    hidden = int(getattr(config, "hidden_size", 0) or 0) or 768
    inner = next((int(v) for v in (getattr(config, key, None) for key in
                                   ("intermediate_size", "n_inner", "hidden_dim", "ffn_dim"))
                  if isinstance(v, int) and v > 0), 4 * hidden)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0) or 12
    heads = int(getattr(config, "num_attention_heads", 0) or 0) or 12
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    per_token = 16 * hidden + 4 * inner + 2 * heads * n_tokens  # floats kept per token and layer
    per_row = 4 * (n_tokens * layers * per_token + vocab)
    return max(1, int(memory_budget) // per_row)


def _integrated_gradients(task: EvaluationTask, forward: Callable[..., Tensor], x: Tensor, batch: Batch,
                          target: Tensor, options: dict[str, Any]) -> Tensor:
    """Captum's IntegratedGradients with its steps batched so that one pass holds at most
    ``internal_batch_size`` rows (default: as many as fit ``memory_budget``, see
    :func:`ig_rows`); a batch with more examples than that runs in groups of examples."""
    import captum.attr as ca

    rows = options.get("internal_batch_size")
    if rows is None:
        rows = ig_rows(task.model, x.shape[1], int(options.get("memory_budget", DEFAULT_MEMORY_BUDGET)))
    rows = int(rows)
    if rows < 1:
        raise ValueError(f"integrated_gradients.internal_batch_size must be at least 1, got {rows}")
    parts = []
    for start in range(0, x.shape[0], rows):  # Captum takes at least one step of every example
        group = slice(start, start + rows)
        parts.append(ca.IntegratedGradients(forward).attribute(
            x[group], baselines=torch.zeros_like(x[group]),
            additional_forward_args=(batch.attention_mask[group], target[group]),
            n_steps=int(options.get("n_steps", 50)), internal_batch_size=rows))
    return torch.cat(parts)


def baseline_token_id(tokenizer: Any) -> int:
    """GIM's default baseline token (its package's choice): the first id of a space
    (``tokenizer.encode(" ", add_special_tokens=False)``), else the padding id, else the
    unknown token's; a one-line error where the tokenizer has none of them."""
    encode = getattr(tokenizer, "encode", None)
    if encode is not None:
        try:
            ids = encode(" ", add_special_tokens=False)
        except (TypeError, ValueError):
            ids = []
        if len(ids):
            return int(ids[0])
    for name in ("pad_token_id", "unk_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ValueError("gim needs a baseline token: the tokenizer encodes no space and has no padding "
                     "or unknown token")


def _gim(task: EvaluationTask, batch: Batch, target: Tensor, options: dict[str, Any]) -> Tensor:
    """GIM (Edin et al. 2025, arXiv:2505.17630): the gradient of the explained value with GIM's
    backward changes (:func:`~captum_ffb.patching.estimators.gim.gim_rules`), one backward pass
    of the batch, times each position's first-block input less that of the baseline token
    (:func:`baseline_token_id`) there, summed over the hidden dimension."""
    from captum_ffb.patching.estimators.gim import gim_rules

    nd_target, sign = task.decomposition_target(target)
    rules = gim_rules(task.nd.engine, float(options.get("temperature", 2.0)))
    with torch.enable_grad():
        c = task.nd.attribute(batch.input_ids, target=nd_target,
                              forward_kwargs={"attention_mask": batch.attention_mask},
                              rules=rules, reference=baseline_token_id(task.tokenizer))
    return c.detach() * sign.to(c.device).unsqueeze(1)


def _perturbation_method(name: str) -> MethodFn:
    def run(task, batch, target, options):
        import captum.attr as ca

        x = _embeds(task, batch)
        forward = _captum_forward(task)
        b, n, d = x.shape
        out = torch.zeros(b, n, device=x.device)
        cls = {"feature_ablation": ca.FeatureAblation, "shapley_value_sampling": ca.ShapleyValueSampling,
               "kernel_shap": ca.KernelShap, "lime": ca.Lime}[name]
        with torch.no_grad():
            for row in range(b):  # KernelShap and Lime take one example at a time
                real = batch.attention_mask[row].bool()
                xr = x[row:row + 1, real]
                groups = torch.arange(xr.shape[1]).view(1, -1, 1).expand_as(xr).contiguous()
                kwargs: dict[str, Any] = {"baselines": 0.0, "feature_mask": groups,
                                          "additional_forward_args": (batch.attention_mask[row:row + 1, real],
                                                                      target[row:row + 1])}
                kwargs["perturbations_per_eval"] = int(options["per_eval"])
                if name != "feature_ablation":
                    kwargs["n_samples"] = int(options["n_samples"])
                    if name != "shapley_value_sampling":
                        kwargs["show_progress"] = False
                state = torch.random.get_rng_state()
                torch.manual_seed(int(batch.index[row]))  # the same samples in any batching
                try:
                    attr = cls(forward).attribute(xr, **kwargs)
                finally:
                    torch.random.set_rng_state(state)
                out[row, real] = attr[0, :, 0].float()
        return out
    return run


def _attnlrp(task, batch, target, options):
    relevances = options.get("precomputed")
    if relevances is None:
        raise RuntimeError("attnlrp needs its relevances computed first (evaluate does this)")
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for row, index in enumerate(batch.index.tolist()):
        values = torch.as_tensor(relevances[index], dtype=torch.float32, device=out.device)
        real = batch.attention_mask[row].bool()
        if int(real.sum()) != values.numel():
            raise RuntimeError(f"attnlrp relevance of example {index} has {values.numel()} positions, "
                               f"the example {int(real.sum())}")
        out[row, real] = values
    return out


def _position(kind: str) -> MethodFn:
    """A position-only control (no model): ``recency`` scores each real token by its position
    (the latest highest), ``previous_token`` marks the last real token, ``first_token`` the
    first one; a method that does no better than these has learnt nothing but position."""

    def run(task, batch, target, options):
        mask = batch.attention_mask
        order = (mask.cumsum(1) - 1).float() * mask  # 0 … count − 1 over the real tokens
        last = order.max(1, keepdim=True).values
        if kind == "recency":
            out = order + 1
        elif kind == "previous_token":
            out = (order == last).float()
        else:
            out = (order == 0).float()
        return out * mask
    return run


def _random(task, batch, target, options):
    out = torch.zeros(batch.input_ids.shape)
    seed = int(options.get("seed", 0))
    for row, index in enumerate(batch.index.tolist()):
        g = torch.Generator().manual_seed(seed * 1_000_003 + index)
        out[row] = torch.rand(batch.input_ids.shape[1], generator=g)
    return out.to(batch.attention_mask.device) * batch.attention_mask


#: Every method, in the order of the tables.
METHODS: dict[str, MethodInfo] = {
    "decomposition": MethodInfo(_decomposition(None), {"reference": "centered"},
                                description="NormDecomposition, its default (the paper's rules, players "
                                "centred on the input's mean token)"),
    "decomposition_frozen": MethodInfo(_decomposition(_frozen_attention_rules), {"reference": "zero"},
                                       description="NormDecomposition, the paper's frozen attention"),
    "decomposition_ig_attention": MethodInfo(_decomposition(_ig_attention_rules),
                                             {"n_steps": 32, "exact": False, "reference": "zero"},
                                             description="NormDecomposition, IGAttention"),
    "decomposition_lrp_attention": MethodInfo(_decomposition(_lrp_attention_rules),
                                              {"reference": "zero"},
                                              description="NormDecomposition, AttnLRPAttention"),
    "decomposition_complete_lrp_attention": MethodInfo(
        _decomposition(_complete_lrp_attention_rules), {"reference": "zero"},
        description="NormDecomposition, CompleteAttnLRPAttention (AttnLRP's remainder to the tokens)"),
    "decomposition_complete_attnlrp_rules": MethodInfo(
        _decomposition(_complete_attnlrp_rule_set), {"reference": "zero"},
        description="NormDecomposition, AttnLRP's rules for every role with CompleteAttnLRPAttention"),
    "decomposition_attnlrp_rules": MethodInfo(_decomposition(_attnlrp_rule_set), {"reference": "zero"},
                                              description="NormDecomposition, AttnLRP's rules for "
                                              "every role (= lxt)"),
    "decomposition_frozen_mean": MethodInfo(_decomposition(_frozen_attention_rules),
                                            {"reference": "mean"},
                                            description="decomposition_frozen, players from the "
                                            "mean input vector"),
    "decomposition_ig_attention_mean": MethodInfo(_decomposition(_ig_attention_rules),
                                                  {"n_steps": 32, "exact": False, "reference": "mean"},
                                                  description="decomposition_ig_attention, players "
                                                  "from the mean input vector"),
    "decomposition_lrp_attention_mean": MethodInfo(_decomposition(_lrp_attention_rules),
                                                   {"reference": "mean"},
                                                   description="decomposition_lrp_attention, "
                                                   "players from the mean input vector"),
    "decomposition_complete_lrp_attention_mean": MethodInfo(
        _decomposition(_complete_lrp_attention_rules), {"reference": "mean"},
        description="decomposition_complete_lrp_attention, players from the mean input vector"),
    "decomposition_lrp_attention_centered": MethodInfo(
        _decomposition(_lrp_attention_rules), {"reference": "centered"},
        description="decomposition_lrp_attention, players centred on the input's mean token"),
    "decomposition_complete_lrp_attention_centered": MethodInfo(
        _decomposition(_complete_lrp_attention_rules), {"reference": "centered"},
        description="decomposition_complete_lrp_attention, players centred on the input's mean token"),
    "decomposition_ig_attention_centered": MethodInfo(
        _decomposition(_ig_attention_rules), {"n_steps": 4, "exact": True, "reference": "centered"},
        description="IGAttention(4, exact=True), players centred on the input's mean token"),
    "decomposition_no_ff": MethodInfo(_decomposition(_no_ff_rules),
                                      description="NormDecomposition, FF owed to no token"),
    "decomposition_linearised": MethodInfo(_decomposition(_linearised_rules),
                                           description="NormDecomposition, linearised activation"),
    "attention_last": MethodInfo(_attention_last, description="last layer's attention"),
    "attention_mean": MethodInfo(_attention_mean, description="attention averaged over layers"),
    "rollout": MethodInfo(_rollout, description="attention rollout"),
    "norm_rollout": MethodInfo(_norm_rollout, description="rollout of the layer maps ‖F_i(x_j)‖"),
    "saliency": MethodInfo(_gradient_method("saliency"), description="Captum Saliency (L2 norm)"),
    "input_x_gradient": MethodInfo(_gradient_method("input_x_gradient"), description="Captum InputXGradient"),
    "integrated_gradients": MethodInfo(_gradient_method("integrated_gradients"),
                                       {"n_steps": 50, "internal_batch_size": None,
                                        "memory_budget": DEFAULT_MEMORY_BUDGET},
                                       description="Captum IntegratedGradients, zero baseline"),
    "gim": MethodInfo(_gim, {"temperature": 2.0},
                      description="GIM's gradient × (input − space token's), its backward changes "
                      "as rules"),
    "feature_ablation": MethodInfo(_perturbation_method("feature_ablation"), {"per_eval": 32},
                                   description="Captum FeatureAblation (one token at a time)"),
    "shapley_value_sampling": MethodInfo(_perturbation_method("shapley_value_sampling"),
                                         {"n_samples": 10, "per_eval": 32},
                                         description="Captum ShapleyValueSampling"),
    "kernel_shap": MethodInfo(_perturbation_method("kernel_shap"), {"n_samples": 200, "per_eval": 32},
                              description="Captum KernelShap"),
    "lime": MethodInfo(_perturbation_method("lime"), {"n_samples": 200, "per_eval": 32},
                       description="Captum Lime"),
    "attnlrp": MethodInfo(_attnlrp, peer=True, description="AttnLRP (lxt)"),
    "random": MethodInfo(_random, description="uniform noise"),
    "recency": MethodInfo(_position("recency"), description="position only: the latest token first"),
    "previous_token": MethodInfo(_position("previous_token"),
                                 description="position only: the token before the prediction"),
    "first_token": MethodInfo(_position("first_token"),
                              description="position only: the first token (the attention sink)"),
}
#: The methods that look at positions only (controls for every next-token table).
POSITION_CONTROLS = ("recency", "previous_token", "first_token")


def resolve_names(names: str | Sequence[str], known: Sequence[str], what: str) -> list[str]:
    """Names from a comma list (``all`` = every one of ``known``), once each, in order; an
    unknown name is an error that lists the known ones."""
    items = [m.strip() for m in names.split(",")] if isinstance(names, str) else list(names)
    items = [m for m in items if m]
    if items == ["all"]:
        return list(known)
    unknown = [m for m in items if m not in known]
    if unknown or not items:
        raise ValueError(f"unknown {what} {unknown[0] if unknown else names!r}; choose from "
                         f"{', '.join(known)} (or all)")
    return list(dict.fromkeys(items))


def resolve_methods(names: str | Sequence[str]) -> list[str]:
    """Method names from a comma list (``all`` = every method)."""
    return resolve_names(names, list(METHODS), "method")


def check_option(method: str, key: str) -> None:
    """A one-line error unless ``method`` takes the option ``key`` (a key of its
    :attr:`MethodInfo.options`)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    accepted = sorted(METHODS[method].options)
    if key not in accepted:
        raise ValueError(f"{method} has no option {key!r}; "
                         + (f"it takes {', '.join(accepted)}" if accepted else "it takes none"))


#: How one method option is written on the command line (``captum-ffb evaluate --option``).
OPTION_SYNTAX = "METHOD.KEY=VALUE, e.g. integrated_gradients.n_steps=20"


def parse_option(item: str) -> tuple[str, str, Any]:
    """One ``METHOD.KEY=VALUE`` setting: ``"integrated_gradients.n_steps=20"`` →
    ``("integrated_gradients", "n_steps", 20)``.

    VALUE is read as JSON where it is JSON (numbers, ``true``, ``null``, quoted strings, lists),
    as the text itself otherwise (``reference=mean`` gives ``"mean"``). Only the grammar is
    checked here; :func:`check_option` checks the method and the key.

    Raises:
        ValueError: when the method, the key or the value is missing.
    """
    name, _, text = item.partition("=")
    method, _, key = name.partition(".")
    if not method or not key or not text:
        raise ValueError(f"write {OPTION_SYNTAX}")
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = text
    return method, key, value


def format_option(method: str, key: str, value: Any) -> str:
    """The ``METHOD.KEY=VALUE`` text that :func:`parse_option` reads back as ``value``."""
    if isinstance(value, str):
        try:
            plain = json.loads(value) == value  # "mean" stays mean; "20" must be quoted
        except ValueError:
            plain = True
        text = value if plain and value else json.dumps(value)
    else:
        text = json.dumps(value)
    return f"{method}.{key}={text}"


def option_items(options: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every setting of ``{method: {key: value}}`` as ``METHOD.KEY=VALUE`` (in order), the
    values of repeated ``--option`` arguments; :func:`parse_option` reads each back."""
    return [format_option(method, key, value)
            for method, settings in options.items() for key, value in settings.items()]
