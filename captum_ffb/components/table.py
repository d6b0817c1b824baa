r"""The result of ``NormDecomposition.attribute_components()``: a tokens × components table
of direct effects, with the sums that check it and the paper's FF question asked of a
prediction."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captum_ffb._deprecation import REMOVED_IN
from captum_ffb.core.vocabulary import OUTPUT_HEAD

_BLOCK = re.compile(r"^block\.(\d+)(?:\.|$)")


@dataclass
class FFQuestion:
    r"""Does the feed-forward amplify or cancel what attention wrote, token by token?

    With ``A_l[j]`` and ``F_l[j]`` token ``j``'s direct effects through block ``l``'s
    attention and FF (see :class:`ComponentAttribution`):

    Attributes:
        share (Tensor): ``(B, n)`` the FF blocks' share of the token's direct effects,
                    ``Σ_l |F_l[j]| / Σ_c |C[j, c]|``.
        layer_share (Tensor): ``(B, L, n)`` the same, block by block
                    (``|F_l[j]| / Σ_c |C[j, c]|``).
        attention (Tensor): ``(B, n)`` ``Σ_l A_l[j]``.
        ff (Tensor): ``(B, n)`` ``Σ_l F_l[j]``.
        amplifies (Tensor): ``(B, n)`` bool, ``Σ_l F_l[j]`` has the sign of ``Σ_l A_l[j]``
                    (the FF pushes the read-out the way attention did for this token).
        layer_amplifies (Tensor): ``(B, L, n)`` bool, ``F_l[j]`` has the sign of ``A_l[j]``.
    """

    share: Tensor
    layer_share: Tensor
    attention: Tensor
    ff: Tensor
    amplifies: Tensor
    layer_amplifies: Tensor


class ComponentNames(list):
    """The component names of a table, in stream order; the names of before 0.4 (``"head"``
    for the output head) are found with a ``DeprecationWarning``."""

    _RENAMED = {"head": OUTPUT_HEAD}

    def _name(self, name: object) -> object:
        new = self._RENAMED.get(name) if isinstance(name, str) else None
        if new is not None and not list.__contains__(self, name) and list.__contains__(self, new):
            warnings.warn(f"the component {name!r} is {new!r} now; the old name stops working in {REMOVED_IN}",
                          DeprecationWarning, stacklevel=3)
            return new
        return name

    def index(self, name: object, *args: Any) -> int:  # type: ignore[override]
        return list.index(self, self._name(name), *args)

    def __contains__(self, name: object) -> bool:
        return list.__contains__(self, self._name(name))


@dataclass
class ComponentAttribution:
    r"""Direct effects of every (input token, component) pair on one read-out.

    ``value = Σ_j Σ_c contributions[:, j, c] + Σ_c bias[:, c]`` up to ``delta``.

    A component is a writer of the residual stream: ``"embeddings"`` (the first block's
    input), ``"block.<l>.attention"`` (``.head.<h>`` per head, ``.bias`` for what it writes
    owed to no head), ``"block.<l>.ff"`` (``.expert.<e>``, ``.shared_expert`` for mixtures
    of experts), the β of a norm the stream passes (``"block.<l>.norm1"``, Post-LN), and
    ``"output_head"``, what the final norm and the output head add on their own (``"head"``
    before 0.4; ``components.index("head")`` still finds it, with a ``DeprecationWarning``). ``contributions[:, j, c]``
    is what token ``j`` adds to the read-out through component ``c`` *directly*: the
    component's share for token ``j`` of its output, read through the frozen later norms
    and the head, not through later blocks.

    Attributes:
        contributions (Tensor): ``(B, n, C)``; padded positions are 0.
        bias (Tensor): ``(B, C)`` owed to no token.
        components (list[str]): the ``C`` component names, in the order the stream meets them.
        value (Tensor): ``(B,)`` the read-out in the model's own output.
        delta (Tensor): ``(B,)`` the completeness residual ``|Σ contributions + Σ bias − value|``.
        granularity (str): ``"block"``, ``"sublayer"`` or ``"head"``.
        tokens (list[list[str]], optional): the tokens of each row, when known.
    """

    contributions: Tensor
    bias: Tensor
    components: list[str]
    value: Tensor
    delta: Tensor
    granularity: str
    tokens: list[list[str]] | None = None

    def __post_init__(self) -> None:
        self.components = ComponentNames(self.components)

    def token_contributions(self) -> Tensor:
        """``(B, n)`` summed over components: the contributions of
        ``NormDecomposition.attribute()`` for the same read-out."""
        return self.contributions.sum(-1)

    def component_totals(self) -> Tensor:
        """``(B, C)`` each component's direct effect: its column summed over tokens plus its bias."""
        return self.contributions.sum(1) + self.bias

    def select(self, pattern: str) -> list[int]:
        """Indices of the components whose name matches the regular expression ``pattern``."""
        compiled = re.compile(pattern)
        return [k for k, name in enumerate(self.components) if compiled.search(name)]

    def blocks(self) -> list[int]:
        """The block indices the components name, in order."""
        found = {int(m.group(1)) for name in self.components if (m := _BLOCK.match(name))}
        return sorted(found)

    def _per_block(self, writer: str) -> Tensor:
        """``(B, L, n)`` token contributions through each block's ``writer``
        (``"attention"`` or ``"ff"``), its parts (heads, experts) added up."""
        batch, n, _ = self.contributions.shape
        out = self.contributions.new_zeros(batch, len(self.blocks()), n)
        for slot, block in enumerate(self.blocks()):
            columns = self.select(rf"^block\.{block}\.{writer}(\.|$)")
            if columns:
                out[:, slot] = self.contributions[..., columns].sum(-1)
        return out

    def ff_question(self) -> FFQuestion:
        """The paper's FF question for this prediction (:class:`FFQuestion`); needs the
        ``"sublayer"`` or ``"head"`` granularity."""
        if self.granularity == "block":
            raise ValueError("the FF question needs attention and FF apart: granularity='sublayer' or 'head'")
        attention, ff = self._per_block("attention"), self._per_block("ff")
        everything = self.contributions.abs().sum(-1)[:, None]  # (B, 1, n)
        safe = torch.where(everything > 0, everything, torch.ones_like(everything))
        layer_share = ff.abs() / safe
        total_attention, total_ff = attention.sum(1), ff.sum(1)
        return FFQuestion(
            share=layer_share.sum(1),
            layer_share=layer_share,
            attention=total_attention,
            ff=total_ff,
            amplifies=(total_ff * total_attention) > 0,
            layer_amplifies=(ff * attention) > 0,
        )

    def top(self, k: int = 5, row: int = 0) -> list[tuple[int, str, float]]:
        """The ``k`` largest ``|contribution|`` entries of one row: ``(token index, component,
        value)``."""
        table = self.contributions[row]
        flat = table.abs().flatten()
        k = min(k, flat.numel())
        values, order = flat.topk(k)
        n_components = table.shape[1]
        return [(int(i) // n_components, self.components[int(i) % n_components],
                 float(table.flatten()[i])) for i in order]

    def to_dict(self, row: int = 0) -> dict[str, Any]:
        """One row as plain lists (JSON)."""
        out: dict[str, Any] = {
            "granularity": self.granularity,
            "components": list(self.components),
            "contributions": self.contributions[row].tolist(),
            "bias": self.bias[row].tolist(),
            "value": float(self.value[row]),
            "delta": float(self.delta[row]),
        }
        if self.tokens is not None:
            out["tokens"] = list(self.tokens[row])
        return out

