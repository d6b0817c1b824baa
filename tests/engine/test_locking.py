"""Concurrent calls give the results of sequential ones: one call at a time per model
(:func:`~captum_ffb.engine.locking.model_lock`), calls on different models side by side, and
the softmax read inside attention modules seen by its own thread only."""

from __future__ import annotations

import threading

import pytest
import torch

from captum_ffb import Direction, LayerNormDecomposition, NormDecomposition
from captum_ffb.engine.locking import model_lock
from captum_ffb.engine.passes import ModelPass
from tests.models import tiny_lm, tiny_models

TINY = {model.name: model for model in tiny_models()}


def _in_threads(work, threads: int = 4, calls: int = 3) -> list:
    """``work(k)`` for k in 0 … threads·calls − 1, ``calls`` per thread, all threads at once;
    the results in order (an exception is kept as the result)."""
    results: list = [None] * (threads * calls)
    start = threading.Barrier(threads)

    def run(first: int) -> None:
        start.wait()
        for k in range(first, first + calls):
            try:
                results[k] = work(k)
            except Exception as error:  # noqa: BLE001 - kept to be reported
                results[k] = error

    workers = [threading.Thread(target=run, args=(t * calls,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return results


def _same(found, expected) -> None:
    errors = [r for r in found if isinstance(r, Exception)]
    assert not errors, errors[:3]
    for got, want in zip(found, expected):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("instances", [1, 2])
def test_concurrent_attributions_equal_sequential_ones(instances):
    model = tiny_lm("llama")
    explainers = [NormDecomposition(model) for _ in range(instances)]
    torch.manual_seed(0)
    inputs = [torch.randint(4, 50, (2, 7)) for _ in range(12)]

    def call(k: int):
        return explainers[k % instances].attribute(inputs[k], target=5, return_bias=True,
                                                   return_convergence_delta=True)

    expected = [call(k) for k in range(12)]
    _same(_in_threads(call), expected)
    handles = [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert not handles  # nothing left behind


def test_layer_maps_and_whole_model_share_the_lock():
    model = tiny_lm("gpt2")
    nd = NormDecomposition(model)
    lnd = LayerNormDecomposition(model, model.transformer.h[1])
    torch.manual_seed(1)
    inputs = [torch.randint(4, 50, (1, 6)) for _ in range(12)]

    def call(k: int):
        if k % 2:
            return (lnd.attribute(inputs[k], scope="AtbLnFf"),)
        return nd.attribute_components(inputs[k], target=3).contributions,

    expected = [call(k) for k in range(12)]
    _same(_in_threads(call), expected)


def test_two_models_that_compute_probabilities_inline_run_side_by_side():
    """BLOOM reads its probabilities from the softmax it calls: two models in two threads must
    not see each other's (the softmax replacement is per thread)."""
    first, second = TINY["bloom"].build(), TINY["bloom"].build()
    with torch.no_grad():
        for parameter in second.parameters():
            parameter.mul_(1.1)
    explainers = [NormDecomposition(first), NormDecomposition(second)]
    torch.manual_seed(2)
    inputs = [torch.randint(4, 50, (1, 6)) for _ in range(12)]
    directions = [Direction(torch.randn(32)) for _ in range(12)]
    original = torch.nn.functional.softmax

    def call(k: int):
        return explainers[k % 2].attribute(inputs[k], target=directions[k], route="forward",
                                           return_convergence_delta=True)

    expected = [call(k) for k in range(12)]
    found = _in_threads(call)
    _same(found, expected)
    assert all(float(delta.max()) < 1e-4 for _, delta in found)
    assert torch.nn.functional.softmax is original


def test_the_softmax_replacement_is_per_thread():
    module = torch.nn.Identity()
    seen: list[int] = []
    other: list[torch.Tensor] = []
    original = torch.nn.functional.softmax
    inside = threading.Event()
    done = threading.Event()

    def elsewhere() -> None:
        inside.wait()
        other.append(torch.nn.functional.softmax(torch.zeros(3), dim=0))
        done.set()

    def forward(*args):
        inside.set()
        done.wait(10)
        return torch.nn.functional.softmax(torch.zeros(3), dim=0)

    module.forward = forward
    thread = threading.Thread(target=elsewhere)
    thread.start()
    with ModelPass(module) as run:
        run.softmax(module, lambda t: seen.append(threading.get_ident()) or t)
        run.call(module, torch.zeros(1))
    thread.join()
    assert seen == [threading.get_ident()]  # the other thread's softmax was not handed over
    assert len(other) == 1
    assert torch.nn.functional.softmax is original


def test_the_lock_is_one_per_model():
    a, b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    assert model_lock(a) is model_lock(a)
    assert model_lock(a) is not model_lock(b)


def test_concurrent_graphs_and_score_splits_equal_sequential_ones():
    """Attribution graphs (and the score splits they read from the model's frozen pass)
    built in four threads at once, beside plain attributions of the same model."""
    model = tiny_lm("llama")
    nd = NormDecomposition(model)
    torch.manual_seed(2)
    inputs = [torch.randint(4, 50, (1, 6)) for _ in range(12)]

    def call(k: int):
        if k % 3 == 2:
            return nd.attribute(inputs[k], target=5, return_bias=True)
        graph = nd.attribute_graph(inputs[k], target=5, granularity="head", prune=False)
        split = graph.score_split(1, 0, 5, 2)
        return graph.data.weights, graph.data.values, torch.tensor(sorted(split.values()))

    expected = [call(k) for k in range(12)]
    _same(_in_threads(call), expected)
