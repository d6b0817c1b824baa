"""The test suite's tiny models, in one place: a random model of every registered family,
the word-level tokenizers that fit them, saved model folders, and a GPT-2 set by hand to copy.

Fixtures live in the ``conftest.py`` files; what they build comes from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from captum_ffb.explained.models import LoadedModel

VOCAB = 60


@dataclass(frozen=True)
class TinyModel:
    """A factory for one tiny model, and where its blocks and sub-modules live."""

    name: str
    build: Callable[[], nn.Module]
    blocks: Callable[[nn.Module], nn.ModuleList]
    causal: bool
    # scope -> (path from the block, "input" | "output"), or a list of those to add up: the
    # real tensor the scope explains ("" is the block itself)
    references: dict[str, tuple[str, str] | list[tuple[str, str]]]
    final_norm: bool = False  # a norm after the last block (Pre-LN decoders)


def _seeded(factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        model = factory().eval()
        _randomise_norms(model)
        return model

    return build


def _randomise_norms(model: nn.Module) -> None:
    """Random γ and β (and MoE routers) so that every component is non-trivial."""
    with torch.no_grad():
        for module in model.modules():
            name = type(module).__name__
            if isinstance(module, nn.LayerNorm) and module.weight is not None:
                module.weight.uniform_(0.5, 1.5)
                if module.bias is not None:
                    module.bias.uniform_(-0.2, 0.2)
            elif name.endswith("RMSNorm") and getattr(module, "weight", None) is not None:
                module.weight.uniform_(0.5, 1.5)
            elif name.endswith("TopKRouter"):
                module.weight.normal_(0, 0.5)


def _bert_like(config_cls, model_cls, **extra) -> Callable[[], nn.Module]:
    def factory() -> nn.Module:
        config = config_cls(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, **extra,
        )
        return model_cls(config)

    return _seeded(factory)


POST_LN_REFS = {
    "Atb": ("attention.output.LayerNorm", "output"),
    "AtbFf": ("output.dense", "output"),
    "AtbFfRes": ("output.LayerNorm", "input"),
    "AtbFfResLn": ("", "output"),
}


def _needs_transformers(lowest: tuple[int, ...], factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """``factory``, skipping the test where the installed transformers is older than ``lowest``."""
    def build() -> nn.Module:
        import transformers
        from packaging.version import Version

        if Version(transformers.__version__).release < lowest:
            import pytest

            pytest.skip(f"the family needs transformers >= {'.'.join(map(str, lowest))}")
        return factory()

    return build


def tiny_models() -> list[TinyModel]:
    from transformers import (
        BertConfig,
        BertModel,
        CamembertConfig,
        CamembertModel,
        DistilBertConfig,
        DistilBertModel,
        ElectraConfig,
        ElectraModel,
        GPT2Config,
        GPT2Model,
        OPTConfig,
        OPTModel,
        RobertaConfig,
        RobertaModel,
        XLMRobertaConfig,
        XLMRobertaModel,
    )

    def modernbert() -> nn.Module:
        from transformers import ModernBertConfig, ModernBertModel

        return ModernBertModel(ModernBertConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, max_position_embeddings=64, global_attn_every_n_layers=2,
            local_attention=4, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
            sep_token_id=2, norm_bias=True, mlp_bias=True, attention_bias=True,
        ))

    def distilbert() -> nn.Module:
        return DistilBertModel(DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
            max_position_embeddings=64,
        ))

    def gpt2() -> nn.Module:
        return GPT2Model(GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
            bos_token_id=0, eos_token_id=0,
        ))

    def opt(pre: bool) -> Callable[[], nn.Module]:
        def factory() -> nn.Module:
            return OPTModel(OPTConfig(
                vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32,
                do_layer_norm_before=pre, pad_token_id=1, bos_token_id=0, eos_token_id=0,
            ))

        return factory

    pre_ln_gpt2 = {
        "Atb": ("ln_2", "input"), "AtbLn": ("ln_2", "output"),
        "AtbLnFf": ("mlp.c_proj", "output"), "AtbLnFfRes": ("", "output"),
    }
    pre_ln_opt = {
        "Atb": ("final_layer_norm", "input"), "AtbLn": ("final_layer_norm", "output"),
        "AtbLnFf": ("fc2", "output"), "AtbLnFfRes": ("", "output"),
    }
    post_ln_opt = {
        "Atb": ("self_attn_layer_norm", "output"), "AtbFf": ("fc2", "output"),
        "AtbFfRes": ("final_layer_norm", "input"), "AtbFfResLn": ("", "output"),
    }
    post_ln_distil = {
        "Atb": ("sa_layer_norm", "output"), "AtbFf": ("ffn.lin2", "output"),
        "AtbFfRes": ("output_layer_norm", "input"), "AtbFfResLn": ("", "output"),
    }
    llama_refs = {
        "Atb": ("post_attention_layernorm", "input"), "AtbLn": ("post_attention_layernorm", "output"),
        "AtbLnFf": ("mlp", "output"), "AtbLnFfRes": ("", "output"),
    }
    sandwich_refs = {
        "Atb": ("pre_feedforward_layernorm", "input"), "AtbLn": ("pre_feedforward_layernorm", "output"),
        "AtbLnFf": ("post_feedforward_layernorm", "output"), "AtbLnFfRes": ("", "output"),
    }

    def parallel_refs(attention: str, ff: str) -> dict:
        return {"Atb": [("", "input"), (attention, "output")], "LnFf": (ff, "output"), "AtbLnFfRes": ("", "output")}

    def decoder(config_cls, model_cls, **extra) -> Callable[[], nn.Module]:
        def factory() -> nn.Module:
            fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          pad_token_id=0, bos_token_id=0, eos_token_id=0)
            fields.update(extra)
            return model_cls(config_cls(**fields))

        return _seeded(factory)

    from transformers import (
        CohereConfig,
        CohereModel,
        Gemma2Config,
        Gemma2Model,
        Gemma3TextConfig,
        Gemma3TextModel,
        GemmaConfig,
        GemmaModel,
        GPTJConfig,
        GPTJModel,
        GPTNeoXConfig,
        GPTNeoXModel,
        GraniteConfig,
        GraniteModel,
        LlamaConfig,
        LlamaModel,
        MistralConfig,
        MistralModel,
        MixtralConfig,
        MixtralModel,
        Olmo2Config,
        Olmo2Model,
        OlmoConfig,
        OlmoModel,
        Phi3Config,
        Phi3Model,
        PhiConfig,
        PhiModel,
        Qwen2Config,
        Qwen2Model,
        Qwen2MoeConfig,
        Qwen2MoeModel,
        Qwen3Config,
        Qwen3Model,
        Qwen3MoeConfig,
        Qwen3MoeModel,
        Starcoder2Config,
        Starcoder2Model,
    )

    def gptj() -> nn.Module:
        return GPTJModel(GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                    n_positions=64, bos_token_id=0, eos_token_id=0))

    olmo2_refs = {
        "Atb": ("mlp", "input"), "AtbLn": ("mlp", "input"),
        "AtbLnFf": ("post_feedforward_layernorm", "output"), "AtbLnFfRes": ("", "output"),
    }
    modern = [
        TinyModel("llama", decoder(LlamaConfig, LlamaModel), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("mistral", decoder(MistralConfig, MistralModel, sliding_window=4), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("qwen2", decoder(Qwen2Config, Qwen2Model), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("qwen3", decoder(Qwen3Config, Qwen3Model, head_dim=8), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("granite", decoder(GraniteConfig, GraniteModel, residual_multiplier=0.5, embedding_multiplier=2.0, attention_multiplier=0.3, logits_scaling=4.0), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("starcoder2", decoder(Starcoder2Config, Starcoder2Model, sliding_window=4), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("gemma", decoder(GemmaConfig, GemmaModel, head_dim=8, num_key_value_heads=1, hidden_activation="gelu_pytorch_tanh"), lambda m: m.layers, True, llama_refs, final_norm=True),
        # eager, as transformers advises for Gemma 2: before 5.21 it ran sdpa by default, which drops the soft-capping
        TinyModel("gemma2", decoder(Gemma2Config, Gemma2Model, head_dim=8, sliding_window=4, attn_logit_softcapping=5.0, query_pre_attn_scalar=8, attn_implementation="eager"), lambda m: m.layers, True, sandwich_refs, final_norm=True),
        TinyModel("gemma3_text", decoder(Gemma3TextConfig, Gemma3TextModel, head_dim=8, sliding_window=4, query_pre_attn_scalar=8, layer_types=["sliding_attention", "full_attention"]), lambda m: m.layers, True, sandwich_refs, final_norm=True),
        TinyModel("gpt_neox", decoder(GPTNeoXConfig, GPTNeoXModel, rotary_pct=0.5, num_key_value_heads=None), lambda m: m.layers, True, parallel_refs("attention", "mlp"), final_norm=True),
        TinyModel("gpt_neox-sequential", decoder(GPTNeoXConfig, GPTNeoXModel, rotary_pct=0.5, num_key_value_heads=None, use_parallel_residual=False), lambda m: m.layers, True,
                  {"Atb": ("post_attention_layernorm", "input"), "AtbLn": ("post_attention_layernorm", "output"), "AtbLnFf": ("mlp", "output"), "AtbLnFfRes": ("", "output")}, final_norm=True),
        TinyModel("gptj", _seeded(gptj), lambda m: m.h, True, parallel_refs("attn", "mlp"), final_norm=True),
        TinyModel("cohere", decoder(CohereConfig, CohereModel, logit_scale=0.5, use_qk_norm=True), lambda m: m.layers, True, parallel_refs("self_attn", "mlp"), final_norm=True),
        TinyModel("phi", decoder(PhiConfig, PhiModel, partial_rotary_factor=0.5, num_key_value_heads=4), lambda m: m.layers, True, parallel_refs("self_attn", "mlp"), final_norm=True),
        TinyModel("phi3", decoder(Phi3Config, Phi3Model, head_dim=8, num_key_value_heads=2, pad_token_id=0), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("olmo", decoder(OlmoConfig, OlmoModel), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("olmo2", decoder(Olmo2Config, Olmo2Model), lambda m: m.layers, True, olmo2_refs, final_norm=True),
        TinyModel("mixtral", decoder(MixtralConfig, MixtralModel, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("qwen2_moe", decoder(Qwen2MoeConfig, Qwen2MoeModel, moe_intermediate_size=24, shared_expert_intermediate_size=40, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1]), lambda m: m.layers, True, llama_refs, final_norm=True),
        TinyModel("qwen3_moe", decoder(Qwen3MoeConfig, Qwen3MoeModel, head_dim=8, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1]), lambda m: m.layers, True, llama_refs, final_norm=True),
    ]
    def bloom() -> nn.Module:
        from transformers import BloomConfig, BloomModel

        return BloomModel(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4,
                                      pad_token_id=0, bos_token_id=0, eos_token_id=0))

    def deberta_v2() -> nn.Module:
        from transformers import DebertaV2Config, DebertaV2Model

        return DebertaV2Model(DebertaV2Config(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, type_vocab_size=0, relative_attention=True, position_buckets=8,
            max_relative_positions=16, pos_att_type=["p2c", "c2p"], position_biased_input=False,
            norm_rel_ebd="layer_norm", share_att_key=True, pad_token_id=0,
        ))

    modern.append(TinyModel("deberta-v2", _seeded(deberta_v2), lambda m: m.encoder.layer, False, POST_LN_REFS))
    def falcon(**layout) -> Callable[[], nn.Module]:
        def factory() -> nn.Module:
            from transformers import FalconConfig, FalconModel

            fields = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          pad_token_id=0, bos_token_id=0, eos_token_id=0, bias=True, max_position_embeddings=64)
            return FalconModel(FalconConfig(**{**fields, **layout}))

        return _seeded(factory)

    falcon_sequential = {"Atb": ("post_attention_layernorm", "input"), "AtbLn": ("post_attention_layernorm", "output"),
                         "AtbLnFf": ("mlp", "output"), "AtbLnFfRes": ("", "output")}
    modern += [
        # Falcon-7B's layout: parallel, one LayerNorm, multi-query, rotary
        TinyModel("falcon", falcon(parallel_attn=True, multi_query=True, alibi=False), lambda m: m.h, True,
                  parallel_refs("self_attention.dense", "mlp"), final_norm=True),
        # Falcon-RW's: sequential Pre-LN, ALiBi, one key/value per head
        TinyModel("falcon-sequential", falcon(parallel_attn=False, multi_query=False, alibi=True,
                                              attn_implementation="eager"), lambda m: m.h, True,
                  falcon_sequential, final_norm=True),
        # the new architecture (Falcon-40B, Falcon 2): grouped keys/values, two LayerNorms
        TinyModel("falcon-new", falcon(new_decoder_architecture=True, num_kv_heads=2, alibi=False), lambda m: m.h, True,
                  parallel_refs("self_attention.dense", "mlp"), final_norm=True),
    ]
    modern.append(TinyModel("bloom", _seeded(bloom), lambda m: m.h, True, {
        "Atb": ("post_attention_layernorm", "input"), "AtbLn": ("post_attention_layernorm", "output"),
        "AtbLnFf": ("mlp.dense_4h_to_h", "output"), "AtbLnFfRes": ("", "output")}, final_norm=True))
    return modern + [
        TinyModel("bert", _bert_like(BertConfig, BertModel), lambda m: m.encoder.layer, False, POST_LN_REFS),
        TinyModel("roberta", _bert_like(RobertaConfig, RobertaModel, pad_token_id=1), lambda m: m.encoder.layer, False, POST_LN_REFS),
        TinyModel("xlm-roberta", _bert_like(XLMRobertaConfig, XLMRobertaModel, pad_token_id=1), lambda m: m.encoder.layer, False, POST_LN_REFS),
        TinyModel("camembert", _bert_like(CamembertConfig, CamembertModel, pad_token_id=1), lambda m: m.encoder.layer, False, POST_LN_REFS),
        TinyModel("electra", _bert_like(ElectraConfig, ElectraModel, embedding_size=32), lambda m: m.encoder.layer, False, POST_LN_REFS),
        TinyModel("modernbert", _needs_transformers((5, 1), _seeded(modernbert)), lambda m: m.layers, False,
                  {"Atb": ("mlp_norm", "input"), "AtbLn": ("mlp_norm", "output"), "AtbLnFf": ("mlp", "output"),
                   "AtbLnFfRes": ("", "output")}, final_norm=True),
        TinyModel("distilbert", _seeded(distilbert), lambda m: m.transformer.layer, False, post_ln_distil),
        TinyModel("gpt2", _seeded(gpt2), lambda m: m.h, True, pre_ln_gpt2, final_norm=True),
        TinyModel("opt", _seeded(opt(True)), lambda m: m.decoder.layers, True, pre_ln_opt, final_norm=True),
        TinyModel("opt-post-ln", _seeded(opt(False)), lambda m: m.decoder.layers, True, post_ln_opt),
    ]


TINY_MODELS = {model.name: model for model in tiny_models()}
#: Families whose attention computes its probabilities inline (no attention interface): their
#: queries and keys cannot be read, so rules crediting them are refused (a clear error).
INLINE_ATTENTION = {"bloom", "deberta-v2", "falcon", "falcon-sequential", "falcon-new"}


def tiny_task_model(name: str, task: str = "causal_lm", num_labels: int = 3) -> nn.Module:
    """The tiny model ``name`` with a head (``"causal_lm"`` or ``"sequence_classification"``),
    norms and every bias randomised so that the bias player is not trivially zero."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = TINY_MODELS[name].build().config
    torch.manual_seed(0)
    if task == "causal_lm":
        model = AutoModelForCausalLM.from_config(config)
    else:
        config.num_labels = num_labels
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = 0
        try:
            model = AutoModelForSequenceClassification.from_config(config)
        except ValueError:  # a family whose classifier the installed transformers lacks (OLMo < 5.x)
            import pytest
            import transformers

            pytest.skip(f"transformers {transformers.__version__} has no {type(config).__name__} classifier")
    model.eval()
    _randomise_norms(model)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.1)
    return model


