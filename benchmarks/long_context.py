"""Long contexts: whole-model attribution against the input-gradient pass, n = 512 … 8192.

Run from the repository root::

    python benchmarks/long_context.py                      # writes LONG_CONTEXT.md and .json here
    python benchmarks/long_context.py --sizes 512 --quick  # a smoke test, no files

SmolLM2-135M-Instruct in float32, the last position's predicted token of random token ids.
Each (n, method) runs in a process of its own (the model loaded, one warm-up call at n = 64,
the high-water mark of resident memory reset, then a first call at n, whose peak memory and
seconds are reported, then ``--repeat`` more calls at n: the seconds are their median, as on the
GPU, "one call after a warm-up at that n, median of 3"): the input-gradient pass
(``benchmarks/baseline.py``: the gradient of the same logit with respect to the input
embeddings, no parameter gradient, the model's default attention, only the last position's
logits; what Captum's ``Saliency`` or ``InputXGradient`` costs; an encoder–decoder's takes the
gradient with respect to the source and the target prefix) and
``NormDecomposition(model).attribute(ids, target=token)`` (the default rules and route).
``--tree DIR`` runs the attribution from another checkout (a "before" column). Two threads.

``--context-only`` measures context attribution as a user calls it, at ``--context-sizes``
(2048 and 4096), and adds its table to the files: a document of n tokens (the repository's
``docs/examples/field_report.txt`` repeated) and a question in the documented template, the
model's predicted answer token explained, paragraphs as groups. In a process of its own,
``context_attribution`` against the input-gradient pass of the same prompt and token (first
call, then the median of ``--repeat``); and the command line, ``captum-ffb explain --context``
writing its files, end to end (start, load, explain, write) against a process that loads the
model the same way and runs one input-gradient pass.

``--context-method-costs 1024`` times each method of ``context_attribution`` (decomposition,
presence, fitted with and without its focus; sentences as groups) on the same kind of document
against the input-gradient pass, and adds its table to the files.

``--presence-paths 976,2045,4096`` times presence attribution's passes both ways on the same
documents (``presence_attribution(..., blocks=True)``, the default, and ``blocks=False``;
sentences as groups), the ``n × n`` mask only where its attention weights fit half the memory
available.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # a --tree child puts its checkout before this one

from benchmarks.baseline import NAME as BASELINE  # noqa: E402
from benchmarks.baseline import input_gradient_pass  # noqa: E402

METHODS = (BASELINE, "attribute")
#: the rules that credit queries and keys, timed at ``--rule-sizes``
RULES = {"attribute (IGAttention)": "IGAttention()",
         "attribute (IGAttention, 4 points, exact)": "IGAttention(n_steps=4, exact=True)",
         "attribute (CompleteAttnLRPAttention)": "CompleteAttnLRPAttention()"}
#: the encoder–decoder route, timed at ``--seq2seq-sizes`` on a BART-base-sized model (random
#: weights: none are available offline) with a source of n tokens and a 16-token target prefix
SEQ2SEQ = (f"{BASELINE} (encoder–decoder)", "attribute (encoder–decoder)")
PREFIX = 16


def seq2seq_model(n: int):
    """A BART-base-sized encoder–decoder (6 + 6 blocks, d = 768, 12 heads) with random weights."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    config = BartConfig(max_position_embeddings=max(1024, n + 2), attn_implementation="sdpa")
    return BartForConditionalGeneration(config).eval()


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(method: str, n: int, tree: str, repeat: int) -> None:
    """In a process of its own: a first call at ``n`` (its seconds and peak memory), then
    ``repeat`` timed calls (their median); print them as JSON."""
    sys.path.insert(0, tree)
    import gc

    import torch

    torch.set_num_threads(2)
    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir

    seq2seq = method in SEQ2SEQ
    if seq2seq:
        model = seq2seq_model(n)
    else:
        model = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm").model.eval()
    rules = {}
    if method in RULES:
        from captum_ffb import rules as rule_classes

        rules = {"attention": eval(RULES[method], vars(rule_classes))}  # a rule's constructor call
    nd = NormDecomposition(model, rules=rules)

    def ids_of(length: int) -> torch.Tensor:
        return torch.randint(100, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(length))

    prefix = ids_of(PREFIX)
    kwargs = {"decoder_input_ids": prefix} if seq2seq else {}

    def logits(ids: torch.Tensor) -> torch.Tensor:
        if seq2seq:
            return model(ids, decoder_input_ids=prefix).logits[:, -1:]
        return model(ids, logits_to_keep=1).logits

    def base(ids: torch.Tensor, token: int) -> None:
        input_gradient_pass(model, ids, token, kwargs or None)

    def ours(ids: torch.Tensor, token: int) -> None:
        nd.attribute(ids, target=token, forward_kwargs=kwargs or None)

    run = base if method.startswith(BASELINE) else ours
    warm = ids_of(64)
    run(warm, 0)
    ids = ids_of(n)
    with torch.no_grad():
        token = int(logits(ids)[0, -1].argmax())
    model.zero_grad(set_to_none=True)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_bytes("VmRSS")
    start = time.perf_counter()
    run(ids, token)
    first = time.perf_counter() - start
    peak = _status_bytes("VmHWM")
    again = []
    for _ in range(repeat):
        start = time.perf_counter()
        run(ids, token)
        again.append(time.perf_counter() - start)
    seconds = statistics.median(again) if again else first
    print(json.dumps({"n": n, "method": method, "seconds": seconds, "first_seconds": first, "repeat": repeat,
                      "peak_bytes": peak, "added_bytes": peak - before}))


