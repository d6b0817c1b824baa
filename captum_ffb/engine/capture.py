"""A recorded pass: the real tensors the decompositions use and are checked against.

Attention probabilities come from the model's own attention function: while capturing, the
model runs with a recording attention implementation registered in transformers'
``AttentionInterface``. It calls the eager attention function of the module's own modeling
file (so rotary embeddings, GQA, sliding windows and soft-capping are the model's) and keeps
the probabilities it returns.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from captum_ffb._private import model_eager_attention
from captum_ffb.engine.passes import ModelPass, eager_attention, register_attention

RECORDING_IMPLEMENTATION = "captum_ffb_recording"

_recording: contextvars.ContextVar[dict[int, list[Any]] | None] = contextvars.ContextVar(
    "captum_ffb_recording", default=None
)


def _recording_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, **kwargs):
    """Attention through the module's own eager function, keeping the probabilities."""
    output, weights = eager_attention(module)(module, query, key, value, attention_mask, **kwargs)
    store = _recording.get()
    if store is not None and id(module) in store and not store[id(module)]:
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = getattr(module, "scaling", None) or query.shape[-1] ** -0.5
        store[id(module)].extend([weights.detach(), AttentionCall(
            query.detach(), key.detach(), attention_mask, float(scaling), kwargs.get("softcap"))])
    return output, weights


def computes_probabilities_inline(module: nn.Module, method: str | None) -> bool:
    """Whether ``module`` neither calls transformers' attention interface (its modeling file
    has no eager attention function) nor has a spec's attention method: its probabilities are
    then read from the softmax it calls (:meth:`~captum_ffb.engine.passes.ModelPass.softmax`)."""
    return method is None and model_eager_attention(module) is None


@dataclass
class AttentionCall:
    """What the attention function of one block saw (for rules that credit queries and keys).

    Attributes:
        query (Tensor): the queries as the attention function read them (after rotary
                    embeddings and query norms) ``(B, H, n, d_head)``.
        key (Tensor): the keys ``(B, H_kv, n, d_head)``.
        mask (Tensor, optional): the attention mask it was given (additive float, or bool).
        scaling (float): the factor of ``q·k``.
        softcap (float, optional): the logit soft-capping ``c·tanh(s / c)`` (Gemma 2).
        args (tuple): the attention module's positional call arguments (hidden states first).
        kwargs (dict): its keyword arguments.
        norm_inputs (dict): for the norms inside the attention module (query/key norms),
                    name → the real input they normalised.
    """

    query: Tensor
    key: Tensor
    mask: Tensor | None
    scaling: float
    softcap: float | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    norm_inputs: dict[str, Tensor] = field(default_factory=dict)


def inner_norms(attention: nn.Module) -> dict[str, nn.Module]:
    """The norms inside an attention module (query and key norms: Qwen3, OLMo 2, Gemma 3)."""
    return {name: module for name, module in attention.named_modules()
            if name and (isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("Norm"))}


def _first_tensor(value: Any) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    return None


@dataclass
class BlockCapture:
    """What one forward pass showed of one Transformer block.

    Attributes:
        inputs (Tensor): the block's input hidden states ``(B, n, d)``.
        output (Tensor): the block's output hidden states ``(B, n, d)``.
        probs (list[Tensor]): attention probabilities ``(B, H, n, n)`` per recorded attention.
        attention_calls (list[AttentionCall]): what each recorded attention function read.
        tensors (dict): ``(role, "input" | "output") → (B, n, width)`` for each watched module.
        raw_outputs (dict): role → the watched module's output as returned (tuples kept),
                    for modules such as MoE routers that return several tensors.
        call_args (tuple, optional): the positional arguments the block was called with,
                    after the hidden states (kept when asked for, to call the block again).
        call_kwargs (dict, optional): its keyword arguments (without ``hidden_states``).
        hidden_keyword (bool): whether the hidden states were passed by keyword
                    (``hidden_states``).
    """

    inputs: Tensor | None = None
    output: Tensor | None = None
    probs: list[Tensor] = field(default_factory=list)
    attention_calls: list[AttentionCall] = field(default_factory=list)
    tensors: dict[tuple[str, str], Tensor] = field(default_factory=dict)
    raw_outputs: dict[str, Any] = field(default_factory=dict)
    call_args: tuple[Any, ...] | None = None
    call_kwargs: dict[str, Any] | None = None
    hidden_keyword: bool = False


