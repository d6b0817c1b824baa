"""Model knowledge lives in the spec: blocks, final norm, causality, ε; one capture pass."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

import captum_ffb
from captum_ffb import LayerNormDecomposition, get_architecture
from captum_ffb.architectures import ArchitectureSpec, Projection
from captum_ffb.engine import final_norm_of, find_blocks, next_norms, norm_parameters
from tests.models import TINY_MODELS, token_ids

NAMES = sorted(TINY_MODELS)


def _family(name: str) -> str:
    return name.split("-post-ln")[0].split("-sequential")[0]


def _task_model(base: nn.Module, causal: bool) -> nn.Module:
    auto = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    torch.manual_seed(0)
    return auto.from_config(base.config)


@pytest.mark.parametrize("name", NAMES)
def test_find_blocks_on_base_and_task_models(name):
    tiny = TINY_MODELS[name]
    base = tiny.build()
    assert find_blocks(base) is tiny.blocks(base)
    wrapped = _task_model(base, tiny.causal)
    blocks = find_blocks(wrapped)
    assert blocks is tiny.blocks(wrapped.base_model)
    assert len(blocks) == len(tiny.blocks(base))


def _norm_reading_last_block(model: nn.Module, blocks: nn.ModuleList) -> nn.Module | None:
    """Found the slow way: the norm outside the blocks whose input is the last block's output."""
    inside = {id(m) for block in blocks for m in block.modules()}
    seen: dict[str, torch.Tensor] = {}

    def keep(key: str, which: str):
        def hook(module, args, output) -> None:  # returns nothing: the output stays
            value = args[0] if which == "input" else output
            seen.setdefault(key, value[0] if isinstance(value, tuple) else value)

        return hook

    handles = [blocks[-1].register_forward_hook(keep("last", "output"))]
    candidates = [m for m in model.modules()
                  if "norm" in type(m).__name__.lower() and id(m) not in inside]
    for k, module in enumerate(candidates):
        handles.append(module.register_forward_hook(keep(f"norm{k}", "input")))
    with torch.no_grad():
        model(input_ids=token_ids())
    for handle in handles:
        handle.remove()
    for k, module in enumerate(candidates):
        if f"norm{k}" in seen and torch.equal(seen[f"norm{k}"], seen["last"]):
            return module
    return None


@pytest.mark.parametrize("name", NAMES)
def test_final_norm_and_next_norms_from_the_spec(name):
    tiny = TINY_MODELS[name]
    model = tiny.build()
    spec = get_architecture(model.config.model_type)
    blocks = tiny.blocks(model)
    expected = _norm_reading_last_block(model, blocks)
    assert final_norm_of(model, spec) is expected
    assert (expected is not None) == tiny.final_norm
    following = next_norms(model, spec, list(blocks))
    assert following[-1] is expected
    if spec.norm1 is not None:
        assert following[0] is blocks[1].get_submodule(spec.norm1)


@pytest.mark.parametrize("name", NAMES)
def test_causality_comes_from_the_spec(name):
    tiny = TINY_MODELS[name]
    model = tiny.build()
    assert get_architecture(model.config.model_type).is_causal(model.config) == tiny.causal


def test_a_bert_decoder_is_causal():
    from transformers import BertConfig

    spec = get_architecture("bert")
    assert not spec.is_causal(BertConfig())
    assert spec.is_causal(BertConfig(is_decoder=True))


def test_eps_is_read_from_the_module_the_spec_or_the_config_never_guessed():
    olmo = TINY_MODELS["olmo"].build()
    norm = olmo.layers[0].input_layernorm
    assert not hasattr(norm, "eps")
    spec = get_architecture("olmo")
    assert norm_parameters(norm, spec, olmo.config)[2] == 1e-5  # from the spec: OLMo's code
    llama = TINY_MODELS["llama"].build()
    llama_spec = get_architecture("llama")
    assert norm_parameters(llama.layers[0].input_layernorm, llama_spec, None)[2] == llama.config.rms_norm_eps

    class NoEpsNorm(nn.Module):
        weight = None

    bare = ArchitectureSpec(chain="pre_ln", attention="a", value=Projection("v"),
                            attention_output=Projection("o"), norm1="n1", norm2="n2",
                            ff_in=Projection("i"), activation="g", ff_out=Projection("o"))
    assert norm_parameters(NoEpsNorm(), bare, type("C", (), {"layer_norm_eps": 1e-7})())[2] == 1e-7
    with pytest.raises(ValueError, match="cannot read the ε of NoEpsNorm"):
        norm_parameters(NoEpsNorm(), bare, None)


def test_olmo_value_clipping_is_refused():
    from transformers import OlmoConfig, OlmoModel

    model = OlmoModel(OlmoConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, clip_qkv=8.0, pad_token_id=0))
    with pytest.raises(ValueError, match="clip_qkv"):
        LayerNormDecomposition(model, model.layers[0])


def test_one_forward_pass_serves_every_layer_and_scope():
    tiny = TINY_MODELS["gpt2"]
    model = tiny.build()
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        lnd = LayerNormDecomposition(model, list(tiny.blocks(model)))
        results = list(lnd.iter_layers(token_ids(), scope=[*lnd.scopes, "AtbLnFfResLn"],
                                       convergence_delta=True))
    finally:
        handle.remove()
    assert len(calls) == 1 and len(results) == 2
    for _, result in results:
        assert set(result.decompositions) == {*lnd.scopes, "AtbLnFfResLn"}
        assert float(result.delta["AtbLnFfResLn"].max()) < 1e-4


def test_compute_convergence_delta_checks_given_decompositions():
    tiny = TINY_MODELS["bert"]
    model = tiny.build()
    layer = tiny.blocks(model)[0]
    ids = token_ids()
    lnd = LayerNormDecomposition(model, layer)
    dec, delta = lnd.decompose(ids, scope="AtbFf", return_convergence_delta=True)
    torch.testing.assert_close(lnd.compute_convergence_delta(dec, ids, scope="AtbFf"), delta)
    shifted = captum_ffb.Decomposition(dec.terms, dec.bias + 0.5)
    torch.testing.assert_close(lnd.compute_convergence_delta(shifted, ids, scope="AtbFf"),
                               delta + 0.5, atol=1e-5, rtol=0)


def test_a_padded_batch_without_an_attention_mask_warns():
    tiny = TINY_MODELS["llama"]
    model = tiny.build()  # pad_token_id = 0
    lnd = LayerNormDecomposition(model, model.layers[0])
    ids = token_ids()
    ids[1, -2:] = 0
    with pytest.warns(UserWarning, match="pad token"):
        lnd.attribute(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lnd.attribute(ids, forward_kwargs={"attention_mask": (ids != 0).long()})
        lnd.attribute(token_ids())


def _imports(path: Path, package: Path) -> set[str]:
    """The captum_ffb modules a file imports at module level (not inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("captum_ffb"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("captum_ffb"))
    return found


def test_no_import_cycles_between_modules():
    package = Path(captum_ffb.__file__).parent
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {
        name: {m for m in _imports(path, package) if m in modules and m != name}
        for name, path in modules.items()
    }
    # a package's __init__ re-exports its own modules: edges into a package's own children
    # are part of defining it, not a cycle
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " → ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
