"""Output folders and files of every command: an unusable ``--out`` is one line before the
model loads, files are replaced atomically (a symbolic link is not followed) and every JSON
file is strict JSON."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest

import captum_ffb.explained.models
import captum_ffb.io.files
from captum_ffb.cli import main
from captum_ffb.io.files import atomic_open, check_out_dir, to_json, write_json
from tests.models import save_tiny, save_tiny_seq2seq, tiny_task_model, wordpiece_tokenizer

TEXT = "the cat sat on the mat ."
TEXTS = ["the cat sat on the mat", "a dog was tired", "she loves math", "big green mat"]
COMMANDS = ("maps", "explain", "explain-corpus", "analyze", "compare", "evaluate")
#: Commands whose every output file the symbolic-link test links (all formats written).
ALL_FILES = ("maps-all", "explain-all", "explain-seq2seq", "explain-corpus", "analyze", "compare",
             "evaluate")
#: The file of each command that the symbolic-link test puts a link at.
WRITTEN = {"maps": "maps.json", "explain": "explanation.json",
           "explain-corpus": "explanations.jsonl", "analyze": "results.json",
           "compare": "compare.csv", "evaluate": "results.json"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    classifier = root / "classifier"
    tiny_task_model("bert", "sequence_classification", num_labels=2).save_pretrained(classifier)
    wordpiece_tokenizer().save_pretrained(classifier)
    data = root / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": k % 2}) + "\n"
                            for k, t in enumerate(TEXTS)))
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    return {"bert": save_tiny("bert", root / "bert"), "classifier": classifier, "data": data,
            "corpus": corpus, "marian": save_tiny_seq2seq(root / "marian")}


def _argv(command: str, models: dict, out: os.PathLike) -> list[str]:
    """The quickest run of ``command`` on the tiny models, into ``out``."""
    bert, classifier = str(models["bert"]), str(models["classifier"])
    return {
        "maps": ["maps", TEXT, "--model", bert, "--layer", "0", "--format", "json"],
        "explain": ["explain", TEXT, "--model", bert, "--format", "json", "--no-maps"],
        "maps-all": ["maps", TEXT, "--model", bert, "--layer", "0", "--dpi", "20"],
        "explain-all": ["explain", TEXT, "--model", classifier, "--components"],
        "explain-seq2seq": ["explain", "the cat ||| the dog", "--model", str(models["marian"])],
        "explain-corpus": ["explain", "--data", str(models["corpus"]), "--model", classifier],
        "analyze": ["analyze", "--model", bert, "--data", str(models["corpus"]), "--no-figures"],
        "compare": ["compare", TEXT, "--model", bert, "--layer", "0", "--baselines", "attention",
                    "--no-figures"],
        "evaluate": ["evaluate", "--model", classifier, "--task", "sentiment", "--data",
                     str(models["data"]), "--methods", "decomposition,random", "--protocol",
                     "decompx"],
    }[command] + ["--quiet", "--out", str(out)]


def _strict_json(text: str):
    """``json.loads`` that refuses ``NaN`` and ``Infinity``."""

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("command", COMMANDS)
def test_out_is_a_file(command, models, tmp_path, one_line, no_model):
    out = tmp_path / "taken"
    out.write_text("mine")
    assert one_line(_argv(command, models, out)) == f"--out {out} exists and is not a folder"
    assert out.read_text() == "mine"


@pytest.mark.parametrize("command", COMMANDS)
def test_out_under_a_file(command, models, tmp_path, one_line, no_model):
    file = tmp_path / "file"
    file.write_text("mine")
    out = file / "sub" / "dir"
    assert one_line(_argv(command, models, out)) == (
        f"--out {out} cannot be created: {file} is a file, not a folder")


@pytest.mark.parametrize("command", COMMANDS)
def test_out_that_cannot_be_written(command, models, tmp_path, one_line, no_model, monkeypatch):
    """What a read-only folder or file system answers (simulated: root may write anywhere)."""

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(captum_ffb.io.files, "_try_writing", denied)
    out = tmp_path / "out"
    out.mkdir()
    assert one_line(_argv(command, models, out)) == (
        f"--out {out} is not writable ({os.strerror(errno.EACCES)})")
    new = tmp_path / "new" / "out"
    assert one_line(_argv(command, models, new)) == (
        f"--out {new} cannot be created: {tmp_path} is not writable ({os.strerror(errno.EACCES)})")


def test_read_only_folder(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)  # 0o500
    try:
        if os.access(folder, os.W_OK):  # root ignores the permission bits
            pytest.skip("this user may write into a read-only folder (root)")
        with pytest.raises(ValueError, match=r"is not writable \(Permission denied\)$"):
            check_out_dir(folder)
        with pytest.raises(ValueError, match=r"cannot be created: .*read-only is not writable"):
            check_out_dir(folder / "sub")
    finally:
        folder.chmod(stat.S_IRWXU)


def test_broken_link_and_usable_folders(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="is a broken symbolic link"):
        check_out_dir(link)
    assert check_out_dir(tmp_path) == tmp_path
    assert check_out_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert sorted(tmp_path.iterdir()) == [link]  # the checks leave nothing behind


@pytest.mark.parametrize("command", COMMANDS)
def test_a_link_at_an_output_file_is_replaced_not_followed(command, models, tmp_path):
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not yours")
    out = tmp_path / "out"
    out.mkdir()
    (out / WRITTEN[command]).symlink_to(elsewhere)
    assert main(_argv(command, models, out)) == 0
    assert elsewhere.read_text() == "not yours"
    written = out / WRITTEN[command]
    assert written.is_file() and not written.is_symlink()
    for path in out.rglob("*"):
        assert not path.name.endswith(".tmp"), path
        if path.suffix == ".json":
            _strict_json(path.read_text())
        elif path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                _strict_json(line)


@pytest.mark.parametrize("command", ALL_FILES)
def test_no_file_is_written_through_a_link(command, models, tmp_path):
    """Every file a command writes, made a link to a file outside the output folder before a
    second run: the second run replaces each link and leaves the file it pointed to alone."""
    out = tmp_path / "out"
    assert main(_argv(command, models, out)) == 0
    written = sorted(p for p in out.rglob("*") if p.is_file())
    assert written
    outside = tmp_path / "outside"
    outside.mkdir()
    for k, path in enumerate(written):
        target = outside / f"file-{k}"
        target.write_text("not yours")
        path.unlink()
        path.symlink_to(target)
    assert main([*_argv(command, models, out), *(["--overwrite"] if command in (
        "explain-corpus", "analyze", "evaluate") else [])]) == 0
    assert all(p.read_text() == "not yours" for p in outside.iterdir())
    relinked = [p for p in written if p.is_symlink()]
    assert not relinked, relinked


def test_evaluate_without_ig_writes_strict_json(models, tmp_path):
    out = tmp_path / "out"
    assert main(_argv("evaluate", models, out)) == 0
    summary = _strict_json((out / "results.json").read_text())
    assert [row["cost_vs_ig"] for row in summary["rows"]] == [None, None]
    assert all(isinstance(row["decompx_aopc"], float) for row in summary["rows"])


def test_to_json_writes_null_for_non_finite_numbers():
    import numpy as np

    data = {"a": float("nan"), "b": [1.5, float("inf"), (np.float32("nan"), np.int64(3))],
            "c": np.array([1.0, -np.inf])}
    assert _strict_json(to_json(data, default=float)) == {
        "a": None, "b": [1.5, None, [None, 3]], "c": [1.0, None]}
    assert to_json({"x": object()}, default=lambda o: float("nan")) == '{"x": null}'


def test_atomic_writes(tmp_path):
    path = write_json(tmp_path / "a.json", {"x": 1})
    mode = stat.S_IMODE(path.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # as open() would make it
    with pytest.raises(RuntimeError), atomic_open(path) as handle:
        handle.write("half")
        raise RuntimeError("interrupted")
    assert json.loads(path.read_text()) == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


# --------------------------------------------------------------------------- output sets (issue 45)
def test_an_output_set_moves_in_whole_or_not_at_all(tmp_path):
    from captum_ffb.io.files import OutputError, output_set, write_text

    out = tmp_path / "out"
    with output_set(out) as files:
        write_text(files.path("a.json"), "old a")
        write_text(files.path("b.html"), "old b")
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a.json": "old a", "b.html": "old b"}
    with pytest.raises(KeyboardInterrupt):  # an interrupt halfway: the old set stays whole
        with output_set(out) as files:
            write_text(files.path("a.json"), "new a")
            raise KeyboardInterrupt
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a.json": "old a", "b.html": "old b"}
    with pytest.raises(OutputError, match="a file could not be written \\(No space left on device\\)"):
        with output_set(out) as files:
            write_text(files.path("a.json"), "new a")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a.json": "old a", "b.html": "old b"}
    (out / "c.png").mkdir()
    with pytest.raises(OutputError, match="c.png is a folder there, in the way"):
        with output_set(out) as files:
            write_text(files.path("a.json"), "new a")
            write_text(files.path("c.png"), "new c")
    assert {p.name: p.is_dir() or p.read_text() for p in out.iterdir()} == {"a.json": "old a", "b.html": "old b",
                                                                             "c.png": True}
    with output_set(out) as files:
        write_text(files.path("a.json"), "new a")
        paths = [files.path("a.json")]
    assert files.final(paths) == [out / "a.json"] and (out / "a.json").read_text() == "new a"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_an_interrupted_graph_command_leaves_the_old_set(tmp_path, monkeypatch):
    """The graph's files were written one by one: an interrupt left graph.json of the new
    prompt beside the old page."""
    import captum_ffb.viz.graph as views
    from tests.models import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "lm")
    out = tmp_path / "graph"
    assert main(["graph", "the cat sat on the mat", "--model", str(folder), "--out", str(out), "--quiet"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"graph.json", "graph.html", "graph_neuronpedia.json", "graph.npz", "components.csv"}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(views, "save_graph_html", interrupted)
    assert main(["graph", "a dog ran to the park", "--model", str(folder), "--out", str(out), "--quiet"]) == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_graphs_title_and_lens_are_the_same_from_the_command_line_and_from_python(tmp_path):
    """One title: the explained token as the tokenizer decodes it, quoted (``' cat'``), from
    ``captum-ffb graph`` and from ``attribute_graph``; the writers' lens decoded alike."""
    import re

    from captum_ffb import NormDecomposition
    from captum_ffb.viz.graph import graph_html
    from tests.models import load_saved, save_tiny_lm

    folder = save_tiny_lm(tmp_path / "lm", byte_level=True)
    out = tmp_path / "graph"
    text = "the cat sat on the mat"
    assert main(["graph", text, "--model", str(folder), "--target", " cat", "--out", str(out), "--quiet"]) == 0
    saved = json.loads((out / "graph.json").read_text(encoding="utf-8"))
    loaded = load_saved(folder)
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"]
    (unit,) = loaded.tokenizer(" cat", add_special_tokens=False)["input_ids"]
    graph = NormDecomposition(loaded).attribute_graph(ids, unit)
    assert graph.output_label == saved["output"] == repr(loaded.tokenizer.decode([unit])) == "' cat'"
    titles = [re.search(r"<title>(.*?)</title>", page).group(1)
              for page in ((out / "graph.html").read_text(encoding="utf-8"), graph_html(graph))]
    assert titles[0] == titles[1] and "cat" in titles[0]
    lenses = [{n["id"]: n["promotes"] for n in nodes if "promotes" in n}
              for nodes in (saved["nodes"], graph.to_dict()["nodes"])]
    assert lenses[0] and lenses[0] == {k: v for k, v in lenses[1].items() if k in lenses[0]}
    assert all(not t.startswith("#") for words in lenses[0].values() for t in words)  # decoded by the tokenizer
