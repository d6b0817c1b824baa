"""The bad-input table: every input a careful user got wrong, with the one line it now gives.

Two tables that grow: the command line (exit code 2, exactly one line on stderr, no
traceback, nothing on stdout) and the Python API (a ``ValueError`` or ``TypeError`` whose
message names the parameter). They hold the robustness probe's cases (issue 36) and the
earlier first-use cases (issue 17) that are bad input; a Hypothesis property then feeds
random ids, masks and targets to ``attribute`` and ``attribute_components`` and accepts only
an exact answer or one of those two errors.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from captum_ffb import (
    AnswerLogProbability,
    Contrast,
    Direction,
    LayerNormDecomposition,
    NormDecomposition,
    TopLogits,
    activation_patching,
    context_attribution,
)
from captum_ffb.explained.readouts import NextToken
from captum_ffb.long_context.presence import presence_attribution
from captum_ffb.viz.neuronpedia import neuronpedia_graph, read_neuronpedia_state
from tests.models import (
    TINY_SEQ2SEQ,
    causal_tokenizer,
    save_tiny,
    save_tiny_lm,
    save_tiny_seq2seq,
    save_tiny_whisper,
    tiny_lm,
    tiny_models,
    tiny_task_model,
    token_ids,
    wordpiece_tokenizer,
    write_wav,
)

TINY = {model.name: model for model in tiny_models()}


# --------------------------------------------------------------------------- files
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The saved tiny models and the bad files the command lines read."""
    root = tmp_path_factory.mktemp("bad-input")
    whisper = save_tiny_whisper(root / "whisper")
    bare = root / "whisper-without-extractor"
    bare.mkdir()
    for path in whisper.iterdir():
        if path.name != "preprocessor_config.json":
            (bare / path.name).write_bytes(path.read_bytes())
    damaged = root / "damaged-bert"
    save_tiny("bert", damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    out_file = root / "a-file"
    out_file.write_text("mine")
    (root / "empty.wav").write_bytes(b"")
    (root / "not-a.wav").write_bytes(b"RIFF....WAVEfmt nonsense")
    (root / "number.jsonl").write_text(json.dumps({"text": 123}) + "\n")
    (root / "broken.jsonl").write_text(json.dumps({"text": "fine"}) + "\n{oops\n")
    (root / "no-text.jsonl").write_text(json.dumps({"label": 1}) + "\n")
    (root / "latin1.txt").write_bytes(b"the cat\nthe caf\xe9\n")
    (root / "label.jsonl").write_text(json.dumps({"text": "a", "label": "yes"}) + "\n")
    with open(root / "long-field.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerow(["the cat " * 20000, "x"])
    with open(root / "long-evidence.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["", "Sentence_good", "one_prefix_prefix", "one_prefix_word_good", "one_prefix_word_bad",
                         "target"])
        writer.writerow([0, "x", "the cat " * 20000, "dog", "sat", "cat"])
    (root / "short-row.csv").write_text(
        ",Sentence_good,one_prefix_prefix,one_prefix_word_good,one_prefix_word_bad,target\n"
        "0,the cat is,the cat,is\n")
    (root / "corpus.txt").write_text("the cat sat\na dog ran\n")
    (root / "zero-width.txt").write_text("\u200b\u2060\n\u200b")
    (root / "huge.txt").write_text("the cat sat on the mat. " * 4000)
    (root / "blocked" / "graph.json").mkdir(parents=True)
    return {
        "root": root, "gpt2": save_tiny_lm(root / "gpt2", "gpt2"), "llama": save_tiny_lm(root / "llama"),
        "bert": save_tiny("bert", root / "bert"), "marian": save_tiny_seq2seq(root / "marian"),
        "whisper": whisper, "bare-whisper": bare, "damaged": damaged, "a-file": out_file,
        "clip": write_wav(root / "clip.wav", 3), "long-clip": write_wav(root / "long.wav", 12),
    }


def _argv(template: list[str], files: dict, out: Path) -> list[str]:
    names = {key: str(value) for key, value in files.items()}
    names["out"] = str(out)
    return [part.format(**names, r=names["root"]) for part in template] + (
        [] if "--out" in template else ["--out", str(out)])


#: (case, command line, the one line it gives: exact, or a regular expression after "re:")
CLI_CASES = [
    # issue 36, item 5: tracebacks from the CLI
    ("audio on a text encoder–decoder (explain)",
     ["explain", "the cat", "--audio", "{clip}", "--model", "{marian}"],
     "audio is for speech encoder–decoders (Whisper); marian reads text"),
    ("audio on a text encoder–decoder (maps)",
     ["maps", "the cat ||| the dog", "--audio", "{clip}", "--model", "{marian}"],
     "audio is for speech encoder–decoders (Whisper); marian reads text"),
    ("a Whisper folder without its feature extractor",
     ["explain", "--audio", "{clip}", "--model", "{bare-whisper}"],
     "re:the model folder .*whisper-without-extractor has no preprocessor_config.json .*"),
    ("--generate past GPT-2's positions",
     ["explain", "the cat", "--model", "{gpt2}", "--generate", "100000"],
     "--generate 100000 runs past the model's 64 positions: at most 63 new tokens fit after 1 position"),
    ("--generate past a rotary model's positions",
     ["explain", "the cat", "--model", "{llama}", "--generate", "100000"],
     "--generate 100000 runs past the model's 64 positions: at most 63 new tokens fit after 1 position"),
    ("--generate past Marian's positions",
     ["explain", "the cat", "--model", "{marian}", "--generate", "100000"],
     "--generate 100000 runs past the model's 64 positions: at most 63 new tokens fit after 1 position"),
    ("a CSV field over 131,072 characters (explain --data)",
     ["explain", "--data", "{r}/long-field.csv", "--model", "{gpt2}"],
     're:.*long-field.csv: line 2: "label" must be an integer, got \'x\''),
    ("a CSV field over 131,072 characters (evaluate --task evidence)",
     ["evaluate", "--task", "evidence", "--data", "{r}/long-evidence.csv", "--model", "{llama}", "--quiet"],
     "no usable evidence pairs ({'longer than the model takes': 1})"),
    ("an evidence row with too few fields",
     ["evaluate", "--task", "evidence", "--data", "{r}/short-row.csv", "--model", "{llama}"],
     "re:.*short-row.csv: line 2 has no one_prefix_word_bad, target \\(too few fields\\)"),
    ("a JSONL text that is a number",
     ["explain", "--data", "{r}/number.jsonl", "--model", "{gpt2}"],
     're:.*number.jsonl: line 1: "text" must be a string, got int'),
    # item 7: unclear or reinterpreted input
    ("an empty WAV file", ["explain", "--audio", "{r}/empty.wav", "--model", "{whisper}"],
     "re:cannot read .*empty.wav as a WAV file: the file is empty \\(0 bytes\\)"),
    ("a file that is not a WAV", ["explain", "--audio", "{r}/not-a.wav", "--model", "{whisper}"],
     "re:cannot read .*not-a.wav as a WAV file: .+"),
    ("bad UTF-8 names the file", ["explain", "--data", "{r}/latin1.txt", "--model", "{gpt2}"],
     "re:.*latin1.txt is not valid UTF-8: line 2 \\(byte 0xe9 at position 7\\); save it as UTF-8"),
    ("bad JSONL names the file and line", ["explain", "--data", "{r}/broken.jsonl", "--model", "{gpt2}"],
     "re:.*broken.jsonl: line 2 is not JSON \\(.+\\)"),
    ("a JSONL line without text", ["explain", "--data", "{r}/no-text.jsonl", "--model", "{gpt2}"],
     're:.*no-text.jsonl: line 1 needs a "text" \\(a JSON object per line\\)'),
    ("a label that is no integer", ["explain", "--data", "{r}/label.jsonl", "--model", "{gpt2}"],
     're:.*label.jsonl: line 1: "label" must be an integer, got \'yes\''),
    ("Whisper without audio (explain)", ["explain", "hello", "--model", "{whisper}"],
     "whisper reads audio: give a WAV file as its source (--audio WAV)"),
    ("Whisper without audio (maps)", ["maps", "hello ||| world", "--model", "{whisper}"],
     "whisper reads audio: give a WAV file as its source (--audio WAV)"),
    ("||| on a decoder-only model", ["explain", "the cat ||| the dog", "--model", "{llama}"],
     "||| separates an encoder–decoder's source from its target; llama has one stack: leave it out "
     "of the text"),
    ("||| on an encoder-only model", ["maps", "the cat ||| the dog", "--model", "{bert}"],
     "||| separates an encoder–decoder's source from its target; bert has one stack: leave it out "
     "of the text"),
    ("a --model-name that is a path", ["graph", "the cat", "--model", "{gpt2}", "--model-name", "a/b"],
     "--model-name is a name, not a path, got 'a/b'"),
    ("--max-n-logits with --target", ["graph", "the cat", "--model", "{gpt2}", "--max-n-logits", "3", "--target", "x"],
     "--max-n-logits explains the most probable next tokens: give it without --target"),
    ("--max-n-logits of 0", ["graph", "the cat", "--model", "{gpt2}", "--max-n-logits", "0"],
     "--max-n-logits must be from 1 to 1000, got 0"),
    ("--desired-logit-prob over 1", ["graph", "the cat", "--model", "{gpt2}", "--max-n-logits", "3",
                                     "--desired-logit-prob", "1.5"],
     "--desired-logit-prob must lie in (0, 1], got 1.5"),
    ("a second |||", ["explain", "the ||| cat ||| dog", "--model", "{marian}"],
     "the text holds ||| 2 times: give one, between the source and the target"),
    ("zero-width text (explain)", ["explain", "\u200b\u200b", "--model", "{bert}"],
     "the text has no visible characters (only spaces, zero-width or control characters)"),
    ("zero-width text (maps)", ["maps", "\u200b\u2060", "--model", "{bert}"],
     "the text has no visible characters (only spaces, zero-width or control characters)"),
    ("a text longer than the model takes", ["maps", "the cat " * 40, "--model", "{bert}", "--quiet"],
     "the text has 82 tokens; the model takes at most 64"),
    # issue 17 (the earlier cases that are bad input)
    ("--out is a file", ["maps", "the cat", "--model", "{bert}", "--out", "{a-file}"],
     "re:--out .*a-file exists and is not a folder"),
    ("--out under a file", ["maps", "the cat", "--model", "{bert}", "--out", "{a-file}/sub"],
     "re:--out .*a-file/sub cannot be created: .*a-file is a file, not a folder"),
    ("damaged weights", ["maps", "the cat", "--model", "{damaged}", "--quiet"],
     "re:cannot load model .*: the weights file .*model.safetensors is damaged or incomplete .*"),
    ("a misspelt method option", ["evaluate", "--task", "sentiment", "--model", "{bert}", "--data", "{r}/corpus.txt",
                                  "--methods", "integrated_gradients",
                                  "--option", "integrated_gradients.n_stepz=3"],
     "re:.*n_stepz.*"),
    ("an unknown device", ["explain", "--data", "{r}/corpus.txt", "--model", "{gpt2}",
                           "--device", "nonsense"],
     "cannot use device 'nonsense': not a torch device name"),
    ("a model folder that does not exist", ["maps", "the cat", "--model", "{r}/nowhere"],
     "re:.*nowhere.*"),
    ("a required option missing", ["evaluate", "--model", "{bert}"],
     "the following arguments are required: --task (see captum-ffb evaluate --help)"),
    ("an unknown choice", ["explain", "the cat", "--route", "sideways"],
     "re:argument --route: invalid choice: 'sideways' \\(choose from '?backward'?, '?forward'?\\) "
     "\\(see captum-ffb explain --help\\)"),
    # issue 37 item 3, issue 40: the shared options
    ("a dtype the loader does not take", ["maps", "the cat", "--model", "{bert}", "--dtype", "int8"],
     "re:argument --dtype: invalid choice: 'int8' \\(choose from '?float32'?, '?bfloat16'?, '?float16'?, "
     "'?float64'?\\) \\(see captum-ffb maps --help\\)"),
    ("an unknown device (maps)", ["maps", "the cat", "--model", "{bert}", "--device", "nonsense"],
     "cannot use device 'nonsense': not a torch device name"),
    ("an unknown device (one text)", ["explain", "the cat", "--model", "{gpt2}", "--device", "nonsense"],
     "cannot use device 'nonsense': not a torch device name"),
    ("an unknown device (compare)", ["compare", "the cat", "--model", "{bert}", "--device", "gpu0"],
     "cannot use device 'gpu0': not a torch device name"),
    ("--dtype in the corpus mode", ["explain", "--data", "{r}/corpus.txt", "--model", "{gpt2}",
                                    "--dtype", "bfloat16"],
     "--dtype bfloat16 is for one TEXT: the corpus mode's workers load the model in its saved dtype"),
    ("an unknown differentiation", ["compare", "the cat", "--model", "{bert}", "--differentiation", "reverse"],
     "re:argument --differentiation: invalid choice: 'reverse' \\(choose from '?forward-mode'?, '?captum'?\\) "
     "\\(see captum-ffb compare --help\\)"),
    ("an unknown route, spelt the old way (compare)", ["compare", "the cat", "--route", "backward"],
     "re:argument --route: invalid choice: 'backward' \\(choose from '?forward'?, '?captum'?\\) "
     "\\(see captum-ffb compare --help\\)"),
    ("no scope in --scopes", ["maps", "the cat", "--model", "{bert}", "--scopes", ","], "--scopes is empty"),
    ("--n 0 (analyze)", ["analyze", "--model", "{bert}", "--data", "{r}/corpus.txt", "--n", "0"],
     "--n must be at least 1, got 0"),
    ("--n 0, spelt the old way (analyze)",
     ["analyze", "--model", "{bert}", "--data", "{r}/corpus.txt", "--max-seqs", "0", "--quiet"],
     "--n must be at least 1, got 0"),
    # issue 40: the contrast and the figures' colours
    ("--contrast with --target", ["explain", "the cat", "--model", "{gpt2}", "--contrast", " a", " b",
                                  "--target", " a"],
     "argument --target: not allowed with argument --contrast (see captum-ffb explain --help)"),
    ("--contrast with --generate", ["explain", "the cat", "--model", "{gpt2}", "--contrast", " a", " b",
                                    "--generate", "2"],
     "re:.*contrast explains logit\\(A\\) − logit\\(B\\) at the next position: leave out .*generate.*"),
    ("--contrast on a classifier", ["explain", "the cat", "--model", "{bert}", "--contrast", " a", " b"],
     "re:.*contrast compares two next tokens: it needs a causal LM"),
    ("--contrast with one token", ["explain", "the cat", "--model", "{gpt2}", "--contrast", " a"],
     "re:argument --contrast: expected 2 arguments \\(see captum-ffb explain --help\\)"),
    ("--contrast in the corpus mode", ["explain", "--data", "{r}/corpus.txt", "--model", "{gpt2}",
                                       "--contrast", " a", " b"],
     "--contrast explains one text: leave out --data"),
    ("an unknown colour normalisation", ["maps", "the cat", "--model", "{bert}", "--normalize", "max"],
     "re:argument --normalize: invalid choice: 'max' .*\\(see captum-ffb maps --help\\)"),
    # issue 39: context attribution
    ("--context without --question", ["explain", "--context", "{r}/corpus.txt", "--model", "{gpt2}"],
     "context attribution takes both --context FILE and --question TEXT"),
    ("--context with --contrast", ["explain", "--context", "{r}/corpus.txt", "--question", "Why?",
                                   "--model", "{gpt2}", "--contrast", " a", " b"],
     "--contrast does not apply to context attribution (--context)"),
    ("an unknown grouping", ["explain", "--context", "{r}/corpus.txt", "--question", "Why?", "--model", "{gpt2}",
                             "--group-by", "word"],
     "re:argument --group-by: invalid choice: 'word' .*"),
    # issue 58: presence attribution
    ("an unknown context method", ["explain", "--context", "{r}/corpus.txt", "--question", "Why?", "--model", "{gpt2}",
                                   "--context-method", "ablation"],
     "re:argument --context-method: invalid choice: 'ablation' .*"),
    ("too few ablations", ["explain", "--context", "{r}/corpus.txt", "--question", "Why?", "--model", "{gpt2}",
                           "--context-method", "fitted", "--ablations", "2"],
     "--ablations must be at least 3, got 2"),
    ("a focus of one group", ["explain", "--context", "{r}/corpus.txt", "--question", "Why?", "--model", "{gpt2}",
                              "--context-method", "fitted", "--focus", "1"],
     "--focus must be 0 (every group) or at least 2, got 1"),
    ("negative nested prompts", ["explain", "--context", "{r}/corpus.txt", "--question", "Why?", "--model", "{gpt2}",
                                "--context-method", "fitted", "--rounds", "-2"],
     "--rounds must be 0 or more, got -2"),
    ("no presence steps", ["explain", "--context", "{r}/corpus.txt", "--question", "Why?", "--model", "{gpt2}",
                           "--context-method", "presence", "--presence-steps", "0"],
     "--presence-steps must be a positive integer, got 0"),
    # issue 45: the newest features
    ("an empty --question", ["explain", "--context", "{r}/corpus.txt", "--question", " ", "--model", "{gpt2}"],
     "--question is empty"),
    ("a context of zero-width characters only",
     ["explain", "--context", "{r}/zero-width.txt", "--question", "Why?", "--model", "{gpt2}"],
     "re:--context .*zero-width.txt has no visible characters .*"),
    ("a --context past the model's positions, refused before tokenising it",
     ["explain", "--context", "{r}/huge.txt", "--question", "Why?", "--model", "{gpt2}", "--quiet"],
     "re:the prompt has [0-9,]+ characters, at least [0-9,]+ tokens: more than 64"),
    ("a two-token --contrast names --contrast",
     ["explain", "the cat", "--model", "{gpt2}", "--contrast", " the cat", " a", "--quiet"],
     "re:--contrast ' the cat' is 2 tokens for this tokenizer .*"),
    ("--class on a causal LM names --class (graph)", ["graph", "the cat", "--model", "{gpt2}", "--class", "1"],
     "--class needs a sequence classifier"),
    ("--class on a causal LM names --class (explain)", ["explain", "the cat", "--model", "{gpt2}", "--class", "1"],
     "--class needs a sequence classifier"),
    ("a --corrupted of another length names --corrupted",
     ["graph", "the cat sat", "--model", "{gpt2}", "--corrupted", "the", "--quiet"],
     "re:--corrupted must have as many tokens as the text \\(\\d+\\), it has \\d+"),
    ("an empty --corrupted", ["graph", "the cat sat", "--model", "{gpt2}", "--corrupted", " ", "--quiet"],
     "--corrupted is empty"),
    # issue 54
    ("a --target the tokenizer does not know (explained as <unk> before)",
     ["explain", "the cat", "--model", "{gpt2}", "--target", "zebra", "--quiet"],
     "--target 'zebra' is not in the tokenizer's vocabulary: it reads as '<unk>', which would be explained instead"),
    ("a graph's --target the tokenizer does not know",
     ["graph", "the cat", "--model", "{gpt2}", "--target", "zebra", "--quiet"],
     "--target 'zebra' is not in the tokenizer's vocabulary: it reads as '<unk>', which would be explained instead"),
    ("a folder in the way of a graph file",
     ["graph", "the cat sat", "--model", "{gpt2}", "--format", "json", "--out", "{r}/blocked", "--quiet"],
     "re:--out .*blocked: graph.json is a folder there, in the way of the file of that name; .*"),
]


@pytest.mark.parametrize("case, template, expected", CLI_CASES, ids=[case for case, *_ in CLI_CASES])
def test_cli_gives_one_line(case, template, expected, files, tmp_path, one_line):
    message = one_line(_argv(template, files, tmp_path / "out"))
    if expected.startswith("re:"):
        assert re.fullmatch(expected[3:], message), message
    else:
        assert message == expected


def test_a_refused_run_leaves_the_finished_one_alone(files, tmp_path, one_line):
    """Issue 36, item 2: the settings are checked before anything is written."""
    from captum_ffb.cli import main

    first, second = tmp_path / "c1.txt", tmp_path / "c2.txt"
    first.write_text("the cat sat\n\na dog ran\n")
    second.write_text("the cat ran\n")
    out = tmp_path / "run"
    assert main(["explain", "--data", str(first), "--model", str(files["gpt2"]), "--out", str(out),
                 "--quiet"]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    message = one_line(["explain", "--data", str(second), "--model", str(files["gpt2"]), "--out", str(out)])
    assert message.endswith("holds a run with other settings or data; use another --out or --overwrite")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_long_clip_is_cut_with_one_line(files, tmp_path, capsys):
    """Issue 36, item 7: audio longer than the extractor's window is cut with a notice."""
    from captum_ffb.cli import main

    argv = ["explain", "--audio", str(files["long-clip"]), "--model", str(files["whisper"]),
            "--generate", "2", "--format", "json", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [f"captum-ffb: warning: {files['long-clip']} lasts 12.0 s; whisper reads its first 10 s"]


# --------------------------------------------------------------------------- the API
@pytest.fixture(scope="module")
def api():
    lm = tiny_lm("llama")
    base = TINY["bert"].build()
    marian = TINY_SEQ2SEQ["marian"].build()
    classifier = tiny_task_model("llama", "sequence_classification")
    nd = NormDecomposition(lm)
    nd_base = NormDecomposition(base)
    return {"lm": lm, "nd": nd, "base": base, "nd_base": nd_base,
            "graph": nd.attribute_graph(IDS[:1], target=3, prune=False),
            "patched": nd.attribute_graph(IDS[:1], target=3, corrupted_inputs=IDS[1:], max_nodes=12),
            "class_graph": NormDecomposition(classifier).attribute_graph(IDS[:1], target=1),
            "direction_graph": nd_base.attribute_graph(IDS[:1], target=Direction(torch.ones(32))),
            "nd_text": NormDecomposition(lm, tokenizer=causal_tokenizer()),
            "marian": marian, "nd_marian": NormDecomposition(marian),
            "lnd": LayerNormDecomposition(base, base.encoder.layer[0]), "tokenizer": wordpiece_tokenizer()}


def _edge_patcher(a, steps):
    from captum_ffb.patching.patches import EdgePatcher

    nd = a["nd"]
    return EdgePatcher(nd.engine, nd.request(IDS[:1], 3), nd.request(IDS[1:], 3), "head", steps=steps)


def _circuits():
    from captum_ffb.patching import circuits

    return circuits


def _graph(a):
    return _circuits().ComponentGraph.of(a["nd"].engine, "head")


def _pair(a):
    return a["nd"].request(IDS[:1], 3), a["nd"].request(IDS[1:], 3)


MIB_CONFIG = {"n_layers": 2, "n_heads": 4, "d_model": 32, "parallel_attn_mlp": False}
IDS = torch.tensor([[5, 6, 7, 8, 9], [9, 8, 7, 6, 5]])
PADDED_ROW = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
SOURCE = torch.tensor([[5, 6, 7, 8]])
PREFIX = torch.tensor([[0, 5, 6], [0, 7, 8]])

#: (case, call, the exception type, a regular expression the message matches: the parameter)
API_CASES = [
    ("a row that is all padding (NaN before)",
     lambda a: a["nd_base"].attribute(IDS, target=Direction(torch.ones(32)),
                                      forward_kwargs={"attention_mask": PADDED_ROW}),
     ValueError, r"attention_mask: row 1 has no real token \(all padding\)"),
    ("a mask of another shape (taken as all ones before)",
     lambda a: a["nd"].attribute(IDS, target=3, forward_kwargs={"attention_mask": torch.ones(2, 3)}),
     ValueError, r"attention_mask has shape \(2, 3\); the ids it masks have \(2, 5\)"),
    ("a mask of other values",
     lambda a: a["nd"].attribute(IDS, target=3, forward_kwargs={"attention_mask": IDS}),
     ValueError, r"attention_mask holds values other than 0 and 1"),
    ("a target batch that is not the source's (accepted before)",
     lambda a: a["nd_marian"].attribute(SOURCE, target=3, forward_kwargs={"decoder_input_ids": PREFIX}),
     ValueError, r"decoder_input_ids has 2 rows; the source \(inputs\) has 1"),
    ("float ids", lambda a: a["nd"].attribute(IDS.float(), target=3),
     TypeError, r"inputs must hold integer token ids, got float32"),
    ("bool ids", lambda a: a["nd"].attribute(IDS > 6, target=3),
     TypeError, r"inputs must hold integer token ids, got bool"),
    ("ids out of the vocabulary", lambda a: a["nd"].attribute(IDS + 100, target=3),
     ValueError, r"inputs holds the token id 109, outside the model's vocabulary \(0 … 59\)"),
    ("negative ids", lambda a: a["nd"].attribute(-IDS, target=3),
     ValueError, r"inputs holds the token id -9, outside the model's vocabulary \(0 … 59\)"),
    ("ids of one dimension", lambda a: a["nd"].attribute(IDS[0], target=3),
     ValueError, r"inputs must have shape \(batch, n\), got \(5,\)"),
    ("empty ids", lambda a: a["nd"].attribute(IDS[:, :0], target=3),
     ValueError, r"inputs are empty"),
    ("a reference token out of the vocabulary", lambda a: a["nd"].attribute(IDS, target=3, reference=10**5),
     ValueError, r"reference 100000 is out of range \(0 … 59\)"),
    ("a reference that is a bool", lambda a: a["nd"].attribute(IDS, target=3, reference=True),
     TypeError, r"reference must be an integer index, got a bool"),
    ("more positions than the model has (MiniLM at 600)",
     lambda a: a["nd_base"].attribute(torch.randint(4, 50, (1, 70)), target=Direction(torch.ones(32))),
     ValueError, r"inputs has 70 positions; the model takes at most 64"),
    ("layer maps past the position table",
     lambda a: a["lnd"].attribute(torch.randint(4, 50, (1, 70))),
     ValueError, r"inputs has 70 positions; the model takes at most 64"),
    ("an encoder–decoder target out of the vocabulary",
     lambda a: a["nd_marian"].attribute(SOURCE, target=60, forward_kwargs={"decoder_input_ids": PREFIX[:1]}),
     ValueError, r"target 60 is out of range \(0 … 59\)"),
    ("empty decoder ids",
     lambda a: a["nd_marian"].attribute(SOURCE, target=3,
                                        forward_kwargs={"decoder_input_ids": PREFIX[:1, :0]}),
     ValueError, r"decoder_input_ids is empty"),
    ("generation past the positions",
     lambda a: a["nd_marian"].explain_generation(SOURCE, max_new_tokens=100000),
     ValueError, r"max_new_tokens 100000 runs past the model's 64 positions"),
    ("a target that is a bool (token 1 before)", lambda a: a["nd"].attribute(IDS, target=True),
     TypeError, r"target must be an integer index, got a bool"),
    ("a target that is a float", lambda a: a["nd"].attribute(IDS, target=3.0),
     TypeError, r"target must be an integer index, got a float"),
    ("a target out of the vocabulary", lambda a: a["nd"].attribute(IDS, target=60),
     ValueError, r"target 60 is out of range \(0 … 59\)"),
    ("forward_kwargs that is not a dict", lambda a: a["nd"].attribute(IDS, target=3, forward_kwargs=[1]),
     TypeError, r"forward_kwargs must be a dict"),
    ("a components call with a padded row",
     lambda a: a["nd"].attribute_components(IDS, target=3, forward_kwargs={"attention_mask": PADDED_ROW}),
     ValueError, r"attention_mask: row 1 has no real token"),
    ("attribute_steps with an id out of the vocabulary",
     lambda a: a["nd"].attribute_steps(IDS[:1] + 60, targets=[3], positions=[4]),
     ValueError, r"inputs holds the token id 69, outside the model's vocabulary"),
    # attribution graphs (issue 38)
    ("a graph of a batch", lambda a: a["nd"].attribute_graph(IDS, target=3),
     ValueError, r"inputs: an attribution graph explains one input at a time"),
    ("a graph at an unknown granularity", lambda a: a["nd"].attribute_graph(IDS[:1], target=3, granularity="layer"),
     ValueError, r"granularity must be one of sublayer, head, neuron, got 'layer'"),
    ("a graph with no writer nodes", lambda a: a["nd"].attribute_graph(IDS[:1], target=3, max_nodes=0),
     ValueError, r"max_nodes must be a positive number of nodes, got 0"),
    ("a node threshold past 1", lambda a: a["nd"].attribute_graph(IDS[:1], target=3, node_threshold=1.5),
     ValueError, r"node_threshold must lie between 0 and 1, got 1.5"),
    ("a corrupted prompt of another length",
     lambda a: a["nd"].attribute_graph(IDS[:1], target=3, baseline_inputs=IDS[:1, :4]),
     ValueError, r"corrupted_inputs must have the inputs' shape \(1, 5\)"),
    ("a negative patching threshold",
     lambda a: a["nd"].attribute_graph(IDS[:1], target=3, baseline_inputs=IDS[1:], exact_above=-1),
     ValueError, r"exact_above must be a positive number"),
    ("a negative count of verified components",
     lambda a: a["nd"].attribute_graph(IDS[:1], target=3, corrupted_inputs=IDS[1:], verify_top=-1),
     ValueError, r"verify_top must be a number of components \(0: none\), got -1"),
    ("a bool as the count of verified components",
     lambda a: a["nd"].attribute_graph(IDS[:1], target=3, corrupted_inputs=IDS[1:], verify_top=True),
     ValueError, r"verify_top must be a number of components \(0: none\), got True"),
    ("verify_top without a corrupted run",
     lambda a: a["nd"].attribute_graph(IDS[:1], target=3, verify_top=2),
     ValueError, r"verify_top sets up patching estimates, which need corrupted_inputs"),
    # context attribution (issue 39)
    ("context groups of an unknown kind",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One. Two.", "Why?", group_by="word"),
     ValueError, r"group_by must be one of"),
    ("an empty context", lambda a: context_attribution(a["nd"], a["tokenizer"], " ", "Why?"),
     ValueError, r"context is empty"),
    ("a question that is not a string", lambda a: context_attribution(a["nd"], a["tokenizer"], "One.", 3),
     TypeError, r"question must be a string, got int"),
    ("a template without the question",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One.", "Why?", template="{context} so"),
     ValueError, r"template must hold \{context\} and \{question\} once each"),
    # issue 58: presence attribution, at the API
    ("an unknown context method",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One. Two.", "Why?", method="ablation"),
     ValueError, r"method must be one of \('decomposition', 'presence', 'fitted'\), got 'ablation'"),
    ("no presence steps",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One. Two.", "Why?", method="presence", steps=0),
     ValueError, r"steps must be a positive integer, got 0"),
    ("too few ablations for a fitted surrogate",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One. Two.", "Why?", method="fitted", ablations=2),
     ValueError, r"ablations must be an integer of at least 3, got 2"),
    ("a focus of one group for a fitted surrogate",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One. Two.", "Why?", method="fitted", focus=1),
     ValueError, r"focus must be None or an integer of at least 2, got 1"),
    ("negative nested prompts for a fitted surrogate",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One. Two.", "Why?", method="fitted", rounds=-1),
     ValueError, r"rounds must be an integer of at least 0, got -1"),
    ("a fitted surrogate's rerank as a number",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One. Two.", "Why?", method="fitted", rerank=1),
     TypeError, r"rerank must be True or False, got int"),
    ("presence's ends as a number",
     lambda a: presence_attribution(a["lm"], IDS[:1], [0] * IDS.shape[1], 1, NextToken(3), ends=1),
     TypeError, r"ends must be True or False, got int"),
    ("presence's blocks as a number",
     lambda a: presence_attribution(a["lm"], IDS[:1], [0] * IDS.shape[1], 1, NextToken(3), blocks=1),
     TypeError, r"blocks must be True or False, got int"),
    ("a fitted surrogate's unknown prior",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One. Two.", "Why?", method="fitted", prior="lasso"),
     ValueError, r"prior must be 'presence' or 'decomposition', got 'lasso'"),
    ("a fitted surrogate's seed that is not an integer",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One. Two.", "Why?", method="fitted", seed="0"),
     TypeError, r"seed must be an integer, got str"),
    # issue 45: the newest features, at the API
    ("an empty question", lambda a: context_attribution(a["nd"], a["tokenizer"], "One.", " "),
     ValueError, r"question is empty"),
    ("a context of zero-width characters", lambda a: context_attribution(a["nd"], a["tokenizer"], "\u200b\u2060", "Why?"),
     ValueError, r"context has no visible characters"),
    ("a context attribution's target of no token (IndexError before)",
     lambda a: context_attribution(a["nd"], a["tokenizer"], "One.", "Why?", target=""),
     ValueError, r"target '' holds no token for this tokenizer"),
    ("max_tokens as a string", lambda a: context_attribution(a["nd"], a["tokenizer"], "One.", "Why?", max_tokens="10"),
     TypeError, r"max_tokens must be a positive integer, got str"),
    ("max_tokens 0", lambda a: context_attribution(a["nd"], a["tokenizer"], "One.", "Why?", max_tokens=0),
     ValueError, r"max_tokens must be at least 1, got 0"),
    ("a context attribution of a raw model (AttributeError before)",
     lambda a: context_attribution(a["lm"], a["tokenizer"], "One.", "Why?", group_by="sentences"),
     ValueError, r"group_by must be one of paragraph, sentence, line"),
    ("a contrast of one unit with itself", lambda a: a["nd"].attribute(IDS, target=Contrast(5, 5)),
     ValueError, r"Contrast: the positive and the negative target are the same unit \(5\)"),
    ("a reference holding NaN (a non-finite result before)",
     lambda a: a["nd"].attribute(IDS, target=3, reference=torch.full((32,), float("nan"))),
     ValueError, r"reference holds non-finite values"),
    ("a reference of integers", lambda a: a["nd"].attribute(IDS, target=3, reference=torch.ones(32, dtype=torch.long)),
     TypeError, r"a reference tensor holds input vectors \(floats\), got int64"),
    ("rules as a string", lambda a: a["nd"].attribute(IDS, target=3, rules="AttnLRP"),
     TypeError, r"rules must be a mapping role → rule"),
    ("a model on the meta device", lambda a: NormDecomposition(tiny_lm("llama").to("meta")),
     ValueError, r"weights are on the meta device"),
    ("a node threshold as a string", lambda a: a["nd"].attribute_graph(IDS[:1], target=3, node_threshold="0.5"),
     TypeError, r"node_threshold must be a number between 0 and 1, got str"),
    ("a Neuronpedia scan that is a path", lambda a: neuronpedia_graph(a["graph"], "x", scan="/home/me/model"),
     ValueError, r"scan names the model for the viewer \(a name, not a path\)"),
    ("Neuronpedia pins that are not a list", lambda a: read_neuronpedia_state({"qParams": {"pinnedIds": "1_2_3"}}),
     ValueError, r"qParams.pinnedIds must be a list"),
    ("an answer with a target position", lambda a: a["nd"].attribute(IDS[:1], target=AnswerLogProbability([3, 4]),
                                                                     target_position=2),
     ValueError, r"takes no target_position"),
    ("several outputs of a negative mass", lambda a: a["nd"].attribute_graph(IDS[:1], target=TopLogits(3, -0.5)),
     ValueError, r"desired_logit_prob must be a probability in \(0, 1\], got -0.5"),
    ("prune as a string", lambda a: a["nd"].attribute_graph(IDS[:1], target=3, prune="no"),
     TypeError, r"prune must be True or False, got 'no'"),
    ("a score split at a float position", lambda a: a["graph"].score_split(1, 0, 4.0, 2),
     TypeError, r"query_position must be an integer, got float"),
    ("a score split at a string layer", lambda a: a["graph"].score_split("1", 0, 4, 2),
     TypeError, r"layer must be an integer, got str"),
    ("a score split with bools", lambda a: a["graph"].score_split(1, 0, True, False),
     TypeError, r"query_position must be an integer, got bool"),
    ("a score split at a masked key (27,225 'exact' pairs before)", lambda a: a["graph"].score_split(1, 0, 2, 4),
     ValueError, r"key_position 4 is masked for query_position 2 in block 1"),
    ("query-key pairs of 1.5 heads", lambda a: a["graph"].query_key_pairs(heads=1.5),
     TypeError, r"heads must be a positive integer, got float"),
    ("query-key pairs of -1 heads", lambda a: a["graph"].query_key_pairs(heads=-1),
     ValueError, r"heads must be at least 1, got -1"),
    ("attached pairs, top -1", lambda a: a["graph"].attach_score_pairs(1, 0, 4, 2, top=-1),
     ValueError, r"top must be at least 1, got -1"),
    ("activation patching of a raw model with a float batch size",
     lambda a: activation_patching(a["lm"], IDS[:1], IDS[1:], 3, batch_size=2.5),
     TypeError, r"batch_size must be an integer, got float"),
    ("activation patching with a corrupted prompt of another length",
     lambda a: activation_patching(a["lm"], IDS[:1], IDS[1:, :3], 3, show_progress=False),
     ValueError, r"corrupted_inputs must have the inputs' shape \(1, 5\)"),
    ("activation patching with corrupted ids out of the vocabulary",
     lambda a: activation_patching(a["lm"], IDS[:1], IDS[1:] + 100, 3, show_progress=False),
     ValueError, r"corrupted_inputs holds the token id 109"),
    # issue 54: graphs a stranger can send, and the arguments of their methods
    ("a negative edge index (wrapped before)", lambda a: a["patched"].edge_patch_estimates(edges=[-1]),
     ValueError, r"edges: edge -1 is outside the graph's \d+ edges \(0 … \d+\)"),
    ("a float edge index (truncated before)", lambda a: a["patched"].edge_patch_estimates(edges=[1.5]),
     TypeError, r"edges must be integer edge indices \(or a bool mask\), got float32"),
    ("an edge index past the edges (a raw IndexError before)",
     lambda a: a["patched"].edge_path_patching([10 ** 6]),
     ValueError, r"edges: edge 1000000 is outside the graph's \d+ edges"),
    ("a bool mask of another length", lambda a: a["patched"].edge_path_patching(torch.ones(3, dtype=torch.bool)),
     ValueError, r"edges: a bool mask must have one entry per edge \(\d+\), got shape \(3,\)"),
    ("one bool as the edges", lambda a: a["patched"].edge_patch_estimates(edges=True),
     TypeError, r"edges must be edge indices or a bool mask of the edges, got bool"),
    ("path patching in batches of 0 ('range() arg 3 must not be zero' before)",
     lambda a: a["patched"].edge_path_patching([0], batch_size=0),
     ValueError, r"batch_size must be at least 1, got 0"),
    ("an edge patcher of 0 steps (a raw error before)", lambda a: _edge_patcher(a, 0),
     ValueError, r"steps must be a positive integer, got 0"),
    ("max_links as a string (a raw TypeError before)", lambda a: a["graph"].to_dict(max_links="10"),
     TypeError, r"max_links must be a whole number of links or None \(no limit\), got '10'"),
    ("max_links nan (no limit before)", lambda a: a["graph"].to_dict(max_links=float("nan")),
     TypeError, r"max_links must be a whole number of links or None \(no limit\), got nan"),
    ("max_links -1 (accepted before)", lambda a: a["graph"].to_dict(max_links=-1),
     ValueError, r"max_links must be at least 0 \(None: no limit\), got -1"),
    ("max_links 1.5 (accepted before)", lambda a: a["graph"].to_dict(max_links=1.5),
     TypeError, r"max_links must be a whole number of links or None"),
    ("max_links True (accepted before)", lambda a: a["graph"].to_dict(max_links=True),
     TypeError, r"max_links must be a whole number of links or None \(no limit\), got True"),
    ("estimators without a corrupted run (ignored before)",
     lambda a: a["nd"].attribute_graph(IDS[:1], target=3, estimators=["eap-ig"]),
     ValueError, r"estimators sets up patching estimates, which need corrupted_inputs"),
    ("exact_above without a corrupted run (ignored before)",
     lambda a: a["nd"].attribute_graph(IDS[:1], target=3, exact_above=2.0),
     ValueError, r"exact_above sets up patching estimates, which need corrupted_inputs"),
    ("an unknown estimator lists every name the docs give",
     lambda a: a["nd"].attribute_graph(IDS[:1], target=3, corrupted_inputs=IDS[1:], estimators="atp**"),
     ValueError, r"estimators must be among frozen, .*atp\*, default, atp\+qk; got 'atp\*\*'"),
    ("estimators of a number", lambda a: a["nd"].attribute_graph(IDS[:1], target=3, corrupted_inputs=IDS[1:],
                                                                 estimators=3),
     TypeError, r"estimators must be an estimator's name or a list of names, got 3"),
    ("a ranking by patch without a corrupted run ('one of none' before)",
     lambda a: a["graph"].ranking(by="patch"),
     ValueError, r"ranking by patch needs patch estimates, and this graph has none: build it with corrupted_inputs="),
    ("component estimates without a corrupted run", lambda a: a["graph"].component_estimates(),
     ValueError, r"component_estimates needs patch estimates, and this graph has none"),
    ("the TransformerLens hook of a classifier's class (unembed.hook_out before)",
     lambda a: a["class_graph"].hook_name("output"),
     ValueError, r"the output node is a classifier's class \(read by its score head\), not a logit of the "
                 r"unembedding: no TransformerLens hook carries it"),
    ("the TransformerLens hook of a base model's direction (unembed.hook_out before)",
     lambda a: a["direction_graph"].hook_name("output"),
     ValueError, r"the output node is a direction read from the hidden states, not a logit"),
    ("a text target the tokenizer does not know (explained as <unk> before)",
     lambda a: a["nd_text"].attribute(IDS, target="zebra"),
     ValueError, r"target 'zebra' is not in the tokenizer's vocabulary: it reads as '<unk>'"),
    ("a text target of a graph the tokenizer does not know",
     lambda a: a["nd_text"].attribute_graph(IDS[:1], target="zebra"),
     ValueError, r"target 'zebra' is not in the tokenizer's vocabulary"),
    ("a graph of text without a tokenizer", lambda a: a["nd"].attribute_graph("the cat sat", target=3),
     TypeError, r"inputs is text: give NormDecomposition\(model, tokenizer=...\) to read it, or token ids"),
    ("a graph saved as .json (a zip named .json before)", lambda a: a["graph"].save("/tmp/graph.json"),
     ValueError, r"path '/tmp/graph.json': a graph file is a .npz archive"),
    # issue 56: MIB's circuits (captum_ffb.patching.circuits)
    ("a component graph of neurons", lambda a: _circuits().ComponentGraph.of(a["nd"].engine, "neuron"),
     ValueError, r"granularity is 'head' or 'sublayer', got 'neuron'"),
    ("a component graph of a Post-LN model", lambda a: _circuits().ComponentGraph.of(a["nd_base"].engine, "sublayer"),
     ValueError, r"circuits need the model's final norm"),
    ("circuit scores one short", lambda a: _circuits().circuit_masks(_graph(a), torch.zeros(_graph(a).n_edges - 1)),
     ValueError, r"scores must have one value per edge \(\d+\), got \d+"),
    ("circuit scores with a NaN", lambda a: _circuits().circuit_masks(_graph(a), torch.full((_graph(a).n_edges,), 0.0)
                                                                      .index_fill(0, torch.tensor([2]), float("nan"))),
     ValueError, r"scores must be finite"),
    ("an edge share above 1", lambda a: _circuits().circuit_masks(_graph(a), torch.ones(_graph(a).n_edges), [0.5, 2]),
     ValueError, r"shares must lie in \[0, 1\], got 2"),
    ("an edge share True", lambda a: _circuits().circuit_masks(_graph(a), torch.ones(_graph(a).n_edges), [True]),
     ValueError, r"shares must lie in \[0, 1\], got True"),
    ("a task with no prompts", lambda a: _circuits().task_scores(a["nd"].engine, [], _graph(a)),
     ValueError, r"pairs must hold at least one \(request, counterfactual\) pair"),
    ("a faithfulness curve with no prompts",
     lambda a: _circuits().faithfulness_curve(a["nd"].engine, [], _graph(a), torch.ones(_graph(a).n_edges)),
     ValueError, r"pairs must hold at least one \(request, counterfactual\) pair"),
    ("MIB's scores with no prompts",
     lambda a: _circuits().mib_scores(a["nd"].engine, [], _graph(a), torch.ones(_graph(a).n_edges)),
     ValueError, r"pairs must hold at least one \(request, counterfactual\) pair"),
    ("circuit masks of one dimension",
     lambda a: _circuits().circuit_values(a["nd"].engine, *_pair(a), _graph(a), torch.ones(_graph(a).n_edges)),
     ValueError, r"masks must be \(circuits, \d+\), got \(\d+,\)"),
    ("a counterfactual of another length",
     lambda a: _circuits().circuit_values(a["nd"].engine, _pair(a)[0], a["nd"].request(IDS[1:, :4], 3), _graph(a),
                                          torch.ones(1, _graph(a).n_edges)),
     ValueError, r"corrupted must have the input's shape \(1, 5\), got \(1, 4\)"),
    ("a circuit batch of none",
     lambda a: _circuits().circuit_values(a["nd"].engine, *_pair(a), _graph(a), torch.ones(1, _graph(a).n_edges),
                                          batch_size=0),
     ValueError, r"batch_size must be a whole number of circuits, at least 1, got 0"),
    ("an MIB export without the model's config",
     lambda a: _circuits().mib_graph(_graph(a), torch.ones(_graph(a).n_edges), {"n_layers": 2}),
     ValueError, r"config must name n_heads, d_model, parallel_attn_mlp"),
    ("an MIB export whose in_graph is not a mask of the edges",
     lambda a: _circuits().mib_graph(_graph(a), torch.ones(_graph(a).n_edges), MIB_CONFIG, torch.ones(3)),
     ValueError, r"in_graph must be a bool mask of the \d+ edges, got torch.float32 of shape \(3,\)"),
    ("MIB's summaries of curves of other lengths", lambda a: _circuits().mib_summaries((0.1, 0.2), (1.0,)),
     ValueError, r"shares and faithfulness need the same length"),
]


@pytest.mark.parametrize("case, call, error, message", API_CASES, ids=[case for case, *_ in API_CASES])
def test_api_raises_naming_the_parameter(case, call, error, message, api):
    with pytest.raises(error) as raised:
        call(api)
    assert type(raised.value) in (ValueError, TypeError)
    assert re.search(message, str(raised.value)), str(raised.value)
    assert "\n" not in str(raised.value)


# --------------------------------------------------------------------------- issue 54: what was silently wrong
def test_a_bool_mask_of_edges_is_read_as_a_mask(api):
    """``edge_patch_estimates(edges=graph.edge_mask)`` read the mask as the indices 0 and 1
    (2 values instead of the kept edges) and ``edge_path_patching(mask)`` ran a pass per edge
    of the graph on edges 0 and 1."""
    graph = api["patched"]
    mask = graph.edge_mask & graph.node_mask[graph.data.sources] & graph.node_mask[graph.data.targets]
    by_mask = graph.edge_patch_estimates(edges=mask)
    assert torch.equal(by_mask.isnan(), graph.edge_patch_estimates().isnan())
    assert int((~by_mask.isnan()).sum()) > 2
    kept = mask.nonzero()[:, 0][:3]
    chosen = torch.zeros_like(mask)
    chosen[kept] = True
    assert torch.equal(graph.edge_path_patching(chosen), graph.edge_path_patching(kept))
    assert len(graph.edge_path_patching(chosen)) == 3


def test_every_estimator_name_the_docs_give_is_taken(api):
    """A string is one name (``"atp*"`` was read as 'a', 't', 'p', '*'); ``"default"`` and
    ``"atp+qk"`` (named by the docs) were refused."""
    nd = api["nd"]
    star = nd.attribute_graph(IDS[:1], target=3, corrupted_inputs=IDS[1:], max_nodes=8, estimators="atp*")
    assert {"atp*", "atp+qk", "default"} <= set(star.patch_estimates)
    qk = nd.attribute_graph(IDS[:1], target=3, corrupted_inputs=IDS[1:], max_nodes=8, estimators=["atp+qk", "default"])
    assert "atp+qk" in qk.patch_estimates and torch.equal(qk.patch_estimates["atp+qk"], star.patch_estimates["atp+qk"])
    # what docs/graphs.md says to ask for, and then to read
    heads = nd.attribute_graph(IDS[:1], target=3, corrupted_inputs=IDS[1:], max_nodes=8, estimators="eap-ig+exact")
    assert heads.component_estimates("eap-ig+exact").keys() == heads.component_estimates().keys()


def test_a_ranking_by_patch_puts_what_is_no_number_last(api):
    """Nodes whose estimate is NaN came out in arbitrary order."""
    graph = replace(api["patched"], patch_estimates=dict(api["patched"].patch_estimates))
    values = graph.patch_estimates["default"].clone()
    writers = [k for k, kind in enumerate(graph.data.kinds) if kind not in ("token", "bias", "output")]
    values[writers[::2]] = float("nan")
    graph.patch_estimates["default"] = values
    ranked = graph.ranking(by="patch", level="node", top=None)
    numbers = [v for _, v in ranked if v == v]
    assert [v != v for _, v in ranked] == [False] * len(numbers) + [True] * (len(ranked) - len(numbers))
    assert [abs(v) for v in numbers] == sorted((abs(v) for v in numbers), reverse=True)
    assert [name for name, _ in ranked] == [name for name, _ in graph.ranking(by="patch", level="node", top=None)]


def test_a_graphs_repr_is_one_short_line(api):
    """The dataclass dump was 38,568 characters for a 7-token graph."""
    text = repr(api["patched"])
    assert "\n" not in text and len(text) < 400, text
    assert re.fullmatch(r"BoundGraph\('3', value -?[0-9.e-]+, head granularity, 5 tokens, \d+ of \d+ nodes "
                        r"and \d+ of \d+ edges kept .*; patch estimates: .*; bound to its model\)", text), text


def test_saving_runs_no_model(api, tmp_path, monkeypatch):
    """``save()`` computed every kept edge's estimate first (55 s on SmolLM2): it writes what
    was computed, and what ``edge_patch_estimates`` computed before is in the file."""
    graph = api["nd"].attribute_graph(IDS[:1], target=3, corrupted_inputs=IDS[1:], max_nodes=6)
    graph.edge_patch_estimates(edges=[0, 1])
    patcher = graph.edge_patcher

    def refuse(*args, **kwargs):
        raise AssertionError("save() ran the model")

    monkeypatch.setattr(patcher, "estimates", refuse)
    monkeypatch.setattr(patcher, "real", refuse)
    path = graph.save(tmp_path / "graph.npz")
    from captum_ffb.attr import AttributionGraph

    again = AttributionGraph.load(path)
    assert again.edge_patches.keys() == graph.edge_patches.keys()


def test_a_text_target_without_its_leading_space_gets_a_hint(files, one_line, capsys):
    """``target="Paris"`` explained the token 'Paris' without a word when the prediction was
    ' Paris': a warning says so (API and command line), and the explanation is still of 'Paris'."""
    from tests.models import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    lm = tiny_lm("llama")
    nd = NormDecomposition(lm, tokenizer=tokenizer)
    for seed in range(1, 40):  # a prompt whose prediction is a word with its leading space
        ids = token_ids(batch=1, n=6, seed=seed) % 40 + 5
        predicted = tokenizer.convert_ids_to_tokens([int(lm(ids).logits[0, -1].argmax())])[0]
        if predicted.startswith("Ġ") and len(tokenizer.encode(predicted[1:], add_special_tokens=False)) == 1:
            break
    else:
        pytest.skip("no prompt predicts a spaced word")
    word = predicted[1:]
    with pytest.warns(UserWarning, match=rf"target '{word}' is the token '{word}', not the model's prediction "
                                         rf"'Ġ{word}' \(the word with its leading space\): give ' {word}' to explain "
                                         "the prediction"):
        nd.attribute(ids, target=word)
    with pytest.warns(UserWarning, match="not the model's prediction"):
        nd.attribute_graph(ids, target=word)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nd.attribute(ids, target=" " + word)  # the prediction itself: no warning


def test_a_blocked_graph_out_is_found_before_the_model_loads(files, one_line, monkeypatch):
    """``captum-ffb graph`` into an --out where graph.json is a folder found out only after
    building the graph."""
    import captum_ffb.explained.models

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(captum_ffb.explained.models, "load_model", refuse)
    message = one_line(["graph", "the cat sat", "--model", str(files["gpt2"]), "--format", "json", "--out",
                        str(files["root"] / "blocked"), "--quiet"])
    assert re.fullmatch(r"--out .*blocked: graph.json is a folder there, in the way of the file of that name; .*",
                        message), message


# --------------------------------------------------------------------------- random requests
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

VOCAB = 60


@st.composite
def requests(draw):
    """Random ids, masks and targets: mostly well formed, the rest of wrong shapes, dtypes and
    ranges."""
    batch = draw(st.integers(1, 3))
    n = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7]))
    dtype = draw(st.sampled_from([torch.long] * 4 + [torch.int32, torch.float32, torch.bool]))
    low, high = draw(st.sampled_from([(0, VOCAB - 1)] * 4 + [(-2, VOCAB + 2)]))
    ids = torch.tensor(draw(st.lists(st.lists(st.integers(low, high), min_size=n, max_size=n),
                                     min_size=batch, max_size=batch)), dtype=torch.long).reshape(batch, n)
    ids = ids.to(dtype)
    kind = draw(st.sampled_from(["none", "ones", "padded", "padded", "wrong-shape", "values", "empty-row"]))
    mask = None
    if kind == "ones":
        mask = torch.ones(batch, n, dtype=torch.long)
    elif kind == "padded" and n > 1:
        mask = torch.ones(batch, n, dtype=torch.long)
        mask[:, : draw(st.integers(1, n - 1))] = 0  # left padding
    elif kind == "wrong-shape":
        mask = torch.ones(batch, n + 1, dtype=torch.long)
    elif kind == "values":
        mask = torch.full((batch, n), 2)
    elif kind == "empty-row":
        mask = torch.ones(batch, n, dtype=torch.long)
        mask[-1] = 0
    target = draw(st.one_of(st.integers(0, VOCAB - 1), st.integers(0, VOCAB - 1), st.integers(-1, VOCAB + 1),
                            st.booleans(), st.floats(0, 5), st.just("text"),
                            st.lists(st.integers(0, VOCAB - 1), min_size=batch, max_size=batch + 1)
                            .map(torch.tensor)))
    return ids, mask, target


