"""Attribution graphs, checked against the model on every tiny family: (a) flow is conserved at
every node of the unpruned graph, (b) the token nodes are ``attribute``'s contributions,
(c) removing a node (or one edge) in the frozen model changes the output by its value (its
weight), (d) score splits add up to the model's own scores, (e) the frozen patch estimate is
the frozen model's finite difference."""

from __future__ import annotations

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.architectures.paths import resolve
from captum_ffb.core.keys import is_writer_node
from captum_ffb.engine import tape as engine_tape
from captum_ffb.engine.frozen import FrozenCoefficients
from captum_ffb.engine.tape import graph_pass
from captum_ffb.graph import build as graph_build
from captum_ffb.graph import pipeline as graph_pipeline
from captum_ffb.graph.record import AttributionGraph
from tests.models import (
    INLINE_ATTENTION,
    TINY_MODELS,
    TINY_SEQ2SEQ,
    seq2seq_inputs,
    split_source,
    tiny_task_model,
    token_ids,
)

ENCODERS = {"bert", "roberta", "xlm-roberta", "camembert", "electra", "modernbert", "distilbert", "deberta-v2"}
FAMILIES = sorted(TINY_MODELS)
#: bias-free families: their bias node may hold nothing (the centred reference moves none)
BIAS_FREE = {"llama", "mistral", "qwen3", "gemma", "gemma2", "gemma3_text", "cohere", "olmo", "olmo2", "mixtral",
             "qwen3_moe", "granite"}


def _model(name: str) -> tuple[NormDecomposition, torch.Tensor, int]:
    task = "sequence_classification" if name in ENCODERS else "causal_lm"
    model = tiny_task_model(name, task)
    return NormDecomposition(model), token_ids()[:1, :7], 2 if name in ENCODERS else 5  # not 1: a padding id


@pytest.mark.parametrize("name", FAMILIES)
def test_the_unpruned_graph_conserves_flow_and_its_tokens_are_the_contributions(name):
    nd, ids, target = _model(name)
    for granularity in ("sublayer", "head"):
        graph = nd.attribute_graph(ids, target, granularity=granularity, prune=False)
        d = graph.data
        inflow, outflow = graph.flow()
        writers = torch.tensor([k not in ("token", "bias", "output") for k in d.kinds])
        scale = float(d.values.abs().max()) or 1.0
        assert float((inflow - d.values)[writers].abs().max()) <= 1e-5 * scale  # in-flow (bias edge included)
        assert float((outflow - d.values)[: d.output].abs().max()) <= 1e-5 * scale  # out-flow (direct edge included)
        assert abs(float(inflow[d.output]) - graph.value) <= 1e-5 * scale
        tokens = torch.tensor([k == "token" for k in d.kinds])
        expected = nd.attribute(ids, target=target)[0]
        torch.testing.assert_close(d.values[tokens], expected, atol=1e-5 * scale, rtol=1e-4)
        if name in BIAS_FREE:  # nothing of a bias-free model is owed to no token
            assert float(d.weights[d.sources == d.bias].abs().sum()) <= 1e-5 * scale


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "gemma2", "mixtral", "opt-post-ln", "granite", "cohere"])
def test_an_ff_blocks_edges_from_one_product_equal_those_node_by_node(name, monkeypatch):
    """The position-wise shortcut (one vector–Jacobian product for all of an FF block's nodes)
    against the general path (one per node), on pruned and unpruned graphs."""

    nd, ids, target = _model(name)
    found = {}
    for shortcut in (True, False):
        if not shortcut:
            monkeypatch.setattr(graph_build, "_position_wise", lambda tape, index: False)
        found[shortcut] = [nd.attribute_graph(ids, target, granularity=granularity, prune=False, max_nodes=max_nodes)
                           for granularity, max_nodes in (("head", None), ("sublayer", 6))]
    def dense(d):
        matrix = torch.zeros(len(d.values), len(d.values), dtype=torch.float64)
        return matrix.index_put_((d.sources, d.targets), d.weights.double(), accumulate=True)

    for fast, slow in zip(found[True], found[False]):
        a, b = fast.data, slow.data
        assert a.kinds == b.kinds and a.positions == b.positions
        scale = float(b.weights.abs().max())
        torch.testing.assert_close(dense(a), dense(b), atol=1e-6 * scale, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-6 * scale, rtol=1e-5)
        assert int((dense(a) != 0).sum()) >= int((dense(b).abs() > 1e-6 * scale).sum())  # no edge lost


