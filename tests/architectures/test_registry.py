"""The architecture registry."""

from __future__ import annotations

import pytest

from captum_ffb import (
    ArchitectureSpec,
    Projection,
    UnsupportedArchitectureError,
    get_architecture,
    register_architecture,
    supported_architectures,
)
from captum_ffb.architectures import registry


def test_required_families_are_registered():
    assert {"bert", "roberta", "distilbert", "electra", "gpt2", "opt"} <= set(supported_architectures())


def test_register_and_overwrite(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    spec = ArchitectureSpec(
        chain="post_ln", attention="a", value=Projection("a.v"), attention_output=Projection("a.o"),
        norm1="n1", norm2="n2", ff_in=Projection("f1"), activation="act", ff_out=Projection("f2"),
    )
    register_architecture("toy", spec)
    assert "toy" in supported_architectures() and get_architecture("toy") is spec
    with pytest.raises(ValueError, match="already registered"):
        register_architecture("toy", spec)
    register_architecture("toy", get_architecture("bert"), overwrite=True)
    assert get_architecture("toy") is get_architecture("bert")
    with pytest.raises(TypeError):
        register_architecture("bad", {"chain": "post_ln"})


def test_unknown_model_type_explains_how_to_register():
    with pytest.raises(UnsupportedArchitectureError, match="register_architecture"):
        get_architecture("xlnet")


def test_docs_table_is_generated_from_the_registry():
    from pathlib import Path

    from captum_ffb.architectures.table import architectures_rows, architectures_table

    rows = {row["model_type"]: row for row in architectures_rows()}
    assert set(rows) == set(supported_architectures())
    assert rows["llama"]["norm"] == "RMSNorm" and rows["gpt2"]["chain"] == "pre_ln"
    assert rows["mixtral"]["activation"] == "mixture of gated experts"
    committed = Path(__file__).parents[2] / "docs" / "architectures.md"
    assert committed.read_text() == architectures_table(), (
        "docs/architectures.md is stale: python -m captum_ffb.architectures.table > docs/architectures.md"
    )


def test_every_family_names_a_registered_chain():
    from captum_ffb.architectures import get_chain
    from tests.models import TINY_MODELS, TINY_SEQ2SEQ

    registry.check_chain_names()  # also run when the built-in chains are registered
    seen = set()
    for model in [*TINY_MODELS.values(), *TINY_SEQ2SEQ.values()]:  # each choice of a config's chain
        config = model.build().config
        spec = get_architecture(config.model_type)
        for stack in (spec, spec.decoder) if spec.decoder is not None else (spec,):
            name = stack.chain_name(config)
            assert get_chain(name).name == name
        seen.add(config.model_type)
    assert seen == set(supported_architectures())


def test_a_family_naming_an_unknown_chain_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    spec = ArchitectureSpec(
        chain="no_such_chain", attention="a", value=Projection("a.v"), attention_output=Projection("a.o"),
        norm1="n1", norm2="n2", ff_in=Projection("f1"), activation="act", ff_out=Projection("f2"),
    )
    message = r"the spec of 'toy' names chain 'no_such_chain', which is not registered; registered: parallel"
    with pytest.raises(ValueError, match=message):
        register_architecture("toy", spec)
    registry._REGISTRY["toy"] = spec  # as if registered before the chains were
    with pytest.raises(ValueError, match=message):
        registry.check_chain_names()