def _exact_or_refused(call, value_of) -> None:
    try:
        result = call()
    except (ValueError, TypeError) as error:
        assert str(error) and "\n" not in str(error)
        hypothesis.event("refused")
        return
    hypothesis.event("exact")
    delta, scale = value_of(result)
    assert torch.isfinite(delta).all()
    assert (delta <= 1e-4 * (1 + scale)).all(), delta


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=requests())
def test_random_requests_are_exact_or_refused(api, request):
    ids, mask, target = request
    kwargs = {} if mask is None else {"attention_mask": mask}
    nd = api["nd"]

    def attribute():
        return nd.attribute(ids, target=target, forward_kwargs=kwargs, return_bias=True,
                            return_convergence_delta=True)

    def components():
        return nd.attribute_components(ids, target=target, forward_kwargs=kwargs)

    _exact_or_refused(attribute, lambda r: (r[2], r[0].abs().sum(-1) + r[1].abs()))
    _exact_or_refused(components, lambda r: (r.delta, r.value.abs()))


# --------------------------------------------------------------------------- the newest entry points
ANY = st.one_of(st.integers(-3, 12), st.floats(-2, 2), st.just(float("nan")), st.booleans(), st.text(max_size=3),
                st.none())


def _refused_or_finite(call) -> None:
    """Either a one-line ``ValueError``/``TypeError``, or a result whose numbers are finite."""
    try:
        result = call()
    except (ValueError, TypeError) as error:
        assert str(error) and "\n" not in str(error)
        hypothesis.event("refused")
        return
    hypothesis.event("answered")
    numbers = []
    stack = [result]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            numbers.append(item.detach().float().reshape(-1))
        elif isinstance(item, float):
            numbers.append(torch.tensor([item]))
        elif isinstance(item, dict):
            stack += list(item.values())
        elif isinstance(item, (list, tuple)):
            stack += list(item)
    assert all(bool(torch.isfinite(n).all()) for n in numbers)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(layer=st.one_of(st.integers(0, 1), st.integers(0, 1), ANY), head=st.one_of(st.integers(0, 3), ANY),
       query=st.one_of(st.integers(0, 4), st.integers(3, 4), ANY), key=st.one_of(st.integers(0, 2), ANY),
       heads=st.one_of(st.integers(1, 3), ANY), top=st.one_of(st.integers(1, 4), ANY))
