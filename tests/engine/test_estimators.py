"""The patching estimators (``patching/estimators/``, ``patching/patches.py``), each checked where
it is exact, on tiny random models in double precision:

* attribution patching (``atp``) and AtP's QK fix (``atp+qk``) become the real patch effect as
  the patch shrinks (the QK fix changes AtP at second order only), and so does the edges'
  ``atp`` against real path patching;
* the QK fix's probabilities are those the real attention computes when the patch reaches its
  input, and its first-order term the real attention's derivative (a finite difference);
* GradDrop's gradients are those of a pass with a block's writes detached, and AtP* combines
  them as Kramár et al. do;
* EAP-IG with one step is attribution patching, and with many steps its input-embedding
  gradients integrate to the whole change of the output (completeness);
* RelP's attention derivative is the attention's own, and with the AH-rule on an element-wise
  activation it is the frozen estimator (exact for the frozen model: ``tests/graph/test_graph.py``);
* path patching does what it says (by hand), and the frozen edge estimates are the graph's edge
  weights when the patch is the write itself.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.engine.autograd import sequence_shaped, swap_first
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.tape import covectors
from captum_ffb.patching import estimators as E
from captum_ffb.patching.estimators import atpstar
from captum_ffb.patching.estimators import recorded as recorded_passes
from captum_ffb.patching.patches import (
    COMPUTED,
    DEFAULT_ESTIMATOR,
    ESTIMATORS,
    Patch,
    patched_values,
    path_patching,
)
from tests.models import tiny_task_model, token_ids


def _model(name: str = "llama"):
    nd = NormDecomposition(tiny_task_model(name, "causal_lm").double())
    ids = token_ids()[:1, :7]
    corrupted = ids.clone()
    corrupted[0, 1], corrupted[0, 3] = 11, 13
    request = nd.request(ids, 5)
    return nd, ids, corrupted, request, nd.request(corrupted, request.target)


@pytest.fixture(scope="module")
def llama():
    return _model("llama")


def _runs(nd, request, other, granularity="head", **options):
    clean = E.record(nd.engine, request, granularity, **options)
    base = E.record(nd.engine, other, granularity, grad=False)
    return clean, base, E.differences(clean, base)


def _scaled(diff: E.Differences, eps: float) -> E.Differences:
    return replace(diff, outputs={k: v * eps for k, v in diff.outputs.items()},
                   parts={k: v * eps for k, v in diff.parts.items()},
                   writes={k: v * eps for k, v in diff.writes.items()}, inputs=diff.inputs * eps)


def _partial_patches(nd, clean: E.Recorded, diff: E.Differences, eps: float) -> tuple[list[str], list[Patch]]:
    """Every head and FF block patched by the share ``eps`` of its difference, at every position."""
    writers = {w.id: w for w in nd.engine.points.read_stack()}
    names, patches = [], []
    for recorded in clean.tape.writers:
        writer = writers[recorded.id]
        if recorded.parts is None:
            value = sequence_shaped(recorded.output.detach(), recorded.n) - eps * diff.outputs[recorded.id][None]
            names.append(recorded.id)
            patches.append(Patch(writer.module, value))
        else:
            parts = recorded.parts.detach() - eps * diff.parts[recorded.id][None]
            for h in range(parts.shape[2]):
                names.append(f"{recorded.id}.head.{h}")
                patches.append(Patch(writer.parts, parts[:, :, h], h, parts.shape[2]))
    return names, patches


def _by_component(per_writer: dict[str, torch.Tensor]) -> dict[str, float]:
    found = {}
    for key, values in per_writer.items():
        values = values if values.dim() == 1 else values.sum(0)
        if values.numel() == 1:
            found[key] = float(values[0])
        else:
            found.update({f"{key}.head.{h}": float(v) for h, v in enumerate(values)})
    return found


# --------------------------------------------------------------------------- exact as the patch shrinks
def test_attribution_patching_and_the_qk_fix_become_the_real_effect_as_the_patch_shrinks(llama):
    """``atp`` and ``atp+qk`` are first-order estimates of the real patch: for a patch of
    ``ε`` times the difference their error falls like ``ε²`` (AtP*'s fix, exact beyond the first
    order through the softmax, adds nothing at first order)."""
    nd, _, _, request, other = llama
    clean, _, diff = _runs(nd, request, other, probe=True, gate=True)
    (grads,) = E.gradients(clean)
    atp = _by_component(E.linear_estimates(grads, diff, clean.tape))
    value = float(clean.value.detach()[0])
    errors = {}
    for eps in (1e-1, 1e-2):  # (the values are read in float32: smaller patches meet its rounding)
        names, patches = _partial_patches(nd, clean, diff, eps)
        real = {name: value - v for name, v in zip(names, patched_values(nd.engine, request, request.target, patches))}
        qk = _by_component(E.atp_star(nd.engine, clean, _scaled(diff, eps)).qk_components)
        top = max(abs(v) for v in atp.values())
        errors[eps] = max(abs(real[c] - eps * atp[c]) for c in names) / (eps * top)
        assert max(abs(qk[c] - eps * atp[c]) for c in names) / (eps * top) < 5 * errors[eps] + 1e-9
    assert errors[1e-2] < 0.02 and errors[1e-2] < errors[1e-1] / 3


def test_the_qk_fix_recomputes_the_attention_the_model_computes():
    """For patches ``δ`` reaching a later attention's input: the fix is ``−⟨g, α(x + δ) − α(x) −
    J δ⟩`` with ``α(x + δ)`` the real attention's probabilities with that input and ``J δ`` a
    finite difference of them, every position patched at once and each alone (for any
    covector ``g`` at the probabilities)."""
    torch.manual_seed(0)
    nd, _, _, request, _ = _model("llama")
    engine = nd.engine
    clean = E.record(engine, request, "head", probe=True)
    probe = clean.probes[-1]
    n, d = probe.stream.shape[1:]
    delta = torch.randn(2, n, d, dtype=torch.float64) * 0.5
    g = torch.randn(2, *probe.weights.shape[1:], dtype=torch.float64)
    fix_all, fix_each = atpstar._qk_fix(probe, delta, g, chunk=1)
    writers = [w for w in engine.points.read_stack() if w.layer == probe.layer]

    def probabilities(add: torch.Tensor) -> torch.Tensor:
        store: dict = {}
        with ModelPass(engine.model) as run:
            run.before(probe.read, lambda module, args: (args[0] + add,))
            recorded_passes._install_probes(run, engine, writers, store)
            token = recorded_passes._probed.set(store)
            try:
                run.run(*request.args, **request.kwargs)
            finally:
                recorded_passes._probed.reset(token)
        return store[id(probe.module)]["weights"][0].double()

    alpha, eps = probabilities(torch.zeros(1, n, d, dtype=torch.float64)), 1e-3
    for c in range(2):
        for position in [None, *range(n)]:
            patch = delta[c:c + 1].clone()
            if position is not None:
                patch[:, [p for p in range(n) if p != position]] = 0
            tangent = (probabilities(eps * patch) - probabilities(-eps * patch)) / (2 * eps)
            expected = -torch.einsum("hij,shij->s", probabilities(patch) - alpha - tangent, g)
            found = fix_all[:, c] if position is None else fix_each[:, c, position]
            # the model's softmax runs in float32: the finite difference is good to ~1e-4 per entry
            assert found == pytest.approx(expected, abs=3e-3), (c, position)


# --------------------------------------------------------------------------- GradDrop and AtP*
def test_graddrop_gradients_are_those_with_a_blocks_writes_detached_and_atp_star_averages_them(llama):
    nd, _, _, request, other = llama
    engine = nd.engine
    clean, _, diff = _runs(nd, request, other, probe=True, gate=True)
    dropped = E.gradients(clean, [1])[0]
    # by hand: block 1's writes detached (nothing flows back through them)
    kept = {}
    with ModelPass(engine.model, grad=True) as run:
        leaf = {}

        def start(module, args, kwargs):
            x = (args[0] if args else kwargs["hidden_states"]).detach().requires_grad_(True)
            leaf["x"] = x
            return swap_first(args, kwargs, x)

        run.before(engine.blocks[0], start, with_kwargs=True)
        for writer in engine.points.read_stack():
            def keep(module, args, output, writer=writer):
                out = output[0] if isinstance(output, tuple) else output
                kept[writer.id] = out
                new = out.detach() if writer.layer == 1 else out.clone()
                return (new, *output[1:]) if isinstance(output, tuple) else new

            run.after(writer.module, keep)
        from captum_ffb.engine.head import target_value

        value = target_value(engine.head, run.run(*request.args, **request.kwargs), request.target)
        grads = torch.autograd.grad(value.sum(), list(kept.values()), allow_unused=True)
    for (key, out), g in zip(kept.items(), grads):
        expected = torch.zeros_like(out) if g is None else g
        assert dropped[key] == pytest.approx(sequence_shaped(expected, out.shape[-2])[0].detach(), rel=1e-6, abs=1e-9), key
    # two blocks: GradDrop averages over L − 1 = 1 block; block 1's components keep the fixed AtP, block 0's the
    # estimate with block 1 dropped (whose probabilities then get no gradient: no QK fix)
    star = E.atp_star(engine, clean, diff)
    lin = E.linear_estimates(dropped, diff, clean.tape)
    for key in star.components:
        qk = star.qk_components[key]
        if key.startswith("block.1"):
            assert star.components[key] == pytest.approx(qk, abs=1e-12)
        else:
            expected = torch.sign(qk) * lin[key].double().sum(0).abs()
            assert star.components[key] == pytest.approx(expected, abs=1e-10)


# --------------------------------------------------------------------------- EAP-IG
def test_eap_ig_is_attribution_patching_with_one_step_and_complete_with_many(llama):
    nd, _, _, request, other = llama
    clean, base, diff = _runs(nd, request, other)
    (grads,) = E.gradients(clean)
    one = E.eap_ig_gradients(nd.engine, request, "head", diff, steps=1)
    assert set(one) == set(grads)
    for name in grads:
        assert one[name] == pytest.approx(grads[name], abs=1e-12)
    change = float(clean.value.detach()[0]) - float(base.value[0])
    gaps = {}
    for steps in (4, 32):
        found = E.eap_ig_gradients(nd.engine, request, "head", diff, steps=steps)
        gaps[steps] = abs(float((found["inputs"] * diff.inputs).sum()) - change)
    assert gaps[32] < 0.02 * abs(change) and gaps[32] < gaps[4] / 4  # the right Riemann sum: error ~ 1/steps
    with pytest.raises(ValueError, match="steps"):
        E.eap_ig_gradients(nd.engine, request, "head", diff, steps=0)


# --------------------------------------------------------------------------- RelP
def test_gradient_attention_is_the_attentions_own_derivative():
    torch.manual_seed(1)
    b, h, kv, n, e = 1, 4, 2, 6, 5
    query = torch.randn(b, h, n, e, dtype=torch.float64, requires_grad=True)
    key = torch.randn(b, kv, n, e, dtype=torch.float64, requires_grad=True)
    value = torch.randn(b, kv, n, e, dtype=torch.float64, requires_grad=True)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    scaling = e ** -0.5
    cotangent = torch.randn(b, h, n, e, dtype=torch.float64)
    found = torch.autograd.grad(E.GradientAttention().linearised(query, key, value, allowed, scaling, None),
                                (query, key, value), cotangent)
    scores = torch.matmul(query, key.repeat_interleave(2, 1).transpose(-1, -2)) * scaling
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    out = torch.matmul(probs, value.repeat_interleave(2, 1))
    expected = torch.autograd.grad(out, (query, key, value), cotangent)
    for a, x in zip(found, expected):
        assert a == pytest.approx(x, abs=1e-12)


def test_relp_with_the_ah_rule_is_the_frozen_estimator_on_element_wise_activations():
    """GPT-2 (GELU, LayerNorm): RelP's LN-rule and identity rule are the frozen model's norm and
    activation maps; with the AH-rule (probabilities frozen) RelP is the frozen estimator, and
    without it the two differ only through the attention's softmax."""
    nd, ids, corrupted, request, other = _model("gpt2")
    engine = nd.engine
    clean, _, diff = _runs(nd, request, other)
    graph = nd.attribute_graph(ids, 5, granularity="head", prune=False, corrupted_inputs=corrupted)
    for ah_rule in (True, False):
        relp = E.record(engine, request, "head", rules=E.relp_rules(engine, ah_rule=ah_rule))
        estimates = _by_component(E.linear_estimates(E.gradients(relp)[0], diff, relp.tape))
        frozen = graph.component_estimates("frozen")
        gap = max(abs(estimates[c] - frozen[c]) for c in estimates)
        assert (gap < 1e-6) == ah_rule, gap