#: families whose every read stream is the players' stream plus earlier writes, each added once
PLAIN_SUMS = {"llama", "gpt2", "gemma2", "mixtral", "cohere", "gpt_neox", "falcon"}


@pytest.mark.parametrize("name", sorted(PLAIN_SUMS) + ["bert", "granite", "opt"])
def test_plain_sum_streams_pass_covectors_on_unchanged_as_autograd_does(name, monkeypatch):
    """Where every stream a writer reads is a plain sum of the earlier writes (read from the
    pass's autograd graph), the covectors, edges and score splits skip the pull-back along the
    stream and equal those of the vector–Jacobian products; a Post-LN norm (BERT), a scaled
    residual (Granite) or a flattened write (OPT) takes the products."""
    nd, ids, target = _model(name)
    tapes = []
    real_covectors = engine_tape.covectors
    monkeypatch.setattr(graph_pipeline, "covectors", lambda tape: tapes.append(tape) or real_covectors(tape))
    fast = nd.attribute_graph(ids, target, granularity="head", prune=False)
    assert (engine_tape.stream_sums(tapes[0]) is not None) == (name in PLAIN_SUMS)
    monkeypatch.setattr(engine_tape, "_stream_sums", lambda tape: None)
    slow = nd.attribute_graph(ids, target, granularity="head", prune=False)
    a, b = fast.data, slow.data
    scale = float(b.weights.abs().max())
    torch.testing.assert_close(_dense(a), _dense(b), atol=1e-6 * scale, rtol=1e-5)
    torch.testing.assert_close(a.values, b.values, atol=1e-6 * scale, rtol=1e-5)
    if name not in INLINE_ATTENTION and name not in ENCODERS:
        monkeypatch.undo()
        layer = len(nd.engine.stack.blocks) - 1
        split = fast.score_split(layer=layer, head=0, query_position=ids.shape[1] - 1, key_position=1)
        monkeypatch.setattr(engine_tape, "_stream_sums", lambda tape: None)
        again = slow.score_split(layer=layer, head=0, query_position=ids.shape[1] - 1, key_position=1)
        assert split.keys() == again.keys()
        for key in split:
            torch.testing.assert_close(torch.as_tensor(split[key]), torch.as_tensor(again[key]), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_graph_pass_keeps_only_the_targets_logits_and_reads_the_models_probability(name, monkeypatch):
    nd, ids, target = _model(name)
    tapes = []
    real_covectors = engine_tape.covectors
    monkeypatch.setattr(graph_pipeline, "covectors", lambda tape: tapes.append(tape) or real_covectors(tape))
    graph = nd.attribute_graph(ids, target)
    assert tapes[0].output.logits.shape[1] == 1  # not n × vocabulary
    with torch.no_grad():
        expected = nd.model(ids).logits[0, -1].softmax(-1)[target]
    assert graph.probability == pytest.approx(float(expected), rel=1e-5)


def _dense(d) -> torch.Tensor:
    matrix = torch.zeros(len(d.values), len(d.values), dtype=torch.float64)
    return matrix.index_put_((d.sources, d.targets), d.weights.double(), accumulate=True)


def _replayed(nd, ids, target, store, edit):
    """The frozen model of the recorded pass, with ``edit``'s hooks: its value."""
    request = nd.engine.request((ids,), {})
    head_target = nd._target(target, None, request.read_mask)
    return float(graph_pass(nd.engine, request, head_target, nd.rules, "head", store.replayed(), edit).value.detach())


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "gemma2", "mixtral", "gpt_neox", "opt-post-ln", "phi3"])
def test_removing_a_node_or_an_edge_in_the_frozen_model(name):
    """(c): with every coefficient of the clean run fixed, the output falls by a node's value
    when its output is removed, and by an edge's weight when only that write into one
    writer's input is removed."""
    nd, ids, target = _model(name)
    request = nd.engine.request((ids,), {})
    head_target = nd._target(target, None, request.read_mask)
    store = FrozenCoefficients()
    tape = graph_pass(nd.engine, request, head_target, nd.rules, "head", store)
    graph = nd.attribute_graph(ids, target, granularity="sublayer", prune=False, reference="zero")
    d = graph.data
    clean = float(tape.value.detach())
    ids_of = graph.ids()
    ff = [k for k, kind in enumerate(d.kinds) if kind == "ff" and d.layers[k] == 0]
    node = max(ff, key=lambda k: abs(float(d.values[k])))
    layer, position = d.layers[node], d.positions[node]
    module = _writer_module(nd, layer, "ff")

    def remove(recorder):
        def hook(mod, args, output):
            out = (output[0] if isinstance(output, tuple) else output).clone()
            out.reshape(1, ids.shape[1], -1)[:, position] = 0
            return (out, *output[1:]) if isinstance(output, tuple) else out
        recorder.run.after(module, hook)

    removed = _replayed(nd, ids, target, store, remove)
    scale = max(abs(clean), 1e-3)
    assert abs((clean - removed) - float(d.values[node])) <= 1e-4 * scale, (clean - removed, float(d.values[node]))
    # one edge: the block-1 attention's input loses only the layer-0 FF's write at its position
    edges = [(int(s), int(t), float(w)) for s, t, w in zip(d.sources, d.targets, d.weights)
             if int(s) == node and d.kinds[int(t)] == "attention" and d.layers[int(t)] == 1]
    if not edges:
        pytest.skip("no edge from the chosen node into the next attention")
    _, edge_target, weight = max(edges, key=lambda e: abs(e[2]))
    read_module = _read_module(nd, 1, "attention")
    with_node = {}
    without_node = {}

    def keep(into):
        def install(recorder):
            def hook(mod, args, kwargs):
                x = args[0] if args else next(iter(kwargs.values()))
                into["x"] = x.detach().clone()
            recorder.run.before(read_module, hook, with_kwargs=True)
        return install

    _replayed(nd, ids, target, store, keep(with_node))
    _replayed(nd, ids, target, store, lambda recorder: (remove(recorder), keep(without_node)(recorder)))
    contribution = with_node["x"] - without_node["x"]  # the node's write, as block 1 reads it
    writer = _writer_module(nd, 1, "attention")
    outputs = {}

    def cut(record_into):
        def install(recorder):
            def pre(mod, args, kwargs):  # only this writer's reads lose the node's write
                return _minus(args, kwargs, contribution, slice(None))

            def post(mod, args, output):
                record_into["y"] = (output[0] if isinstance(output, tuple) else output).detach().clone()
            recorder.run.before(read_module, pre, with_kwargs=True)
            recorder.run.after(writer, post)
        return install

    def watch(recorder):
        def post(mod, args, output):
            outputs["clean"] = (output[0] if isinstance(output, tuple) else output).detach().clone()
        recorder.run.after(writer, post)

    _replayed(nd, ids, target, store, watch)
    all_cut = _replayed(nd, ids, target, store, cut(outputs))
    # every edge from the node into block 1's attention, together
    assert abs((clean - all_cut) - sum(w for _, _, w in edges)) <= 1e-4 * scale
    # one edge: only the target's row of block 1's attention output loses what the cut removed
    change = (outputs["clean"] - outputs["y"]).reshape(1, ids.shape[1], -1)
    query_position = d.positions[edge_target]

    def one_row(recorder):
        def post(mod, args, output):
            out = (output[0] if isinstance(output, tuple) else output).clone()
            out.reshape(1, ids.shape[1], -1)[:, query_position] -= change[:, query_position]
            return (out, *output[1:]) if isinstance(output, tuple) else out
        recorder.run.after(writer, post)

    edited = _replayed(nd, ids, target, store, one_row)
    assert abs((clean - edited) - weight) <= 1e-4 * scale, (clean - edited, weight, ids_of[edge_target])


