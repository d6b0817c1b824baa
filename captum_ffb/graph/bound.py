"""Binding a graph to a model: the graph's record stays passive (data only); a bound graph
(:class:`~captum_ffb.graph.record.BoundGraph`) owns the model handles that compute score
splits and edge estimates. Binding a saved graph checks that the model is the one the graph
was built on (its family, the fingerprint of its weights, the rules, the explained value)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import torch
from torch import Tensor

from captum_ffb.engine import find_model
from captum_ffb.engine.fingerprint import fingerprint_difference, weights_fingerprint, weights_stamp
from captum_ffb.engine.head import HeadTarget
from captum_ffb.engine.locking import model_lock
from captum_ffb.engine.requests import check_call
from captum_ffb.engine.tape import graph_pass, players_of
from captum_ffb.engine.whole import WholeModel
from captum_ffb.explained.models import LoadedModel
from captum_ffb.graph.score_split import ScoreSplitter

__all__ = ["bound_engine", "bound_scorer", "origin_of", "plain", "rules_of", "unplain"]


def bound_engine(model: Any, rules: Mapping[str, Any] | None = None) -> tuple[WholeModel, dict[str, Any]]:
    """The whole-model engine of ``model`` (an ``nn.Module``, a ``LoadedModel``, a
    ``NormDecomposition``, a TransformerLens bridge or an nnsight model) and the rules by role
    (its defaults, then the attribution's, then ``rules``)."""
    if rules is not None and not isinstance(rules, Mapping):
        raise TypeError(f"rules must be a mapping role → rule, got {type(rules).__name__}")
    engine = getattr(model, "engine", None)
    if isinstance(engine, WholeModel):  # an attribution: its engine and its rules
        return engine, engine.rules({**model.rules, **(rules or {})})
    found = find_model(model.model if isinstance(model, LoadedModel) else model)
    if found is None:
        raise TypeError(f"bind needs the model (an nn.Module, a LoadedModel or an attribution), got "
                        f"{type(model).__name__}")
    if any(p.device.type == "meta" for p in found.parameters()):
        raise ValueError(f"{type(found).__name__}'s weights are on the meta device (not loaded): load them, then bind")
    engine = WholeModel(found)
    return engine, engine.rules(dict(rules or {}))


def plain(value: Any, arrays: dict[str, Tensor], key: str) -> Any:
    """``value`` as JSON, its tensors moved to ``arrays`` (``{"array": name}``); a
    ``TypeError`` for what neither holds."""
    if isinstance(value, Tensor):
        arrays[key] = value.detach().cpu()
        return {"array": key, "dtype": str(value.dtype).removeprefix("torch.")}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return {"list": [plain(v, arrays, f"{key}.{k}") for k, v in enumerate(value)]}
    raise TypeError(f"{type(value).__name__} is neither a tensor nor a plain value")


def unplain(value: Any, arrays: Mapping[str, Tensor], device: torch.device | None) -> Any:
    """A value written by :func:`plain` (checked when a file is read)."""
    if isinstance(value, dict) and "array" in value:
        tensor = arrays[value["array"]].to(getattr(torch, value["dtype"]))
        return tensor if device is None else tensor.to(device)
    if isinstance(value, dict):
        return [unplain(v, arrays, device) for v in value["list"]]
    return value


def rules_of(rules: Mapping[str, Any]) -> dict[str, str]:
    """The rules by role as their reprs (what a file keeps of them)."""
    return {role: repr(rule) for role, rule in sorted(rules.items())}


def origin_of(scorer: Any) -> dict[str, Any]:
    """What binding needs, from a score splitter (its model, input and rules): the input,
    reference and target as plain values and arrays, the model's family and class, the
    rules, and the weights' fingerprint (``None`` where the weights changed after the build)."""
    request = scorer.request
    arrays: dict[str, Tensor] = {}
    try:
        inputs = {"args": plain(list(request.args), arrays, "origin.args"),
                  "kwargs": {k: plain(v, arrays, f"origin.kwargs.{k}") for k, v in request.kwargs.items()},
                  "reference": plain(request.reference, arrays, "origin.reference")}
    except TypeError as error:
        return {"unbindable": f"its input holds what a file cannot ({error})"}
    target = {f.name: plain(getattr(request.target, f.name), arrays, f"origin.target.{f.name}")
              for f in fields(request.target)}
    unchanged = weights_stamp(scorer.model) == scorer.stamp
    return {"model_type": scorer.engine.model_type, "model_class": type(scorer.model).__name__,
            "fingerprint": [list(row) for row in weights_fingerprint(scorer.model)] if unchanged else None,
            "rules": rules_of(scorer.rules), **inputs, "target": target, "arrays": arrays}


def bound_scorer(graph: Any, engine: WholeModel, chosen: Mapping[str, Any]) -> ScoreSplitter:
    """Give ``graph`` (loaded, or built on another copy of the model) a score splitter bound to
    ``engine`` (a ``NormDecomposition``'s engine): refused (a ``ValueError``) unless
    its model is of the graph's family with the same weights and buffers
    (:mod:`~captum_ffb.engine.fingerprint`), the rules ``chosen`` (by role, the defaults filled
    in) are the graph's and the frozen pass gives the graph's value again. The recorded input
    is checked as a call's is (:func:`~captum_ffb.engine.requests.check_call`)."""
    origin = graph.origin
    if origin is None:
        raise ValueError("this graph records no input and no model to bind to (it was saved without its score "
                         "splitter): build it again with attribute_graph")
    if "unbindable" in origin:
        raise ValueError(f"this graph cannot be bound to a model: {origin['unbindable']}")
    if engine.model_type != origin["model_type"]:
        raise ValueError(f"this graph was built on a {origin['model_type']} model ({origin['model_class']}), not "
                         f"a {engine.model_type} one")
    if origin["fingerprint"] is None:
        raise ValueError("this graph's model changed after the graph was built and before it was saved: its "
                         "score splits cannot be bound; build the graph again")
    if origin["fingerprint"] == [["version 1"]]:
        raise ValueError("this graph file is of version 1, whose fingerprint of the weights cannot tell swapped or "
                         "NaN weights apart: build the graph again to bind it")
    difference = fingerprint_difference(origin["fingerprint"], weights_fingerprint(engine.model))
    if difference is not None:
        raise ValueError(f"the weights of this {type(engine.model).__name__} are not those this graph was built on "
                         f"({difference}): its score splits would describe another model; bind the model the "
                         "graph was built on, or build the graph again")
    if rules_of(chosen) != origin["rules"]:
        other = sorted(set(origin["rules"].items()) ^ set(rules_of(chosen).items()))
        raise ValueError(f"this graph was built with other rules ({', '.join(f'{r}: {v}' for r, v in other)}): "
                         "give bind(model, rules=...) the rules attribute_graph had")
    device = next(engine.model.parameters()).device
    arrays = origin["arrays"]
    args = tuple(unplain(origin["args"], arrays, device))
    kwargs = {k: unplain(v, arrays, device) for k, v in origin["kwargs"].items()}
    check_call(engine.model, args, kwargs)
    reference = unplain(origin["reference"], arrays, device)
    target = HeadTarget(**{k: unplain(v, arrays, device) for k, v in origin["target"].items()})
    request = engine.request(args, kwargs)
    request.reference, request.target = reference, target
    with model_lock(engine.model):
        tape = graph_pass(engine, request, target, chosen, graph.granularity)
        players = players_of(engine, request, tape)
    value = float(tape.value.detach().reshape(-1)[0])
    if abs(value - graph.value) > 1e-4 * max(1.0, abs(graph.value)):
        raise ValueError(f"the model gives the explained output {value:.6g}, the graph {graph.value:.6g}: it is "
                         "not the graph's model (or runs in another precision)")
    return ScoreSplitter(engine, request, chosen, graph.granularity, players)