# --------------------------------------------------------------------------- edges
def test_path_patching_by_hand(llama):
    """Path patching of one edge into a head, into an FF block and into the output, against
    hooks written here."""
    nd, _, _, request, other = llama
    engine = nd.engine
    clean, base, diff = _runs(nd, request, other)
    # (block 1 is the last: only its computation at the read position 6 reaches the output)
    links = [E.Link(("ff", 0, -1, 3), ("head", 1, 2, 6)), E.Link(("head", 0, 1, 6), ("ff", 1, -1, 6)),
             E.Link(("token", -1, -1, 3), ("output", -1, -1, -1)), E.Link(("ff", 1, -1, 6), ("output", -1, -1, -1))]
    found = path_patching(engine, request, other, links, "head", batch_size=3)
    value = float(clean.value.detach()[0])
    block1 = engine.blocks[1]
    parts = {w.id: w.parts.detach() for w in clean.tape.writers if w.parts is not None}
    ff_out = {w.id: w.output.detach() for w in clean.tape.writers}
    from captum_ffb.engine.head import target_value

    def run(hooks):
        with torch.no_grad():
            handles = [register(fn) for register, fn in hooks]
            try:
                return float(target_value(engine.head, nd.model(*request.args), request.target)[0])
            finally:
                for handle in handles:
                    handle.remove()

    # ff 0 @ 3 → head 2 of block 1 @ 6
    delta = -diff.outputs["block.0.ff"][3]

    def add_at(position, vector):
        def pre(module, args):
            x = args[0].clone()
            x[0, position] += vector
            return (x,)
        return pre

    def keep_head(q, h):
        def pre(module, args):
            x = args[0].clone().reshape(1, 7, 4, -1)
            new = parts["block.1.attention"].clone()
            new[0, q, h] = x[0, q, h]
            return (new.reshape(args[0].shape),)
        return pre

    expected = [value - run([(block1.input_layernorm.register_forward_pre_hook, add_at(3, delta)),
                             (block1.self_attn.o_proj.register_forward_pre_hook, keep_head(6, 2))])]
    # head 1 of block 0 @ 6 → ff 1 @ 6: the FF reads the stream after block 1's attention
    delta = -diff.writes["block.0.attention"][6, 1]

    def keep_ff(q):
        def post(module, args, output):
            new = ff_out["block.1.ff"].clone()
            new[0, q] = output[0, q]
            return new
        return post

    expected.append(value - run([(block1.post_attention_layernorm.register_forward_pre_hook, add_at(6, delta)),
                                 (block1.mlp.register_forward_hook, keep_ff(6))]))
    norm = engine.head.final_norm
    expected.append(value - run([(norm.register_forward_pre_hook, add_at(3, -diff.inputs[3]))]))
    expected.append(value - run([(norm.register_forward_pre_hook, add_at(6, -diff.outputs["block.1.ff"][6]))]))
    assert found == pytest.approx(expected, abs=1e-9)
    assert min(abs(v) for v in (found[0], found[1], found[3])) > 1e-5
    assert found[2] == pytest.approx(0.0, abs=1e-12)  # the output reads the last position only