@dataclass
class BlockWatch:
    """What to record of one block: its watched modules by role and its attention modules.

    Attributes:
        module (nn.Module): the block.
        roles (dict): role → module whose input and output to keep.
        attention (list[nn.Module]): modules that compute the block's self-attention.
        attention_method (str, optional): for attention modules that do not call
                    transformers' ``AttentionInterface``, their method returning
                    ``(output, probabilities)`` (see :class:`~captum_ffb.architectures.ArchitectureSpec`).
    """

    module: nn.Module
    roles: dict[str, nn.Module] = field(default_factory=dict)
    attention: list[nn.Module] = field(default_factory=list)
    attention_method: str | None = None


@dataclass
class ModelCapture:
    """Everything one forward pass recorded.

    Attributes:
        blocks (list[BlockCapture]): one per watched block, in the order given.
        tensors (dict): ``(role, "input" | "output") → tensor`` for modules watched outside
                    the blocks (a final norm, a head).
        raw_outputs (dict): role → the output of such a module as returned.
        output (Any): what the forward call returned, when asked for.
    """

    blocks: list[BlockCapture]
    tensors: dict[tuple[str, str], Tensor] = field(default_factory=dict)
    raw_outputs: dict[str, Any] = field(default_factory=dict)
    output: Any = None


def _as_sequence(tensor: Tensor, batch: int) -> Tensor:
    """Give ``(B·n, w)`` tensors (some models flatten before the FF) back their batch axis."""
    if tensor.dim() == 2 and tensor.shape[0] % batch == 0:
        return tensor.reshape(batch, -1, tensor.shape[-1])
    return tensor


#: Roles whose output :func:`_keep_module` copies (see there).
_COPIED_OUTPUTS = frozenset({"ff", "ff_out"})


def _keep_module(tensors: dict, raw: dict, role: str):
    """A forward hook keeping the first input and output of a module under ``role``."""

    def hook(module, args, kwargs, output):
        if (role, "output") in tensors:
            return  # a module used twice keeps its first call
        hidden = args[0] if args else next(iter(kwargs.values()), None)
        tensor = _first_tensor(output)
        if isinstance(hidden, Tensor):
            tensors[(role, "input")] = hidden.detach()
        if tensor is not None:
            tensor = tensor.detach()
            # the FF branch's output copied: some blocks add to it in place (Falcon adds the
            # attention's output to its MLP's); the other roles' outputs are kept as they are
            tensors[(role, "output")] = tensor.clone() if role in _COPIED_OUTPUTS else tensor
        raw[role] = output

    return hook


def keep_module(run: ModelPass, module: nn.Module, tensors: dict, role: str, raw: dict | None = None) -> None:
    """Keep the first input and output of ``module`` in ``run`` under ``(role, "input" |
    "output")`` in ``tensors`` (detached; its raw output in ``raw``), as a capture does: a
    pass of its own (the backward route's) reads what a capture would have given it."""
    run.after(module, _keep_module(tensors, {} if raw is None else raw, role), with_kwargs=True)


def _keep_block_output(record: BlockCapture):
    """A forward hook keeping a block's first output hidden states."""

    def hook(module, args, kwargs, output):
        tensor = _first_tensor(output)
        if record.output is None and tensor is not None:
            record.output = tensor.detach()

    return hook


