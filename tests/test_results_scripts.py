"""The scripts under ``results/`` speak the library's language: the command lines that
``results/faithfulness/run.py --print-commands`` prints are read by ``captum-ffb evaluate``
as the same runs."""

from __future__ import annotations

import shlex

from captum_ffb.cli import build_parser
from captum_ffb.cli.evaluate import parse_options
from captum_ffb.evaluation.methods import resolve_methods
from tests.scripts import load_script


def test_faithfulness_commands_are_the_runs():
    script = load_script("results/faithfulness/run.py")
    assert script.RUNS
    parser = build_parser()
    for name, run in script.RUNS.items():
        words = shlex.split(script.command(name))
        assert words[:2] == ["captum-ffb", "evaluate"]
        args = parser.parse_args(words[1:])
        assert args.task == run["task"] and args.n == run.get("n", script.N)
        assert args.protocol == run.get("protocols", "all")
        assert args.model == (None if run["model"] is None else "$SMOL")
        assert args.max_tokens == run["max_tokens"]
        assert args.methods == run["methods"] and args.out == f"results/faithfulness/{name}"
        assert parse_options(args.option, resolve_methods(args.methods)) == run["options"]


def test_print_commands_prints_one_line_per_run(capsys):
    script = load_script("results/faithfulness/run.py")
    assert script.main(["--print-commands"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [script.command(name) for name in script.RUNS]