def test_edge_attribution_patching_becomes_path_patching_as_the_patch_shrinks(llama):
    nd, _, _, request, other = llama
    links = [E.Link(("ff", 0, -1, 3), ("head", 1, 2, 6)), E.Link(("head", 0, 1, 6), ("ff", 1, -1, 6)),
             E.Link(("token", -1, -1, 3), ("head", 0, 0, 4)), E.Link(("head", 1, 3, 6), ("output", -1, -1, -1)),
             E.Link(("attention", 0, -1, 2), ("attention", 1, -1, 6))]
    clean, base, diff = _runs(nd, request, other, "sublayer")
    heads = [link for link in links if "attention" not in (link.source[0], link.target[0])]
    whole = [link for link in links if link not in heads]
    errors = {}
    for eps in (1e-1, 1e-2):
        gap = 0.0
        for granularity, chosen in (("head", heads), ("sublayer", whole)):
            estimate = E.edge_estimates(nd.engine, request, other, granularity, chosen, ("atp",))["atp"]
            real = torch.tensor(path_patching(nd.engine, request, other, chosen, granularity, fraction=eps),
                                dtype=torch.float64)
            assert estimate.abs().min() > 1e-6
            gap = max(gap, float(((real - eps * estimate).abs() / (eps * estimate.abs())).max()))
        errors[eps] = gap
    assert errors[1e-2] < 0.02 and errors[1e-2] < errors[1e-1] / 3


