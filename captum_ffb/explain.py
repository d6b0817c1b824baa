"""Explain one text: which input tokens drove the model's output, exactly.

:func:`explain_text` picks what to explain from the model: the next token of a causal LM
(or every generated token), a class of a sequence classifier, or, for a base model, the
whole-model token-to-token maps (and, for the bundled all-MiniLM-L6-v2, the logit of the
bundled sentiment head). On request it also splits the first explained output over tokens
× components (:meth:`~captum_ffb.attr.NormDecomposition.attribute_components`). It returns
an :class:`Explanation` that the CLI, the figures and the HTML view consume.

The **token share** of an explained output is ``Σ_j c_j / value``: how much of the output the
tokens own (1 on a model without bias terms; the rest is the model's own bias terms, the bias
player). The **first-token share** of a row of contributions ``c`` is ``|c_0| / Σ_j |c_j|`` over
the real positions: the part of the attribution that lands on the first position (where causal
models park attention, the "attention sink"); ``first_token`` is the signed ``c_0``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from captum_ffb._deprecation import BACKEND_RENAMES, REMOVED_IN, renamed_arguments
from captum_ffb.attr import NormDecomposition
from captum_ffb.components.table import ComponentAttribution
from captum_ffb.core.vocabulary import check_granularity
from captum_ffb.engine.generation import generate_greedily
from captum_ffb.engine.requests import check_new_tokens, leading_space_hint, text_token_ids
from captum_ffb.explained.models import LoadedModel, load_model
from captum_ffb.explained.readouts import (
    AnswerLogProbability,
    ClassLogit,
    Contrast,
    NextToken,
    ReadOut,
    TokenLogProbability,
    TopLogits,
)
from captum_ffb.explained.results import ExplainedOutput, first_token_share, token_share
from captum_ffb.texts.text import check_text, check_text_request, display_tokens, encode_text

#: Longest input (tokens) for which the whole-model maps are computed by default.
MAPS_UP_TO = 256
#: Longest input (tokens) for which the backward route is checked against the forward route.
CHECK_UP_TO = 64


@dataclass
class Explanation:
    r"""The exact contributions of one text's tokens to one or more outputs.

    Attributes:
        text (str): the input text.
        model_name (str): the model's name or folder.
        model_type (str): its ``model_type``.
        task (str): ``"causal_lm"``, ``"sequence_classification"`` or ``"base"``.
        tokens (list[str]): the tokens (prompt and, when generating, the generated ones).
        prompt_length (int): how many of ``tokens`` are the input (the rest were generated).
        explained (str): what is explained, in words.
        targets (list[str]): one label per explained output (a token, a class).
        contributions (Tensor): ``(steps, len(tokens))``: row ``t`` explains output ``t``;
                    empty ``(0, n)`` when only maps were asked for.
        values (Tensor): ``(steps,)`` the real output values (logits).
        bias (Tensor): ``(steps,)`` the bias player (what is owed to no token).
        delta (Tensor): ``(steps,)`` the convergence delta ``|Σ c + bias − value|``.
        maps (Tensor, optional): ``(blocks, n, n)`` whole-model token-to-token maps.
        route (str): ``"backward"`` or ``"forward"``.
        check (dict, optional): for the backward route on short inputs, the forward route's
                    own convergence delta (the bias propagated on its own: a real check) and
                    the largest difference between the two routes' contributions.
        labels (list[str]): ``tokens`` as people read them (no ``Ġ``, ``▁`` or ``##``; see
                    :func:`~captum_ffb.texts.text.display_token`); empty: derived from ``tokens``.
        target_labels (list[str]): ``targets`` likewise, a token's leading space kept.
        components (ComponentAttribution, optional): the first explained output split over
                    tokens × components (direct effects; ``tokens`` are ``labels``), when
                    asked for.
        result (ExplainedOutput, optional): the numbers these views are read from (the one
                    result type of every explained output; ``contributions`` above adds a
                    zero column for a generation's last token, which is an output only).
    """

    text: str
    model_name: str
    model_type: str
    task: str
    tokens: list[str]
    prompt_length: int
    explained: str
    targets: list[str] = field(default_factory=list)
    contributions: Tensor = field(default_factory=lambda: torch.zeros(0, 0))
    values: Tensor = field(default_factory=lambda: torch.zeros(0))
    bias: Tensor = field(default_factory=lambda: torch.zeros(0))
    delta: Tensor = field(default_factory=lambda: torch.zeros(0))
    maps: Tensor | None = None
    route: str = "backward"
    check: dict[str, float] | None = None
    labels: list[str] = field(default_factory=list)
    target_labels: list[str] = field(default_factory=list)
    components: ComponentAttribution | None = None
    result: ExplainedOutput | None = None

    def __post_init__(self) -> None:
        if not self.labels:
            self.labels = display_tokens(self.tokens)
        if not self.target_labels:
            self.target_labels = list(self.targets)

    @property
    def steps(self) -> int:
        """How many outputs are explained."""
        return int(self.contributions.shape[0])

    def first_token_share(self) -> Tensor:
        """``|c_0| / Σ_j |c_j|`` per explained output ``(steps,)`` (0 where all are 0)."""
        return first_token_share(self.contributions)

    def token_share(self) -> Tensor:
        """``Σ_j c_j / value`` per explained output ``(steps,)``: how much of it the tokens own."""
        return token_share(self.contributions, self.values)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything explained."""
        out: dict[str, Any] = {
            "text": self.text, "model": self.model_name, "model_type": self.model_type,
            "task": self.task, "explained": self.explained, "route": self.route,
            "tokens": self.tokens, "labels": self.labels, "prompt_length": self.prompt_length,
            "first_token_share_definition": "|c_0| / sum_j |c_j| over the input positions",
            "token_share_definition": "sum_j c_j / value: the part of the value the tokens own",
            "outputs": [
                {
                    "target": target,
                    "target_label": self.target_labels[t] if t < len(self.target_labels) else target,
                    "value": float(self.values[t]),
                    "tokens": float(self.contributions[t].sum()),
                    "bias": float(self.bias[t]),
                    "token_share": _finite(float(self.token_share()[t])),
                    "convergence_delta": float(self.delta[t]),
                    "first_token": float(self.contributions[t, 0]),
                    "first_token_share": float(self.first_token_share()[t]),
                    "contributions": self.contributions[t].tolist(),
                }
                for t, target in enumerate(self.targets)
            ],
        }
        if self.check is not None:
            out["forward_route_check"] = self.check
        if self.maps is not None:
            out["maps"] = self.maps.tolist()
        if self.components is not None:
            out["components"] = self.components.to_dict()
        return out


def _finite(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None


def _single_token(tokenizer: Any, text: str, name: str = "target") -> int:
    return int(text_token_ids(tokenizer, text, name, one=True)[0])


def explain_text(
    text: str,
    model: LoadedModel | str | None = None,
    target: str | None = None,
    class_index: int | None = None,
    generate: int = 0,
    route: str = "backward",
    maps: bool | None = None,
    readout: ReadOut | None = None,
    components: str | None = None,
    show_progress: bool = False,
    config: Any = None,
    contrast: tuple[str, str] | None = None,
) -> Explanation:
    r"""Explain ``text`` on ``model`` (the bundled all-MiniLM-L6-v2 by default).

    The request is checked once, here, before any weights load (from the model's
    configuration when ``model`` is a name or folder, see :func:`check_request`).
    The model runs twice: once recording the forward route (the real values, the predicted
    output, the bias player, the maps and, on inputs of up to :data:`CHECK_UP_TO` tokens,
    the forward route's check), once for the backward route (not on the forward route).
    Generating runs the model once per generated token first, and the maps of the prompt
    then take one more pass.

    Args:
        text (str): the input.
        model (LoadedModel or str, optional): from :func:`captum_ffb.explained.models.load_model`, or
                    a model folder or name to load (after the request is checked).
        target (str, optional): a causal LM's next token to explain, as text (one token);
                    the predicted one by default.
        class_index (int, optional): a sequence classifier's class; the predicted one by
                    default.
        generate (int): a causal LM generates this many tokens greedily, and every one of
                    them is explained (teacher forced, one forward pass).
        route (str): ``"backward"`` or ``"forward"`` (see ``NormDecomposition``).
        maps (bool, optional): also compute the whole-model token-to-token maps; by default
                    for base models, and for inputs up to :data:`MAPS_UP_TO` tokens.
        readout (ReadOut, optional): what a base model's output is read as
                    (:mod:`captum_ffb.explained.readouts`); by default the bundled sentiment head
                    where the model fits it
                    (:func:`~captum_ffb.explained.readouts.default_readout`), else only the maps are
                    explained.
        components (str, optional): also split the explained output over tokens ×
                    components at this granularity, ``"block"``, ``"sublayer"`` or ``"head"``
                    (see ``NormDecomposition.attribute_components()``; one more pass of
                    the model); not with ``generate``, and a base model needs a read-out.
        show_progress (bool): when ``model`` is loaded here, say so on stderr and show the
                    weights' progress bar; a bar over the component table's passes.
        config (PretrainedConfig, optional): the configuration of the model ``model`` names,
                    when already read (:func:`~captum_ffb.explained.models.model_config`).
        contrast (tuple[str, str], optional): a causal LM's ``logit(A) − logit(B)`` for two
                    next tokens given as text (one token each), instead of one logit.

    Returns:
        Explanation
    """
    loaded = _checked_model(model, config, show_progress, text, target, class_index, generate, components,
                            readout, contrast)
    nd = NormDecomposition(loaded.model)
    ids = encode_text(text, loaded)["input_ids"]
    ids = ids.to(next(loaded.model.parameters()).device)
    n_prompt = ids.shape[1]
    if generate:
        check_new_tokens(generate, n_prompt, loaded.model.config, name="generate")
    want_maps = maps if maps is not None else (nd.task == "base" or n_prompt <= MAPS_UP_TO)
    common = dict(text=text, model_name=loaded.name, model_type=loaded.model_type, task=nd.task,
                  route=route, prompt_length=n_prompt)
    if nd.task == "causal_lm":
        explanation, first = _explain_causal_lm(nd, loaded, ids, target, generate, route, want_maps, common,
                                                contrast)
    elif nd.task == "sequence_classification":
        explanation, first = _explain_classifier(nd, loaded, ids, class_index, route, want_maps, common)
    else:
        explanation, first = _explain_base(nd, loaded, ids, readout, route, want_maps, common)
    if components is not None and first is not None:
        nd.show_progress = show_progress  # a bar over the blocks (a long prompt takes a while)
        explanation.components = _component_table(nd, ids, first, components, explanation.labels[:n_prompt])
    return explanation


def _checked_model(model: LoadedModel | str | None, config: Any, show_progress: bool, text: str,
                   target: str | None, class_index: int | None, generate: int, components: str | None,
                   readout: ReadOut | None, contrast: tuple[str, str] | None) -> LoadedModel:
    """The model, the request checked against it first (a name or folder loads after the check,
    from its configuration)."""
    from captum_ffb.architectures.heads import task_of
    from captum_ffb.explained.models import model_config

    if isinstance(model, LoadedModel):
        check_request(model.model.config, text, target, class_index, generate, components, readout,
                      task=task_of(model.model), contrast=contrast)
        return model
    config = config if config is not None else model_config(model)
    task = check_request(config, text, target, class_index, generate, components, readout, contrast=contrast)
    if show_progress:
        print(f"loading {model or 'the bundled all-MiniLM-L6-v2'} ...", file=sys.stderr)
    return load_model(model, show_progress=show_progress, config=config, task=task)


def _component_table(nd: NormDecomposition, ids: Tensor, first: Any, granularity: str,
                     labels: list[str]) -> ComponentAttribution:
    """The first explained output over tokens × components, its tokens labelled."""
    table = nd.attribute_components(ids, target=first, granularity=granularity,
                                    forward_kwargs={"attention_mask": torch.ones_like(ids)})
    table.tokens = [labels]
    return table


def graph_text(text: str, loaded: LoadedModel, target: str | None = None, class_index: int | None = None,
               corrupted: str | None = None, granularity: str = "head", prune: bool = True,
               node_threshold: float = 0.8, edge_threshold: float = 0.98, max_nodes: int | None = None,
               baseline: str | None = None, exclude_positions: Sequence[int] = (),
               max_n_logits: int | None = None, desired_logit_prob: float = 0.95) -> Any:
    r"""The exact attribution graph of ``text``'s output (what ``captum-ffb graph`` and the
    app's Graph tab draw): :meth:`~captum_ffb.attr.NormDecomposition.attribute_graph` on the
    encoded text, its tokens shown as people read them.

    Args:
        text (str): the input.
        loaded (LoadedModel): the model.
        target (str, optional): a causal LM's next token, as text; an answer of several tokens
                    explains its teacher-forced log-probability.
        class_index (int, optional): a sequence classifier's class.
        corrupted (str, optional): a corrupted text of the same length in tokens: the nodes
                    then carry patching estimates (``baseline``, its name before 0.4, is read
                    with a ``DeprecationWarning``).
        granularity, prune, node_threshold, edge_threshold, max_nodes, exclude_positions: as
                    in :meth:`~captum_ffb.attr.NormDecomposition.attribute_graph`.
        max_n_logits (int, optional): a causal LM's several outputs at once: its most
                    probable next tokens (at most this many, until ``desired_logit_prob`` of
                    the probability; :class:`~captum_ffb.explained.readouts.TopLogits`).
        desired_logit_prob (float): the probability mass ``max_n_logits`` tokens reach.

    Returns:
        AttributionGraph: with ``token_ids`` set (the input's ids).
    """
    from captum_ffb.explained.readouts import default_readout

    if baseline is not None:
        if corrupted is not None:
            raise TypeError("graph_text() got baseline= and corrupted=: give corrupted= only")
        warnings.warn(f"graph_text(): baseline= is now corrupted= (the old name stops working in {REMOVED_IN})",
                      DeprecationWarning, stacklevel=2)
        corrupted = baseline
    check_text(text)
    nd = NormDecomposition(loaded)  # its tokenizer names the explained token
    if loaded.spec.decoder is not None:
        return _graph_pair(text, loaded, nd, target, corrupted, granularity=granularity, prune=prune,
                           node_threshold=node_threshold, edge_threshold=edge_threshold, max_nodes=max_nodes,
                           exclude_positions=exclude_positions)
    ids = encode_text(text, loaded)["input_ids"]
    corrupted_ids = None
    if corrupted is not None:
        check_text(corrupted, name="corrupted")
        corrupted_ids = encode_text(corrupted, loaded)["input_ids"]
        if corrupted_ids.shape != ids.shape:
            raise ValueError(f"corrupted must have as many tokens as the text ({ids.shape[1]}), it has "
                             f"{corrupted_ids.shape[1]}")
    if target is not None and nd.task != "causal_lm":
        raise ValueError("target names a next token: it needs a causal LM")
    if max_n_logits is not None and (target is not None or nd.task != "causal_lm"):
        raise ValueError("max_n_logits explains a causal LM's most probable next tokens: give it without a target")
    if class_index is not None and nd.task != "sequence_classification":
        raise ValueError("class_index needs a sequence classifier")
    chosen: Any = class_index
    if target is not None:  # a next token's logit, or an answer of several tokens' log-probability
        pieces = text_token_ids(loaded.tokenizer, target, "target")
        chosen = int(pieces[0]) if len(pieces) == 1 else AnswerLogProbability(tuple(pieces))
    if max_n_logits is not None:
        chosen = TopLogits(max_n_logits, desired_logit_prob)
    if chosen is None and nd.task == "base":
        chosen = default_readout(loaded.model)
        if chosen is None:
            raise ValueError("this base model has no output to explain (the bundled sentiment head fits only "
                             "all-MiniLM-L6-v2): give a model with a head")
    graph = nd.attribute_graph(ids, chosen, granularity=granularity, prune=prune, node_threshold=node_threshold,
                               edge_threshold=edge_threshold, max_nodes=max_nodes, corrupted_inputs=corrupted_ids,
                               exclude_positions=exclude_positions)
    shown = graph.token_ids if graph.token_ids is not None else ids[0].tolist()  # an answer's tokens too
    return replace(graph, tokens=display_tokens(loaded.tokenizer.convert_ids_to_tokens(shown), loaded.tokenizer),
                   token_ids=shown)


def _graph_pair(text: str, loaded: LoadedModel, nd: NormDecomposition, target: str | None, corrupted: str | None,
                **options: Any) -> Any:
    """:func:`graph_text` for an encoder–decoder: ``"SOURCE ||| PREFIX"``, the next target
    token after the decoder's start token and the prefix (which may be empty)."""
    from captum_ffb.texts.text import PAIR_SEPARATOR, check_one_separator, decoder_ids

    if PAIR_SEPARATOR not in text:
        raise ValueError(f"an encoder–decoder's graph explains the next target token: give 'SOURCE {PAIR_SEPARATOR} "
                         f"PREFIX' (the prefix may be empty)")
    if corrupted is not None:
        raise ValueError("corrupted: patching estimates are for one-stack models; an encoder–decoder's graph has none")
    check_one_separator(text)
    source, prefix = (part.strip() for part in text.split(PAIR_SEPARATOR, 1))
    check_text(source)
    encoded = encode_text(source, loaded)
    decoded = decoder_ids(prefix, loaded)
    eos = loaded.model.config.eos_token_id
    if decoded.shape[1] > 1 and eos is not None and int(decoded[0, -1]) == int(eos):
        decoded = decoded[:, :-1]  # the tokenizer closed the prefix; the graph explains what follows it
    chosen = _single_token(loaded.tokenizer, target) if target is not None else None
    graph = nd.attribute_graph(encoded["input_ids"], chosen, forward_kwargs={
        "attention_mask": encoded["attention_mask"], "decoder_input_ids": decoded}, **options)
    tokens = loaded.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist() + decoded[0].tolist())
    return replace(graph, tokens=display_tokens(tokens, loaded.tokenizer))


def check_request(config: Any, text: str | None = None, target: str | None = None,
                  class_index: int | None = None, generate: int = 0, components: str | None = None,
                  readout: ReadOut | None = None, task: str | None = None,
                  contrast: tuple[str, str] | None = None) -> str:
    r"""Check an explain request against a model's configuration, before any weights load;
    return the model's task. Every refusal of ``explain`` is made here, once (the command line
    only turns the ``ValueError`` into its one line).

    Args:
        config: the model's configuration (:func:`~captum_ffb.explained.models.model_config`).
        text, target, class_index, generate, components, readout: as for :func:`explain_text`.
        task (str, optional): the model's task when it is known (a loaded model's own head);
                    else read from ``config``.
    """
    from captum_ffb.architectures import get_architecture
    from captum_ffb.explained.models import task_from_config
    from captum_ffb.explained.readouts import fits_minilm_head

    if text is not None:
        check_text_request(text, config)
    get_architecture(getattr(config, "model_type", None)).check_config(config)
    task = task or task_from_config(config)
    if target is not None and task != "causal_lm":
        raise ValueError("target names a next token: it needs a causal LM")
    if contrast is not None:
        if task != "causal_lm":
            raise ValueError("contrast compares two next tokens: it needs a causal LM")
        if target is not None or generate:
            raise ValueError("contrast explains logit(A) − logit(B) at the next position: leave out target and "
                             "generate")
        if len(contrast) != 2 or not all(isinstance(t, str) and t for t in contrast):
            raise ValueError(f"contrast takes two next tokens as text, got {contrast!r}")
    if class_index is not None and task != "sequence_classification":
        raise ValueError("class_index needs a sequence classifier")
    if generate and task != "causal_lm":
        raise ValueError("generate needs a causal LM")
    if generate < 0:
        raise ValueError(f"generate must be a positive number of tokens, got {generate}")
    if generate:  # the prompt has at least one token: the exact check follows the tokenizer
        check_new_tokens(generate, 1, config, name="generate")
    if readout is not None and task != "base":
        raise ValueError("a read-out is chosen for a base model; a model with a head explains "
                         "its next token or class")
    if components is not None:
        check_granularity(components, "components")
        if generate:
            raise ValueError("components explains one output; leave out generate")
        if task == "base" and readout is None and not fits_minilm_head(config):
            raise ValueError("components needs an output to explain: this base model has none "
                             "(the bundled sentiment head fits only all-MiniLM-L6-v2)")
    return task


def _run(nd: NormDecomposition, sequence: Tensor, readouts: list[ReadOut], route: str, maps: bool,
         forward_kwargs: dict[str, Any] | None = None) -> tuple[ExplainedOutput, dict[str, float] | None]:
    """The explained read-outs and, on the backward route for short inputs, the check against
    the forward route (its own delta and the largest relative difference of the answers)."""
    check = route == "backward" and sequence.shape[1] <= CHECK_UP_TO
    result = nd.explain(sequence, readouts, forward_kwargs, route=route, maps=maps, check=check)
    if not check:
        return result, None
    forward = result.forward_contributions
    scale = float(forward.abs().max()) or 1.0
    return result, {"forward_route_delta": float(result.forward_delta.max()),
                    "largest_relative_difference_between_routes":
                        float((forward - result.contributions).abs().max()) / scale}


def _explain_causal_lm(nd: NormDecomposition, loaded: LoadedModel, ids: Tensor, target: str | None,
                       generate: int, route: str, maps: bool, common: dict[str, Any],
                       contrast: tuple[str, str] | None = None) -> tuple[Explanation, ReadOut]:
    """The next token (given or predicted), or every generated token; and the first one's
    read-out, made concrete."""
    tokenizer = loaded.tokenizer
    n_prompt = ids.shape[1]
    if generate:
        generated = generate_greedily(loaded.model, ids, generate, name="generate").tolist()
        if not generated:
            raise ValueError("the model generated nothing to explain")
        sequence = torch.cat([ids, ids.new_tensor(generated[:-1])[None]], dim=1)
        readouts = [NextToken(token, n_prompt - 1 + t) for t, token in enumerate(generated)]
        what = f"the logit of each of the {len(generated)} generated tokens, read where it was predicted"
    elif contrast is not None:
        pair = [_single_token(tokenizer, t, "contrast") for t in contrast]
        sequence = ids
        readouts = [Contrast(*pair)]
        what = f"logit({contrast[0]!r}) − logit({contrast[1]!r}) at the next position"
    else:
        answer = text_token_ids(tokenizer, target, "target") if target is not None else []
        if len(answer) > 1:  # an answer of several tokens: its log-probability, teacher-forced
            sequence = torch.cat([ids, ids.new_tensor(answer[:-1])[None]], dim=1)
            readouts = [TokenLogProbability(token, n_prompt - 1 + t) for t, token in enumerate(answer)]
            what = (f"the log-probability of each of the answer's {len(answer)} tokens, teacher-forced (their sum "
                    f"is the log-probability of {target!r}; each bias also holds −log V, the log-probability "
                    "at uniform logits)")
        else:
            sequence = ids
            readouts = [NextToken(int(answer[0]) if answer else None, n_prompt - 1)]
            what = ("the logit of the predicted next token" if target is None
                    else "the logit of the next token " + repr(target))
    mask = torch.ones_like(sequence)
    result, check = _run(nd, sequence, readouts, route, maps and not generate, {"attention_mask": mask})
    if target is not None and not generate and len(result.readouts) == 1:
        hint = leading_space_hint(tokenizer, target, NextToken(None, n_prompt - 1).resolve(result.outputs, mask).token)
        if hint is not None:
            warnings.warn(hint, UserWarning, stacklevel=3)
    values = torch.cat([r.value(result.outputs, mask) for r in result.readouts])
    contributions = result.contributions
    if contrast is not None:
        targets = pair
        shown = display_tokens(tokenizer.convert_ids_to_tokens(pair), tokenizer, strip=False)
        labels = [f"{shown[0]!r} − {shown[1]!r}"]
    else:
        targets = [int(r.token) for r in result.readouts]
        labels = tokenizer.convert_ids_to_tokens(targets)
    all_ids = torch.cat([sequence[0], sequence.new_tensor(targets[-1:])]) if generate else sequence[0]
    tokens = tokenizer.convert_ids_to_tokens(all_ids.tolist())
    if generate:  # the last generated token is an output only
        contributions = torch.cat([contributions, contributions.new_zeros(contributions.shape[0], 1)], 1)
    explanation = Explanation(**common, tokens=tokens, explained=what, targets=labels,
                              contributions=contributions.detach(), values=values.detach(),
                              bias=result.bias.detach(), delta=result.delta.detach(), check=check,
                              labels=display_tokens(tokens, tokenizer),
                              target_labels=labels if contrast is not None else display_tokens(labels, tokenizer, strip=False),
                              result=result)
    explanation.maps = result.maps[0].detach() if result.maps is not None else None
    if maps and generate:  # the maps are of the prompt
        with torch.no_grad():
            explanation.maps = nd.maps(ids)[0].detach()
    return explanation, result.readouts[0]


def _explain_classifier(nd: NormDecomposition, loaded: LoadedModel, ids: Tensor,
                        class_index: int | None, route: str, maps: bool,
                        common: dict[str, Any]) -> tuple[Explanation, ReadOut]:
    """A class (given or predicted) of a sequence classifier, and its read-out."""
    classes = nd.head.output.weight.shape[0]
    if class_index is not None and not 0 <= class_index < classes:
        raise ValueError(f"class_index {class_index} does not exist: the model has {classes} classes")
    result, check = _run(nd, ids, [ClassLogit(class_index)], route, maps)
    readout = result.readouts[0]
    chosen = int(readout.index)
    names = getattr(loaded.model.config, "id2label", None) or {}
    label = str(names.get(chosen, chosen))
    what = f"the logit of class {chosen} ({label})" + (", the predicted class" if class_index is None else "")
    tokens = loaded.tokenizer.convert_ids_to_tokens(ids[0].tolist())
    value = readout.value(result.outputs, torch.ones_like(ids))
    explanation = Explanation(**common, tokens=tokens, labels=display_tokens(tokens, loaded.tokenizer),
                              explained=what, targets=[label], contributions=result.contributions.detach(),
                              values=value.detach(), bias=result.bias.detach(), delta=result.delta.detach(),
                              check=check, maps=None if result.maps is None else result.maps[0].detach(),
                              result=result)
    return explanation, readout


def _explain_base(nd: NormDecomposition, loaded: LoadedModel, ids: Tensor, readout: ReadOut | None,
                  route: str, maps: bool,
                  common: dict[str, Any]) -> tuple[Explanation, ReadOut | None]:
    """The whole-model maps, and a read-out of the hidden states when there is one (the
    bundled sentiment head where the model fits it), with that read-out."""
    from captum_ffb.explained.readouts import default_readout

    tokens = loaded.tokenizer.convert_ids_to_tokens(ids[0].tolist())
    explanation = Explanation(**common, tokens=tokens, labels=display_tokens(tokens, loaded.tokenizer),
                              explained="the whole-model token-to-token maps",
                              contributions=torch.zeros(0, ids.shape[1]))
    bundled = readout is None
    readout = default_readout(loaded.model) if bundled else readout
    if readout is None:
        if maps:
            with torch.no_grad():
                explanation.maps = nd.maps(ids)[0].detach()
        return explanation, None
    result, explanation.check = _run(nd, ids, [readout], route, maps)
    if bundled:
        explanation.explained = ("the logit of the bundled sentiment head (positive vs negative, a "
                                 "logistic regression on mean-pooled embeddings) and the whole-model maps")
        explanation.targets = explanation.target_labels = ["positive sentiment"]
    else:
        explanation.explained = f"the read-out {type(readout).__name__} and the whole-model maps"
        explanation.targets = explanation.target_labels = [type(readout).__name__]
    explanation.contributions = result.contributions.detach()
    explanation.values = readout.value(result.outputs, torch.ones_like(ids)).detach().reshape(1)
    explanation.bias = result.bias.detach()
    explanation.delta = result.delta.detach()
    explanation.maps = None if result.maps is None else result.maps[0].detach()
    explanation.result = result
    return explanation, result.readouts[0]


# ---------------------------------------------------------------------------------------
# corpus mode


@dataclass
class PairExplanation:
    r"""An encoder–decoder's explanation of a source and its (forced or generated) target.

    Attributes:
        model_name (str): the model's name or folder.
        model_type (str): its Hugging Face ``model_type``.
        source (str): the source text.
        source_tokens (list[str]): the source's tokens.
        prefix_tokens (list[str]): the decoder's input tokens (its start token first).
        target_tokens (list[str]): the explained tokens, one per decoder position.
        result (ExplainedOutput): the numbers (contributions, bias, logits, delta, shares).
        route (str): the route that computed them.
    """

    model_name: str
    model_type: str
    source: str
    source_tokens: list[str]
    prefix_tokens: list[str]
    target_tokens: list[str]
    result: Any
    route: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        r = self.result
        return {"model": self.model_name, "model_type": self.model_type, "source_text": self.source,
                "source_tokens": self.source_tokens, "target_prefix_tokens": self.prefix_tokens,
                "explained_tokens": self.target_tokens, "source": r.source.tolist(), "target": r.target.tolist(),
                "bias": r.bias.tolist(), "value": r.value.tolist(), "delta": r.delta.tolist(),
                "source_share": r.source_share.tolist(),
                "source_magnitude_share": r.source_magnitude_share.tolist(), "route": self.route}


def explain_pair(text: str, loaded: LoadedModel, generate: int = 0, route: str = "backward",
                 max_new_tokens: int = 20, audio: str | None = None) -> PairExplanation:
    r"""Explain an encoder–decoder on ``"SOURCE ||| TARGET"`` (every target token, forced) or on
    a source alone (``generate`` tokens, greedily; ``max_new_tokens`` when 0).

    Args:
        text (str): ``"SOURCE ||| TARGET"`` or the source.
        loaded (LoadedModel): an encoder–decoder with its LM head.
        generate (int): how many tokens to generate from a source alone.
        route (str): ``"backward"`` or ``"forward"``.
        max_new_tokens (int): the generation's length when ``generate`` is 0.
        audio (str, optional): a speech model's source, a WAV file; ``text`` is then its
                    forced target (prompt tokens included), or empty to generate.
    """
    from captum_ffb.texts.text import (
        PAIR_SEPARATOR,
        encode_audio,
        encode_pair,
        encode_source,
        split_pair,
    )

    if loaded.spec.decoder is None:
        raise ValueError(f"{loaded.model_type} is not an encoder–decoder")
    check_text_request(text, loaded.model.config, audio, loaded.source)
    if audio is None and PAIR_SEPARATOR not in text or audio is not None and not text.strip():
        check_new_tokens(generate or max_new_tokens, 1, loaded.model.config, decoder=True, name="generate")
    nd = NormDecomposition(loaded.model)
    if audio is not None:
        if text.strip():
            first, _, decoded, labels = encode_source(str(audio), text.strip(), loaded, audio)
            result = nd.explain_target(first, decoded[0, 1:], forward_kwargs={"decoder_input_ids": decoded[:, :-1]},
                                       route=route)
        else:
            first = encode_audio(audio, loaded)
            result = nd.explain_generation(first, max_new_tokens=generate or max_new_tokens, route=route)
            labels = [f"frame {k}" for k in range(result.source.shape[1])]
        tokens = loaded.tokenizer.convert_ids_to_tokens
        return PairExplanation(loaded.name, loaded.model_type, str(audio), labels,
                               tokens(result.target_ids.tolist()), tokens(result.tokens.tolist()), result, route)
    if PAIR_SEPARATOR in text:
        if generate:
            raise ValueError(f"give a target ('SOURCE {PAIR_SEPARATOR} TARGET') or a number of tokens to "
                             "generate, not both")
        source, target = split_pair(text, None)
        encoded, decoded = encode_pair(source, target, loaded)  # the start token, then the target's
        result = nd.explain_target(encoded["input_ids"], decoded[0, 1:], route=route,
                                   forward_kwargs={"attention_mask": encoded["attention_mask"],
                                                   "decoder_input_ids": decoded[:, :-1]})
    else:
        source = text.strip()
        encoded = encode_text(source, loaded)
        result = nd.explain_generation(encoded["input_ids"], max_new_tokens=generate or max_new_tokens, route=route)
    tokenizer = loaded.tokenizer
    return PairExplanation(
        loaded.name, loaded.model_type, source,
        tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist()),
        tokenizer.convert_ids_to_tokens(result.target_ids.tolist()),
        tokenizer.convert_ids_to_tokens(result.tokens.tolist()), result, route)


