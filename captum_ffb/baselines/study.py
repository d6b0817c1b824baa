r"""The comparison studies of ``captum-ffb compare``, for a piece of text.

* :func:`compare_with_baselines`: the decomposition's maps of some layers next to baselines
  on the same layers and text, from one forward pass of the model;
* :func:`activation_study_by_length`: the paper's App. E (IG against Shapley values for the
  FF activation) on the text cut to several lengths, one forward pass per length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from captum_ffb.architectures import get_architecture
from captum_ffb.baselines.activation import activation_study
from captum_ffb.baselines.captured import CapturedLayer, capture_layer
from captum_ffb.baselines.compare import ComparisonTable, compare_methods
from captum_ffb.baselines.maps import baseline_maps, resolve_baselines
from captum_ffb.engine import chain_for
from captum_ffb.explained.models import LoadedModel, load_model
from captum_ffb.texts.text import encode_text, layer_indices


@dataclass
class BaselineComparison:
    r"""The decomposition's maps of some layers next to baselines on the same text.

    Attributes:
        tokens (list[str]): the tokens, as the tokenizer writes them.
        model_name (str): the model's name or folder.
        layers (list[int]): the layer indices compared.
        scopes (list[str]): the decomposition's scopes compared.
        baselines (list[str]): the baselines run (aliases expanded).
        maps (dict): ``layer → name → (1, n, n)`` maps: the scopes, then the baselines.
        table (ComparisonTable): per layer, each baseline against each scope's map.
    """

    tokens: list[str]
    model_name: str
    layers: list[int]
    scopes: list[str]
    baselines: list[str]
    maps: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    table: ComparisonTable = field(default_factory=ComparisonTable)


def _contexts(loaded: LoadedModel, indices: Sequence[int], encoded: Any,
              with_next_norms: bool = False) -> list[CapturedLayer]:
    """The contexts of the blocks ``indices`` for the encoded text, from one forward pass."""
    kwargs = {k: v for k, v in encoded.items() if k != "input_ids"}
    blocks = loaded.blocks
    return capture_layer(loaded.model, [blocks[i] for i in indices], encoded["input_ids"],
                         forward_kwargs=kwargs, with_next_norms=with_next_norms)


def _progress(items: Sequence[Any], show_progress: bool, desc: str = "layers", unit: str = "layer") -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit=unit, disable=not show_progress)


def compare_with_baselines(
    text: str,
    model: LoadedModel | None = None,
    layers: Sequence[int] | str = "all",
    baselines: str | Sequence[str] = ("attention", "norm", "ig", "shap"),
    scopes: Sequence[str] | None = None,
    k: int = 3,
    route: str = "forward",
    n_steps: int = 50,
    n_samples: int | None = None,
    seed: int | None = 0,
    show_progress: bool = False,
) -> BaselineComparison:
    r"""Put the decomposition's maps of ``text`` next to baselines on the same layers.

    The model runs once: the decomposition and the baselines read the same captured
    tensors (:func:`~captum_ffb.baselines.capture_layer` on every layer at once).

    Args:
        text (str): the input; not empty, valid UTF-8.
        model (LoadedModel, optional): from :func:`captum_ffb.explained.models.load_model`; the bundled
                    all-MiniLM-L6-v2 by default.
        layers (list[int] or "all"): layer indices (negative counts from the end).
        baselines (str or list[str]): names of :data:`~captum_ffb.baselines.maps.BASELINES` or
                    :data:`~captum_ffb.baselines.maps.ALIASES` (a comma-separated string works).
        scopes (list[str], optional): the decomposition's scopes to compare with; all scopes
                    of the chain by default.
        k (int): size of the top-k sets of the overlap score.
        route (str): gradient route, ``"forward"`` or ``"captum"``.
        n_steps (int): IG steps.
        n_samples (int, optional): budget of the sampling Shapley methods.
        seed (int, optional): seed of the sampling methods.
        show_progress (bool): show a progress bar over the layers.

    Returns:
        BaselineComparison
    """
    loaded = model or load_model()
    indices = layer_indices(layers, len(loaded.blocks))
    chain = chain_for(get_architecture(loaded.model_type), loaded.model.config)
    if scopes is not None:
        chain.check_scopes(scopes)
    encoded = encode_text(text, loaded)
    ids = encoded["input_ids"]
    names = resolve_baselines(baselines, ids.shape[1])
    chosen = list(scopes) if scopes else list(chain.scopes)
    extra = any(scope in chain.extra_scopes for scope in chosen)
    contexts = _contexts(loaded, indices, encoded, with_next_norms=extra)
    result = BaselineComparison(
        tokens=loaded.tokenizer.convert_ids_to_tokens(ids[0].tolist()), model_name=loaded.name,
        layers=indices, scopes=chosen, baselines=names, table=ComparisonTable(k=k),
    )
    for layer, context in zip(_progress(indices, show_progress), contexts):
        ours = context.decomposition_maps(chosen)
        theirs = baseline_maps(context, methods=names, route=route, n_steps=n_steps,
                               n_samples=n_samples, seed=seed)
        for scope in chosen:  # rows: each baseline against this scope's map
            result.table.extend(compare_methods(
                {**theirs, scope: ours[scope]}, reference=scope, token_mask=context.token_mask,
                causal=context.causal, k=k, extra={"layer": layer},
            ))
        result.maps[layer] = {**ours, **theirs}
    return result


@dataclass
class LengthStudy:
    r"""App. E on one text cut to several lengths, for some layers.

    Attributes:
        layers (list[int]): the layer indices studied.
        lengths (list[int]): the token counts the text was cut to.
        agreement (ComparisonTable): each method against IG, per layer, length and scope.
        contextualization (ComparisonTable): per layer, length and method, ``1 − ρ`` between
                    consecutive scopes from the FF input on.
        timing (ComparisonTable): seconds to decompose the activation, per layer, length and
                    method.
        seconds (dict): method → length → seconds, of the first layer.
    """

    layers: list[int]
    lengths: list[int]
    agreement: ComparisonTable
    contextualization: ComparisonTable
    timing: ComparisonTable
    seconds: dict[str, dict[int, float]] = field(default_factory=dict)


def text_lengths(text: str, model: LoadedModel, lengths: Sequence[int] | None = None,
                 option: str = "lengths") -> list[int]:
    r"""``lengths`` (by default the text's full length in tokens) if the text can be cut to
    each: from 2 tokens to its full length; else a one-line ValueError that names the
    argument as ``option``."""
    full = encode_text(text, model)["input_ids"].shape[1]
    if lengths is None:
        return [full]
    impossible = [n for n in lengths if n > full or n < 2]
    if impossible:
        raise ValueError(
            f"{option} {impossible[0]} is not possible: the text has {full} tokens (at least 2 "
            "are needed)"
        )
    return list(lengths)


def activation_study_by_length(
    text: str,
    model: LoadedModel | None = None,
    layers: Sequence[int] | str = (0,),
    lengths: Sequence[int] | None = None,
    methods: Sequence[str] = ("ig", "ig_captum", "shap_exact", "shap_sampling", "shap_kernel"),
    n_samples: int | None = None,
    seed: int | None = 0,
    n_steps: int = 50,
    k: int = 3,
    show_progress: bool = False,
) -> LengthStudy:
    r"""The paper's App. E (:func:`~captum_ffb.baselines.activation_study`) on ``text`` cut to
    each of ``lengths`` tokens, for each layer; the model runs once per length.

    Args:
        text (str): the input; not empty, valid UTF-8.
        model (LoadedModel, optional): the bundled all-MiniLM-L6-v2 by default.
        layers (list[int] or "all"): layer indices (negative counts from the end).
        lengths (list[int], optional): token counts (with special tokens), each from 2 to the
                    text's full length; by default its full length only.
        methods (list[str]): activation methods; IG is the reference.
        n_samples, seed, n_steps, k: see :func:`~captum_ffb.baselines.activation_study`.
        show_progress (bool): show progress bars.

    Returns:
        LengthStudy
    """
    loaded = model or load_model()
    indices = layer_indices(layers, len(loaded.blocks))
    lengths = text_lengths(text, loaded, lengths)
    by_length = {
        n: _contexts(loaded, indices, encode_text(text, loaded, truncation=True, max_length=n))
        for n in dict.fromkeys(lengths)
    }
    study = LengthStudy(
        indices, lengths, ComparisonTable(k=k), ComparisonTable(k=k),
        ComparisonTable(columns=["layer", "n", "method", "seconds"], k=k),
    )
    runs = [(position, layer, n) for position, layer in enumerate(indices) for n in lengths]
    for position, layer, n in _progress(runs, show_progress, "layer × length", "study"):
        result = activation_study(
            by_length[n][position], methods, n_samples=n_samples, seed=seed,
            n_steps=n_steps, k=k, extra={"layer": layer}, show_progress=show_progress,
        )
        study.agreement.extend(result.agreement)
        study.contextualization.extend(result.contextualization)
        for method, value in result.seconds.items():
            study.timing.rows.append({"layer": layer, "n": n, "method": method, "seconds": value})
            if position == 0:
                study.seconds.setdefault(method, {})[n] = value
    return study
