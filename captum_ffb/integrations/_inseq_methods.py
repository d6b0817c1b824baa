"""The inseq attribution methods. Importing this module registers them: inseq finds its methods
among the subclasses of ``FeatureAttribution`` (by their ``method_name``), so defining the
classes is the registration. Import it through :func:`captum_ffb.integrations.inseq.register`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from inseq.attr.feat import FeatureAttribution
from inseq.attr.step_functions import get_step_function
from inseq.data import CoarseFeatureAttributionStepOutput, FeatureAttributionStepOutput
from torch import Tensor

from captum_ffb.attr.llm import explain_steps
from captum_ffb.attr.norm_decomposition import NormDecomposition
from captum_ffb.engine.passes import run_model

#: Per-step scores every result carries (inseq's own step scores need a per-step method).
STEP_SCORES = ("logit", "probability", "bias", "convergence_delta")


class NormDecompositionAttribution(FeatureAttribution):
    r"""inseq method ``"norm_decomposition"``: exact contributions of every prefix token to each
    generated token's **logit** (``Σ column + bias = logit``), decoder-only models; for
    encoder–decoder models, of every source token (``source_attributions``) and, with
    ``attribute_target=True``, every target-prefix token (``target_attributions``):
    ``Σ source column + Σ target column + bias = logit``.

    All steps of a sequence come from one teacher-forced forward pass (inseq's "final step"
    methods, like ``"attention"``), so inseq's ``step_scores`` argument is refused; every result
    instead carries the step scores ``logit``, ``probability``, ``bias`` and
    ``convergence_delta``. The attributed function is always the logit (``attributed_fn`` may
    only be left as is or set to ``"logit"``).

    Args:
        attribution_model: inseq's model (a decoder-only Hugging Face model).
        rules (dict, optional): role → rule, as for :class:`~captum_ffb.attr.NormDecomposition`.

    Examples::

        >>> import inseq
        >>> from captum_ffb.integrations import inseq as ffb_inseq
        >>> ffb_inseq.register()
        >>> model = inseq.load_model(hf_model, "norm_decomposition", tokenizer=tokenizer)
        >>> out = model.attribute("The capital of France is", generation_args={"max_new_tokens": 5})
        >>> out.show()
    """

    method_name = "norm_decomposition"
    route = "backward"

    def __init__(self, attribution_model: Any, rules: dict[str, Callable] | None = None, **kwargs: Any) -> None:
        super().__init__(attribution_model, hook_to_model=False)
        if kwargs:
            raise TypeError(f"{self.method_name} got unexpected arguments: {', '.join(sorted(kwargs))}")
        self.attribute_batch_ids = True
        # inseq refuses attribute_target=True to id-attributing methods that forward ids; the
        # forward here is ours (filtered_attribute_step reads the ids), so say embeddings
        self.forward_batch_embeds = attribution_model.is_encoder_decoder
        self.is_final_step_method = True
        self.method = NormDecomposition(attribution_model.model, rules=rules)
        self._scores: dict[str, Tensor] = {}
        self.hook()

    def get_attribution_args(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """``rules`` is the one attribution argument taken from ``model.attribute(**kwargs)``."""
        taken = {k: v for k, v in kwargs.items() if k == "rules"}
        return taken, {k: v for k, v in kwargs.items() if k not in taken}

    def prepare_and_attribute(self, sources: Any, targets: Any, *args: Any,
                              attributed_fn: str | Callable | None = None, **kwargs: Any) -> Any:
        logit = get_step_function("logit")
        allowed = (None, "logit", logit, self.attribution_model.default_attributed_fn_id,
                   get_step_function(self.attribution_model.default_attributed_fn_id))
        if not any(attributed_fn is fn or attributed_fn == fn for fn in allowed):
            name = getattr(attributed_fn, "__name__", attributed_fn)
            raise ValueError(f"{self.method_name} explains each token's logit exactly; "
                             f"attributed_fn={name!r} is not supported")
        if kwargs.get("attributed_fn_args"):
            raise ValueError(f"{self.method_name} takes no attributed_fn_args (contrastive targets "
                             "are not supported)")
        unknown = set(kwargs.get("attribution_args") or {}) - {"rules"}
        if unknown:
            raise ValueError(f"{self.method_name} got unexpected attribution_args: {', '.join(sorted(unknown))}")
        return super().prepare_and_attribute(sources, targets, *args, attributed_fn=logit, **kwargs)

    def filtered_attribute_step(
        self,
        batch: Any,
        target_ids: Tensor,
        attributed_fn: Callable,
        target_attention_mask: Tensor | None = None,
        attribute_target: bool = False,
        step_scores: list[str] = [],  # noqa: B006 (inseq's signature)
        attribution_args: dict[str, Any] = {},  # noqa: B006
        attributed_fn_args: dict[str, Any] = {},  # noqa: B006
        step_scores_args: dict[str, Any] = {},  # noqa: B006
    ) -> FeatureAttributionStepOutput:
        """The final step: every row of ``batch`` (left-padded prefixes) followed by its
        ``target_ids`` is explained at all its positions at once. ``[b, j, i]`` of the
        ``(B, S, S)`` target attributions is position ``j``'s contribution to the token
        predicted at position ``i`` (encoder–decoders: ``[b, s, i]`` of the ``(B, n_source,
        S)`` source attributions too)."""
        if self.attribution_model.is_encoder_decoder:
            return self._encoder_decoder_step(batch, target_ids, target_attention_mask, attribute_target,
                                              attribution_args)
        ids = torch.cat([batch.input_ids, target_ids.reshape(-1, 1).to(batch.input_ids.device)], 1)
        last = torch.ones_like(target_ids.reshape(-1, 1)) if target_attention_mask is None \
            else target_attention_mask.reshape(-1, 1)
        mask = torch.cat([batch.attention_mask, last.to(batch.attention_mask.device)], 1).bool()
        rows, length = ids.shape[0], ids.shape[1] - 1
        grid = torch.zeros(rows, length, length)
        scores = {name: torch.full((rows, length), float("nan")) for name in STEP_SCORES}
        for b in range(rows):
            where = mask[b].nonzero()[:, 0]
            if where.numel() < 2:
                continue
            real = ids[b, where]
            steps = where.numel() - 1
            contributions, bias, delta, logits, probs = explain_steps(
                self.method, real[None, :-1], real[1:], torch.arange(steps, device=real.device),
                route=self.route, rules=attribution_args.get("rules"),
            )
            inputs = where[:-1].cpu()
            grid[b, inputs[:, None], inputs[None, :]] = contributions.T
            for name, values in zip(STEP_SCORES, (logits, probs, bias, delta)):
                scores[name][b, inputs] = values
        self._scores = scores
        return CoarseFeatureAttributionStepOutput(target_attributions=grid, step_scores={})

    def _encoder_decoder_step(self, batch: Any, target_ids: Tensor, target_attention_mask: Tensor | None,
                              attribute_target: bool, attribution_args: dict[str, Any]
                              ) -> FeatureAttributionStepOutput:
        """Every row's source and forced target explained at once (``explain_target``)."""
        sources, targets = batch.sources, batch.targets
        ids = torch.cat([targets.input_ids, target_ids.reshape(-1, 1).to(targets.input_ids.device)], 1)
        last = torch.ones_like(target_ids.reshape(-1, 1)) if target_attention_mask is None \
            else target_attention_mask.reshape(-1, 1)
        mask = torch.cat([targets.attention_mask, last.to(targets.attention_mask.device)], 1).bool()
        source_mask = sources.attention_mask.bool()
        rows, length = ids.shape[0], ids.shape[1] - 1
        source_grid = torch.zeros(rows, sources.input_ids.shape[1], length)
        target_grid = torch.zeros(rows, length, length)
        scores = {name: torch.full((rows, length), float("nan")) for name in STEP_SCORES}
        for b in range(rows):
            where = mask[b].nonzero()[:, 0]
            seen = source_mask[b].nonzero()[:, 0]
            if where.numel() < 2 or seen.numel() == 0:
                continue
            real = ids[b, where]
            out = self.method.explain_target(sources.input_ids[b, seen][None], real[1:],
                                             forward_kwargs={"decoder_input_ids": real[None, :-1]},
                                             route=self.route, rules=attribution_args.get("rules"))
            steps = where[:-1].cpu()
            source_grid[b, seen.cpu()[:, None], steps[None, :]] = out.source.T
            target_grid[b, steps[:, None], steps[None, :]] = out.target.T
            step_logits = run_model(self.method.model, sources.input_ids[b, seen][None],
                                    decoder_input_ids=real[None, :-1]).logits[0].float()
            probs = torch.softmax(step_logits, -1)[torch.arange(len(real) - 1), real[1:]]
            for name, values in zip(STEP_SCORES, (out.value, probs, out.bias, out.delta)):
                scores[name][b, steps] = values
        self._scores = scores
        return CoarseFeatureAttributionStepOutput(source_attributions=source_grid,
                                                  target_attributions=target_grid if attribute_target else None,
                                                  step_scores={})

    def _build_multistep_output_from_single_step(
        self,
        single_step_output: FeatureAttributionStepOutput,
        attr_pos_start: int,
        attr_pos_end: int,
    ) -> list[FeatureAttributionStepOutput]:
        steps = FeatureAttribution._build_multistep_output_from_single_step(
            single_step_output, attr_pos_start=attr_pos_start, attr_pos_end=attr_pos_end
        )
        for step, position in zip(steps, range(attr_pos_start, attr_pos_end)):
            step.step_scores = {name: values[:, position - 1] for name, values in self._scores.items()}
        self._scores = {}
        return steps


class NormDecompositionForwardAttribution(NormDecompositionAttribution):
    r"""inseq method ``"norm_decomposition_forward"``: :class:`NormDecompositionAttribution`
    computed by forward propagation of the decompositions (``route="forward"``) instead of one
    backward pass per step; the same numbers up to float rounding.

    Examples::

        >>> model = inseq.load_model(hf_model, "norm_decomposition_forward", tokenizer=tokenizer)
    """

    method_name = "norm_decomposition_forward"
    route = "forward"