def _minus(args, kwargs, contribution, position):
    x = args[0] if args else next(iter(kwargs.values()))
    mask = torch.zeros_like(x)
    mask[:, position] = 1
    new = x - contribution * mask
    if args:
        return (new, *args[1:]), kwargs
    key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
    return args, {**kwargs, key: new}


def _writer_module(nd, layer, kind):
    return nd.engine.points.writer(layer, kind).module


def _read_module(nd, layer, kind):
    writer = nd.engine.points.writer(layer, kind)
    return next(read.module for read in nd.engine.points.reads if read.id == writer.read)


@pytest.mark.parametrize("name", sorted(set(FAMILIES) - INLINE_ATTENTION - ENCODERS)[:12] + ["bert", "gpt2"])
def test_score_splits_add_up_to_the_models_scores(name):
    """(d)"""
    nd, ids, target = _model(name)
    graph = nd.attribute_graph(ids, target, granularity="head", prune=False)
    tape = graph.scorer.tape
    for layer in range(len(nd.engine.blocks)):
        block = nd.engine.blocks[layer]
        attention = resolve(block, nd.engine.family.for_block(block).attention)
        query, key, scaling, _ = tape.coefficients.scores[id(attention)]
        head = query.shape[1] - 1
        kv = head // (query.shape[1] // key.shape[1])
        q = ids.shape[1] - 1
        s = 2 if float(graph.attention(layer, head, q)[2]) > 0 else q  # a key the head may see (windows)
        real = float((query[0, head, q] * key[0, kv, s]).sum().detach()) * scaling
        split = graph.score_split(layer, head, q, s)
        assert abs(sum(split.values()) - real) <= 1e-5 * max(1.0, abs(real))
        assert all(isinstance(k, tuple) and len(k) == 2 for k in split)


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "qwen2_moe", "gemma2"])
def test_the_frozen_patch_estimate_is_the_frozen_finite_difference(name):
    """(e): patching a head's (or FF block's) output from the baseline run, in the frozen
    model of the clean run, changes the output by the node's frozen estimate."""
    nd, ids, target = _model(name)
    baseline = ids.clone()
    baseline[0, 1], baseline[0, 3] = 11, 13
    graph = nd.attribute_graph(ids, target, granularity="head", prune=False, corrupted_inputs=baseline)
    d = graph.data
    estimates = graph.patch_estimates["frozen"]
    request = nd.engine.request((ids,), {})
    head_target = nd._target(target, None, request.read_mask)
    store = FrozenCoefficients()
    clean = float(graph_pass(nd.engine, request, head_target, nd.rules, "head", store).value.detach())
    from captum_ffb.patching.patches import real_writers

    base = real_writers(nd.engine, nd.engine.request((baseline,), {}), head_target, "head")
    ff = [k for k, kind in enumerate(d.kinds) if kind == "ff"]
    node = max(ff, key=lambda k: abs(float(estimates[k])))
    layer, position = d.layers[node], d.positions[node]
    module = _writer_module(nd, layer, "ff")
    patched_value = base.outputs[f"block.{layer}.ff"][:, position]

    def patch(recorder):
        def hook(mod, args, output):
            out = (output[0] if isinstance(output, tuple) else output).clone()
            out.reshape(1, ids.shape[1], -1)[:, position] = patched_value
            return (out, *output[1:]) if isinstance(output, tuple) else out
        recorder.run.after(module, hook)

    patched = _replayed(nd, ids, target, store, patch)
    assert abs((clean - patched) - float(estimates[node])) <= 1e-4 * max(abs(clean), 1e-3)


