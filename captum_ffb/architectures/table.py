"""The supported-architectures table, generated from the registry.

``python -m captum_ffb.architectures.table`` prints it as Markdown (docs/architectures.md is
this output; a test keeps the two equal).
"""

from __future__ import annotations

from captum_ffb.architectures.registry import get_architecture, supported_architectures
from captum_ffb.architectures.spec import ArchitectureSpec


def _chain(spec: ArchitectureSpec) -> str:
    if callable(spec.chain):
        name = (spec.chain.__doc__ or spec.chain.__name__).strip()
    else:
        name = spec.chain
    if spec.decoder is not None:
        return f"{name} (encoder), {_chain(spec.decoder)} (decoder)"
    return name


def _feed_forward(spec: ArchitectureSpec) -> str:
    if spec.moe is not None:
        return "mixture of gated experts"
    kind = "gated (g(A) ⊙ B)" if spec.ff_gate is not None else "element-wise g"
    if spec.alternative is not None and spec.alternative.ff_gate is not None and spec.ff_gate is None:
        kind += " or gated"
    return kind


def architectures_rows() -> list[dict[str, str]]:
    """One row per registered ``model_type``: chain, norm, FF activation kind, notes."""
    rows = []
    for model_type in supported_architectures():
        spec = get_architecture(model_type)
        norm = "RMSNorm" if spec.norm == "rms_norm" else "LayerNorm"
        if spec.norm_weight_offset:
            norm += f" (γ = {spec.norm_weight_offset:g} + w)"
        rows.append({
            "model_type": model_type,
            "chain": _chain(spec),
            "norm": norm,
            "activation": _feed_forward(spec),
            "notes": spec.description,
        })
    return rows


def architectures_table() -> str:
    """The supported architectures as a Markdown table."""
    header = ["model_type", "chain", "norm", "activation", "notes"]
    lines = [
        "# Supported architectures",
        "",
        "Generated from the registry by `python -m captum_ffb.architectures.table`.",
        "Scopes: `post_ln` Atb, AtbFf, AtbFfRes, AtbFfResLn; `pre_ln` Atb, AtbLn, AtbLnFf,",
        "AtbLnFfRes; `parallel` Atb, LnFf, AtbLnFfRes; the decoders of encoder–decoders:",
        "`post_ln_cross` Atb, Cross, AtbCatb, AtbCatbFf, AtbCatbFfRes, AtbCatbFfResLn;",
        "`pre_ln_cross` Atb, Cross, AtbCatb, AtbCatbLn, AtbCatbLnFf, AtbCatbLnFfRes",
        "(see docs/encoder_decoder.md).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in architectures_rows():
        lines.append("| " + " | ".join(f"`{row[k]}`" if k == "model_type" else row[k] for k in header) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(architectures_table(), end="")