def token_ids(batch: int = 2, n: int = 9, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, n), generator=generator)


def padded_pair(side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, slice]:
    """Two sequences of 7 token ids whose second row is 4 real tokens padded on ``side``
    ("left" or "right"): ``(padded ids, attention mask, those 4 ids alone (1, 4), the real
    columns of the second row)``."""
    ids = token_ids(batch=2, n=7)
    short = ids[1:, :4]
    padded = ids.clone()
    mask = torch.ones_like(ids)
    if side == "right":
        padded[1, 4:] = 0
        mask[1, 4:] = 0
        return padded, mask, short, slice(0, 4)
    padded[1] = torch.cat([torch.zeros(3, dtype=ids.dtype), short[0]])
    mask[1, :3] = 0
    return padded, mask, short, slice(3, 7)


def capture_references(model: nn.Module, block: nn.Module, refs: dict[str, tuple[str, str]], **forward_kwargs) -> dict[str, torch.Tensor]:
    """The real tensor behind each scope, taken with the test's own hooks."""
    found: dict[tuple[str, str], torch.Tensor] = {}
    handles = []
    sources = {scope: ([ref] if isinstance(ref, tuple) else list(ref)) for scope, ref in refs.items()}
    for path, which in {src for srcs in sources.values() for src in srcs}:
        module = block.get_submodule(path) if path else block

        def hook(mod, args, kwargs, output, key=(path, which)):
            value = (args[0] if args else kwargs["hidden_states"]) if key[1] == "input" else output
            value = value[0] if isinstance(value, tuple) else value
            found.setdefault(key, value.detach().clone())  # a copy: Falcon adds to its MLP's output in place

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(**forward_kwargs)
    finally:
        for handle in handles:
            handle.remove()
    batch = forward_kwargs["input_ids"].shape[0]
    return {
        scope: sum(found[src].reshape(batch, -1, found[src].shape[-1]) for src in srcs)
        for scope, srcs in sources.items()
    }


