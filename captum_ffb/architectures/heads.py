"""Declarative heads: what a task model computes after its last block, for each family.

A head reads one position (or a pooling of positions) of the last block's output, applies
the family's final norm, then dense layers and activations, then the output layer whose
row for the target (a class, a token) gives the scalar explained. Paths are resolved from
the task model first, then from its base model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from captum_ffb.architectures.registry import get_architecture, supported_architectures
from captum_ffb.architectures.spec import Projection

#: Tasks a head can serve, read from the model's class name.
TASKS = ("causal_lm", "sequence_classification", "base", "seq2seq_lm")


@dataclass(frozen=True)
class HeadActivation:
    """An element-wise activation between two dense layers of a head.

    Attributes:
        path (str, optional): the activation module (BERT's ``pooler.activation``).
        function (str, optional): the name of a function the head calls directly
                    (``"tanh"``, ``"relu"``, ``"gelu"``), when it is not a module.
    """

    path: str | None = None
    function: str | None = None


@dataclass(frozen=True)
class HeadNorm:
    """A norm between the layers of a head (ModernBERT's ``head.norm``), of the family's kind.

    Attributes:
        path (str): the norm module, from the task model.
    """

    path: str


@dataclass(frozen=True)
class HeadSpec:
    r"""What follows the blocks in one kind of task model.

    Attributes:
        position (str): the position read: ``"first"`` (the [CLS] / ``<s>`` token) or
                    ``"last"`` (each row's last real token; a causal LM's default target
                    position, which the user may change).
        final_norm (bool): apply the family's final norm (``ArchitectureSpec.final_norm``)
                    first, when the model has one.
        layers (tuple): dense layers (:class:`~captum_ffb.architectures.spec.Projection`), activations
                    (:class:`HeadActivation`) and norms (:class:`HeadNorm`) after the final
                    norm, in order.
        output (str, optional): the output layer whose rows are the targets; ``None``: the
                    model's output embeddings (``get_output_embeddings()``, the LM head).
        softcap (str, optional): the config attribute of a final ``c·tanh(logit / c)``
                    (Gemma 2's ``final_logit_softcapping``).
        scale (Callable, optional): the factor the model multiplies its logits by, from the
                    config (Cohere's ``logit_scale``, T5's ``d_model ** -0.5`` with tied
                    embeddings), before any soft-capping.
        logits_bias (str, optional): a buffer of the task model added to every row of logits
                    (BART's and Marian's ``final_logits_bias``), where the model has it.
        unsupported (Callable, optional): a function of the config returning why this head
                    cannot be decomposed (``None`` when it can).
    """

    position: str = "last"
    final_norm: bool = True
    layers: tuple[Projection | HeadActivation | HeadNorm, ...] = field(default_factory=tuple)
    output: str | None = None
    softcap: str | None = None
    scale: Callable[[Any], float] | None = None
    logits_bias: str | None = None
    unsupported: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        if self.position not in ("first", "last"):
            raise ValueError(f"position must be 'first' or 'last', got {self.position!r}")


_HEADS: dict[tuple[str, str], HeadSpec] = {}

#: The head every causal LM has unless its family registers another (the final soft-capping
#: applies when the config sets one, as Gemma 2's does).
CAUSAL_LM = HeadSpec(position="last", softcap="final_logit_softcapping")
#: The sequence classifier of every decoder family (``GPT2ForSequenceClassification``,
#: Llama's, ...) unless it registers another.
DECODER_CLASSIFIER = HeadSpec(position="last", output="score")
#: The language-model head of every encoder–decoder (on the decoder's last block) unless its
#: family registers another: the final norm, the output embeddings, ``final_logits_bias``.
SEQ2SEQ_LM = HeadSpec(position="last", logits_bias="final_logits_bias")
#: A base model read through a pooling and a direction (see ``captum_ffb.Direction``).
BASE = HeadSpec(position="last", output=None)


def register_head(model_type: str, task: str, head: HeadSpec, overwrite: bool = False) -> None:
    r"""Register the head of one family's task model.

    Args:
        model_type (str): the Hugging Face ``model_type``.
        task (str): one of ``TASKS``.
        head (HeadSpec): what the task model computes after its last block.
        overwrite (bool): replace an existing registration.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if (model_type, task) in _HEADS and not overwrite:
        raise ValueError(f"a {task} head of {model_type!r} is already registered")
    _HEADS[(model_type, task)] = head


def task_of(model: Any) -> str:
    """The task (one of ``TASKS``) of a transformers model, of its class's name, or of a
    saved model's configuration (its ``architectures``; a GGUF file's has none: a causal
    family is then read as a causal LM). The one place where a model's task is inferred."""
    if isinstance(model, str):
        if model.endswith(("ForCausalLM", "LMHeadModel")):
            return "causal_lm"
        if model.endswith("ForSequenceClassification"):
            return "sequence_classification"
        if model.endswith(("ForConditionalGeneration", "MTModel")):
            return "seq2seq_lm"
        return "base"
    if isinstance(model, nn.Module):
        return task_of(type(model).__name__)
    names = getattr(model, "architectures", None) or []
    for name in names:
        if task_of(name) != "base":
            return task_of(name)
    if not names:
        from captum_ffb.architectures.registry import get_architecture

        return "causal_lm" if get_architecture(getattr(model, "model_type", None)).is_causal(model) else "base"
    return "base"


def _is_decoder(model_type: str) -> bool:
    """Whether the family's spec makes every model of it causal (a decoder-only family)."""
    if model_type not in supported_architectures():
        return False
    spec = get_architecture(model_type)
    if spec.causal is None:  # the chain's default: only Post-LN blocks may be bidirectional
        return isinstance(spec.chain, str) and spec.chain != "post_ln"
    return spec.causal is True


def get_head(model_type: str, task: str) -> HeadSpec:
    """The head of ``model_type``'s ``task`` model: the one registered for it, else the
    default of its task (a decoder family's classifier is :data:`DECODER_CLASSIFIER`); a clear
    error when none is known."""
    if (model_type, task) in _HEADS:
        return _HEADS[(model_type, task)]
    if task == "causal_lm":
        return CAUSAL_LM
    if task == "seq2seq_lm":
        return SEQ2SEQ_LM
    if task == "base":
        return BASE
    if task == "sequence_classification" and _is_decoder(model_type):
        return DECODER_CLASSIFIER
    known = {m for m, t in _HEADS if t == task}
    if task == "sequence_classification":
        known |= {m for m in supported_architectures() if _is_decoder(m)}
    raise ValueError(
        f"no {task} head is registered for {model_type!r} (known: {', '.join(sorted(known))}); "
        "describe it with captum_ffb.architectures.heads.HeadSpec and register_head"
    )


_BERT_CLASSIFIER = HeadSpec(
    position="first",
    final_norm=False,
    layers=(Projection("pooler.dense"), HeadActivation(path="pooler.activation")),
    output="classifier",
)
_ROBERTA_CLASSIFIER = HeadSpec(
    position="first",
    final_norm=False,
    layers=(Projection("classifier.dense"), HeadActivation(function="tanh")),
    output="classifier.out_proj",
)
_ELECTRA_CLASSIFIER = HeadSpec(
    position="first",
    final_norm=False,
    layers=(Projection("classifier.dense"), HeadActivation(path="classifier.activation")),
    output="classifier.out_proj",
)
_DISTILBERT_CLASSIFIER = HeadSpec(
    position="first",
    final_norm=False,
    layers=(Projection("pre_classifier"), HeadActivation(function="relu")),
    output="classifier",
)

register_head("bert", "sequence_classification", _BERT_CLASSIFIER)
for _name in ("roberta", "xlm-roberta", "camembert"):
    register_head(_name, "sequence_classification", _ROBERTA_CLASSIFIER)
register_head("electra", "sequence_classification", _ELECTRA_CLASSIFIER)
register_head("distilbert", "sequence_classification", _DISTILBERT_CLASSIFIER)
register_head("modernbert", "sequence_classification", HeadSpec(
    position="first",
    layers=(Projection("head.dense"), HeadActivation(path="head.act"), HeadNorm("head.norm")),
    output="classifier",
    unsupported=lambda config: (
        f"its classifier pools the positions ({config.classifier_pooling!r}); the [CLS] pooling "
        "('cls') is supported" if getattr(config, "classifier_pooling", "cls") != "cls" else None
    ),
))
# OPT-350m projects the final hidden states down to the embedding width before the LM head
# (its base model's output includes the projection too); absent layers are skipped.
_OPT_PROJECT_OUT = (Projection("decoder.project_out"),)
def _deberta_pooler(config: Any) -> str | None:
    act = getattr(config, "pooler_hidden_act", "gelu")
    return None if act == "gelu" else f"its pooler's activation {act!r} (gelu is supported)"


register_head("deberta-v2", "sequence_classification", HeadSpec(
    position="first",
    final_norm=False,
    layers=(Projection("pooler.dense"), HeadActivation(function="gelu")),
    output="classifier",
    unsupported=_deberta_pooler,
))
# An encoder family's language-model head run as a causal LM (``BertLMHeadModel``,
# ``RobertaForCausalLM``, ...): a dense layer, GELU and a LayerNorm before the output layer.
register_head("bert", "causal_lm", HeadSpec(
    final_norm=False,
    layers=(Projection("cls.predictions.transform.dense"),
            HeadActivation(path="cls.predictions.transform.transform_act_fn"),
            HeadNorm("cls.predictions.transform.LayerNorm")),
    output="cls.predictions.decoder",
))
for _name in ("roberta", "xlm-roberta", "camembert"):
    register_head(_name, "causal_lm", HeadSpec(
        final_norm=False,
        layers=(Projection("lm_head.dense"), HeadActivation(function="gelu"), HeadNorm("lm_head.layer_norm")),
        output="lm_head.decoder",
    ))
register_head("electra", "causal_lm", HeadSpec(
    final_norm=False,
    layers=(Projection("generator_predictions.dense"), HeadActivation(path="generator_predictions.activation"),
            HeadNorm("generator_predictions.LayerNorm")),
    output="generator_lm_head",
))
register_head("cohere", "causal_lm", HeadSpec(position="last", scale=lambda config: float(config.logit_scale)))
register_head("granite", "causal_lm", HeadSpec(position="last", scale=lambda config: 1.0 / float(config.logits_scaling)))
register_head("opt", "causal_lm", HeadSpec(position="last", layers=_OPT_PROJECT_OUT))
register_head("opt", "base", HeadSpec(position="last", layers=_OPT_PROJECT_OUT))


def _t5_scale(config: Any) -> float:
    """T5 and UMT5 rescale the decoder's output by ``d_model ** -0.5`` before the output
    embeddings when the config says so (``scale_decoder_outputs``; older releases read
    ``tie_word_embeddings``); mT5 does not rescale."""
    flag = getattr(config, "scale_decoder_outputs", None)
    if flag is None:
        flag = getattr(config, "tie_word_embeddings", True)
    return float(config.d_model) ** -0.5 if flag else 1.0


for _model_type in ("t5", "umt5"):
    register_head(_model_type, "seq2seq_lm", HeadSpec(position="last", scale=_t5_scale))
