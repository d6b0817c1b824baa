"""``LLMNormAttribution``: :class:`~captum_ffb.attr.NormDecomposition` behind Captum's LLM
attribution API (``TextTokenInput`` / ``TextTemplateInput`` in, ``LLMAttributionResult`` out).

Captum's ``LLMAttribution`` accepts only its own perturbation methods and
``LLMGradientAttribution`` only its layer-gradient methods, so this is a third subclass of
their base, ``BaseLLMAttribution`` (not exported by ``captum.attr``; reached through
:mod:`captum_ffb._private`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from captum.attr import InterpretableInput, LLMAttributionResult, TextTemplateInput, TextTokenInput
from captum.log import log_usage
from torch import Tensor

from captum_ffb._deprecation import keyword_only
from captum_ffb._private import llm_attribution_base, pretty_tokens
from captum_ffb.attr.norm_decomposition import NormDecomposition
from captum_ffb.engine.generation import DEFAULT_NEW_TOKENS, generate_greedily
from captum_ffb.engine.locking import serialized
from captum_ffb.explained.readouts import NextToken, output_logits
from captum_ffb.explained.results import ExplainedOutput

#: The generation ``attribute`` runs without a target: greedy, :data:`DEFAULT_NEW_TOKENS` new
#: tokens (every entry point generates the same way); ``gen_args`` entries replace these.
DEFAULT_GEN_ARGS: dict[str, Any] = {"max_new_tokens": DEFAULT_NEW_TOKENS, "do_sample": False, "num_beams": 1}

_MARK = re.compile("\x00(\\d+)\x01")


class NormLLMAttributionResult(LLMAttributionResult):
    r"""Captum's ``LLMAttributionResult`` plus what keeps the decomposition exact.

    For output step ``t`` (the logit of ``output_tokens[t]``, read where the model predicts it
    from the prompt and the output tokens before it):

    ``prompt_attr[t].sum() + output_attr[t].sum() + bias[t] = logits[t]``

    up to ``convergence_delta[t]`` (float rounding). ``token_attr`` holds the prompt's share
    per interpretable feature (see :class:`LLMNormAttribution`); prompt tokens outside every
    feature (template text, ``skip_tokens``) appear only in ``prompt_attr``. Besides Captum's
    attributes it has:

    Attributes:
        prompt_tokens (list[str]): every prompt token.
        prompt_attr (Tensor): ``(T, n_prompt)`` each prompt token's contribution.
        prompt_features (Tensor): ``(n_prompt,)`` the interpretable feature (column of
                    ``token_attr`` before Captum's mask formatting) of each prompt token, or
                    -1 for a token in no feature.
        output_attr (Tensor): ``(T, T)`` contribution of output token ``s`` to step ``t``
                    (teacher forcing; zero unless ``s < t``).
        bias (Tensor): ``(T,)`` the part owed to no token (biases, norm shifts).
        logits (Tensor): ``(T,)`` the explained logits, from the model's own forward pass.
        convergence_delta (Tensor): ``(T,)`` ``|Σ contributions + bias − logit|``.
        target_ids (Tensor): ``(T,)`` the output token ids.
        route (str): ``"backward"`` or ``"forward"``.
        decoder_start_attr (Tensor, optional): ``(T,)`` for an encoder–decoder, the decoder's
                    start token's contribution (in no prompt or output token; it joins the
                    sum above). The prompt is then the source.
        explained (ExplainedOutput, optional): the numbers all of this is read from.
    """

    def __init__(
        self,
        *,
        input_tokens: list[str],
        output_tokens: list[str],
        seq_attr: Tensor,
        token_attr: Tensor,
        output_probs: Tensor,
        inp: InterpretableInput,
        prompt_tokens: list[str],
        prompt_attr: Tensor,
        prompt_features: Tensor,
        output_attr: Tensor,
        bias: Tensor,
        logits: Tensor,
        convergence_delta: Tensor,
        target_ids: Tensor,
        route: str,
        decoder_start_attr: Tensor | None = None,
        explained: ExplainedOutput | None = None,
    ) -> None:
        super().__init__(input_tokens=input_tokens, output_tokens=output_tokens, seq_attr=seq_attr,
                         token_attr=token_attr, output_probs=output_probs, inp=inp)
        self.prompt_tokens = prompt_tokens
        self.prompt_attr = prompt_attr
        self.prompt_features = prompt_features
        self.output_attr = output_attr
        self.bias = bias
        self.logits = logits
        self.convergence_delta = convergence_delta
        self.target_ids = target_ids
        self.route = route
        self.decoder_start_attr = decoder_start_attr
        self.explained = explained

    def __repr__(self) -> str:
        return (f"NormLLMAttributionResult({len(self.output_tokens)} output tokens × "
                f"{len(self.input_tokens)} input features, route={self.route!r}, "
                f"max convergence delta {float(self.convergence_delta.max()):.2e})")


BaseLLMAttribution = llm_attribution_base()


class LLMNormAttribution(BaseLLMAttribution):
    r"""Exact attribution of a causal LM's generated (or given) tokens to its prompt, in
    Captum's LLM attribution API; for an encoder–decoder, of its target's tokens to its
    source (the prompt), the target prefix's share in ``output_attr``.

    Each output token ``y_t`` is explained by its **logit** (not its log-probability, which is
    not linear in the tokens): with the prompt and ``y_<t`` fed in (teacher forcing), that
    logit is ``Σ_j c_j + c_bias`` exactly, one ``c_j`` per position. One forward pass over
    prompt + output serves every step (:meth:`NormDecomposition.attribute_steps`).

    Columns of ``token_attr`` (Captum's convention for ``LLMGradientAttribution``): the
    prompt's interpretable features only. With :class:`TextTokenInput` they are the prompt
    tokens left after ``skip_tokens``; with :class:`TextTemplateInput` they are the template's
    values (segments): a segment's attribution is the sum of its tokens', a token counting
    for the segment holding most of its characters (a fast tokenizer gives the offsets), and
    segments sharing a ``mask`` id share their total, as in Captum's ``format_attr``. What the
    columns leave out (earlier output tokens, template text, skipped tokens, the bias) is on
    the result (:class:`NormLLMAttributionResult`), so every step stays exact.
    ``seq_attr = token_attr.sum(0)``, as for Captum's gradient methods; ``output_probs`` are
    the model's probabilities of the output tokens.

    Args:
        attr_method (NormDecomposition): built on a ``*ForCausalLM``.
        tokenizer: the model's Hugging Face tokenizer.

    Examples::

        >>> from captum.attr import TextTemplateInput, TextTokenInput
        >>> from captum_ffb import NormDecomposition
        >>> from captum_ffb.attr import LLMNormAttribution
        >>> llm_attr = LLMNormAttribution(NormDecomposition(model), tokenizer)
        >>> result = llm_attr.attribute(TextTokenInput("The capital of France is", tokenizer),
        ...                             gen_args={"max_new_tokens": 5})
        >>> result.token_attr.shape           # (5 output tokens, prompt tokens)
        >>> result.plot_token_attr(show=True)
        >>> template = TextTemplateInput("{} lives in {}.", values=["Marie", "Paris"])
        >>> llm_attr.attribute(template, target=" She speaks French").seq_attr  # per segment
    """

    SUPPORTED_METHODS = (NormDecomposition,)
    SUPPORTED_INPUTS = (TextTokenInput, TextTemplateInput)

    def __init__(self, attr_method: NormDecomposition, tokenizer: Any) -> None:
        if not isinstance(attr_method, NormDecomposition):
            raise TypeError(
                f"LLMNormAttribution wraps a NormDecomposition, got {type(attr_method).__name__}"
            )
        if attr_method.task not in ("causal_lm", "seq2seq_lm"):
            raise ValueError(
                f"LLMNormAttribution needs a causal LM (a *ForCausalLM) or an encoder–decoder with its "
                f"LM head; {type(attr_method.model).__name__} is a {attr_method.task} model"
            )
        super().__init__(attr_method, tokenizer)
        self.attr_method = attr_method

    def has_convergence_delta(self) -> bool:
        return True

    @log_usage()
    @serialized
    @keyword_only(2, ("inp", "target", "gen_args", "route", "rules"))
    def attribute(
        self,
        inp: TextTokenInput | TextTemplateInput,
        target: str | Tensor | None = None,
        *,
        gen_args: dict[str, Any] | None = None,
        route: str = "backward",
        rules: Mapping[str, Callable] | None = None,
        reference: str | int | Tensor | None = None,
    ) -> NormLLMAttributionResult:
        r"""Contributions of the prompt's features to every output token's logit.

        Args:
            inp (TextTokenInput or TextTemplateInput): the prompt and its features.
            target (str or Tensor, optional): the output to explain: a string (tokenized
                        without special tokens, as Captum does) or token ids ``(T,)``.
                        ``None``: generate it greedily
                        (:func:`~captum_ffb.engine.generation.generate_greedily`).
            gen_args (dict, optional): generation arguments (only with ``target=None``):
                        ``max_new_tokens`` (20 by default) and any other of ``generate``'s.
            route (str): ``"backward"`` or ``"forward"`` (see ``NormDecomposition``).
            rules (dict, optional): role → rule for this call.
            reference (str, int or Tensor, optional): what the players are measured from
                        (see ``NormDecomposition.attribute``; the instance's by default).

        Returns:
            NormLLMAttributionResult: ``token_attr`` ``(T, n_features)``, ``seq_attr``
            ``(n_features,)``, ``output_probs`` ``(T,)``, the exactness terms, and the
            :class:`~captum_ffb.explained.results.ExplainedOutput` they come from (``explained``).
        """
        if not isinstance(inp, self.SUPPORTED_INPUTS):
            raise TypeError(
                f"inp must be a TextTokenInput or a TextTemplateInput, got {type(inp).__name__}"
            )
        prompt, features = self._prompt(inp)
        if prompt.shape[1] == 0:
            raise ValueError("the prompt has no tokens")
        tokens = self._targets(prompt, target, gen_args)
        result = self.attr_method.explain_target(prompt, tokens, route=route, rules=rules, reference=reference)
        n_prompt, steps = prompt.shape[1], tokens.numel()
        contributions = result.contributions.detach().float().cpu()
        # the players: the prompt (a causal LM's, or an encoder–decoder's source), then an
        # encoder–decoder's decoder start token, then the output tokens but the last
        after = n_prompt + (1 if result.n_source else 0)
        prompt_attr = contributions[:, :n_prompt]
        output_attr = torch.zeros(steps, steps)
        output_attr[:, : steps - 1] = contributions[:, after:after + steps - 1]
        token_attr = self._feature_attr(inp, prompt_attr, features)
        return NormLLMAttributionResult(
            input_tokens=list(inp.values),
            output_tokens=self._pretty(tokens.cpu()),
            seq_attr=token_attr.sum(0),
            token_attr=token_attr,
            output_probs=step_probabilities(result),
            inp=inp,
            prompt_tokens=self.tokenizer.convert_ids_to_tokens(prompt[0].tolist()),
            prompt_attr=prompt_attr,
            prompt_features=features.cpu(),
            output_attr=output_attr,
            bias=result.bias.detach().float().cpu(),
            logits=result.value.detach().float().cpu(),
            convergence_delta=result.delta.detach().float().cpu(),
            target_ids=tokens.cpu(),
            route=route,
            decoder_start_attr=contributions[:, n_prompt] if result.n_source else None,
            explained=result,
        )

    def attribute_future(self) -> Callable:
        r"""Not implemented for LLMNormAttribution."""
        raise NotImplementedError("attribute_future is not implemented for LLMNormAttribution")

    # ------------------------------------------------------------------ helpers
    def _pretty(self, ids: Tensor) -> list[str]:
        """Captum's readable tokens; its fallback for tokens that do not re-encode alone
        (e.g. "\\n\\n") is fine, so its warnings about taking it are not passed on."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"(\(i=\d+, idx=\d+\))|(Pretty tokens length)")
            return pretty_tokens(ids, self.tokenizer)

    def _prompt(self, inp: TextTokenInput | TextTemplateInput) -> tuple[Tensor, Tensor]:
        """The prompt ids ``(1, n)`` and each token's interpretable feature (-1: none)."""
        if isinstance(inp, TextTokenInput):
            ids = torch.as_tensor(inp.to_model_input()).reshape(1, -1).to(self.device)
            n = ids.shape[1]
            if inp.itp_mask is None:
                return ids, torch.arange(n)
            kept = inp.itp_mask.reshape(-1).bool()
            features = torch.full((n,), -1, dtype=torch.long)
            features[kept] = torch.arange(int(kept.sum()))
            return ids, features
        text, spans = _segment_spans(inp)
        try:
            encoded = self.tokenizer(text, return_offsets_mapping=True)
        except (NotImplementedError, TypeError, ValueError) as error:
            raise ValueError(
                "TextTemplateInput needs a fast tokenizer (one that returns offsets) to map "
                "tokens to segments"
            ) from error
        ids = torch.tensor([encoded["input_ids"]], device=self.device)
        groups = list(inp.formatted_mask) if inp.mask is not None else list(range(len(inp.values)))
        features = []
        for start, end in encoded["offset_mapping"]:
            overlap = [(min(end, b) - max(start, a), value) for a, b, value in spans]
            best, value = max(overlap, default=(0, -1), key=lambda pair: pair[0])
            features.append(groups[value] if best > 0 else -1)
        return ids, torch.tensor(features, dtype=torch.long)

    def _targets(self, prompt: Tensor, target: str | Tensor | None,
                 gen_args: dict[str, Any] | None) -> Tensor:
        if target is not None and gen_args is not None:
            raise ValueError("gen_args is for generating the target: give one or the other")
        if target is None:
            if not callable(getattr(self.model, "generate", None)):
                raise ValueError(f"{type(self.model).__name__} cannot generate: give the target")
            arguments = dict(gen_args or {})
            count = arguments.pop("max_new_tokens", DEFAULT_NEW_TOKENS)
            tokens = generate_greedily(self.model, prompt, count, arguments, name="gen_args['max_new_tokens']")
        elif isinstance(target, str):
            encoded = self.tokenizer(text_target=target, add_special_tokens=False)["input_ids"] \
                if self.attr_method.engine.source is not None else \
                self.tokenizer.encode(target, add_special_tokens=False)
            tokens = torch.tensor(encoded)
        elif isinstance(target, Tensor):
            if target.is_floating_point():
                raise TypeError("target token ids must be integers")
            if target.dim() == 2 and target.shape[0] == 1:
                target = target[0]
            if target.dim() != 1:
                raise ValueError(f"target ids must be (T,), got shape {tuple(target.shape)}")
            tokens = target
        else:
            raise TypeError(f"target must be a str, a Tensor of token ids or None, got {type(target).__name__}")
        if tokens.numel() == 0:
            raise ValueError("the target has no tokens (an empty string, or nothing was generated)")
        return tokens.long().to(self.device)

    @staticmethod
    def _feature_attr(inp: TextTokenInput | TextTemplateInput, prompt_attr: Tensor,
                      features: Tensor) -> Tensor:
        """``(T, n_itp)`` per interpretable feature, then Captum's ``format_attr``."""
        n_itp = inp.n_itp_features
        kept = features >= 0
        per_feature = torch.zeros(prompt_attr.shape[0], n_itp, dtype=prompt_attr.dtype)
        per_feature.index_add_(1, features[kept], prompt_attr[:, kept])
        return inp.format_attr(per_feature)


def step_probabilities(result: ExplainedOutput) -> Tensor:
    """``(T,)`` the model's probability of each explained token where it is read, from the
    logits of the pass that recorded the explanation (float32, on the CPU)."""
    logits = output_logits(result.outputs)[0]
    positions = torch.as_tensor([int(r.position) for r in result.readouts], device=logits.device)
    tokens = torch.as_tensor([int(r.token) for r in result.readouts], device=logits.device)
    step_logits = logits[positions].float()
    chosen = step_logits.gather(1, tokens[:, None])[:, 0]
    return (chosen - torch.logsumexp(step_logits, dim=1)).exp().detach().cpu()


def explain_steps(
    nd: NormDecomposition,
    ids: Tensor,
    targets: Tensor,
    positions: Tensor,
    route: str = "backward",
    rules: Mapping[str, Callable] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    r"""Teacher-forced steps of one sequence ``ids`` ``(1, n)``: the contributions ``(T, n)``,
    bias, convergence delta, logit and probability ``(T,)`` of ``targets[t]`` read at
    ``positions[t]``, from :meth:`NormDecomposition.explain`'s passes (the probabilities from
    its recording pass: no extra call). Float32 tensors on the CPU."""
    readouts = [NextToken(int(t), int(p)) for t, p in zip(torch.as_tensor(targets).reshape(-1),
                                                          torch.as_tensor(positions).reshape(-1))]
    result = nd.explain(ids, readouts, forward_kwargs={"attention_mask": torch.ones_like(ids)}, route=route,
                        rules=rules)
    return tuple(t.detach().float().cpu() for t in (result.contributions, result.bias, result.delta, result.value,
                                                    step_probabilities(result)))


def _segment_spans(inp: TextTemplateInput) -> tuple[str, list[tuple[int, int, int]]]:
    """The template's text and the character span ``(start, end, value)`` of each value's
    occurrence, found by formatting the template with markers."""
    markers = [f"\x00{k}\x01" for k in range(len(inp.values))]
    if inp.dict_keys:
        marked = inp.format_fn(**dict(zip(inp.dict_keys, markers)))
    else:
        marked = inp.format_fn(*markers)
    pieces: list[str] = []
    spans: list[tuple[int, int, int]] = []
    cursor, length = 0, 0
    for match in _MARK.finditer(marked):
        literal = marked[cursor:match.start()]
        pieces.append(literal)
        length += len(literal)
        value = int(match.group(1))
        pieces.append(inp.values[value])
        spans.append((length, length + len(inp.values[value]), value))
        length += len(inp.values[value])
        cursor = match.end()
    pieces.append(marked[cursor:])
    text = "".join(pieces)
    if text != inp.to_model_input():
        raise ValueError("cannot locate the segments in this TextTemplateInput's text (does the "
                         "template transform its values?)")
    return text, spans