# --- WordPiece tokenizers over a few words, and the tiny models with them ---------------------

#: The words of the default WordPiece vocabulary (viz, command-line and evaluation tests).
WORDS = (
    "the cat sat on mat because it was tired . tokyo is capital of she loves math rather "
    "than engaging in a dog , hello world and big small red blue green run fast slow"
).split()
#: BERT's special tokens, first in every WordPiece vocabulary here.
WORDPIECE_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def wordpiece_tokenizer(words: Sequence[str] | None = None, folder: Path | None = None):
    """A BERT WordPiece tokenizer over :data:`WORDPIECE_SPECIAL` and ``words`` (default: the
    sorted :data:`WORDS`), whose vocabulary fits the tiny models (< VOCAB ids); saved in
    ``folder`` when one is given."""
    from transformers import BertTokenizer

    vocab = WORDPIECE_SPECIAL + (sorted(set(WORDS)) if words is None else list(words))
    assert len(vocab) <= VOCAB
    tokenizer = BertTokenizer(vocab={word: k for k, word in enumerate(vocab)}, do_lower_case=True)
    if folder is not None:
        tokenizer.save_pretrained(folder)
    return tokenizer


def tiny_loaded(name: str, tokenizer=None) -> LoadedModel:
    """The tiny model ``name`` with ``tokenizer`` (default: :func:`wordpiece_tokenizer`)."""
    torch.manual_seed(0)
    model = TINY_MODELS[name].build()
    return LoadedModel(model, wordpiece_tokenizer() if tokenizer is None else tokenizer,
                       f"tiny-{name}")