QUESTION = "Who led the survey team?"
TEMPLATE = "{context}\n\nQuestion: {question}\nAnswer: The survey team was led by"
CONTEXT_METHODS = (f"{BASELINE} (context prompt)", "context_attribution")
#: ``--context-method-costs``: each method of ``context_attribution`` with sentences as groups,
#: by its keyword arguments.
METHOD_COSTS = {"decomposition": {}, "presence": {"method": "presence"}, "fitted": {"method": "fitted"},
                "fitted, ablations=16, rerank=True": {"method": "fitted", "ablations": 16, "rerank": True},
                "fitted, ablations=16, rounds=0": {"method": "fitted", "ablations": 16, "rounds": 0},
                "fitted, ablations=16, focus=None, rounds=0": {"method": "fitted", "ablations": 16, "focus": None,
                                                               "rounds": 0}}


#: ``--presence-paths``: presence attribution's passes by blocks of queries, or through the mask.
PRESENCE_PATHS = {"presence, passes by blocks": True, "presence, passes through the n × n mask": False}


def sentence_groups(tokenizer, prompt: str, document: str) -> tuple[list[int], int]:
    """Each token's sentence of ``document`` (at the start of ``prompt``; -1: none) and how many."""
    from captum_ffb.long_context.attribution import split_context

    spans = split_context(document, "sentence")
    offsets = tokenizer(prompt, return_offsets_mapping=True).offset_mapping
    groups = [next((g for g, (a, b) in enumerate(spans) if a <= start < b), -1) if end > start else -1
              for start, end in offsets]
    return groups, len(spans)


def context_document(tokenizer, n: int) -> str:
    """A document whose prompt (the template with the question) has about ``n`` tokens."""
    report = (ROOT / "docs" / "examples" / "field_report.txt").read_text(encoding="utf-8")
    spare = len(tokenizer(TEMPLATE.format(context="", question=QUESTION)).input_ids)
    paragraphs, ids = [], []
    while len(ids) < n - spare:
        paragraphs += report.split("\n\n")
        ids = tokenizer("\n\n".join(paragraphs)).input_ids
    while len(tokenizer("\n\n".join(paragraphs)).input_ids) > n - spare and len(paragraphs) > 1:
        paragraphs.pop()
    return "\n\n".join(paragraphs)


