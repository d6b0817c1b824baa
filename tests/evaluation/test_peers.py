"""The AttnLRP peer (real ``lxt`` in its own environment): file handling, the error without the
environment, and one end-to-end run on SmolLM2 when both are installed."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from captum_ffb.evaluation import peers


def _load_worker():
    spec = importlib.util.spec_from_file_location("attnlrp_worker", peers.WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the worker imports only numpy at module level
    return module


EXAMPLES = [
    {"input_ids": [1, 5, 9, 2], "target_position": -1, "target_id": 7},
    {"input_ids": np.array([3, 4, 5]), "target_position": 1, "contrast": (8, np.int64(9))},
]


def test_input_file_round_trip_through_the_worker_reader(tmp_path):
    worker = _load_worker()
    path = peers.write_worker_input(EXAMPLES, tmp_path / "in.json")
    read = worker.read_examples(path)
    assert read == [
        {"input_ids": [1, 5, 9, 2], "target_position": -1, "target_id": 7},
        {"input_ids": [3, 4, 5], "target_position": 1, "contrast": [8, 9]},
    ]
    assert [worker.target_tokens(e) for e in read] == [(7, None), (8, 9)]
    json.loads(path.read_text())  # plain JSON


def test_worker_reads_npz_input(tmp_path):
    worker = _load_worker()
    np.savez(tmp_path / "in.npz", input_ids=np.array([1, 5, 9, 2, 3, 4, 5]),
             lengths=np.array([4, 3]), target_position=np.array([-1, 1]),
             target_a=np.array([7, 8]), target_b=np.array([-1, 9]))
    assert worker.read_examples(tmp_path / "in.npz") == [
        {"input_ids": [1, 5, 9, 2], "target_position": -1, "target_id": 7},
        {"input_ids": [3, 4, 5], "target_position": 1, "contrast": [8, 9]},
    ]


@pytest.mark.parametrize("bad, message", [
    ({"input_ids": [1, 2], "target_position": 0}, "exactly one"),
    ({"input_ids": [1, 2], "target_position": 0, "target_id": 1, "contrast": (1, 2)},
     "exactly one"),
    ({"input_ids": [1, 2], "target_position": 2, "target_id": 1}, "outside"),
    ({"input_ids": [], "target_position": 0, "target_id": 1}, "non-empty"),
    ({"input_ids": [0.5], "target_position": 0, "target_id": 1}, "ints"),
    ({"target_position": 0, "target_id": 1}, "input_ids"),
])
def test_bad_examples_are_refused(tmp_path, bad, message):
    with pytest.raises(ValueError, match=message):
        peers.write_worker_input([bad], tmp_path / "in.json")


def test_output_file_round_trip(tmp_path):
    worker = _load_worker()
    records = [
        {"relevance": np.array([0.5, -1.0, 2.0]), "target_value": 3.25, "target_position": 2,
         "seconds": 0.1, "peak_rss_bytes": 1000, "logits": np.arange(5.0)},
        {"relevance": np.array([1.0]), "target_value": -1.0, "target_position": 0,
         "seconds": 0.2, "peak_rss_bytes": 2000, "logits": np.ones(5)},
    ]
    worker.write_output(tmp_path / "out.npz", records, 4.5, {"lxt": "2.1"})
    relevances, info = peers.read_worker_output(tmp_path / "out.npz")
    assert [r.tolist() for r in relevances] == [[0.5, -1.0, 2.0], [1.0]]
    assert all(r.dtype == np.float32 for r in relevances)
    assert info["target_value"].tolist() == [3.25, -1.0]
    assert info["target_position"].tolist() == [2, 0]
    assert info["seconds"].tolist() == [0.1, 0.2]
    assert info["peak_rss_bytes"].tolist() == [1000, 2000]
    assert info["load_seconds"] == 4.5 and info["meta"] == {"lxt": "2.1"}
    assert info["logits"].shape == (2, 5)


def test_missing_environment_names_the_setup_script(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_FFB_LXT_VENV", str(tmp_path / "no-venv"))
    assert not peers.attnlrp_available()
    assert peers.SETUP_COMMAND == f"bash {peers.SETUP_SCRIPT}"  # no blanks in the path here
    with pytest.raises(RuntimeError, match=re.escape(peers.SETUP_COMMAND)) as error:
        peers.attnlrp_relevance(EXAMPLES, model_dir=tmp_path)
    assert "\n" not in str(error.value)
    with pytest.raises(RuntimeError, match="setup_lxt.sh"):
        peers.attnlrp_relevance(EXAMPLES, model_dir=tmp_path, python=tmp_path / "bin/python")


FAKE_WORKER = '''
import importlib.util, json, os, sys
import numpy as np
spec = importlib.util.spec_from_file_location("w", {real!r})
w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
model_dir, source, output = sys.argv[1:4]
assert sys.argv[4:6] == ["--threads", "3"] and os.environ["OMP_NUM_THREADS"] == "3"
if model_dir.endswith("fail"):
    sys.exit("worker says no")
records = [{{"relevance": np.full(len(e["input_ids"]), float(w.target_tokens(e)[0])),
            "target_value": 1.5, "target_position": e["target_position"] % len(e["input_ids"]),
            "seconds": 0.0, "peak_rss_bytes": 1}} for e in w.read_examples(source)]
w.write_output(output, records, 0.0, {{"fake": True}})
'''


def test_subprocess_plumbing_with_a_stand_in_worker(tmp_path, monkeypatch):
    fake = tmp_path / "fake_worker.py"
    fake.write_text(FAKE_WORKER.format(real=str(peers.WORKER)))
    monkeypatch.setattr(peers, "WORKER", fake)
    relevances, info = peers.attnlrp_relevance(EXAMPLES, model_dir=tmp_path, python=sys.executable,
                                               threads=3)
    assert [r.tolist() for r in relevances] == [[7.0] * 4, [8.0] * 3]
    assert info["target_position"].tolist() == [3, 1]
    assert info["meta"] == {"fake": True} and info["wall_seconds"] > 0
    with pytest.raises(RuntimeError, match="worker says no"):
        peers.attnlrp_relevance(EXAMPLES, model_dir=tmp_path / "fail", python=sys.executable,
                                threads=3)


# --- the real peer ----------------------------------------------------------------------------


@pytest.mark.real_weights
def test_attnlrp_end_to_end_on_smollm2():
    from captum_ffb.explained.models import SMOLLM2_INSTALL, smollm2_dir

    folder = smollm2_dir()
    if folder is None:
        pytest.skip(f"SmolLM2 is not installed ({SMOLLM2_INSTALL})")
    if not peers.attnlrp_available():
        pytest.skip(f"the lxt peer environment is missing ({peers.SETUP_COMMAND})")
    torch = pytest.importorskip("torch")
    from captum_ffb.explained.models import load_model

    loaded = load_model(folder, causal_lm=True)
    ids = loaded.tokenizer("The film is a gripping, funny ride.").input_ids
    with torch.no_grad():
        logits = loaded.model(torch.tensor([ids])).logits[0, -1].double()
    target = int(logits.argmax())
    relevances, info = peers.attnlrp_relevance(
        [{"input_ids": ids, "target_position": -1, "target_id": target}], model_dir=folder)
    (relevance,) = relevances
    assert relevance.shape == (len(ids),)
    assert np.isfinite(relevance).all() and np.abs(relevance).sum() > 0
    ours = float(logits[target])
    assert abs(info["target_value"][0] - ours) <= 1e-3 * abs(ours)
    assert info["meta"]["lxt"] == "2.1" and info["meta"]["attn_implementation"] == "eager"
    assert Path(info["meta"]["model_dir"]) == Path(folder)