def test_pruning_keeps_tokens_and_output_and_reports_its_share():
    nd, ids, target = _model("llama")
    full = nd.attribute_graph(ids, target, granularity="head", prune=False)
    pruned = full.prune()
    assert isinstance(pruned, AttributionGraph)
    d = pruned.data
    kinds = [d.kinds[k] for k in pruned.node_mask.nonzero()[:, 0].tolist()]
    assert kinds.count("token") == ids.shape[1] and "output" in kinds
    assert int(pruned.node_mask.sum()) < len(d) and 0 < int(pruned.edge_mask.sum()) < len(d.weights)
    assert abs(full.kept_share - 1.0) < 1e-5 and pruned.kept_share <= 1.0 + 1e-6
    everything = full.prune(node_threshold=1.0, edge_threshold=1.0)
    assert int(everything.edge_mask.sum()) > int(pruned.edge_mask.sum())
    as_dict = pruned.to_dict()
    ids_kept = {node["id"] for node in as_dict["nodes"]}
    assert all(link["source"] in ids_kept and link["target"] in ids_kept for link in as_dict["links"])
    with pytest.raises(ValueError, match="node_threshold must lie between 0 and 1"):
        full.prune(node_threshold=1.5)


def test_max_nodes_leaves_out_the_smallest_and_says_so():
    nd, ids, target = _model("llama")
    full = nd.attribute_graph(ids, target, granularity="head", prune=False)
    few = nd.attribute_graph(ids, target, granularity="head", prune=False, max_nodes=10)
    writers = [k for k in few.node_mask.nonzero()[:, 0].tolist() if few.data.kinds[k] == "head"]
    assert 0 < len(writers) <= 10
    assert float(few.data.left_out.abs().sum()) > 0
    torch.testing.assert_close(few.data.values, full.data.values)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_max_nodes_computes_the_full_graph_s_edges_and_leaves_out_the_rest_exactly(name):
    """The edges a graph with ``max_nodes`` computes are the full graph's, and what each
    computed node receives from the nodes left out is the full graph's edges from them."""
    nd, ids, target = _model(name)
    full = nd.attribute_graph(ids, target, granularity="head", prune=False).data
    few = nd.attribute_graph(ids, target, granularity="head", prune=False, max_nodes=12).data
    computed = few.computed
    writer = torch.tensor([is_writer_node(k) for k in full.kinds])
    scale = float(full.values.abs().max())
    weights = {(int(s), int(t)): float(w) for s, t, w in zip(full.sources, full.targets, full.weights)}
    kept = {(int(s), int(t)): float(w) for s, t, w in zip(few.sources, few.targets, few.weights)}
    for (s, t), w in kept.items():
        if s not in (few.bias,) and t != few.output:
            assert abs(weights.get((s, t), 0.0) - w) <= 1e-5 * scale, (s, t)
    left = torch.zeros(len(full))
    for (s, t), w in weights.items():
        if bool(writer[s]) and not bool(computed[s]) and t != full.output:
            left[t] += w
    targets = (computed & writer).nonzero()[:, 0]
    torch.testing.assert_close(few.left_out[targets].float(), left[targets], atol=1e-5 * scale, rtol=1e-4)


