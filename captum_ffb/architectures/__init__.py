"""Architectures: declarative specs per model family and the registries of families and
chains. The chains themselves live in ``captum_ffb.engine.chains``."""

from captum_ffb.architectures import families as _families  # noqa: F401  (registrations)
from captum_ffb.architectures.registry import (
    UnsupportedArchitectureError,
    get_architecture,
    get_chain,
    model_type_of,
    register_architecture,
    register_chain,
    registered_chains,
    supported_architectures,
)
from captum_ffb.architectures.spec import ArchitectureSpec, MixtureOfExperts, Projection

__all__ = [
    "ArchitectureSpec",
    "MixtureOfExperts",
    "Projection",
    "UnsupportedArchitectureError",
    "get_architecture",
    "get_chain",
    "model_type_of",
    "register_architecture",
    "register_chain",
    "registered_chains",
    "supported_architectures",
]