def context_child(method: str, n: int, repeat: int) -> None:
    """In a process of its own: ``context_attribution`` (or the input-gradient pass of its
    prompt and predicted token) at about ``n`` tokens, a first call and ``repeat`` more."""
    import torch

    torch.set_num_threads(2)
    from captum_ffb import NormDecomposition, context_attribution
    from captum_ffb.explained.models import load_model, smollm2_dir

    loaded = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm")
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    nd = NormDecomposition(model)
    document = context_document(tokenizer, n)
    ids = tokenizer(TEMPLATE.format(context=document, question=QUESTION), return_tensors="pt").input_ids
    with torch.no_grad():
        token = int(model(ids, logits_to_keep=1).logits[0, -1].argmax())

    def run() -> None:
        if method == CONTEXT_METHODS[0]:
            input_gradient_pass(model, ids, token)
        elif method in PRESENCE_PATHS:
            from captum_ffb.explained.readouts import NextToken
            from captum_ffb.long_context.presence import presence_attribution

            groups, count = sentence_groups(tokenizer, TEMPLATE.format(context=document, question=QUESTION), document)
            presence_attribution(model, ids, groups, count, NextToken(token), blocks=PRESENCE_PATHS[method])
        elif method in METHOD_COSTS:
            context_attribution(nd, tokenizer, document, QUESTION, template=TEMPLATE, group_by="sentence",
                                **METHOD_COSTS[method])
        else:
            found = context_attribution(nd, tokenizer, document, QUESTION, template=TEMPLATE)
            assert found.delta < 1e-3 * max(1.0, abs(found.value)), found.delta

    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    before = _status_bytes("VmRSS")
    times = []
    for _ in range(1 + repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
        if len(times) == 1:
            added = _status_bytes("VmHWM") - before
    print(json.dumps({"n": int(ids.shape[1]), "method": method, "first_seconds": times[0],
                      "seconds": statistics.median(times[1:]) if repeat else times[0], "repeat": repeat,
                      "added_bytes": added}))


def measure_cli(n: int, scratch: Path) -> dict:
    """Seconds of ``captum-ffb explain --context`` end to end and of a process that loads the
    model the same way and runs one input-gradient pass of the same prompt."""
    from captum_ffb.explained.models import load_model, smollm2_dir

    folder = str(smollm2_dir(required=True))
    tokenizer = load_model(folder, show_progress=False, task="causal_lm").tokenizer
    document = scratch / f"document-{n}.txt"
    document.write_text(context_document(tokenizer, n), encoding="utf-8")
    cli = [sys.executable, "-m", "captum_ffb.cli", "explain", "--context", str(document), "--question", QUESTION,
           "--template", TEMPLATE, "--model", folder, "--out", str(scratch / f"out-{n}"), "--quiet"]
    base = [sys.executable, __file__, "--child", "cli-baseline", "--n", str(n), "--tree", str(document)]
    found = {}
    for name, command in (("cli", cli), ("cli-baseline", base)):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, text=True)
        found[name] = time.perf_counter() - start
    files = sorted(p.name for p in (scratch / f"out-{n}").iterdir())
    return {"n": n, "cli_seconds": found["cli"], "baseline_seconds": found["cli-baseline"], "files": files}


def cli_baseline(document: str) -> None:
    """A user's plain run: load the model as the command line does, one input-gradient pass."""
    import torch

    from captum_ffb.explained.models import load_model, smollm2_dir

    loaded = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm")
    text = TEMPLATE.format(context=Path(document).read_text(encoding="utf-8"), question=QUESTION)
    ids = loaded.tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        token = int(loaded.model(ids, logits_to_keep=1).logits[0, -1].argmax())
    input_gradient_pass(loaded.model, ids, token)