def test_frozen_edge_estimates_are_the_graphs_edge_weights_for_the_write_itself(llama):
    """``⟨J_Bᵀ G_B[q], δ_A[p]⟩`` with the write ``o_A`` in place of the patch ``δ_A`` is the graph's
    edge weight ``w(A → B)``."""
    nd, ids, _, request, other = llama
    graph = nd.attribute_graph(ids, 5, granularity="head", prune=False)
    clean, _, diff = _runs(nd, request, other)
    writes = {w.id: sequence_shaped(w.output.detach(), w.n)[0] for w in clean.tape.writers}
    heads = {w.id: clean.tape.part_outputs(k) for k, w in enumerate(clean.tape.writers) if w.parts is not None}
    itself = replace(diff, outputs=writes, writes=heads)
    d = graph.data
    chosen = [e for e in range(len(d.weights)) if d.kinds[int(d.sources[e])] in ("head", "ff")]
    links = [E.link_of(d.kinds, d.layers, d.heads, d.positions, int(d.sources[e]), int(d.targets[e])) for e in chosen]
    tape = E.record(nd.engine, request, "head", rules=nd.engine.rules(), reads=True).tape
    values = E.link_values(tape, covectors(tape), itself, links)
    assert values == pytest.approx(d.weights[chosen].double(), rel=1e-6, abs=1e-9)


