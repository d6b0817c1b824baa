"""The pass runner (``engine/passes.py``): the one module that installs anything on a model and
the one way the library runs one; what it installs acts only inside its own pass and is gone
after it; it holds the model's lock and restores the model's state."""

from __future__ import annotations

import ast
import pathlib
import threading

import pytest
import torch

import captum_ffb
from captum_ffb.engine.passes import ModelPass, register_attention, run_model
from tests.models import tiny_lm, token_ids

PACKAGE = pathlib.Path(captum_ffb.__file__).parent
RUNNER = PACKAGE / "engine" / "passes.py"
#: What installs something on a model (hooks, attention implementations, the softmax).
INSTALLERS = {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
              "register_full_backward_pre_hook", "register_backward_hook", "set_attn_implementation",
              "set_attention_implementation"}
#: Calls that run a model's forward (or generation) directly.
MODEL_CALLS = {"model", "self.model", "nd.model", "loaded.model", "self.loaded.model", "self.module",
               "block.module", "task.model", "self.method.model", "model.model", "forward_func"}
#: Files allowed to call a model directly, and why.
ALLOWED_CALLS = {
    # a wrapper model's own forward calling the model it wraps (it is run through a pass)
    "integrations/_readout_classifier.py",
    # runs in lxt's own environment (a subprocess), never beside an attribution
    "evaluation/peers/attnlrp_worker.py",
}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_hooks_and_attention_implementations_are_installed_in_one_module():
    found = []
    for path, tree in _sources():
        if path == RUNNER:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                text = ast.unparse(node.func)
                if name in INSTALLERS and not (path.name == "_private.py" and name == "set_attention_implementation"):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {text}")
                if text.endswith(("AttentionInterface.register", "AttentionMaskInterface.register")):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {text}")
                if name == "train" and isinstance(node.func, ast.Attribute):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {text}")  # the mode is the runner's
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    text = ast.unparse(target)
                    if text.endswith((".forward", "functional.softmax")):
                        found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {text} = ...")
    assert not found, "outside engine/passes.py:\n" + "\n".join(found)


def test_the_library_runs_models_only_through_the_runner():
    found = []
    for path, tree in _sources():
        relative = path.relative_to(PACKAGE).as_posix()
        if path == RUNNER or relative in ALLOWED_CALLS:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                text = ast.unparse(node.func)
                if text in MODEL_CALLS or (text.endswith(".generate") and not text.startswith("run.")):
                    found.append(f"{relative}:{node.lineno} {text}(...)")
    assert not found, "a model run outside the pass runner:\n" + "\n".join(found)


def test_what_a_pass_installs_is_gone_after_it_even_on_error():
    model = tiny_lm("llama")
    config = model.config
    before = config._attn_implementation
    training = [m.training for m in model.modules()]
    model.train()
    with pytest.raises(RuntimeError, match="boom"):
        with ModelPass(model, grad=True) as run:
            run.after(model.model.layers[0], lambda *args: None)
            run.before(model.model.layers[1].mlp, lambda *args: None, with_kwargs=True)
            run.attention("eager")
            run.method([model.model.layers[0].self_attn], "forward", lambda module, original: original)
            assert not model.training and all(not p.requires_grad for p in model.parameters())
            assert config._attn_implementation == "eager"
            raise RuntimeError("boom")
    assert not [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert "forward" not in vars(model.model.layers[0].self_attn)
    assert config._attn_implementation == before
    assert model.training and all(p.requires_grad for p in model.parameters())
    model.train(False)
    del training


def test_a_pass_acts_only_on_its_own_runs():
    """A nested pass of the same thread, and another thread's plain forward, run the model
    untouched while a pass has hooks and an implementation of its own installed."""
    model = tiny_lm("llama")
    ids = token_ids(1, 6)
    with torch.no_grad():
        plain = model(ids).logits
    seen: list[str] = []

    def zeroed(module, query, key, value, mask, **kwargs):
        seen.append(threading.current_thread().name)
        return torch.zeros_like(query).transpose(1, 2), None

    name = register_attention("captum_ffb_test_zeroed", zeroed)
    other: list[torch.Tensor] = []
    with ModelPass(model) as run:
        run.attention(name)
        run.after(model.lm_head, lambda module, args, output: seen.append("hook") or output * 0)
        own = run.run(ids).logits
        nested = run_model(model, ids).logits  # a nested pass: untouched
        thread = threading.Thread(target=lambda: other.append(model(ids).logits.detach()), name="elsewhere")
        thread.start()
        thread.join()
    assert float(own.abs().max()) == 0  # this pass: its hook and its implementation
    torch.testing.assert_close(nested, plain)
    torch.testing.assert_close(other[0], plain, rtol=1e-5, atol=1e-6)  # eager, not sdpa: rounding
    assert "elsewhere" not in seen and seen.count("hook") == 1


def test_a_pass_holds_the_models_lock():
    model = tiny_lm("llama")
    order: list[str] = []
    inside = threading.Event()

    def second() -> None:
        inside.wait()
        with ModelPass(model):
            order.append("second")

    thread = threading.Thread(target=second)
    thread.start()
    with ModelPass(model):
        inside.set()
        thread.join(0.3)  # the other pass cannot start while this one holds the lock
        order.append("first")
    thread.join()
    assert order == ["first", "second"]


def test_a_pass_must_be_entered_before_use():
    model = tiny_lm("llama")
    run = ModelPass(model)
    with pytest.raises(RuntimeError, match="enter the ModelPass"):
        run.run(token_ids(1, 4))
    with pytest.raises(TypeError, match="nn.Module"):
        ModelPass(lambda x: x)
