"""Every entry point that runs a model, against each other in threads: the results of sequential
calls, exactly. Each runs the model through the pass runner (``engine/passes.py``), which holds
the model's lock for every pass and scopes what it installs to its own pass, so the lock cannot
be skipped (``tests/engine/test_passes.py`` holds every module of the package to the runner);
and a plain forward of the user's own, in a thread that holds no lock, runs the model untouched
meanwhile (or fails loudly: never a wrong number)."""

from __future__ import annotations

import random
import threading

import torch

from captum_ffb import (
    LayerNormDecomposition,
    LLMNormAttribution,
    NormDecomposition,
    activation_patching,
)
from captum_ffb.explained.readouts import NextToken
from captum_ffb.long_context.attribution import context_attribution
from tests.models import load_saved, save_tiny_lm


def _flat(value) -> list[torch.Tensor]:
    """The tensors and numbers of a result, in a fixed order (to compare two results)."""
    if isinstance(value, torch.Tensor):
        return [value.detach().cpu()]
    if isinstance(value, (int, float)):
        return [torch.tensor(float(value))]
    if isinstance(value, dict):
        return [t for key in sorted(value, key=str) for t in _flat(value[key])]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flat(item)]
    return []


def _entry_points(tmp_path):
    loaded = load_saved(save_tiny_lm(tmp_path / "lm"))
    model, tokenizer = loaded.model, loaded.tokenizer
    nd = NormDecomposition(loaded)
    ids = tokenizer("the cat sat on the mat", return_tensors="pt").input_ids
    corrupted = ids.flip(1)
    lnd = LayerNormDecomposition(model, model.model.layers[1])
    llm = LLMNormAttribution(nd, tokenizer)

    def graph():
        found = nd.attribute_graph(ids, 5, prune=False, corrupted_inputs=corrupted)
        return [found.data.values, found.data.weights, found.patch_estimates["default"],
                found.score_split(1, 0, ids.shape[1] - 1, 1)]

    calls = {
        "attribute": lambda: nd.attribute(ids, target=5, return_bias=True),
        "attribute (forward route)": lambda: nd.attribute(ids, target=5, route="forward"),
        "attribute (the prediction)": lambda: nd.attribute(ids),
        "attribute (recomputed blocks)": lambda: NormDecomposition(model, memory_budget=1).attribute(ids, target=5),
        "components": lambda: nd.attribute_components(ids, target=5, granularity="head").contributions,
        "graph, patching estimates, score split": graph,
        "query-key pairs": lambda: nd.attribute_graph(ids, 5).query_key_pairs(heads=2),
        "explain": lambda: nd.explain(ids, [NextToken(5), NextToken()]).contributions,
        "explain_generation": lambda: nd.explain_generation(ids, max_new_tokens=2).contributions,
        "attribute_steps": lambda: nd.attribute_steps(ids, target=[5, 6], target_position=[3, 4]),
        "maps": lambda: nd.maps(ids),
        "layer maps": lambda: lnd.attribute(ids, scope=list(lnd.scopes)),
        "LLM attribution": lambda: llm.attribute(
            __import__("captum.attr", fromlist=["TextTokenInput"]).TextTokenInput("the cat sat", tokenizer),
            target=" on").seq_attr,
        "activation patching": lambda: activation_patching(nd, ids, corrupted, 5, show_progress=False).effects,
        "context attribution": lambda: context_attribution(nd, tokenizer, "the cat.\n\nthe mat.", "where?").contributions,
    }
    return model, ids, calls


def test_every_entry_point_against_each_other(tmp_path):
    model, _, calls = _entry_points(tmp_path)
    expected = {name: _flat(call()) for name, call in calls.items()}
    order = [name for name in calls for _ in range(2)]
    random.Random(0).shuffle(order)
    found: list[tuple[str, object]] = []
    start = threading.Barrier(4)

    def worker(names: list[str]) -> None:
        start.wait()
        for name in names:
            try:
                found.append((name, _flat(calls[name]())))
            except Exception as error:  # noqa: BLE001 - reported below
                found.append((name, error))

    threads = [threading.Thread(target=worker, args=(order[k::4],)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    errors = [(name, result) for name, result in found if isinstance(result, Exception)]
    assert not errors, errors[:3]
    assert len(found) == len(order)
    for name, result in found:
        assert len(result) == len(expected[name]), name
        for got, want in zip(result, expected[name]):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
    assert not [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]


def test_a_plain_forward_without_the_lock_is_never_silently_wrong(tmp_path):
    """A thread of the user's own runs the model with no lock while attributions install
    their hooks and attention implementations: it sees the model untouched (or fails loudly),
    and the attributions give the sequential results."""
    model, ids, calls = _entry_points(tmp_path)
    with torch.no_grad():
        logits = model(ids).logits
    expected = _flat(calls["graph, patching estimates, score split"]())
    expected_attribution = _flat(calls["attribute"]())
    stop = threading.Event()
    plain: list[object] = []

    def user() -> None:
        while not stop.is_set():
            try:
                with torch.no_grad():
                    plain.append(model(ids).logits)
            except RuntimeError as error:  # a hook added while the forward iterates: loud, not wrong
                plain.append(error)

    thread = threading.Thread(target=user)
    thread.start()
    try:
        for _ in range(3):
            for got, want in zip(_flat(calls["graph, patching estimates, score split"]()), expected):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
            for got, want in zip(_flat(calls["attribute"]()), expected_attribution):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
    finally:
        stop.set()
        thread.join()
    numbers = [p for p in plain if isinstance(p, torch.Tensor)]
    assert numbers
    for found in numbers:  # the model's own attention, or eager in our pass's place: rounding only
        torch.testing.assert_close(found, logits, rtol=1e-5, atol=1e-5)