def save_tiny(name: str, folder: Path) -> Path:
    """Save the tiny model and its tokenizer as a model folder that ``load_model`` reads."""
    loaded = tiny_loaded(name)
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder


# --- A small corpus and the WordPiece vocabulary that reads it (the corpus analyses) ----------

CORPUS_WORDS = [
    "the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "table", "red", "blue",
    "big", "small", "and", "or", "it", "was", "is", "very", "old", "new", "house", "tree",
    "river", "bank", "sun", "moon", "light", "dark", "walk", "##s", "##ed", "##ing", "to",
    "from", "of", "in", "by", "with", "happy", "sad", "quick", "slow", "bird", "fish",
    "green", "black", "white", "cold", "hot", "day", "night", ".", ",",
]
assert len(WORDPIECE_SPECIAL) + len(CORPUS_WORDS) <= VOCAB

#: Lines of a corpus file: blank ones, and one longer than the others.
CORPUS_LINES = [
    "the cat sat on the mat .",
    "a dog ran under the table",
    "",
    "the big red house was very old .",
    "a small bird sat in the tree , and it was happy",
    "   ",
    "the river bank was dark and cold at night",
    "the quick dog walked to the river",
    "sun and moon , light and dark , day and night , hot and cold , black and white , big and small , quick and slow , happy and sad , old and new , red and blue and green",
    "the fish was slow",
    "a happy cat",
]


