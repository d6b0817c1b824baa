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


def _split(cpr: dict[str, float], cmd: dict[str, float]) -> dict:
    return {"prompts": [], "results": {n: {"cpr": cpr[n], "cmd": cmd[n]} for n in cpr}}


def test_mib_stability_names_each_tasks_best_on_both_splits():
    script = load_script("results/mib/run.py")
    saved = {"tasks": {
        "a": {"splits": {"selection": _split({"x": 1.0, "y": 0.5, "z": 0.2}, {"x": 0.1, "y": 0.2, "z": 0.3}),
                         "heldout": _split({"x": 0.9, "y": 0.4, "z": 0.1}, {"x": 0.3, "y": 0.2, "z": 0.1})}},
        "b": {"splits": {"selection": _split({"x": 0.1, "y": 0.5, "z": 0.2}, {"x": 0.1, "y": 0.2, "z": 0.3}),
                         "heldout": _split({"x": 0.9, "y": 0.4, "z": 0.1}, {"x": 0.1, "y": 0.2, "z": 0.3}),
                         }}}}
    lines = script.stability(saved)
    assert "| CPR | a | `x` | 1 of 3 | `x` | 0.5000 |" in lines
    assert "| CPR | b | `y` | 2 of 3 | `x` | 0.5000 |" in lines
    assert "| CMD | a | `x` | 3 of 3 | `z` | 0.1000 |" in lines
    assert "| CMD | b | `x` | 1 of 3 | `x` | 0.1000 |" in lines
    assert any("held-out best on 1 of 2 tasks by CPR and on 1 of 2 by CMD" in line and "0.67 of 2" in line
               for line in lines)
    del saved["tasks"]["b"]["splits"]["heldout"]
    assert script.stability(saved) == []