@dataclass
class ExplainJob:
    """One explanation per text of a corpus, batched (a :class:`~captum_ffb.jobs.job.Job`).

    What is explained follows the model, as in :func:`explain_text` without a target: a causal
    LM's predicted next token, a classifier's predicted class, the bundled MiniLM's sentiment
    head (the logit of the predicted side).
    """

    source: Any
    texts: list[str]
    batch_size: int = 16
    route: str = "backward"
    shard_version: int = 1

    def fingerprint(self) -> dict[str, Any]:
        from captum_ffb.jobs.job import fingerprint_of

        settings = {"model": self.source.name, "task": self.source.task, "route": self.route,
                    "batch_size": self.batch_size, "texts": len(self.texts)}
        return {**settings, "fingerprint": fingerprint_of(settings, self.texts)}

    def plan(self) -> list[list[int]]:
        return [list(range(k, min(k + self.batch_size, len(self.texts))))
                for k in range(0, len(self.texts), self.batch_size)]

    def setup(self) -> Any:
        from captum_ffb.evaluation.tasks import EvaluationTask

        loaded = self.source.load()
        kind = "next-token" if self.source.task == "causal_lm" else "sentiment"
        return EvaluationTask(loaded, kind)

    def run_batch(self, task: Any, index: int, batch: list[int]) -> dict[str, Any]:
        import numpy as np

        examples = [task.example(self.texts[k], None, k) for k in batch]
        padded = task.batch(examples)
        target = task.predict(padded)
        nd_target, sign = task.decomposition_target(target)
        with torch.enable_grad():
            c, bias, delta = task.nd.attribute(
                padded.input_ids, target=nd_target, route=self.route, return_bias=True,
                return_convergence_delta=True,
                forward_kwargs={"attention_mask": padded.attention_mask})
        sign = sign.to(c.device)
        c, bias = c.detach() * sign.unsqueeze(1), bias.detach() * sign
        with torch.no_grad():
            logits = task.class_logits(task.forward(padded.attention_mask, input_ids=padded.input_ids),
                                       padded.attention_mask)
        width = padded.input_ids.shape[1]
        out = np.full((len(batch), width), np.nan)
        ids = np.full((len(batch), width), -1)
        for row, e in enumerate(examples):
            real = padded.attention_mask[row].bool()
            out[row, : len(e.ids)] = c[row, real].cpu().numpy()
            ids[row, : len(e.ids)] = padded.input_ids[row, real].cpu().numpy()
        return {"index": np.asarray(batch), "contributions": out, "ids": ids,
                "length": np.asarray([len(e.ids) for e in examples]), "target": target.cpu().numpy(),
                "bias": bias.cpu().numpy(), "delta": delta.detach().cpu().numpy(),
                "value": logits.gather(1, target.view(-1, 1)).squeeze(1).detach().cpu().numpy()}