# --------------------------------------------------------------------------- the graph's estimates
def test_the_graph_carries_every_estimator_and_its_edges_estimates(llama):
    nd, ids, corrupted, request, other = llama
    graph = nd.attribute_graph(ids, 5, granularity="head", prune=False, corrupted_inputs=corrupted,
                               estimators=ESTIMATORS)
    assert set(ESTIMATORS) | {"default", "atp+qk"} == set(graph.patch_estimates)
    assert torch.equal(graph.patch_estimates["default"], graph.patch_estimates[DEFAULT_ESTIMATOR])
    assert graph.patch_passes["atp"] == 3 and graph.patch_passes["eap-ig"] == 11
    assert graph.patch_passes["atp*"] == 3 + len(nd.engine.blocks)
    assert all(graph.patch_seconds[name] > 0 for name in ESTIMATORS)
    for name in ESTIMATORS:
        assert len(graph.component_estimates(name)) == len(nd.engine.blocks) * (4 + 1)
    # AtP*'s components are computed with every position patched at once, not summed from its nodes
    star = graph.component_estimates("atp*")
    assert star == graph.patch_components["atp*"]
    cheap = nd.attribute_graph(ids, 5, granularity="head", prune=False, corrupted_inputs=corrupted)
    assert set(cheap.patch_estimates) == {*COMPUTED, DEFAULT_ESTIMATOR, "default"}  # the default is always computed
    for name in COMPUTED:
        # (the same estimates; AtP*'s pass runs eager attention, the other the model's own: rounding)
        assert torch.allclose(cheap.patch_estimates[name], graph.patch_estimates[name], rtol=1e-5, atol=1e-8)
    with pytest.raises(ValueError, match="estimators"):
        nd.attribute_graph(ids, 5, corrupted_inputs=corrupted, estimators=("nope",))
    with pytest.raises(ValueError, match="neurons"):
        nd.attribute_graph(ids, 5, granularity="neuron", corrupted_inputs=corrupted, estimators=("atp*",))
    # edges: aligned with the graph's, nan on the bias's edges, real path patching to compare
    d = cheap.data
    every = torch.arange(len(d.weights))
    estimates = cheap.edge_patch_estimates("atp", every)
    bias = (d.sources == d.bias) | (d.targets == d.bias)
    assert estimates.shape == d.weights.shape and torch.isnan(estimates[bias]).all()
    assert not torch.isnan(estimates[~bias]).any()
    assert torch.equal(cheap.edge_patches["atp"][~bias], estimates[~bias])
    some = every[~bias][:6]
    real = cheap.edge_path_patching(some)
    assert real.shape == (6,) and not torch.isnan(real).any()
    assert torch.isnan(cheap.edge_path_patching(every[bias][:1])).all()
    with pytest.raises(ValueError, match="estimator"):
        cheap.edge_patch_estimates("atp*")
    pruned = nd.attribute_graph(ids, 5, granularity="head", corrupted_inputs=corrupted)
    links = pruned.to_dict()["links"]
    assert any("patch_estimate" in link for link in links)
    assert all("patch_estimate" not in link for link in links if "bias" in (link["source"], link["target"]))
    with pytest.raises(ValueError, match="corrupted_inputs"):
        nd.attribute_graph(ids, 5).edge_patch_estimates()
    assert math.isfinite(sum(link.get("patch_estimate", 0.0) for link in links))
