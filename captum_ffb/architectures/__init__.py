"""Architectures: declarative specs per model family, a registry, and the block chains."""

from captum_ffb.architectures import families as _families  # noqa: F401  (registrations)
from captum_ffb.architectures.block import Block
from captum_ffb.architectures.chains import CHAINS, Chain, ChainOptions, get_chain
from captum_ffb.architectures.registry import (
    UnsupportedArchitectureError,
    get_architecture,
    register_architecture,
    supported_architectures,
)
from captum_ffb.architectures.spec import ArchitectureSpec, Projection

__all__ = [
    "CHAINS",
    "ArchitectureSpec",
    "Block",
    "Chain",
    "ChainOptions",
    "Projection",
    "UnsupportedArchitectureError",
    "get_architecture",
    "get_chain",
    "register_architecture",
    "supported_architectures",
]