@renamed_arguments(BACKEND_RENAMES)
def explain_corpus(
    texts: list[str],
    model: str | None = None,
    out: str | Any = "captum_ffb_explain",
    batch_size: int = 16,
    route: str = "backward",
    backend: str = "local",
    backend_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
    device: str = "cpu",
) -> Any:
    r"""Explain every text of a corpus; resumable, on the local backend or Ray.

    Writes ``explanations.jsonl`` into ``out`` (one line per text, in order: ``index``, the
    text's position in ``texts``; ``tokens``, ``target``, ``value``, ``bias``,
    ``convergence_delta``, ``first_token_share`` and ``contributions``) and keeps the shards
    in ``out/run/``. Blank texts and texts longer than the model takes are skipped, listed in
    ``out/skipped.csv`` (``line`` = ``index + 1``, reason, detail).

    Args:
        texts (list[str]): the corpus.
        model (str, optional): a model folder or name; the bundled all-MiniLM-L6-v2 (its
                    sentiment head) by default.
        out: the output folder.
        batch_size (int): texts per batch (one shard each).
        route (str): ``"backward"`` or ``"forward"``.
        backend, backend_options: see :func:`captum_ffb.jobs.run_job`.
        overwrite (bool): discard an earlier run with other settings in ``out``.
        show_progress (bool): a progress bar.
        device (str): where the model runs (in every worker).

    Returns:
        Path: the ``explanations.jsonl`` file.
    """
    from captum_ffb.explained.models import load_tokenizer, model_config, task_from_config
    from captum_ffb.explained.readouts import fits_minilm_head
    from captum_ffb.io.files import check_out_dir
    from captum_ffb.jobs.job import ModelSource, check_run, run_job
    from captum_ffb.texts.corpus import write_skipped

    _check_corpus(texts)
    folder = check_out_dir(out)
    config = model_config(model)
    head = task_from_config(config)
    if head == "base" and not fits_minilm_head(config):
        raise ValueError("a base model has no output to explain: the corpus mode needs a causal LM, "
                         "a sequence classifier or the bundled all-MiniLM-L6-v2")
    tokenizer = load_tokenizer(model)
    kept, skipped = _kept_texts(texts, tokenizer, config)
    job = ExplainJob(ModelSource(name=model, task=head, device=device), [texts[k] for k in kept],
                     batch_size, route)
    check_run(job, folder / "run", overwrite)  # a refused run writes nothing
    folder.mkdir(parents=True, exist_ok=True)
    write_skipped(folder / "skipped.csv", skipped)
    if not kept:
        raise ValueError(f"no text to explain: all {len(texts)} are empty or too long (listed in "
                         f"{folder / 'skipped.csv'})")
    shards = run_job(job, folder / "run", backend=backend, overwrite=overwrite,
                     show_progress=show_progress, description="explaining",
                     backend_options=backend_options)
    return _write_explanations(folder / "explanations.jsonl", shards, kept, texts, tokenizer)


