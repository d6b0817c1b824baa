"""A tiny random causal LM with a GPT-style word-level tokenizer (no [CLS]/[SEP] added, every
model id decodes to its own word), for the generation, Captum-LLM and inseq tests."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tests.models import VOCAB, tiny_task_model
from tests.viz.tiny import WORDS

SPECIAL = ["<pad>", "<unk>", "<s>", "</s>"]
PAD, UNK, BOS, EOS = range(4)


def vocabulary() -> list[str]:
    """The special tokens, the words of ``tests.viz.tiny`` and fillers up to the models' VOCAB."""
    words = SPECIAL + sorted(set(WORDS))
    words += [f"w{k}" for k in range(VOCAB - len(words))]
    assert len(words) == VOCAB
    return words


def causal_tokenizer(bos: bool = False):
    """A fast word-level tokenizer over :func:`vocabulary` (whitespace-split, offsets available);
    with ``bos``, ``<s>`` is put in front of every text (as Llama tokenizers do)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={w: k for k, w in enumerate(vocabulary())}, unk_token="<unk>"))
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
    vocab = SPECIAL + ["Ċ"] + [w for word in words for w in (word, "Ġ" + word)]
    vocab = vocab[:VOCAB]
    core = Tokenizer(models.WordLevel(vocab={w: k for k, w in enumerate(vocab)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")


def tiny_lm(name: str = "llama") -> nn.Module:
    """The tiny ``*ForCausalLM`` ``name`` of ``tests.models`` with the tokenizer's special ids."""
    model = tiny_task_model(name, "causal_lm")
    for config in (model.config, model.generation_config):
        config.pad_token_id, config.bos_token_id, config.eos_token_id = PAD, BOS, EOS
    return model


def save_tiny_lm(folder: Path, name: str = "llama", byte_level: bool = False) -> Path:
    """The tiny LM and its tokenizer (with ``byte_level``, :func:`byte_level_tokenizer`) saved
    as a model folder."""
    tiny_lm(name).save_pretrained(folder)
    (byte_level_tokenizer() if byte_level else causal_tokenizer()).save_pretrained(folder)
    return folder
