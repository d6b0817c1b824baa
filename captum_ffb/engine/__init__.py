"""The engine: one capture of the real tensors, blocks bound to their specs, the chains
that wire rules by role, and the loop that runs them by row chunks.

Data flows one way: model + inputs → :func:`capture` → :class:`Block` → a :class:`Chain` of
rules → decompositions. The declarative parts around it are :mod:`captum_ffb.rules` (what
each component does to a decomposition) and :mod:`captum_ffb.architectures` (where each
family keeps its components).
"""

from captum_ffb.engine.block import Block, block_watch, norm_parameters, resolve, watched_modules
from captum_ffb.engine.capture import (
    BlockCapture,
    BlockWatch,
    ModelCapture,
    capture,
    forward_arguments,
    token_mask_of,
)
from captum_ffb.engine.chains import NEXT_NORM_SCOPE, PARALLEL, POST_LN, PRE_LN, Chain
from captum_ffb.engine.layers import (
    DEFAULT_MEMORY_BUDGET,
    LayerResult,
    Outputs,
    capture_layers,
    chain_for,
    iter_scopes,
    reference,
    resolve_rules,
    row_chunks,
    run_block,
)
from captum_ffb.engine.locking import model_lock
from captum_ffb.engine.model import (
    base_model_of,
    final_norm_of,
    find_blocks,
    find_model,
    model_type_of,
    next_norms,
)

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "NEXT_NORM_SCOPE",
    "PARALLEL",
    "POST_LN",
    "PRE_LN",
    "Block",
    "BlockCapture",
    "BlockWatch",
    "Chain",
    "LayerResult",
    "ModelCapture",
    "Outputs",
    "base_model_of",
    "block_watch",
    "capture",
    "capture_layers",
    "chain_for",
    "final_norm_of",
    "find_blocks",
    "find_model",
    "forward_arguments",
    "iter_scopes",
    "model_lock",
    "model_type_of",
    "next_norms",
    "norm_parameters",
    "reference",
    "resolve",
    "resolve_rules",
    "row_chunks",
    "run_block",
    "token_mask_of",
    "watched_modules",
]
