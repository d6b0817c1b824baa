"""One vocabulary for every entry point: the public signatures of the attributions use the
same names (Captum's where Captum has one), everything after ``(inputs, target)`` is
keyword-only, and the old calls still work for one release with a ``DeprecationWarning``."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from captum_ffb import LayerNormDecomposition, LLMNormAttribution, NormDecomposition
from captum_ffb.readouts import NextToken
from tests.models import tiny_lm, tiny_task_model, token_ids

#: Captum's names, then ours, then each method's own (documented) options.
CAPTUM = {"inputs", "target", "additional_forward_args", "forward_kwargs", "baselines", "internal_batch_size",
          "return_convergence_delta", "inp", "gen_args", "forward_func", "layer", "device_ids"}
OURS = {"reference", "route", "rules", "granularity", "return_bias", "feature_mask", "target_position",
        "players", "scope", "relative_delta", "input_decomposition", "maps", "check", "max_new_tokens",
        "decompositions", "convergence_delta", "tokenizer", "model_type", "memory_budget", "dtype",
        "show_progress"}
#: The words the review found for the same concepts, now gone from every signature.
RETIRED = {"input_ids", "tokens", "targets", "readouts", "positions", "decoder_input_ids"}

METHODS = [
    (NormDecomposition, "__init__", 1),
    (NormDecomposition, "attribute", 2),
    (NormDecomposition, "attribute_components", 2),
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
    with pytest.raises(ValueError, match="is 2 tokens for this tokenizer"):
        NormDecomposition(loaded).attribute(ids, target=f"{text} {text}")


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