class _Recorder:
    """The recording hooks of one capture, installed on its pass, and what they keep until
    the forward pass is over.

    Args:
        run (ModelPass): the pass they are installed on.
        keep_calls (bool): keep each block's call arguments.

    Attributes:
        attention (dict): id of an attention module → ``[probabilities, AttentionCall]`` of
                    its first call (empty until it runs).
        calls (dict): id of an attention module → its first call's ``(args, kwargs, inner
                    norm inputs)``.
        methods (dict): attention method name → the modules whose method records.
    """

    def __init__(self, run: ModelPass, keep_calls: bool) -> None:
        self.run = run
        self.keep_calls = keep_calls
        self.attention: dict[int, list[Any]] = {}
        self.calls: dict[int, tuple[tuple[Any, ...], dict[str, Any], dict[str, Tensor]]] = {}
        self.methods: dict[str, list[nn.Module]] = {}

    def watch_block(self, watch: BlockWatch, record: BlockCapture) -> list[int]:
        """Put the hooks of one block; return the ids of its attention modules."""
        block = watch.module
        self.run.before(block, self._keep_block_input(record), with_kwargs=True)
        self.run.after(block, _keep_block_output(record), with_kwargs=True)
        for role, module in watch.roles.items():
            if isinstance(module, nn.Module):
                self.watch_module(module, record.tensors, record.raw_outputs, role)
        for module in watch.attention:
            self._watch_attention(module)
            if watch.attention_method is not None:
                self.methods.setdefault(watch.attention_method, []).append(module)
            elif computes_probabilities_inline(module, None):
                self.run.softmax(module, self._keep_first_softmax(module))
        return [id(module) for module in watch.attention]

    def watch_module(self, module: nn.Module, tensors: dict, raw: dict, role: str) -> None:
        """Keep the first input and output of ``module`` under ``role``."""
        keep_module(self.run, module, tensors, role, raw)

    def _keep_block_input(self, record: BlockCapture):
        keep_calls = self.keep_calls

        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs.get("hidden_states")
            if record.inputs is None and isinstance(hidden, Tensor):
                record.inputs = hidden.detach()
                if keep_calls:
                    record.hidden_keyword = not args
                    record.call_args = tuple(args[1:])
                    record.call_kwargs = {k: v for k, v in kwargs.items() if k != "hidden_states"}

        return hook

    def _watch_attention(self, module: nn.Module) -> None:
        """Record the attention module's first call and the inputs of its inner norms."""
        key = id(module)
        self.attention[key] = []
        calls = self.calls

        def keep_call(module, args, kwargs):
            if key not in calls:
                calls[key] = (args, kwargs, {})

        def keep_norm_input(name: str):
            def keep(module, args):
                inputs = calls.get(key, (None, None, {}))[2]
                if name not in inputs:
                    inputs[name] = args[0].detach()

            return keep

        self.run.before(module, keep_call, with_kwargs=True)
        for name, norm_module in inner_norms(module).items():
            self.run.before(norm_module, keep_norm_input(name))

    def _keep_first_softmax(self, module: nn.Module) -> Callable[[Tensor], Tensor]:
        """Keep the first softmax ``module`` computes as its probabilities (no query/key
        record: rules that credit the scores need the attention interface)."""
        target = self.attention[id(module)]

        def keep(probabilities: Tensor) -> Tensor:
            if not target:
                target.append(probabilities.detach())
            return probabilities

        return keep

    def _recording_method(self, module: nn.Module, original: Callable) -> Callable:
        """``module``'s own attention method (see ``ArchitectureSpec.attention_method``),
        keeping the probabilities it returns."""
        attention = self.attention

        def method(*args: Any, **kwargs: Any) -> Any:
            output, weights = original(*args, **kwargs)
            target = attention.get(id(module))
            if target is not None and not target:
                query, key = args[0], args[1]
                mask = args[3] if len(args) > 3 else kwargs.get("attention_mask")
                scale = getattr(module, "scale_attn", None)
                scaling = 1.0 / float(scale) if scale is not None else query.shape[-1] ** -0.5
                target.extend([weights.detach(), AttentionCall(query.detach(), key.detach(), mask, scaling)])
            return output, weights

        return method

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Run the forward pass inside: the recording attention implementation and methods
        installed on the pass, its store set."""
        self.run.attention(register_attention(RECORDING_IMPLEMENTATION, _recording_attention))
        for name, modules in self.methods.items():
            self.run.method(modules, name, self._recording_method)
        token = _recording.set(self.attention)
        try:
            yield
        finally:
            _recording.reset(token)

    def finish(self, record: BlockCapture, ids: Sequence[int]) -> None:
        """Complete a block's record after the forward pass (probabilities, attention calls)."""
        if record.inputs is None or record.output is None:
            raise RuntimeError(
                "the forward pass did not run one of the given layers; is the layer part of "
                "the model that forward_func calls?"
            )
        batch = record.inputs.shape[0]
        record.tensors = {k: _as_sequence(v, batch) for k, v in record.tensors.items()}
        record.probs = [self.attention[i][0] for i in ids if self.attention[i]]
        record.attention_calls = []
        for i in ids:
            if len(self.attention[i]) > 1:
                call = self.attention[i][1]
                call.args, call.kwargs, call.norm_inputs = self.calls.get(i, ((), {}, {}))
                record.attention_calls.append(call)


