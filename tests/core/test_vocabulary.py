"""One vocabulary for every entry point: the public signatures of the attributions use the
same names (Captum's where Captum has one), everything after ``(inputs, target)`` is
keyword-only, one writer id everywhere (component tables, graph nodes, patching), one
granularity table, ``target=None`` the prediction in every method, the corrupted run is
``corrupted_inputs``, the output head's component is ``output_head``, jobs run on a
``backend``; and the old names and calls still work for one release with a
``DeprecationWarning``."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from captum_ffb import LayerNormDecomposition, LLMNormAttribution, NormDecomposition
from captum_ffb.explained.readouts import NextToken
from tests.models import tiny_lm, tiny_task_model, token_ids

#: Captum's names, then ours, then each method's own (documented) options.
CAPTUM = {"inputs", "target", "additional_forward_args", "forward_kwargs", "baselines", "internal_batch_size",
          "return_convergence_delta", "inp", "gen_args", "forward_func", "layer", "device_ids"}
OURS = {"reference", "route", "rules", "granularity", "return_bias", "feature_mask", "target_position",
        "players", "scope", "relative_delta", "input_decomposition", "maps", "check", "max_new_tokens",
        "decompositions", "convergence_delta", "tokenizer", "model_type", "memory_budget", "dtype",
        "show_progress", "corrupted_inputs", "prune", "node_threshold", "edge_threshold", "max_nodes",
        "exact_above", "exclude_positions", "estimators", "verify_top"}
#: The words the review found for the same concepts, now gone from every signature.
RETIRED = {"input_ids", "tokens", "targets", "readouts", "positions", "decoder_input_ids", "baseline_inputs",
           "engine", "engine_options", "options"}

METHODS = [
    (NormDecomposition, "__init__", 1),
    (NormDecomposition, "attribute", 2),
    (NormDecomposition, "attribute_components", 2),
    (NormDecomposition, "attribute_graph", 2),
    (NormDecomposition, "attribute_steps", 2),
    (NormDecomposition, "explain", 2),
    (NormDecomposition, "explain_target", 2),
    (NormDecomposition, "explain_generation", 1),
    (NormDecomposition, "maps", 1),
    (LayerNormDecomposition, "__init__", 3),
    (LayerNormDecomposition, "attribute", 1),
    (LayerNormDecomposition, "decompose", 1),
    (LayerNormDecomposition, "iter_layers", 1),
    (LLMNormAttribution, "attribute", 2),
]


@pytest.mark.parametrize("owner, name, positional", METHODS, ids=[f"{o.__name__}.{n}" for o, n, _ in METHODS])
def test_every_public_signature_speaks_the_vocabulary(owner, name, positional):
    parameters = list(inspect.signature(getattr(owner, name)).parameters.values())[1:]  # self
    names = [p.name for p in parameters]
    assert not set(names) & RETIRED, names
    assert set(names) <= CAPTUM | OURS, set(names) - CAPTUM - OURS
    kinds = [p.kind for p in parameters]
    assert all(k == inspect.Parameter.POSITIONAL_OR_KEYWORD for k in kinds[:positional]), names
    assert all(k == inspect.Parameter.KEYWORD_ONLY for k in kinds[positional:]), names


def test_the_shared_names_mean_one_thing_everywhere():
    """``rules`` and ``reference`` are keyword-only in every class; ``route`` defaults to the
    backward route everywhere but the component tables, where ``None`` picks the cheaper."""
    for owner, name, _ in METHODS:
        parameters = inspect.signature(getattr(owner, name)).parameters
        if "rules" in parameters:
            assert parameters["rules"].kind == inspect.Parameter.KEYWORD_ONLY
        if "route" in parameters and name != "attribute_components":
            assert parameters["route"].default == "backward", (owner, name)
    assert inspect.signature(NormDecomposition.attribute_components).parameters["route"].default is None
    assert "reference" in inspect.signature(LLMNormAttribution.attribute).parameters


def test_old_calls_still_work_and_warn():
    model = tiny_task_model("llama")
    ids = token_ids()
    nd = NormDecomposition(model)
    expected = nd.attribute(ids, target=3, forward_kwargs={"attention_mask": torch.ones_like(ids)})
    with pytest.warns(DeprecationWarning, match="pass additional_forward_args, forward_kwargs by keyword"):
        old = nd.attribute(ids, 3, None, {"attention_mask": torch.ones_like(ids)})
    torch.testing.assert_close(old, expected)
    with pytest.warns(DeprecationWarning, match=r"input_ids= is now inputs="):
        result = nd.explain(input_ids=ids, target=[NextToken(3)])
    torch.testing.assert_close(result.contributions, expected)
    with pytest.warns(DeprecationWarning, match="positional use is deprecated"):
        steps = nd.attribute_steps(ids[:1], [3], [8])
    torch.testing.assert_close(steps, expected[:1])
    with pytest.warns(DeprecationWarning, match="positional use is deprecated"):
        NormDecomposition(model, "llama")
    with pytest.warns(DeprecationWarning, match="route='auto' is now route=None"):
        nd.attribute_components(ids, target=3, route="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new forms say nothing
        nd.attribute(ids, target=3)
        nd.attribute_components(ids, target=3)


def test_an_encoder_decoder_explain_target_takes_the_old_order():
    from tests.models import TINY_SEQ2SEQ

    model = TINY_SEQ2SEQ["marian"].build()
    nd = NormDecomposition(model)
    source = torch.tensor([[5, 6, 7, 8]])
    prefix = torch.tensor([[model.config.decoder_start_token_id, 9, 10]])
    tokens = torch.tensor([9, 10, 11])
    new = nd.explain_target(source, tokens, forward_kwargs={"decoder_input_ids": prefix})
    made = nd.explain_target(source, tokens)  # the decoder's input made from the target
    with pytest.warns(DeprecationWarning):
        old = nd.explain_target(source, prefix, tokens)
    for other in (made, old):
        torch.testing.assert_close(other.contributions, new.contributions)
    assert new.n_source == 4 and new.source.shape == (3, 4) and new.target.shape == (3, 3)


def test_a_text_target_needs_the_tokenizer(tmp_path):
    from tests.models import load_saved, save_tiny_lm

    loaded = load_saved(save_tiny_lm(tmp_path / "lm"))
    ids = loaded.tokenizer("the cat sat on the", return_tensors="pt").input_ids
    token = loaded.tokenizer.encode(" mat", add_special_tokens=False)
    if len(token) != 1:
        token = loaded.tokenizer.encode("mat", add_special_tokens=False)
    text = loaded.tokenizer.decode(token)
    by_id = NormDecomposition(loaded.model).attribute(ids, target=token[0])
    by_text = NormDecomposition(loaded.model, tokenizer=loaded.tokenizer).attribute(ids, target=text)
    torch.testing.assert_close(by_text, by_id)
    torch.testing.assert_close(NormDecomposition(loaded).attribute(ids, target=text), by_id)  # load_model's
    with pytest.raises(TypeError, match="give NormDecomposition\\(model, tokenizer=...\\)"):
        NormDecomposition(loaded.model).attribute(ids, target=text)
    # two tokens: the answer's teacher-forced log-probability (tests/attr/test_answers.py), over the
    # prompt and the answer's first token
    assert NormDecomposition(loaded).attribute(ids, target=f"{text} {text}").shape == (1, ids.shape[1] + 1)


def test_explain_generation_works_for_a_causal_lm_too():
    model = tiny_lm("llama")
    nd = NormDecomposition(model)
    prompt = torch.tensor([[5, 6, 7]])
    out = nd.explain_generation(prompt, max_new_tokens=3)
    assert out.tokens.numel() == 3 and out.n_source == 0
    assert float(out.delta.max()) < 1e-4
    forced = nd.explain_target(prompt, out.tokens)
    torch.testing.assert_close(forced.contributions, out.contributions)
    # the prompt's players and the earlier generated ones; the last generated token is read only
    assert out.contributions.shape == (3, 3 + 2)


# --------------------------------------------------------------------------- one writer id, one table
def _graph_model():
    model = tiny_task_model("llama")
    return NormDecomposition(model), token_ids()[:1, :7]


def test_one_writer_id_in_tables_graphs_and_patching():
    """The component table's names, the graph nodes' components (their id before ``@``), the
    patching estimates' and activation patching's components are one vocabulary."""
    from captum_ffb import activation_patching

    nd, ids = _graph_model()
    table = nd.attribute_components(ids, target=5, granularity="head")
    names = set(table.components)
    assert {"embeddings", "output_head", "block.0.attention.head.0", "block.0.ff"} <= names
    corrupted = ids.clone()
    corrupted[0, 2] = 11
    graph = nd.attribute_graph(ids, 5, prune=False, corrupted_inputs=corrupted)
    writers = [i for i, kind in zip(graph.ids(), graph.data.kinds) if kind in ("head", "ff")]
    assert writers and all("@" in i and i.split("@")[0] in names for i in writers)
    assert all(i.split("@")[1].isdigit() for i in writers)
    assert {i for i in graph.ids() if i.startswith("token")} == {f"token@{p}" for p in range(ids.shape[1])}
    assert set(graph.component_estimates()) <= names
    real = activation_patching(nd, ids, corrupted, 5, "head", show_progress=False)
    assert set(real.effects) <= names and set(real.effects) == set(graph.component_estimates())
    assert graph.to_dict()["nodes"][0]["id"] == graph.ids()[int(graph.node_mask.nonzero()[0])]


def test_one_granularity_table():
    from captum_ffb.cli.explain import GRANULARITIES as EXPLAIN
    from captum_ffb.cli.graph import GRANULARITIES as GRAPH
    from captum_ffb.core.vocabulary import FEATURE_GRANULARITIES, GRANULARITIES, check_granularity

    assert all(set(offered) <= set(GRANULARITIES) for offered in FEATURE_GRANULARITIES.values())
    assert tuple(EXPLAIN) == FEATURE_GRANULARITIES["components"] and tuple(GRAPH) == FEATURE_GRANULARITIES["graph"]
    from captum_ffb.attr.patching import PATCHING_GRANULARITIES

    assert tuple(PATCHING_GRANULARITIES) == FEATURE_GRANULARITIES["patching"]
    nd, ids = _graph_model()
    with pytest.raises(ValueError, match="granularity must be one of block, sublayer, head, got 'neuron'"):
        nd.attribute_components(ids, target=5, granularity="neuron")
    with pytest.raises(ValueError, match="granularity must be one of sublayer, head, neuron, got 'block'"):
        nd.attribute_graph(ids, 5, granularity="block")
    with pytest.raises(TypeError, match="granularity must be one of"):
        check_granularity(1, "graph")


def test_target_none_is_the_prediction_in_every_method():
    from captum_ffb import activation_patching

    nd, ids = _graph_model()
    predicted = int(nd.model(ids).logits[0, -1].argmax())
    torch.testing.assert_close(nd.attribute(ids), nd.attribute(ids, target=predicted))
    assert float(nd.attribute_components(ids).value[0]) == pytest.approx(
        float(nd.attribute_components(ids, target=predicted).value[0]))
    assert nd.attribute_graph(ids, prune=False).value == pytest.approx(
        nd.attribute_graph(ids, predicted, prune=False).value)
    corrupted = ids.flip(1)
    assert activation_patching(nd, ids, corrupted, show_progress=False).clean == pytest.approx(
        activation_patching(nd, ids, corrupted, predicted, show_progress=False).clean)
    assert int(nd.request(ids).target.indices[0, 0]) == predicted
    encoder = NormDecomposition(tiny_task_model("bert", "sequence_classification"))
    predicted_class = int(encoder.model(ids).logits[0].argmax())
    torch.testing.assert_close(encoder.attribute(ids), encoder.attribute(ids, target=predicted_class))


def test_the_corrupted_run_is_corrupted_inputs_and_the_old_name_forwards():
    from captum_ffb import activation_patching

    nd, ids = _graph_model()
    corrupted = ids.flip(1)
    new = nd.attribute_graph(ids, 5, prune=False, corrupted_inputs=corrupted)
    with pytest.warns(DeprecationWarning, match="baseline_inputs= is now corrupted_inputs="):
        old = nd.attribute_graph(ids, 5, prune=False, baseline_inputs=corrupted)
    torch.testing.assert_close(old.patch_estimates["default"], new.patch_estimates["default"])
    with pytest.warns(DeprecationWarning, match="baseline_inputs= is now corrupted_inputs="):
        old_real = activation_patching(nd, ids, target=5, baseline_inputs=corrupted, show_progress=False)
    assert old_real.effects == activation_patching(nd, ids, corrupted, 5, show_progress=False).effects
    with pytest.raises(ValueError, match="corrupted_inputs must have the inputs' shape"):
        nd.attribute_graph(ids, 5, corrupted_inputs=ids[:, :3])


def test_attribute_graph_has_a_real_signature():
    parameters = inspect.signature(NormDecomposition.attribute_graph).parameters
    assert not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    assert {"granularity", "prune", "node_threshold", "edge_threshold", "max_nodes", "corrupted_inputs",
            "forward_kwargs", "reference", "rules", "exact_above"} <= set(parameters)


def test_old_ids_and_names_still_work_and_warn():
    nd, ids = _graph_model()
    graph = nd.attribute_graph(ids, 5, prune=False)
    head = next(i for i, kind in zip(graph.ids(), graph.data.kinds) if kind == "head")
    layer, part, position = head.split(".")[1], head.split(".")[4].split("@")[0], head.split("@")[1]
    with pytest.warns(DeprecationWarning, match="ids are '<component>@<position>'"):
        assert graph.index(f"block.{layer}.head.{part}.{position}") == graph.index(head)
    with pytest.warns(DeprecationWarning):
        assert graph.index("token.0") == graph.index("token@0")
    table = nd.attribute_components(ids, target=5)
    with pytest.warns(DeprecationWarning, match="'head' is 'output_head' now"):
        assert table.components.index("head") == table.components.index("output_head")
    from captum_ffb import activation_patching

    effects = activation_patching(nd, ids, ids.flip(1), 5, show_progress=False).effects
    with pytest.warns(DeprecationWarning, match="'block.0.head.1' is 'block.0.attention.head.1'"):
        assert effects["block.0.head.1"] == effects["block.0.attention.head.1"]


def test_jobs_run_on_a_backend_and_the_old_name_forwards(tmp_path):
    from captum_ffb.cli import main
    from captum_ffb.jobs import run_job
    from tests.jobs.test_job import SquaresJob

    with pytest.warns(DeprecationWarning, match="engine= is now backend="):
        old = run_job(SquaresJob([1, 2]), tmp_path / "old", engine="local", show_progress=False)
    new = run_job(SquaresJob([1, 2]), tmp_path / "new", backend="local", show_progress=False)
    assert [s["squares"].tolist() for s in old] == [s["squares"].tolist() for s in new]
    parameters = inspect.signature(run_job).parameters
    assert "backend" in parameters and "engine" not in parameters
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])


def test_the_changelog_lists_every_rename():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "CHANGELOG.md").read_text(encoding="utf-8")
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    for old, new in [("baseline_inputs", "corrupted_inputs"), ("engine=", "backend="), ("--engine", "--backend"),
                     ("--baseline", "--corrupted"), ('"head"', '"output_head"'), ("block.3.head.2.5",
                     "block.3.attention.head.2@5"), ("attribution_graph(nd", "nd.attribute_graph"),
                     ("graph_text(baseline", "corrupted=")]:
        assert old in unreleased and new in unreleased, (old, new)


# --------------------------------------------------------------------------- every id a feature emits
@pytest.mark.parametrize("name", ["bert", "llama", "mixtral", "gptj"])
def test_every_component_id_a_table_emits_is_in_the_vocabulary(name):
    from captum_ffb import NormDecomposition
    from captum_ffb.core.vocabulary import form_of
    from tests.models import tiny_task_model, token_ids

    task = "sequence_classification" if name == "bert" else "causal_lm"
    nd = NormDecomposition(tiny_task_model(name, task))
    forms = set()
    for granularity in ("block", "sublayer", "head"):
        for component in nd.attribute_components(token_ids(1), target=2, granularity=granularity).components:
            forms.add(form_of(component))
    assert {"block", "writer", "part", "embeddings", "output_head"} <= forms
    graph = nd.attribute_graph(token_ids(1), target=2, granularity="neuron", prune=False, max_nodes=8)
    assert {form_of(node) for node in graph.ids()} == {"node"}


def test_an_id_outside_the_vocabulary_is_refused():
    from captum_ffb.core.vocabulary import form_of

    assert form_of("block.3.norm2") == "norm" and form_of("block.3.attention.bias") == "writer_bias"
    assert form_of("block.0.ff.expert.2") == "part" and form_of("token@4") == "node"
    for wrong in ("block.x.ff", "block.1.mlp", "layer.2.attention", "block.1.attention.head"):
        with pytest.raises(ValueError, match="no id of the vocabulary"):
            form_of(wrong)


def test_the_typed_key_round_trips_every_node_id():
    from captum_ffb.core.keys import Component, NodeId, NodeKind, WriterKind

    for text in ("token@3", "bias", "output", "block.2.ff@5", "block.1.attention.head.3@0", "block.0.ff.neuron.7@2",
                 "block.4.cross_attention@1"):
        node = NodeId.from_id(text)
        assert node.id == text and NodeId.from_id(node.id) == node
    head = NodeId.from_id("block.1.attention.head.3@0")
    assert head.kind is NodeKind.HEAD and head.kind == "head"
    assert head.component == Component(WriterKind.ATTENTION, 1, 3) and head.component.writer.id == "block.1.attention"
    with pytest.raises(ValueError, match="not a node id"):
        NodeId.from_id("block.1.attention")
    with pytest.raises(ValueError, match="parts are neurons"):
        Component.from_id("block.1.ff.head.2")
