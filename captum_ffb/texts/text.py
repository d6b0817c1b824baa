"""Maps for a piece of text: tokenise, decompose the chosen layers, keep tokens and deltas.

This is what the CLI, the figures, the HTML view and the exports consume. Reading texts from
files is :mod:`captum_ffb.texts.corpus` (``read_rows``, ``read_texts``; still importable from here).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from captum_ffb.attr import LayerNormDecomposition
from captum_ffb.core.pieces import readable
from captum_ffb.engine.requests import INVISIBLE, check_text  # noqa: F401  (their home before)
from captum_ffb.explained.models import LoadedModel, load_model, model_device


@dataclass
class TextMaps:
    """Token-to-token maps of one text, per layer and scope.

    Attributes:
        text (str): the input text.
        tokens (list[str]): the tokens, as the tokenizer writes them.
        model_name (str): the model's name or folder.
        model_type (str): its Hugging Face ``model_type``.
        chain (str): ``"post_ln"`` or ``"pre_ln"``, ...
        scopes (tuple[str, ...]): the scopes computed, in chain order.
        ff_pair (tuple[str, str]): the scopes just before and after the FF block.
        layers (list[int]): the layer indices computed.
        n_layers (int): the number of layers of the model.
        input_ids (list[int]): the token ids.
        maps (dict): ``layer → scope → (n, n)`` tensor.
        delta (dict): ``layer → scope → completeness residual`` (float).
        causal (bool): whether token ``i`` sees only tokens ``j ≤ i`` (from the family's spec).
        n_target (int, optional): for an encoder–decoder's decoder layers, how many of
                    ``tokens`` are the target's (the decoder's input): the last ones, after
                    the source's. The maps are then square over ``[source | target]``: the
                    target's rows hold values (a decoder block writes no source row; those
                    rows are zero) over both players' columns (the source columns come
                    through the cross-attention).
    """

    text: str
    tokens: list[str]
    model_name: str
    model_type: str
    chain: str
    scopes: tuple[str, ...]
    ff_pair: tuple[str, str]
    layers: list[int]
    n_layers: int = 0
    input_ids: list[int] = field(default_factory=list)
    maps: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    delta: dict[int, dict[str, float]] = field(default_factory=dict)
    causal: bool = False
    n_target: int | None = None

    @property
    def n_source(self) -> int:
        """How many of ``tokens`` come first as an encoder–decoder's source (0 otherwise)."""
        return 0 if self.n_target is None else len(self.tokens) - self.n_target

    @property
    def rows(self) -> slice:
        """The rows of a map that hold values: every row, or an encoder–decoder's target rows."""
        return slice(self.n_source, None)

    def ff_amp(self, layer: int) -> Tensor:
        """The FF-amp map of ``layer``: column-normalised map after FF minus before FF."""
        before, after = self.ff_pair
        return ff_amplification(self.maps[layer][before], self.maps[layer][after])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: tokens, maps as nested lists, residuals."""
        return {
            "text": self.text,
            "tokens": self.tokens,
            "model": self.model_name,
            "model_type": self.model_type,
            "chain": self.chain,
            "scopes": list(self.scopes),
            "ff_pair": list(self.ff_pair),
            "n_target": self.n_target,
            "n_source": self.n_source,
            "layers": {
                str(layer): {
                    "maps": {s: self.maps[layer][s].tolist() for s in self.scopes},
                    "completeness_residual": self.delta[layer],
                }
                for layer in self.layers
            },
        }


def ff_amplification(before: Tensor, after: Tensor) -> Tensor:
    r"""``after / Σ_i after[i, j] − before / Σ_i before[i, j]``: each map normalised so every
    column sums to 1, then subtracted (the paper's FF-amp). Works on ``(…, n, n)``."""

    def columns(m: Tensor) -> Tensor:
        total = m.sum(dim=-2, keepdim=True)
        return m / torch.where(total == 0, torch.ones_like(total), total)

    return columns(after) - columns(before)


# Byte-level BPE (GPT-2, RoBERTa, Llama 3) and SentencePiece mark spaces and line breaks so.
_MARKERS = {"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"}
# Characters shown as escapes, so that a label stays on one line and is never blank.
_CONTROLS = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def display_token(token: str, tokenizer: Any = None, strip: bool = True) -> str:
    r"""A token as people read it, for terminal summaries, figure labels and HTML.

    With a ``tokenizer``, its ``convert_tokens_to_string`` decodes the token (byte-level BPE
    bytes such as ``"Ã©"`` become ``"é"``); without one, or where that fails, the space
    markers of byte-level BPE (``Ġ``) and SentencePiece (``▁``) become spaces, ``Ċ`` a line
    break; WordPiece's ``##`` prefix is dropped. Line breaks and tabs are shown as ``\n``
    and ``\t``; a token of spaces only as ``␣``; a token of part of a character as its bytes
    (``\xe2\x80``, :func:`~captum_ffb.core.pieces.readable`).

    Args:
        token (str): a token as the tokenizer writes it (``convert_ids_to_tokens``).
        tokenizer (optional): a Hugging Face tokenizer.
        strip (bool): drop leading and trailing spaces (``False`` keeps ``" Paris"``).

    Returns:
        str: the readable, non-empty label.
    """
    text = None
    if tokenizer is not None and hasattr(tokenizer, "convert_tokens_to_string"):
        try:
            text = tokenizer.convert_tokens_to_string([token])
        except Exception:  # a tokenizer that cannot decode this token alone: use the markers
            text = None
    if not isinstance(text, str):
        text = "".join(_MARKERS.get(ch, ch) for ch in token)
    text = readable(text, token)  # a part of a character: its bytes, not "\ufffd"
    if text.startswith("##") and len(text) > 2:  # WordPiece, where no decoder took it off
        text = text[2:]
    text = "".join(_CONTROLS.get(ch, ch) for ch in text)
    shown = text.strip(" ") if strip else text
    if shown.strip(" "):
        return shown
    return "␣" * len(text) if text else "∅"


def display_tokens(tokens: Sequence[str], tokenizer: Any = None, strip: bool = True) -> list[str]:
    """:func:`display_token` on every token."""
    return [display_token(str(t), tokenizer, strip) for t in tokens]


def encode_text(text: str, model: LoadedModel, **kwargs: Any) -> Any:
    r"""Tokenise ``text`` for ``model`` as PyTorch tensors.

    A one-line ValueError when :func:`~captum_ffb.engine.requests.check_text` refuses the text or it has more tokens
    than the model takes; the tokenizer's own warning about over-long inputs is not shown.

    Args:
        text (str): the input.
        model (LoadedModel): from :func:`captum_ffb.explained.models.load_model`.
        **kwargs: more arguments of the tokenizer call (``truncation``, ``max_length``).
    """
    check_text(text)
    encoded = model.tokenizer(text, return_tensors="pt", verbose=False, **kwargs)
    count = encoded["input_ids"].shape[1]
    if count > model.max_length:
        raise ValueError(f"the text has {count} tokens; the model takes at most {model.max_length}")
    return encoded.to(model_device(model.model))


def layer_indices(layers: Sequence[int] | str, count: int) -> list[int]:
    r"""Layer indices of a model with ``count`` layers, in the order given and once each;
    ``"all"`` is every layer and negative indices count from the end. A one-line ValueError
    names a layer that does not exist."""
    indices = list(range(count)) if layers == "all" else [int(i) for i in layers]
    for i in indices:
        if not -count <= i < count:
            raise ValueError(f"layer {i} does not exist: the model has {count} layers")
    return list(dict.fromkeys(i % count for i in indices))


def text_maps(
    text: str,
    model: LoadedModel | None = None,
    layers: Sequence[int] | str = "all",
    scopes: Sequence[str] | None = None,
    show_progress: bool = False,
    target: str | None = None,
    audio: str | Path | None = None,
) -> TextMaps:
    r"""Compute the maps of ``text`` for the chosen layers and scopes in one forward pass.

    For an encoder–decoder (T5, BART, Marian, ...), ``text`` is the source and ``target``
    the target (or ``text`` is ``"SOURCE ||| TARGET"``); the maps are the decoder layers'
    over the players ``[source | target]`` (see :attr:`TextMaps.n_target`).

    Args:
        text (str): the input; not empty, valid UTF-8 (see :func:`~captum_ffb.engine.requests.check_text`).
        model (LoadedModel, optional): from :func:`captum_ffb.explained.models.load_model`; the bundled
                    all-MiniLM-L6-v2 by default.
        layers (list[int] or "all"): layer indices (negative counts from the end).
        scopes (list[str], optional): scope names; all scopes of the chain by default.
        show_progress (bool): show a progress bar.
        target (str, optional): an encoder–decoder's target text.
        audio (str or Path, optional): a speech encoder–decoder's source, a WAV file (then
                    ``text`` is the target, which its tokenizer frames with its own prompt).
    """
    check_text(text)
    loaded = model or load_model()
    check_text_request(text, loaded.model.config, audio, loaded.source)
    if loaded.spec.decoder is not None:
        return _pair_maps(text, loaded, layers, scopes, show_progress, target, audio)
    if audio is not None:
        raise ValueError(f"audio is for speech encoder–decoders (Whisper); {loaded.model_type} is not one")
    if target is not None:
        raise ValueError(f"a target text is for encoder–decoder models; {loaded.model_type} is not one")
    blocks = loaded.blocks
    indices = layer_indices(layers, len(blocks))
    encoded = encode_text(text, loaded)
    ids = encoded["input_ids"]
    lnd = LayerNormDecomposition(loaded.model, [blocks[i] for i in indices], show_progress=show_progress)
    names = list(scopes) if scopes else list(lnd.scopes)
    kwargs = {k: v for k, v in encoded.items() if k != "input_ids"}
    results = lnd.attribute(ids, scope=names, return_convergence_delta=True, forward_kwargs=kwargs)
    return _collected(results, loaded, lnd, names, indices, len(blocks), text=text,
                      tokens=loaded.tokenizer.convert_ids_to_tokens(ids[0].tolist()), input_ids=ids[0].tolist(),
                      causal=lnd.spec.is_causal(loaded.model.config))


def _collected(results: Any, loaded: LoadedModel, lnd: LayerNormDecomposition, names: Sequence[str],
               indices: list[int], n_layers: int, **fields: Any) -> TextMaps:
    """The :class:`TextMaps` of one text from ``lnd.attribute``'s ``(maps, delta)`` per layer;
    with ``n_target`` among ``fields``, each ``(n_target, P)`` map goes into the last rows of a
    square ``(P, P)`` one (the players ``[source | target]``)."""
    out = TextMaps(model_name=loaded.name, model_type=loaded.model_type, chain=lnd.chain.name,
                   scopes=tuple(n for n in lnd.scopes if n in names), ff_pair=lnd.chain.ff_pair,
                   layers=indices, n_layers=n_layers, **fields)
    for i, (maps, delta) in zip(indices, results):
        out.maps[i] = {}
        for name, m in maps.items():
            square = m[0]
            if out.n_target is not None:
                square = m.new_zeros(m.shape[-1], m.shape[-1])
                square[out.n_source:] = m[0]
            out.maps[i][name] = square.cpu()  # a view's numbers: on the cpu, once
        out.delta[i] = {name: float(d[0]) for name, d in delta.items()}
    return out


#: What separates the source from the target in one text for an encoder–decoder.
PAIR_SEPARATOR = "|||"


def check_one_separator(text: str) -> None:
    """A one-line error where ``text`` holds :data:`PAIR_SEPARATOR` more than once."""
    count = text.count(PAIR_SEPARATOR)
    if count > 1:
        raise ValueError(f"the text holds {PAIR_SEPARATOR} {count} times: give one, between the source "
                         "and the target")


def check_no_separator(text: str, model_type: str) -> None:
    """A one-line error where a text for a model of one stack holds :data:`PAIR_SEPARATOR`
    (it separates an encoder–decoder's source from its target; it is not read as text)."""
    if PAIR_SEPARATOR in text:
        raise ValueError(f"{PAIR_SEPARATOR} separates an encoder–decoder's source from its target; "
                         f"{model_type} has one stack: leave it out of the text")


def check_text_request(text: str | None, config: Any, audio: str | Path | None = None,
                       folder: str | Path | None = None) -> None:
    r"""Check a text (and an audio source) against a model's configuration, before any
    weights load: a speech encoder–decoder reads a WAV file and needs its folder's feature
    extractor settings, other models read text only; ``|||`` appears once in an
    encoder–decoder's text and never in a one-stack model's.

    Args:
        text (str, optional): the text (a speech model's forced transcript, or empty).
        config: the model's configuration.
        audio (str or Path, optional): a WAV file, the source of a speech model.
        folder (str or Path, optional): the model's folder, where the feature extractor's
                    ``preprocessor_config.json`` is looked for.
    """
    from captum_ffb.architectures import get_architecture
    from captum_ffb.explained.models import is_speech_config

    model_type = getattr(config, "model_type", "this model")
    speech = is_speech_config(config)
    if audio is not None and not speech:
        raise ValueError(f"audio is for speech encoder–decoders (Whisper); {model_type} reads text")
    if speech and audio is None:
        raise ValueError(f"{model_type} reads audio: give a WAV file as its source (--audio WAV)")
    if audio is not None:
        from captum_ffb.texts.corpus import read_wav

        read_wav(audio)  # a file it cannot read fails before any weights load
        if folder is not None and Path(folder).is_dir() and not (Path(folder) / "preprocessor_config.json").is_file():
            raise ValueError(f"the model folder {folder} has no preprocessor_config.json (the feature "
                             "extractor's settings): save the feature extractor with the model")
        if text:
            check_one_separator(text)
        return
    check_text(text or "")
    if get_architecture(model_type).decoder is not None:
        check_one_separator(text)
    else:
        check_no_separator(text, model_type)


def split_pair(text: str, target: str | None) -> tuple[str, str]:
    """``(source, target)`` from ``text`` and ``target``, or from ``"SOURCE ||| TARGET"``."""
    if target is None:
        if PAIR_SEPARATOR not in text:
            raise ValueError(
                f"an encoder–decoder needs a source and a target: give 'SOURCE {PAIR_SEPARATOR} TARGET' "
                "(or the target on its own)"
            )
        check_one_separator(text)
        text, target = text.split(PAIR_SEPARATOR, 1)
    source, target = text.strip(), target.strip()
    check_text(source)
    check_text(target)
    return source, target


def encode_pair(source: str, target: str, loaded: LoadedModel) -> tuple[Any, Tensor]:
    """The encoded source and the decoder's input ids ``(1, n_target)``: the decoder's start
    token, then the target's tokens."""
    encoded = encode_text(source, loaded)
    return encoded, decoder_ids(target, loaded)


def decoder_ids(target: str, loaded: LoadedModel) -> Tensor:
    """The decoder's input ids ``(1, n)`` for a target text: the decoder's start token, then
    the target's tokens (the start token once: Whisper's tokenizer already puts it first)."""
    target_ids = loaded.tokenizer(text_target=target, return_tensors="pt", verbose=False)["input_ids"]
    start = loaded.model.config.decoder_start_token_id
    if start is None:
        raise ValueError(f"{loaded.model_type}'s config has no decoder_start_token_id")
    if target_ids.shape[1] and int(target_ids[0, 0]) == int(start):
        return target_ids
    return torch.cat([torch.tensor([[int(start)]]), target_ids], dim=1)


class AudioCutWarning(UserWarning):
    """A clip longer than the speech model's window: only its beginning is read."""


def encode_audio(path: str | Path, loaded: LoadedModel) -> Tensor:
    """A WAV file's features ``(1, mel bins, frames)`` for a speech encoder–decoder (Whisper),
    from the feature extractor saved with the model."""
    from transformers import AutoFeatureExtractor

    from captum_ffb.texts.corpus import AUDIO_RATE, read_wav

    if loaded.source is None or not Path(loaded.source).is_dir():
        raise ValueError("audio needs the model's folder (its feature extractor's settings)")
    check_text_request("", loaded.model.config, path, loaded.source)
    try:
        extractor = AutoFeatureExtractor.from_pretrained(loaded.source)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot load the feature extractor of {loaded.source}: "
                         f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
    samples = read_wav(path)
    window = getattr(extractor, "n_samples", None)
    if isinstance(window, int) and samples.size > window:
        warnings.warn(f"{path} lasts {samples.size / AUDIO_RATE:.1f} s; {loaded.model_type} reads its first "
                      f"{window / AUDIO_RATE:.0f} s", AudioCutWarning, stacklevel=2)
    features = extractor(samples, sampling_rate=AUDIO_RATE, return_tensors="pt").input_features
    return features.to(next(loaded.model.parameters()).dtype)


def encode_source(source: str, target: str, loaded: LoadedModel, audio: str | Path | None = None
                  ) -> tuple[Tensor, dict[str, Tensor], Tensor, list[str]]:
    """``(source input, its keyword arguments, the decoder's ids (1, n_target), the source's
    labels)``: token ids and mask for a text source; a speech model's features for ``audio``
    (its labels the encoder's output frames)."""
    if audio is None:
        encoded, decoded = encode_pair(source, target, loaded)
        labels = loaded.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
        return encoded["input_ids"], {k: v for k, v in encoded.items() if k != "input_ids"}, decoded, labels
    check_text(target)
    features = encode_audio(audio, loaded)
    frames = int(getattr(loaded.model.config, "max_source_positions", features.shape[-1] // 2))
    return features, {}, decoder_ids(target, loaded), [f"frame {k}" for k in range(frames)]


def _pair_maps(text: str, loaded: LoadedModel, layers: Sequence[int] | str, scopes: Sequence[str] | None,
               show_progress: bool, target: str | None, audio: str | Path | None = None) -> TextMaps:
    """The decoder layers' maps of a source and a target (see :func:`text_maps`)."""
    from captum_ffb.engine.model import find_blocks

    if audio is None:
        source, target = split_pair(text, target)
    else:
        source, target = str(audio), (text if target is None else target).strip()
    first, extra, decoded, source_tokens = encode_source(source, target, loaded, audio)
    blocks = find_blocks(loaded.model, loaded.spec.decoder)
    indices = layer_indices(layers, len(blocks))
    lnd = LayerNormDecomposition(loaded.model, [blocks[i] for i in indices], show_progress=show_progress)
    names = list(scopes) if scopes else list(lnd.scopes)
    kwargs = {**extra, "decoder_input_ids": decoded}
    results = lnd.attribute(first, scope=names, return_convergence_delta=True, forward_kwargs=kwargs)
    target_tokens = loaded.tokenizer.convert_ids_to_tokens(decoded[0].tolist())
    return _collected(results, loaded, lnd, names, indices, len(blocks), text=f"{source} {PAIR_SEPARATOR} {target}",
                      tokens=source_tokens + target_tokens,
                      input_ids=(first[0].tolist() if audio is None else []) + decoded[0].tolist(),
                      causal=True, n_target=len(target_tokens))


def __getattr__(name: str) -> Any:
    """``read_rows`` and ``read_texts`` moved to :mod:`captum_ffb.texts.corpus` (0.3); still
    importable from here."""
    if name in ("read_rows", "read_texts"):
        from captum_ffb.texts import corpus

        return getattr(corpus, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