def capture(
    forward: Callable[[ModelPass], Any],
    blocks: Sequence[BlockWatch],
    model: nn.Module | None = None,
    extra: dict[str, nn.Module] | None = None,
    keep_calls: bool = False,
    keep_output: bool = False,
    owners: Sequence[nn.Module] = (),
    run_forward: Callable[..., Any] | None = None,
) -> ModelCapture:
    r"""A recorded pass: ``forward(run)`` once under ``no_grad`` in a
    :class:`~captum_ffb.engine.passes.ModelPass` with every block's real tensors recorded.

    The attributions, the corpus runner and the baselines all read what it records.

    Args:
        forward (Callable): runs the model on the user's inputs in the pass it is given
                    (``run.run(*args, **kwargs)``, or ``run.call(block, ...)``).
        blocks (Sequence[BlockWatch]): the blocks to watch and what to record of each.
        model (nn.Module, optional): the model (its lock, its configs; the first block when
                    it is not known).
        extra (dict, optional): role → module outside the blocks whose input and output to
                    keep (the final norm, a head).
        keep_calls (bool): keep each block's call arguments (to call it again on other
                    hidden states).
        keep_output (bool): keep what ``forward()`` returns.
        owners (Sequence[nn.Module]): further modules whose configs select the attention
                    function (the blocks are always included).
        run_forward (Callable, optional): what ``run.run`` calls (a user's function around
                    the model; default the model).

    Returns:
        ModelCapture
    """
    captures = [BlockCapture() for _ in blocks]
    result = ModelCapture(captures)
    root = model if model is not None else blocks[0].module
    with ModelPass(root, owners=[*owners, *(watch.module for watch in blocks)], forward=run_forward) as run:
        recorder = _Recorder(run, keep_calls)
        order = [recorder.watch_block(watch, record) for watch, record in zip(blocks, captures)]
        for role, module in (extra or {}).items():
            recorder.watch_module(module, result.tensors, result.raw_outputs, role)
        with recorder.recording():
            output = forward(run)
    for record, ids in zip(captures, order):
        recorder.finish(record, ids)
    if keep_output:
        result.output = output
    return result


def forward_arguments(inputs: Any, additional_forward_args: Any) -> tuple[Any, ...]:
    """The positional arguments of the forward call, Captum style; rejects empty inputs."""
    if isinstance(inputs, Tensor):
        args: tuple[Any, ...] = (inputs,)
    elif isinstance(inputs, tuple) and inputs:
        args = inputs
    else:
        raise TypeError("inputs must be a tensor of token ids or a non-empty tuple of tensors")
    first = args[0]
    if isinstance(first, Tensor) and (first.numel() == 0 or (first.dim() >= 2 and first.shape[1] == 0)):
        raise ValueError("inputs are empty: at least one token is needed")
    if additional_forward_args is None:
        return args
    extra = additional_forward_args
    return args + (tuple(extra) if isinstance(extra, (tuple, list)) else (extra,))


def token_mask_of(attention_mask: Any, hidden: Tensor) -> Tensor | None:
    """``1`` for real tokens from a 2-D ``attention_mask`` matching ``hidden``, else ``None``."""
    if not isinstance(attention_mask, Tensor) or attention_mask.dim() != 2:
        return None
    if attention_mask.shape != hidden.shape[:2]:
        return None
    return (attention_mask != 0).to(hidden.device)
