"""``captum-ffb lit``: its help, and its one-line errors before any weights load (the server
itself runs in tests/integrations/test_lit_browser.py)."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from captum_ffb.cli import main


def test_help_names_the_views_and_that_it_works_offline(capsys):
    with pytest.raises(SystemExit):
        main(["lit", "--help"])
    text = capsys.readouterr().out
    for needle in ("examples:", "captum-ffb lit --data rotten_tomatoes", "--model", "--port",
                   "127.0.0.1", "NormDecomposition", "Layer maps", "icon fonts from this package"):
        assert needle in text


def test_without_lit_one_line_names_the_extra(one_line, no_model, monkeypatch):
    from captum_ffb.integrations import lit

    def missing() -> None:
        raise ImportError("the LIT integration needs lit-nlp and what it imports (lit_nlp is "
                          f"missing): {lit.INSTALL}")

    monkeypatch.setattr(lit, "require_lit", missing)
    assert one_line(["lit"]).endswith("pip install 'captum_ffb[lit]' && pip install --no-deps lit-nlp==1.3.1")


needs_lit = pytest.mark.skipif(
    importlib.util.find_spec("lit_nlp") is None,
    reason="needs lit-nlp: pip install 'captum_ffb[lit]' (the README's install line brings it)",
)


@needs_lit
@pytest.mark.parametrize("argv, message", [
    (["--port", "70000"], "--port must lie between 0 and 65535 (0: any free port), got 70000"),
    (["--n", "0"], "--n must be at least 1, got 0"),
    (["--data", "no-such-file.txt", "--port", "0"],
     "--data no-such-file.txt: no such file (or use rotten_tomatoes)"),
])
def test_mistakes_end_in_one_line_before_the_model_is_read(one_line, no_model, argv, message):
    assert one_line(["lit", *argv]) == message


@needs_lit
def test_a_port_in_use_is_refused_before_the_weights_load(one_line, no_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = one_line(["lit", "--port", str(port)])
    assert message.startswith(f"cannot listen on 127.0.0.1:{port}: ")
    assert message.endswith("(choose another --port)")


@needs_lit
def test_a_base_model_without_a_head_is_refused_before_its_weights_load(one_line, no_weights,
                                                                         base_dir):
    assert one_line(["lit", "--model", str(base_dir), "--port", "0"]) == (
        "a base model has nothing to explain in LIT: give a sequence classifier, a causal LM "
        "or the bundled all-MiniLM-L6-v2")


@needs_lit
def test_the_server_answers_on_127_0_0_1_and_stops_on_ctrl_c(tmp_path):
    """``--port 0``: a free port, printed once the server is ready; its page and LIT's metadata
    answer there; Ctrl+C ends it with exit code 0."""
    import json
    import signal
    import subprocess
    import sys
    import urllib.request

    from tests.models import tiny_task_model, wordpiece_tokenizer

    folder = tmp_path / "tiny-bert-classifier"
    tiny_task_model("bert", "sequence_classification").save_pretrained(folder)
    wordpiece_tokenizer().save_pretrained(folder)
    server = subprocess.Popen([sys.executable, "-m", "captum_ffb.cli", "lit", "--model", str(folder),
                               "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or not lines[-1].startswith("LIT is ready at "):
            line = server.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        url = lines[-1].split()[4]
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=30) as page:
            assert b"<lit-app>" in page.read()
        with urllib.request.urlopen(url + "/get_info", timeout=30) as info:
            assert "NormDecomposition" in json.loads(info.read())["interpreters"]
        server.send_signal(signal.SIGINT)
        _, rest = server.communicate(timeout=60)  # reading stderr meanwhile: a full pipe would block it
        assert server.returncode == 0
        assert rest.strip().splitlines()[-1] == "LIT stopped"
    finally:
        if server.poll() is None:
            server.kill()