SEQ2SEQ = sorted(TINY_SEQ2SEQ)
BIAS_FREE_SEQ2SEQ = {"t5", "t5-gated", "mt5", "umt5"}


def _seq2seq(name):
    family = TINY_SEQ2SEQ[name]
    source, kwargs = split_source(seq2seq_inputs(family))
    return family, NormDecomposition(family.build()), source[:1], {k: v[:1] for k, v in kwargs.items()}


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_encoder_decoder_graphs_conserve_flow_over_source_and_target(name):
    """Encoder writers over the source, decoder writers (cross-attention included) over the
    target, in the layout [source | target]: (a) and (b) as for one stack."""
    family, nd, source, kwargs = _seq2seq(name)
    for granularity in ("sublayer", "head"):
        graph = nd.attribute_graph(source, 5, forward_kwargs=kwargs, granularity=granularity, prune=False)
        d = graph.data
        assert "cross_attention" in d.kinds
        inflow, outflow = graph.flow()
        writers = torch.tensor([k not in ("token", "bias", "output") for k in d.kinds])
        scale = float(d.values.abs().max())
        assert float((inflow - d.values)[writers].abs().max()) <= 1e-5 * scale
        assert float((outflow - d.values)[: d.output].abs().max()) <= 1e-5 * scale
        src, tgt = nd.attribute(source, target=5, forward_kwargs=kwargs)
        n_source = src.shape[1]
        tokens = [k for k, kind in enumerate(d.kinds) if kind == "token"]
        expected = torch.cat([src[0], tgt[0]])
        for k in tokens:
            assert abs(float(d.values[k]) - float(expected[d.positions[k]])) <= 1e-5 * scale
        # encoder writers sit over the source, decoder writers over the target
        n_encoder = len(nd.engine.source.blocks)
        for k, kind in enumerate(d.kinds):
            if kind not in ("token", "bias", "output"):
                assert (d.positions[k] < n_source) == (d.layers[k] < n_encoder), (kind, d.layers[k], d.positions[k])
        if name in BIAS_FREE_SEQ2SEQ:
            assert float(d.weights[d.sources == d.bias].abs().sum()) <= 1e-5 * scale
        if family.audio:
            assert graph.tokens[0] == "frame 0" and graph.token_ids is None