def context_markdown(rows: dict) -> list[str]:
    lines = ["", "## Context attribution as a user calls it", "",
             "A document of about n tokens (`docs/examples/field_report.txt` repeated), the question in the "
             "documented template, the predicted answer token, paragraphs as groups (`--context-only`). In a "
             f"process: `context_attribution` against the {BASELINE} of the same prompt and token (first call, "
             "then the median of the repeats). The command line: `captum-ffb explain --context` end to end "
             "(start, load SmolLM2, explain, write its files) against a process that loads the model the same "
             f"way and runs one {BASELINE}.", "",
             f"| n | {BASELINE} (s) | context_attribution (s) | × {BASELINE} | first calls (s) "
             f"| command line (s) | load + {BASELINE} (s) | × |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows.values():
        base, ours, cli = row[CONTEXT_METHODS[0]], row[CONTEXT_METHODS[1]], row["cli"]
        lines.append(f"| {base['n']} | {base['seconds']:.2f} | {ours['seconds']:.2f} | "
                     f"{ours['seconds'] / base['seconds']:.2f}× | {base['first_seconds']:.2f}, "
                     f"{ours['first_seconds']:.2f} | {cli['cli_seconds']:.1f} | {cli['baseline_seconds']:.1f} | "
                     f"{cli['cli_seconds'] / cli['baseline_seconds']:.2f}× |")
    return lines


def method_costs_markdown(rows: dict) -> list[str]:
    """The table of ``--context-method-costs``."""
    lines = ["", "## Each context method's cost", "",
             "The same document and question (`--context-method-costs`), sentences as groups, each method of "
             f"`context_attribution` in a process of its own against the {BASELINE} of the same prompt and token "
             "(first call, then the median of the repeats). `fitted` runs its defaults: 4 nested prompts "
             "(`rounds=4`: the decomposition's top 1 … 4 sentences removed, one forward pass each) and 4 ablated "
             "prompts removing only among the top 10 sentences of presence and the decomposition (`ablations=4`, "
             "`focus=10`); `rerank=True` with 16 ablations is the design before (greedy rounds: the decomposition "
             "again without its first sentence so far, one forward and one backward pass each); `rounds=0` without "
             "nested prompts; `focus=None` among every sentence.", "",
             "Memory: the peak resident memory above the loaded model during the first call (– where not measured).",
             "", f"| n | method | seconds | × {BASELINE} | first call (s) | memory (GiB) |",
             "|---:|---|---:|---:|---:|---:|"]

    def memory(found: dict) -> str:
        return f"{found['added_bytes'] / 2**30:.2f}" if "added_bytes" in found else "–"

    for row in rows.values():
        base = row[CONTEXT_METHODS[0]]
        lines.append(f"| {base['n']} | {BASELINE} | {base['seconds']:.2f} | 1.00× | {base['first_seconds']:.2f} | "
                     f"{memory(base)} |")
        for name in METHOD_COSTS:
            if name in row:
                lines.append(f"| {base['n']} | {name} | {row[name]['seconds']:.2f} | "
                             f"{row[name]['seconds'] / base['seconds']:.2f}× | {row[name]['first_seconds']:.2f} | "
                             f"{memory(row[name])} |")
    return lines


def _commit(tree: str | None) -> str | None:
    """The short commit of the checkout at ``tree`` (``None`` where it is not a git checkout)."""
    if tree is None:
        return None
    out = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None


def measure(method: str, n: int, tree: str, repeat: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", method, "--n", str(n), "--tree", tree,
                          "--repeat", str(repeat)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _protocol(result: dict) -> str:
    repeat = result.get("repeat", 0)
    if not repeat:
        return "one call after a warm-up at n = 64"
    return f"the median of {repeat} calls after a first call at n (which follows a warm-up at n = 64)"


def markdown(result: dict) -> str:
    lines = [f"# Long contexts: attribution against the {BASELINE} (SmolLM2-135M, float32)", "",
             f"Run {result['run']} by `python benchmarks/long_context.py` (torch {result['torch']}, 2 threads, "
             "each measurement in a process of its own, random token ids, the last position's predicted "
             f"token). Seconds: {_protocol(result)}. Memory: the peak resident memory above the loaded model "
             "during the first call at n. The "
             f"{BASELINE}: the gradient of the explained logit with respect to the input embeddings, no "
             "parameter gradient (`benchmarks/baseline.py`; what Captum's `Saliency` or `InputXGradient` "
             "costs).", "",
             f"| n | {BASELINE} (s) | attribute (s) | × {BASELINE} | first call at n: {BASELINE}, attribute (s) "
             f"| memory, {BASELINE} (GiB) | memory, attribute (GiB) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for n, row in result["rows"].items():
        base, ours = row[BASELINE], row["attribute"]
        first = (f"{base['first_seconds']:.2f}, {ours['first_seconds']:.2f}" if "first_seconds" in ours else "")
        lines.append(f"| {n} | {base['seconds']:.2f} | {ours['seconds']:.2f} | "
                     f"{ours['seconds'] / base['seconds']:.2f}× | {first} | {base['added_bytes'] / 2**30:.2f} | "
                     f"{ours['added_bytes'] / 2**30:.2f} |")
    ruled = {n: row for n, row in result["rows"].items() if any(m in row for m in RULES)}
    if ruled:
        lines += ["", "The rules that credit queries and keys (`rules={\"attention\": ...}`; their backward pass "
                  "rebuilds the probabilities chunk by chunk and, for `IGAttention`, one softmax per "
                  "quadrature point):", "",
                  f"| n | rule | seconds | × {BASELINE} | memory (GiB) |", "|---:|---|---:|---:|---:|"]
        for n, row in ruled.items():
            for method in RULES:
                if method in row:
                    found = row[method]
                    lines.append(f"| {n} | `{RULES[method]}` | {found['seconds']:.2f} | "
                                 f"{found['seconds'] / row[BASELINE]['seconds']:.2f}× | "
                                 f"{found['added_bytes'] / 2**30:.2f} |")
    paired = {n: row for n, row in result["rows"].items() if all(m in row for m in SEQ2SEQ)}
    if paired:
        lines += ["", "The encoder–decoder route (a BART-base-sized model, random weights; a source of n "
                  f"tokens, a {PREFIX}-token target prefix, the last target position's predicted token; "
                  "the default route):", "",
                  f"| source n | {BASELINE} (s) | attribute (s) | × {BASELINE} | memory, {BASELINE} (GiB) "
                  "| memory, attribute (GiB) |", "|---:|---:|---:|---:|---:|---:|"]
        for n, row in paired.items():
            base, ours = (row[m] for m in SEQ2SEQ)
            lines.append(f"| {n} | {base['seconds']:.2f} | {ours['seconds']:.2f} | "
                         f"{ours['seconds'] / base['seconds']:.2f}× | {base['added_bytes'] / 2**30:.2f} | "
                         f"{ours['added_bytes'] / 2**30:.2f} |")
    if result.get("before"):
        lines += ["", f"Before (the attribution of the checkout at `{result['before_tree']}`, commit "
                  f"{result.get('before_commit') or 'unknown'}, same run):", "",
                  f"| n | attribute before (s) | × {BASELINE} before | memory before (GiB) |", "|---:|---:|---:|---:|"]
        for n, row in result["before"].items():
            base = result["rows"][n][BASELINE]
            lines.append(f"| {n} | {row['seconds']:.2f} | {row['seconds'] / base['seconds']:.2f}× | "
                         f"{row['added_bytes'] / 2**30:.2f} |")
    if result.get("context"):
        lines += context_markdown(result["context"])
    if result.get("method_costs"):
        lines += method_costs_markdown(result["method_costs"])
    if result.get("presence_paths"):
        lines += presence_paths_markdown(result["presence_paths"])
    return "\n".join(lines) + "\n"


def presence_paths_markdown(rows: dict) -> list[str]:
    """The table of ``--presence-paths``."""
    lines = ["", "## Presence's passes: by blocks of queries or through the n × n mask", "",
             "The same documents (`--presence-paths`), sentences as groups, `presence_attribution` of the "
             "predicted token (two steps and the ends) with `blocks=True` and `blocks=False`, each in a process of "
             f"its own against the {BASELINE}; memory as above. The mask's pass is not run where the attention "
             "weights it keeps (layers × heads × n² floats) would take more than half the memory available. "
             "`blocks=True` is the default.", "",
             f"| n | method | seconds | × {BASELINE} | first call (s) | memory (GiB) |",
             "|---:|---|---:|---:|---:|---:|"]
    for row in rows.values():
        base = row[CONTEXT_METHODS[0]]
        lines.append(f"| {base['n']} | {BASELINE} | {base['seconds']:.2f} | 1.00× | {base['first_seconds']:.2f} | "
                     f"{base['added_bytes'] / 2**30:.2f} |")
        for name in PRESENCE_PATHS:
            found = row.get(name)
            if found is None or "skipped" in found:
                need = f" (its attention weights: {found['skipped'] / 2**30:.1f} GiB)" if found else ""
                lines.append(f"| {base['n']} | {name} | not run{need} | | | |")
                continue
            lines.append(f"| {base['n']} | {name} | {found['seconds']:.2f} | {found['seconds'] / base['seconds']:.2f}× "
                         f"| {found['first_seconds']:.2f} | {found['added_bytes'] / 2**30:.2f} |")
    return lines


def presence_paths_main(args: argparse.Namespace) -> int:
    """``--presence-paths``: presence's passes both ways, added to the saved results."""
    from captum_ffb.engine.whole import available_bytes
    from captum_ffb.explained.models import load_model, smollm2_dir
    from captum_ffb.long_context.presence import mask_bytes

    model = load_model(str(smollm2_dir(required=True)), show_progress=False, task="causal_lm").model
    saved = HERE / "LONG_CONTEXT.json"
    result = json.loads(saved.read_text(encoding="utf-8")) if saved.exists() else {"rows": {}}
    result["presence_paths"] = {}
    for n in (int(s) for s in args.presence_paths.split(",")):
        row = {CONTEXT_METHODS[0]: context_measure(CONTEXT_METHODS[0], n, args.repeat)}
        for name, by_blocks in PRESENCE_PATHS.items():
            need = mask_bytes(model, row[CONTEXT_METHODS[0]]["n"])
            if not by_blocks and need > available_bytes(next(model.parameters()).device) / 2:
                row[name] = {"skipped": need}
                continue
            row[name] = context_measure(name, n, args.repeat)
        result["presence_paths"][str(n)] = row
    return _finish(result, "presence_paths", presence_paths_markdown, args.quick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512,2048,4096,8192")
    parser.add_argument("--before", default=None, metavar="DIR", help="also time the attribution of this checkout")
    parser.add_argument("--before-sizes", default="512,2048,4096", help="the sizes --before times")
    parser.add_argument("--rule-sizes", default="512,2048", help="the sizes the score-crediting rules are timed at")
    parser.add_argument("--seq2seq-sizes", default="512,2048", help="the source sizes the encoder–decoder is timed at")
    parser.add_argument("--quick", action="store_true", help="print, write no files")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tree", default=str(ROOT), help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=3, help="timed calls after the first at each n (their median)")
    parser.add_argument("--context-only", action="store_true",
                        help="measure context attribution and the CLI only; keep the other rows of LONG_CONTEXT.json")
    parser.add_argument("--context-sizes", default="2048,4096", help="the sizes context attribution is timed at")
    parser.add_argument("--context-method-costs", default=None, metavar="SIZES",
                        help="time each context method (decomposition, presence, fitted) at these sizes; keep the "
                        "other rows of LONG_CONTEXT.json")
    parser.add_argument("--presence-paths", default=None, metavar="SIZES",
                        help="time presence attribution's passes by blocks and through the n × n mask at these sizes")
    parser.add_argument("--cost-methods", default=None, metavar="NAMES",
                        help=f"with --context-method-costs, only these (comma-separated) of: {', '.join(METHOD_COSTS)}")
    args = parser.parse_args(argv)
    if args.child == "cli-baseline":
        cli_baseline(args.tree)
        return 0
    if args.child in CONTEXT_METHODS or args.child in METHOD_COSTS or args.child in PRESENCE_PATHS:
        context_child(args.child, args.n, args.repeat)
        return 0
    if args.child is not None:
        child(args.child, args.n, args.tree, args.repeat)
        return 0
    if args.context_only:
        return context_main(args)
    if args.context_method_costs:
        return method_costs_main(args)
    if args.presence_paths:
        return presence_paths_main(args)
    import torch

    result = {"run": datetime.datetime.now().strftime("%Y-%m-%dT%H:%M"), "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(), "repeat": args.repeat, "rows": {}, "before": {},
              "before_tree": args.before, "before_commit": _commit(args.before)}
    for n in (int(s) for s in args.sizes.split(",")):
        row = {}
        for method in METHODS:
            row[method] = measure(method, n, str(ROOT), args.repeat)
            print(json.dumps(row[method]), flush=True)
        result["rows"][str(n)] = row
        if args.before and str(n) in args.before_sizes.split(","):
            result["before"][str(n)] = measure("attribute", n, args.before, args.repeat)
            print("before", json.dumps(result["before"][str(n)]), flush=True)
        if str(n) in args.rule_sizes.split(","):
            for method in RULES:
                row[method] = measure(method, n, str(ROOT), args.repeat)
                print(json.dumps(row[method]), flush=True)
        if str(n) in args.seq2seq_sizes.split(","):
            for method in SEQ2SEQ:
                row[method] = measure(method, n, str(ROOT), args.repeat)
                print(json.dumps(row[method]), flush=True)
    text = markdown(result)
    print(text)
    if not args.quick:
        (HERE / "LONG_CONTEXT.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        (HERE / "LONG_CONTEXT.md").write_text(text, encoding="utf-8")
    return 0


def context_measure(method: str, n: int, repeat: int) -> dict:
    """One context method's (or the input-gradient pass's) row, measured in a process of its own."""
    out = subprocess.run([sys.executable, __file__, "--child", method, "--n", str(n), "--repeat", str(repeat)],
                         capture_output=True, text=True, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)
    return row


def context_main(args: argparse.Namespace) -> int:
    """``--context-only``: the context rows, added to the saved results."""
    import tempfile

    saved = HERE / "LONG_CONTEXT.json"
    result = json.loads(saved.read_text(encoding="utf-8")) if saved.exists() else {"rows": {}}
    result["context"] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for n in (int(s) for s in args.context_sizes.split(",")):
            row = {}
            for method in CONTEXT_METHODS:
                row[method] = context_measure(method, n, args.repeat)
            row["cli"] = measure_cli(n, Path(scratch))
            print(json.dumps(row["cli"]), flush=True)
            result["context"][str(n)] = row
    result["context_run"] = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M")
    text = markdown(result)
    print("\n".join(context_markdown(result["context"])))
    if not args.quick:
        saved.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        (HERE / "LONG_CONTEXT.md").write_text(text, encoding="utf-8")
    return 0


def method_costs_main(args: argparse.Namespace) -> int:
    """``--context-method-costs``: each context method's seconds against the input-gradient pass."""
    saved = HERE / "LONG_CONTEXT.json"
    result = json.loads(saved.read_text(encoding="utf-8")) if saved.exists() else {"rows": {}}
    result["method_costs"] = {}
    chosen = [m for m in METHOD_COSTS if args.cost_methods is None or m in args.cost_methods.split(",")]
    for n in (int(s) for s in args.context_method_costs.split(",")):
        row = {}
        for method in (CONTEXT_METHODS[0], *chosen):
            row[method] = context_measure(method, n, args.repeat)
        result["method_costs"][str(n)] = row
    return _finish(result, "method_costs", method_costs_markdown, args.quick)


def _finish(result: dict, key: str, table, quick: bool) -> int:
    """Stamp ``result[key]``'s run, print its table and (unless ``quick``) save the files."""
    result[f"{key}_run"] = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M")
    print("\n".join(table(result[key])))
    if not quick:
        (HERE / "LONG_CONTEXT.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        (HERE / "LONG_CONTEXT.md").write_text(markdown(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
