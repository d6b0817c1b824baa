"""GIM (``patching/estimators/gim.py``) against its authors' package, ``gim-explain`` 0.1.4, on a
tiny random Llama in double precision.

The package's context manager does not run on Hugging Face models as they are: its softmax
refuses ``dtype=`` (transformers' eager attention passes ``dtype=torch.float32``), under sdpa
its temperature never applies, and it swaps only ``nn.LayerNorm`` and ``nn.RMSNorm``, not
``LlamaRMSNorm``. :func:`package_gim` therefore applies the package's own pieces by hand: its
``_SoftmaxBackwardTOnly`` behind a softmax that takes ``dtype=``, its ``scale_grad`` on the
outputs of ``q_proj``, ``k_proj`` and ``v_proj``, and each RMSNorm's statistic detached.

transformers rounds the attention probabilities and the RMSNorm's statistics to float32 even in
a float64 model, and the library takes norm scales and activation slopes in float32; so the two
gradients agree to float32's rounding (about 1e-7 of their size here), not to float64's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor, nn

from captum_ffb import NormDecomposition
from captum_ffb.patching import estimators as E
from captum_ffb.patching.estimators.gim import GIMAttention, gim_rules
from captum_ffb.patching.patches import check_estimators
from tests.models import tiny_task_model, token_ids

#: relative agreement with the package (float32 rounding inside a float64 model, see above)
TOLERANCE = 1e-6
#: (temperature, value scale, query/key scale): GIM's, each change alone, and none (norms frozen only)
SETTINGS = [(2.0, 0.5, 0.25), (2.0, 1.0, 1.0), (1.0, 0.5, 1.0), (1.0, 1.0, 0.25), (1.0, 1.0, 1.0)]


@contextlib.contextmanager
def package_gim(model: nn.Module, temperature: float = 2.0, value_scale: float = 0.5,
                query_key_scale: float = 0.25) -> Iterator[None]:
    """GIM's backward changes on a Hugging Face Llama (eager attention) from the pieces of
    ``gim-explain``, for the forward passes run inside (and their backward passes)."""
    from gim.context.attention import scale_grad
    from gim.context.softmax import _SoftmaxBackwardTOnly

    functional = torch.nn.functional
    original = functional.softmax

    def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3,
                dtype: torch.dtype | None = None) -> Tensor:
        # the value as transformers asks for it (rounded to ``dtype``), the package's backward
        # at the precision of the wider of the input and ``dtype``
        value = original(input, dim=dim, dtype=dtype)
        wide = input if dtype is None else input.to(torch.promote_types(input.dtype, dtype))
        traced = _SoftmaxBackwardTOnly.apply(wide, -1 if dim is None else dim, float(temperature))
        return traced + (value.to(traced.dtype) - traced).detach()

    def scaled(factor: float):
        return lambda module, args, output: scale_grad(output, factor)

    def frozen_rms(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        x = args[0]
        rms = (x.to(torch.float32).pow(2).mean(-1, keepdim=True) + module.variance_epsilon).sqrt()
        linear = x / rms.detach().to(x.dtype) * module.weight
        return output.detach() + (linear - linear.detach())  # the model's value, the frozen map's gradient

    handles = []
    factors = {"q_proj": query_key_scale, "k_proj": query_key_scale, "v_proj": value_scale}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in factors:
            handles.append(module.register_forward_hook(scaled(factors[leaf])))
        elif type(module).__name__.endswith("RMSNorm"):
            handles.append(module.register_forward_hook(frozen_rms))
    functional.softmax = softmax
    try:
        yield
    finally:
        functional.softmax = original
        for handle in handles:
            handle.remove()


def package_gradient(model: nn.Module, ids: Tensor, token: int, settings=(2.0, 0.5, 0.25),
                     writers: dict[str, nn.Module] | None = None, embeds: Tensor | None = None,
                     ) -> tuple[Tensor, dict[str, Tensor]]:
    """The package's GIM gradient of the logit of ``token`` at the last position of the one
    row ``ids`` (or of the input embeddings ``embeds``), at the input embeddings ``(n, d)``,
    and at the outputs of ``writers`` (name → module whose first output is the writer's)."""
    kept: dict[str, Tensor] = {}
    handles = []
    for key, module in (writers or {}).items():
        def keep(mod, args, output, key=key):
            first = output[0] if isinstance(output, tuple) else output
            first.retain_grad()
            kept[key] = first
        handles.append(module.register_forward_hook(keep))
    embeds = (model.get_input_embeddings()(ids) if embeds is None else embeds).detach().requires_grad_(True)
    try:
        with torch.enable_grad(), package_gim(model, *settings):
            logits = model(inputs_embeds=embeds, use_cache=False).logits
            logits[0, -1, token].backward()
    finally:
        for handle in handles:
            handle.remove()
    return embeds.grad[0], {key: t.grad[0] for key, t in kept.items()}


def outputs_of(model: nn.Module, ids: Tensor, writers: dict[str, nn.Module]) -> dict[str, Tensor]:
    """The writers' first outputs ``(n, d)`` on ``ids``, without gradients."""
    kept: dict[str, Tensor] = {}
    handles = [module.register_forward_hook(
        lambda mod, args, output, key=key: kept.__setitem__(key, (output[0] if isinstance(output, tuple)
                                                                   else output).detach()[0]))
        for key, module in writers.items()]
    try:
        with torch.no_grad():
            model(ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return kept


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("gim")
    model = tiny_task_model("llama", "causal_lm").double()
    model.set_attn_implementation("eager")
    with torch.no_grad():  # sharper attention (scores × 36), so that the temperature matters
        for block in model.model.layers:
            block.self_attn.q_proj.weight.mul_(6.0)
            block.self_attn.k_proj.weight.mul_(6.0)
    nd = NormDecomposition(model)
    ids = token_ids()[:1, :7]
    corrupted = ids.clone()
    corrupted[0, 1], corrupted[0, 3] = 11, 13
    return nd, ids, corrupted, nd.request(ids, 5)


def rules_gradient(nd: NormDecomposition, request, attention: GIMAttention | None = None) -> Tensor:
    """The gradient at the first block's input ``(n, d)`` of a pass with GIM's rules."""
    rules = gim_rules(nd.engine)
    if attention is not None:
        rules["attention"] = attention
    recorded = E.record(nd.engine, request, "head", rules=rules)
    (grad,) = torch.autograd.grad(recorded.value.sum(), recorded.tape.inputs)
    return grad[0]


def _gap(a: Tensor, b: Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_the_rules_give_the_packages_gradient(llama):
    """For GIM's changes together, each alone and none (norms frozen only), the rules' gradient
    at the input embeddings is the package's; the settings' gradients differ from one another by
    far more than that agreement, so a factor in the wrong place would show."""
    nd, ids, _, request = llama
    found, expected = [], []
    for temperature, value_scale, query_key_scale in SETTINGS:
        ours = rules_gradient(nd, request, GIMAttention(temperature, value_scale, query_key_scale))
        theirs, _ = package_gradient(nd.model, ids, 5, (temperature, value_scale, query_key_scale))
        assert _gap(ours, theirs) < TOLERANCE, (temperature, value_scale, query_key_scale)
        found.append(ours)
        expected.append(theirs)
    for k in range(len(SETTINGS)):
        for j in range(k):
            assert _gap(expected[k], expected[j]) > 1e-3, (SETTINGS[k], SETTINGS[j])
    # gim_rules' own attention is GIM's
    assert torch.equal(rules_gradient(nd, request), found[0])
    # the value and query/key scales swapped: not the package's
    swapped = rules_gradient(nd, request, GIMAttention(2.0, 0.25, 0.5))
    assert _gap(swapped, expected[0]) > 1e-3


def test_with_every_change_off_the_attention_is_its_own_derivative(llama):
    """``GIMAttention(1, 1, 1)`` differentiates attention as the model does: the same gradient as
    :class:`GradientAttention` (RelP's attention), and, with the real derivative everywhere but
    the norms, the package's with its norms frozen and nothing else."""
    nd, ids, _, request = llama
    off = rules_gradient(nd, request, GIMAttention(1.0, 1.0, 1.0))
    real = rules_gradient(nd, request, E.GradientAttention())
    assert _gap(off, real) < 1e-12
    norms_only, _ = package_gradient(nd.model, ids, 5, (1.0, 1.0, 1.0))
    assert _gap(off, norms_only) < TOLERANCE
    assert _gap(rules_gradient(nd, request), off) > 1e-3
    with pytest.raises(ValueError, match="temperature"):
        GIMAttention(0.0)


def test_the_node_estimates_are_the_packages_gradient_times_the_patch(llama):
    """``"gim"`` through ``attribute_graph``: every sublayer's estimate is ``Σ_i ⟨G_i, o_i −
    o_i^c⟩`` with ``G`` the package's gradient at the sublayer's output; ``"gim+exact"`` runs;
    the edges' estimates are finite and differ from attribution patching's."""
    nd, ids, corrupted, _ = llama
    assert {"gim", "gim+exact"} <= set(check_estimators(["gim", "gim+exact"]))
    graph = nd.attribute_graph(ids, 5, granularity="sublayer", prune=False, corrupted_inputs=corrupted,
                               estimators=["gim", "gim+exact"])
    estimates = graph.component_estimates("gim")
    writers = {}
    for layer, block in enumerate(nd.model.model.layers):
        writers[f"block.{layer}.attention"] = block.self_attn
        writers[f"block.{layer}.ff"] = block.mlp
    _, grads = package_gradient(nd.model, ids, 5, writers=writers)
    clean, base = outputs_of(nd.model, ids, writers), outputs_of(nd.model, corrupted, writers)
    assert set(estimates) == set(writers)
    for key in writers:
        expected = float((grads[key] * (clean[key] - base[key])).sum())
        assert estimates[key] == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE), key
    found = graph.patch_estimates
    assert torch.isfinite(found["gim+exact"]).all()
    assert not torch.allclose(found["gim"], found["atp"])
    assert graph.patch_passes["gim"] == 3
    gim, atp = graph.edge_patch_estimates("gim"), graph.edge_patch_estimates("atp")
    known = ~torch.isnan(atp)
    assert known.any() and torch.isfinite(gim[known]).all()
    assert not torch.allclose(gim[known], atp[known])


def test_gim_ig_averages_the_packages_gradient_along_eap_igs_path(llama):
    """``"gim-ig"``: every sublayer's estimate is ``Σ_i ⟨Ḡ_i, o_i − o_i^c⟩`` with ``Ḡ`` the
    package's GIM gradient averaged over the passes from ``x^c + k/m (x − x^c)``,
    ``k = 1 … m``, of the input embeddings; it differs from GIM's one gradient and from
    EAP-IG's real ones, and costs EAP-IG's passes."""
    nd, ids, corrupted, _ = llama
    steps = E.EAP_IG_STEPS
    graph = nd.attribute_graph(ids, 5, granularity="sublayer", prune=False, corrupted_inputs=corrupted,
                               estimators=["gim-ig", "gim", "eap-ig"])
    writers = {}
    for layer, block in enumerate(nd.model.model.layers):
        writers[f"block.{layer}.attention"] = block.self_attn
        writers[f"block.{layer}.ff"] = block.mlp
    embed = nd.model.get_input_embeddings()
    clean_x, corrupted_x = embed(ids).detach(), embed(corrupted).detach()
    averaged: dict[str, Tensor] = {}
    for k in range(1, steps + 1):
        point = corrupted_x + (k / steps) * (clean_x - corrupted_x)
        _, grads = package_gradient(nd.model, ids, 5, writers=writers, embeds=point)
        for key, g in grads.items():
            averaged[key] = averaged.get(key, 0) + g / steps
    clean, base = outputs_of(nd.model, ids, writers), outputs_of(nd.model, corrupted, writers)
    estimates = graph.component_estimates("gim-ig")
    for key in writers:
        expected = float((averaged[key] * (clean[key] - base[key])).sum())
        assert estimates[key] == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE), key
    found = graph.patch_estimates
    assert not torch.allclose(found["gim-ig"], found["gim"])
    assert not torch.allclose(found["gim-ig"], found["eap-ig"])
    assert graph.patch_passes["gim-ig"] == graph.patch_passes["eap-ig"] == 1 + 2 * steps