@pytest.mark.parametrize("name", ["bart", "t5"])
def test_removing_a_cross_attention_node_in_the_frozen_model(name):
    """(c) for a node that reads the encoder: zeroing its output at one target position."""
    _, nd, source, kwargs = _seq2seq(name)
    request = nd.engine.request((source,), kwargs)
    head_target = nd._target(5, None, request.read_mask)
    store = FrozenCoefficients()
    clean = float(graph_pass(nd.engine, request, head_target, nd.rules, "sublayer", store).value.detach())
    graph = nd.attribute_graph(source, 5, forward_kwargs=kwargs, granularity="sublayer", prune=False)
    d = graph.data
    cross = [k for k, kind in enumerate(d.kinds) if kind == "cross_attention"]
    node = max(cross, key=lambda k: abs(float(d.values[k])))
    from captum_ffb.engine.block import watched_modules

    n_encoder = len(nd.engine.source.blocks)
    block = nd.engine.blocks[d.layers[node] - n_encoder]
    module = watched_modules(block, nd.engine.family.for_block(block))["cross_out"]
    position = d.positions[node] - source.shape[1]

    def remove(recorder):
        def hook(mod, args, output):
            out = (output[0] if isinstance(output, tuple) else output).clone()
            out[:, position] = 0
            return (out, *output[1:]) if isinstance(output, tuple) else out
        recorder.run.after(module, hook)

    removed = float(graph_pass(nd.engine, request, head_target, nd.rules, "sublayer", store.replayed(),
                               remove).value.detach())
    assert abs((clean - removed) - float(d.values[node])) <= 1e-4 * max(abs(clean), 1e-3)


@pytest.mark.parametrize("name", ["bart", "t5"])
def test_encoder_decoder_score_splits_add_up(name):
    """(d) for a decoder's self-attention, positions in the layout [source | target]."""
    _, nd, source, kwargs = _seq2seq(name)
    graph = nd.attribute_graph(source, 5, forward_kwargs=kwargs, granularity="head", prune=False)
    n_source, n_encoder = source.shape[1], len(nd.engine.source.blocks)
    layer = n_encoder + 1
    tape = graph.scorer.tape
    attention = resolve(nd.engine.blocks[1], nd.engine.family.for_block(nd.engine.blocks[1]).attention)
    query, key, scaling, _ = tape.coefficients.scores[id(attention)]
    q, s = 2, 1
    real = float((query[0, 0, q] * key[0, 0, s]).sum().detach()) * scaling
    split = graph.score_split(layer, 0, n_source + q, n_source + s)
    assert abs(sum(split.values()) - real) <= 1e-5 * max(1.0, abs(real))
    assert all(k == "bias" or int(k.rsplit("@", 1)[1]) >= n_source for pair in split for k in pair)
    with pytest.raises(ValueError, match="query_position"):
        graph.score_split(layer, 0, 0, n_source)
    with pytest.raises(ValueError, match="patching estimates"):
        nd.attribute_graph(source, 5, forward_kwargs=kwargs, corrupted_inputs=source)


def test_the_edges_products_are_sized_by_the_memory_budget():
    """``memory_budget`` sets how many target nodes share one batched product (1 … 64): the
    graph is the same whatever the size."""
    nd, ids, target = _model("llama")
    request = nd.engine.request((ids,), {})
    tape = graph_pass(nd.engine, request, nd._target(target, None, request.read_mask), nd.rules, "head")
    per_target = 8 * ids.shape[1] * tape.inputs.shape[-1] * 4
    assert graph_build.edge_chunk(tape, None) == 16
    assert graph_build.edge_chunk(tape, 1) == 1
    assert graph_build.edge_chunk(tape, 5 * per_target) == 5
    assert graph_build.edge_chunk(tape, 1 << 40) == 64
    default = nd.attribute_graph(ids, target, granularity="head", prune=False).data
    small = NormDecomposition(nd.model, memory_budget=3 * per_target).attribute_graph(
        ids, target, granularity="head", prune=False).data
    def edges(d):  # the same edges, in the order the products found them
        return {(int(s), int(t)): float(w) for s, t, w in zip(d.sources, d.targets, d.weights)}

    found, expected = edges(small), edges(default)
    assert found.keys() == expected.keys()
    assert max(abs(found[e] - expected[e]) for e in expected) <= 1e-6 * float(default.values.abs().max())