def corpus_tokenizer(folder: Path):
    """A WordPiece tokenizer over ``WORDPIECE_SPECIAL + CORPUS_WORDS`` (saved in ``folder``)."""
    return wordpiece_tokenizer(CORPUS_WORDS, folder)


# --- A tiny causal LM with a GPT-style word-level tokenizer -----------------------------------
# No [CLS]/[SEP] added, every model id decodes to its own word: for the generation, Captum-LLM
# and inseq tests.

LM_SPECIAL = ["<pad>", "<unk>", "<s>", "</s>"]
PAD, UNK, BOS, EOS = range(4)


def lm_vocabulary() -> list[str]:
    """The special tokens, the :data:`WORDS` and fillers up to the models' VOCAB."""
    words = LM_SPECIAL + sorted(set(WORDS))
    words += [f"w{k}" for k in range(VOCAB - len(words))]
    assert len(words) == VOCAB
    return words


def causal_tokenizer(bos: bool = False):
    """A fast word-level tokenizer over :func:`lm_vocabulary` (whitespace-split, offsets
    available); with ``bos``, ``<s>`` is put in front of every text (as Llama tokenizers do)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={w: k for k, w in enumerate(lm_vocabulary())}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")


def byte_level_tokenizer():
    """A fast GPT-2-style tokenizer: byte-level pre-tokenisation (a space before a word is
    written ``Ġ``, a line break ``Ċ``) over whole words, with the byte-level decoder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(dict.fromkeys(WORDS))
    vocab = LM_SPECIAL + ["Ċ"] + [w for word in words for w in (word, "Ġ" + word)]
    vocab = vocab[:VOCAB]
    core = Tokenizer(models.WordLevel(vocab={w: k for k, w in enumerate(vocab)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")


def tiny_lm(name: str = "llama") -> nn.Module:
    """The tiny ``*ForCausalLM`` ``name`` with the tokenizer's special ids."""
    model = tiny_task_model(name, "causal_lm")
    for config in (model.config, model.generation_config):
        config.pad_token_id, config.bos_token_id, config.eos_token_id = PAD, BOS, EOS
    return model


def save_tiny_classifier(folder: Path, num_labels: int = 3) -> Path:
    """A tiny BERT sequence classifier and a word-piece tokenizer saved in ``folder``."""
    tiny_task_model("bert", "sequence_classification", num_labels=num_labels).save_pretrained(folder)
    wordpiece_tokenizer().save_pretrained(folder)
    return folder


def load_saved(folder: Path) -> LoadedModel:
    """A saved tiny model loaded as the CLI loads it (its task from its configuration)."""
    from captum_ffb.explained.models import load_model, model_config, task_from_config

    config = model_config(str(folder))
    return load_model(str(folder), show_progress=False, config=config, task=task_from_config(config))


def save_tiny_lm(folder: Path, name: str = "llama", byte_level: bool = False) -> Path:
    """The tiny LM and its tokenizer (with ``byte_level``, :func:`byte_level_tokenizer`) saved
    as a model folder."""
    tiny_lm(name).save_pretrained(folder)
    (byte_level_tokenizer() if byte_level else causal_tokenizer()).save_pretrained(folder)
    return folder


def save_tiny_gguf(folder: Path, name: str = "tiny.gguf", seed: int = 0) -> Path:
    """A tiny Llama written as a GGUF file (float32 tensors, a byte-level BPE vocabulary of
    64 tokens) in ``folder``; returns the folder (``load_model`` finds the file there)."""
    import gguf
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    vocab, d, ff, layers, heads, kv_heads = 64, 16, 32, 2, 4, 2
    writer = gguf.GGUFWriter(str(folder / name), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(d)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = ["<s>", "</s>", "Ġ", *letters, *("Ġ" + c for c in letters)]
    tokens += [f"x{k}" for k in range(vocab - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3] + [1] * (vocab - 2))
    writer.add_token_merges([f"Ġ {c}" for c in letters])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    rng = np.random.default_rng(seed)
    shapes = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,)}
    for k in range(layers):
        shapes.update({f"blk.{k}.attn_norm.weight": (d,), f"blk.{k}.attn_q.weight": (d, d),
                       f"blk.{k}.attn_k.weight": (d // heads * kv_heads, d),
                       f"blk.{k}.attn_v.weight": (d // heads * kv_heads, d), f"blk.{k}.attn_output.weight": (d, d),
                       f"blk.{k}.ffn_norm.weight": (d,), f"blk.{k}.ffn_gate.weight": (ff, d),
                       f"blk.{k}.ffn_up.weight": (ff, d), f"blk.{k}.ffn_down.weight": (d, ff)})
    for tensor, shape in shapes.items():
        writer.add_tensor(tensor, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return folder


# --- A GPT-2 whose weights copy (induction), for the copy task ---------------------------------


def induction_gpt2(vocab: int = 16, positions: int = 32, sharpness: float = 30.0) -> nn.Module:
    """A 2-layer GPT-2 whose weights are set by hand to copy (an induction circuit).

    The residual stream has four blocks of coordinates: the token (one-hot), the position
    (one-hot), the previous token (written by layer 1) and the output (written by layer 2).
    Layer 1's head attends from ``i`` to ``i − 1`` (positions) and copies that token into the
    previous-token block; layer 2's head attends from ``i`` to every ``j`` whose previous token
    is token ``i`` and copies token ``j`` into the output block, which the unembedding reads.
    The feed-forward layers are zero, the norms plain (γ = 1, β = 0).
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    token, position, previous, output = 0, vocab, vocab + positions, 2 * vocab + positions
    d = 3 * vocab + positions
    config = GPT2Config(vocab_size=vocab, n_embd=d, n_layer=2, n_head=1, n_positions=positions,
                        n_inner=4, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = GPT2LMHeadModel(config).eval()
    scale = sharpness * d ** 0.5  # undo the 1/√d of the scores
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
        wte = model.transformer.wte.weight
        wpe = model.transformer.wpe.weight
        for t in range(vocab):
            wte[t, token + t] = 1.0
        for p in range(positions):
            wpe[p, position + p] = 1.0
        first, second = model.transformer.h
        # c_attn is a Conv1D: weight (d, 3d) = [W_Q | W_K | W_V]
        w = first.attn.c_attn.weight
        for p in range(positions - 1):
            w[position + p + 1, p] = scale          # query of position i: coordinate i − 1 …
            w[position + p, d + p] = 1.0             # … key of position j: coordinate j
        for t in range(vocab):
            w[token + t, 2 * d + previous + t] = 1.0  # value: the token, into the previous block
            first.attn.c_proj.weight[previous + t, previous + t] = 1.0
        w = second.attn.c_attn.weight
        for t in range(vocab):
            w[token + t, t] = scale                  # query: the current token
            w[previous + t, d + t] = 1.0             # key: the previous token
            w[token + t, 2 * d + output + t] = 1.0   # value: the token, into the output block
            second.attn.c_proj.weight[output + t, output + t] = 1.0
            model.lm_head.weight[t, output + t] = 10.0
    return model


# --------------------------------------------------------------------------- encoder–decoders
@dataclass(frozen=True)
class TinySeq2Seq:
    """A factory for one tiny encoder–decoder (with its LM head) and where its stacks live.

    ``audio``: the source is ``input_features`` (Whisper's log-mel frames), not token ids.
    """

    name: str
    build: Callable[[], nn.Module]
    encoder_blocks: Callable[[nn.Module], nn.ModuleList]
    decoder_blocks: Callable[[nn.Module], nn.ModuleList]
    audio: bool = False


def _seq2seq_factory(config_cls, model_cls, **extra) -> Callable[[], nn.Module]:
    def factory() -> nn.Module:
        config = config_cls(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, **extra,
        )
        model = model_cls(config)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(0, 0.1)
        return model

    return _seeded(factory)


def _t5_factory(config_cls, model_cls, feed_forward: str) -> Callable[[], nn.Module]:
    def factory() -> nn.Module:
        config = config_cls(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
            feed_forward_proj=feed_forward, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
            relative_attention_num_buckets=8, relative_attention_max_distance=16,
        )
        return model_cls(config)

    return _seeded(factory)


def _whisper() -> nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48,
        max_source_positions=8, max_target_positions=32, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1,
    )
    return WhisperForConditionalGeneration(config)


def tiny_seq2seq_models() -> list[TinySeq2Seq]:
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        M2M100Config,
        M2M100ForConditionalGeneration,
        MarianConfig,
        MarianMTModel,
        MBartConfig,
        MBartForConditionalGeneration,
        MT5Config,
        MT5ForConditionalGeneration,
        T5Config,
        T5ForConditionalGeneration,
        UMT5Config,
        UMT5ForConditionalGeneration,
    )

    fairseq = (lambda m: m.model.encoder.layers, lambda m: m.model.decoder.layers)
    t5 = (lambda m: m.encoder.block, lambda m: m.decoder.block)
    return [
        TinySeq2Seq("bart", _seq2seq_factory(BartConfig, BartForConditionalGeneration), *fairseq),
        TinySeq2Seq("mbart", _seq2seq_factory(MBartConfig, MBartForConditionalGeneration), *fairseq),
        TinySeq2Seq("marian", _seq2seq_factory(MarianConfig, MarianMTModel), *fairseq),
        TinySeq2Seq("m2m_100", _seq2seq_factory(M2M100Config, M2M100ForConditionalGeneration), *fairseq),
        TinySeq2Seq("t5", _t5_factory(T5Config, T5ForConditionalGeneration, "relu"), *t5),
        TinySeq2Seq("t5-gated", _t5_factory(T5Config, T5ForConditionalGeneration, "gated-gelu"), *t5),
        TinySeq2Seq("mt5", _t5_factory(MT5Config, MT5ForConditionalGeneration, "gated-gelu"), *t5),
        TinySeq2Seq("umt5", _t5_factory(UMT5Config, UMT5ForConditionalGeneration, "gated-gelu"), *t5),
        TinySeq2Seq("whisper", _seeded(_whisper), *fairseq, audio=True),
    ]


TINY_SEQ2SEQ = {model.name: model for model in tiny_seq2seq_models()}


def split_source(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(the source: input_ids or Whisper's input_features, the other keyword arguments)``."""
    kwargs = dict(inputs)
    first = kwargs.pop("input_features", None)
    return (kwargs.pop("input_ids") if first is None else first), kwargs


def seq2seq_inputs(model: TinySeq2Seq, n_source: int = 7, n_target: int = 5) -> dict[str, torch.Tensor]:
    """A batch of two: the second source padded on the right by 2 (token sources), the second
    target padded on the right by 1; as keyword arguments of the model's forward."""
    generator = torch.Generator().manual_seed(3)
    target = torch.randint(3, VOCAB, (2, n_target), generator=generator)
    target_mask = torch.ones_like(target)
    target[1, -1] = 0
    target_mask[1, -1] = 0
    if model.audio:
        features = torch.randn(2, 8, 16, generator=generator)  # 16 mel frames → 8 source positions
        return {"input_features": features, "decoder_input_ids": target, "decoder_attention_mask": target_mask}
    source = torch.randint(3, VOCAB, (2, n_source), generator=generator)
    source_mask = torch.ones_like(source)
    source[1, -2:] = 0
    source_mask[1, -2:] = 0
    return {"input_ids": source, "attention_mask": source_mask, "decoder_input_ids": target,
            "decoder_attention_mask": target_mask}


def seq2seq_tokenizer():
    """:func:`causal_tokenizer` that ends every text with ``</s>`` (as translation tokenizers do)."""
    from tokenizers import processors

    tokenizer = causal_tokenizer()
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", EOS)])
    return tokenizer


def save_tiny_whisper(folder: Path) -> Path:
    """The tiny Whisper with :func:`seq2seq_tokenizer` and a feature extractor that turns 10 s
    of audio into its 16 frames of 8 mel bins, saved as a folder."""
    from transformers import WhisperFeatureExtractor

    TINY_SEQ2SEQ["whisper"].build().save_pretrained(folder)
    seq2seq_tokenizer().save_pretrained(folder)
    WhisperFeatureExtractor(feature_size=8, sampling_rate=16000, hop_length=10000, chunk_length=10,
                            n_fft=400).save_pretrained(folder)
    return folder


def write_wav(path: Path, seconds: float, rate: int = 16000) -> Path:
    """A 220 Hz tone of ``seconds`` as a 16-bit mono WAV file."""
    import wave

    import numpy as np

    times = np.arange(int(rate * seconds)) / rate
    samples = (0.1 * np.sin(2 * np.pi * 220 * times) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(samples.tobytes())
    return path


def save_tiny_seq2seq(folder: Path, name: str = "marian") -> Path:
    """The tiny encoder–decoder ``name`` with the tokenizer's special ids (the decoder starts
    from ``<pad>``, as Marian and T5 do), and :func:`seq2seq_tokenizer`, saved as a folder."""
    model = TINY_SEQ2SEQ[name].build()
    for config in (model.config, model.generation_config):
        config.pad_token_id, config.bos_token_id, config.eos_token_id = PAD, BOS, EOS
        config.decoder_start_token_id = PAD
    model.save_pretrained(folder)
    seq2seq_tokenizer().save_pretrained(folder)
    return folder