def _check_corpus(texts: list[str]) -> None:
    """``ValueError`` for an empty corpus or a text that is not usable (blank ones pass: they are
    skipped)."""
    if not texts:
        raise ValueError("the corpus has no texts")
    for k, text in enumerate(texts):
        try:
            if text.strip():  # blank texts are skipped later
                check_text(text)
        except ValueError as error:
            raise ValueError(f"text {k}: {error}") from None


def _kept_texts(texts: list[str], tokenizer: Any, config: Any) -> tuple[list[int], list[Any]]:
    """The positions of the texts to explain, and the skipped ones (blank, or longer than the
    model takes) as :class:`~captum_ffb.texts.corpus.SkippedLine`."""
    from captum_ffb.explained.models import max_length_of
    from captum_ffb.texts.corpus import skip_reason

    lengths = [len(ids) for ids in tokenizer([t if t.strip() else "." for t in texts])["input_ids"]]
    kept: list[int] = []
    skipped = []
    for k, (text, length) in enumerate(zip(texts, lengths)):
        reason = skip_reason(k, text, length, max_length_of(config), "the model's maximum")
        if reason is None:
            kept.append(k)
        else:
            skipped.append(reason)
    return kept, skipped


def _write_explanations(path: Path, shards: Any, kept: list[int], texts: list[str], tokenizer: Any) -> Path:
    """``explanations.jsonl``: one line per explained text, in order, from the shards."""
    from captum_ffb.io.files import atomic_open, to_json

    with atomic_open(path) as f:
        for shard in shards:
            for row, position in enumerate(shard["index"].tolist()):
                index = kept[position]  # the text's position in ``texts``
                n = int(shard["length"][row])
                c = shard["contributions"][row, :n]
                total = float(abs(c).sum())
                f.write(to_json({
                    "index": index, "text": texts[index],
                    "tokens": tokenizer.convert_ids_to_tokens(shard["ids"][row, :n].tolist()),
                    "target": int(shard["target"][row]), "value": float(shard["value"][row]),
                    "bias": float(shard["bias"][row]), "convergence_delta": float(shard["delta"][row]),
                    "first_token_share": float(abs(c[0]) / total) if total > 0 else 0.0,
                    "contributions": c.tolist(),
                }) + "\n")
    return path