def test_random_score_splits_are_exact_or_refused(api, layer, head, query, key, heads, top):
    graph = api["graph"]
    _refused_or_finite(lambda: graph.score_split(layer, head, query, key))
    _refused_or_finite(lambda: graph.attention(layer, head, query))
    _refused_or_finite(lambda: graph.query_key_pairs(heads=heads, keys=1, top=2))
    _refused_or_finite(lambda: graph.attach_score_pairs(layer, head, query, key, top=top))


@st.composite
def graph_requests(draw):
    """A graph's options: all well formed half the time, else one of them drawn anyhow."""
    options = {"granularity": draw(st.sampled_from(["sublayer", "head", "neuron"])), "prune": draw(st.booleans()),
               "threshold": draw(st.floats(0, 1)), "max_nodes": draw(st.one_of(st.none(), st.integers(1, 30))),
               "corrupted": draw(st.sampled_from(["same", "flipped", "none"])),
               "target": draw(st.one_of(st.none(), st.integers(0, 59)))}
    if draw(st.booleans()):
        wrong = draw(st.sampled_from(sorted(options)))
        options[wrong] = draw({"granularity": st.sampled_from(["block", "", 3]), "corrupted": st.sampled_from(
            ["short", "floats"])}.get(wrong, ANY))
    return options


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(options=graph_requests())
def test_random_graphs_and_patching_are_exact_or_refused(api, options):
    granularity, prune, threshold = options["granularity"], options["prune"], options["threshold"]
    max_nodes, corrupted, target = options["max_nodes"], options["corrupted"], options["target"]
    ids = IDS[:1]
    other = {"same": ids, "flipped": ids.flip(1), "short": ids[:, :3], "none": None, "floats": ids.float()}[corrupted]
    nd = api["nd"]

    def graph():
        found = nd.attribute_graph(ids, target, granularity=granularity, prune=prune, node_threshold=threshold,
                                   max_nodes=max_nodes, corrupted_inputs=other)
        assert found.flow_residual() <= 1e-4 * (1 + abs(found.value))
        return found.data.values, found.data.weights, list(found.patch_estimates.values())

    _refused_or_finite(graph)
    _refused_or_finite(lambda: activation_patching(nd, ids, other, target, granularity=granularity,
                                                   show_progress=False).effects)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(context=st.one_of(st.sampled_from(["one two.\n\nthree four. five.", "a b c\r\nd e\r\n\r\nf", "x.\ry."]),
                         st.text(max_size=40)),
       question=st.one_of(st.sampled_from(["why?", "and?"]), st.text(max_size=10)),
       group_by=st.sampled_from(["paragraph", "sentence", "line", "word", 3]),
       max_tokens=st.one_of(st.none(), st.integers(1, 200), ANY), target=st.one_of(st.none(), st.integers(0, 59), ANY))
def test_random_context_attributions_are_exact_or_refused(api, context, question, group_by, max_tokens, target):
    def found():
        result = context_attribution(api["nd"], api["tokenizer"], context, question, group_by=group_by,
                                     target=target, max_tokens=max_tokens)
        assert abs(result.delta) <= 1e-4 * (1 + abs(result.value))
        return result.contributions, result.question, result.rest, result.bias, result.value

    _refused_or_finite(found)
