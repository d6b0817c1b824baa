"""``captum-ffb app``: its refusals come before the weights load, in one line, and it serves
the model it was given on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys

import pytest

from captum_ffb.cli import main
from tests.models import save_tiny_lm

needs_gradio = pytest.mark.skipif(importlib.util.find_spec("gradio") is None,
                                  reason="the Gradio app needs gradio: pip install 'captum_ffb[app]'")


def test_without_gradio_one_line_names_the_extra(monkeypatch, one_line, no_model):
    monkeypatch.setitem(sys.modules, "gradio", None)  # import gradio raises ImportError
    assert one_line(["app"]) == "the Gradio app needs gradio: pip install 'captum_ffb[app]'"


@needs_gradio
def test_a_port_out_of_range_or_taken_is_refused_before_the_model_loads(one_line, no_model):
    assert one_line(["app", "--port", "70000"]) == "--port must lie between 0 and 65535 (0: any free port), got 70000"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert one_line(["app", "--port", str(port)]).startswith(f"cannot listen on 127.0.0.1:{port}: ")


@needs_gradio
def test_an_unknown_model_is_one_line(one_line, tmp_path):
    assert "no_such_model" in one_line(["app", "--model", str(tmp_path / "no_such_model")])


@needs_gradio
def test_serves_the_model_given_on_this_machine_only(monkeypatch, tmp_path, capsys):
    from captum_ffb.integrations import gradio_app

    served = {}
    monkeypatch.setattr(gradio_app, "launch", lambda model, **options: served.update(model=model, **options))
    folder = save_tiny_lm(tmp_path / "model")
    capsys.readouterr()
    assert main(["app", "--model", str(folder), "--port", "7999", "--quiet"]) == 0
    assert served["model"].task == "causal_lm" and served["model"].source == str(folder)
    assert served["host"] == "127.0.0.1" and served["port"] == 7999 and served["quiet"] is True
    assert capsys.readouterr().err == ""


def test_python_m_captum_ffb_app_is_the_same_command_line():
    done = subprocess.run([sys.executable, "-m", "captum_ffb.app", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: captum-ffb app [-h] [--port N]")
    assert "[--model NAME_OR_DIR]" in done.stdout
    assert "127.0.0.1" in done.stdout
