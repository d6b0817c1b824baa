"""Private names of transformers and Captum are used in one module, captum_ffb/_private.py,
and still exist in the installed versions."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from captum_ffb import _private

PACKAGE = Path(__file__).resolve().parents[2] / "captum_ffb"
#: How the package reached private names of transformers and Captum before they moved.
PRIVATE = re.compile(
    r"\b_attn_implementation|\._attn_implementation|_global_mapping|captum\.attr\._|from captum\.[\w.]*\._|"
    r"modeling_gguf_pytorch_utils|eager_attention_forward|_convert_ids_to_pretty_tokens"
)
#: Files that may: the lxt worker runs in its own environment, without captum_ffb.
ELSEWHERE = {
    "_private.py",
    "evaluation/peers/attnlrp_worker.py",
}


def test_only_the_private_module_touches_private_names():
    found = [f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if str(path.relative_to(PACKAGE)) not in ELSEWHERE
             for number, line in enumerate(path.read_text().splitlines(), 1) if PRIVATE.search(line)]
    assert not found, "\n".join(found)


def test_attention_implementation_of_a_config():
    from transformers import LlamaConfig

    config = LlamaConfig()
    assert _private.has_attention_implementation(config)
    before = _private.get_attention_implementation(config)
    _private.set_attention_implementation(config, "eager")
    assert config._attn_implementation == "eager" == _private.get_attention_implementation(config)
    _private.set_attention_implementation(config, before)
    assert _private.get_attention_implementation(config) == before
    assert not _private.has_attention_implementation(object())


def test_the_modeling_file_eager_attention():
    from transformers.models.llama import modeling_llama

    from tests.models import TINY_MODELS

    attention = TINY_MODELS["llama"].build().layers[0].self_attn
    assert _private.model_eager_attention(attention) is modeling_llama.eager_attention_forward
    assert _private.model_eager_attention(torch.nn.Linear(2, 2)) is None


def test_the_private_attention_method_only_where_no_interface_exists():
    from tests.models import TINY_MODELS

    llama = TINY_MODELS["llama"].build().layers[0].self_attn
    assert _private.private_attention_method(llama, None) is None
    assert _private.private_attention_method(llama, "forward") is None  # it has the interface
    gptj = TINY_MODELS["gptj"].build().h[0].attn
    if _private.model_eager_attention(gptj) is None:  # transformers before 5.24
        assert _private.private_attention_method(gptj, "_attn") == "_attn"
        assert _private.private_attention_method(gptj, "_no_such_method") is None
    else:
        assert _private.private_attention_method(gptj, "_attn") is None


def test_the_gguf_progress_bar_is_hidden_then_restored():
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm
    with _private.hidden_gguf_progress_bar():
        assert gguf_utils.tqdm(range(2)).disable
    assert gguf_utils.tqdm is bar


def test_captum_names():
    from captum.attr import LLMAttribution, LLMGradientAttribution

    from captum_ffb.attr import LLMNormAttribution

    base = _private.llm_attribution_base()
    assert issubclass(LLMAttribution, base) and issubclass(LLMGradientAttribution, base)
    assert issubclass(LLMNormAttribution, base)
    from tests.models import causal_tokenizer

    tokenizer = causal_tokenizer()
    ids = tokenizer("the cat", add_special_tokens=False)["input_ids"]
    assert _private.pretty_tokens(ids, tokenizer) == tokenizer.convert_ids_to_tokens(ids)
