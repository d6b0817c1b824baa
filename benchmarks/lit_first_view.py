"""Time to first view of ``captum-ffb lit``, and the screenshot of docs/lit.md.

Run from the repository root (needs lit-nlp, selenium and Debian's chromium and
chromium-driver)::

    python benchmarks/lit_first_view.py                  # writes benchmarks/LIT_FIRST_VIEW.md and .json
    python benchmarks/lit_first_view.py --screenshot docs/lit.png

Each run launches ``captum-ffb lit`` (the bundled all-MiniLM-L6-v2 with its sentiment head, a
free local port) and a headless Chromium; the clock starts when the command is launched and
reads: the server answering, LIT's page showing its data table, and our contributions shown
for the first example after it is clicked (the time to first view). Then the same request's
time for each salience method is read once (LIT's LIME with its default 256 samples, run on
request, included). With ``--screenshot`` the page is saved with our row next to LIME's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from captum_ffb.integrations.lit import DEFAULT_TEXTS  # noqa: E402
from tests.integrations import lit_page  # noqa: E402

OURS = "NormDecomposition"
#: The stages, as the report names them.
STAGES = {"server_ready_s": "the server answers", "page_shown_s": "LIT's page shows its data table",
          "first_view_s": "our contributions shown (first view)"}


def first_view() -> dict[str, float]:
    """One launch: seconds from launching the command to each stage."""
    start = time.monotonic()
    server, url = lit_page.start_lit([], timeout=300)
    ready = time.monotonic() - start
    driver = lit_page.chromium()
    try:
        lit_page.open_lit(driver, url)
        page = time.monotonic() - start
        lit_page.select_example(driver, 0)
        lit_page.wait_for(lambda: lit_page.salience(driver, OURS), 120, "our contributions")
        shown = time.monotonic() - start
    finally:
        driver.quit()
        lit_page.stop(server)
    return {"server_ready_s": ready, "page_shown_s": page, "first_view_s": shown}


def method_times(screenshot: Path | None) -> dict[str, float]:
    """Seconds from clicking the second example to each method's values shown (LIME and the
    layer maps run when their rows are opened), and the screenshot."""
    server, url = lit_page.start_lit([], timeout=300)
    driver = lit_page.chromium(1600, 900)
    times = {}
    try:
        lit_page.open_lit(driver, url)
        lit_page.select_example(driver, 0)
        lit_page.wait_for(lambda: lit_page.salience(driver, OURS), 120, "our contributions")
        lit_page.select_example(driver, 1)
        start = time.monotonic()
        pending = set(lit_page.method_names(driver))
        for name in ("LIME", "Integrated Gradients", "Layer maps (NormDecomposition)"):
            lit_page.expand_method(driver, name)
        word = DEFAULT_TEXTS[1].split()[1]  # a word of the second example
        while pending and time.monotonic() - start < 600:
            for name in list(pending):
                groups = lit_page.salience(driver, name)
                if groups and any(word in token.lower() for token, _ in groups[0][1]):
                    times[name] = time.monotonic() - start
                    pending.discard(name)
            time.sleep(0.1)
        if screenshot is not None:
            for name in ("Integrated Gradients", "Layer maps (NormDecomposition)"):
                lit_page.expand_method(driver, name)  # closed again: ours, gradients, LIME
            time.sleep(1)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(screenshot))
    finally:
        driver.quit()
        lit_page.stop(server)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="launches to time (default 3)")
    parser.add_argument("--screenshot", type=Path, default=None, help="save the page here")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks", help="output folder")
    args = parser.parse_args(argv)
    reason = lit_page.missing_browser()
    if reason is not None:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    runs = [first_view() for _ in range(args.runs)]
    for run in runs:
        print(json.dumps({k: round(v, 2) for k, v in run.items()}), flush=True)
    methods = method_times(args.screenshot)
    from importlib.metadata import version

    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), {platform.python_version()}",
        "versions": {p: version(p) for p in ("lit-nlp", "torch", "transformers", "numpy", "selenium")},
        "runs": runs,
        "median": {k: statistics.median(r[k] for r in runs) for k in runs[0]},
        "method_seconds_after_click": methods,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "LIT_FIRST_VIEW.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    rows = "\n".join(f"| {STAGES[k]} | " + " | ".join(f"{r[k]:.1f}" for r in runs) + f" | {result['median'][k]:.1f} |"
                     for k in runs[0])
    methods_rows = "\n".join(f"| {name} | {seconds:.1f} |" for name, seconds in
                             sorted(methods.items(), key=lambda item: item[1]))
    (args.out / "LIT_FIRST_VIEW.md").write_text(f"""# Time to first view: `captum-ffb lit`

`python benchmarks/lit_first_view.py` ({result['date']}; {result['machine']};
{', '.join(f'{p} {v}' for p, v in result['versions'].items())}). Seconds from launching
`captum-ffb lit` (the bundled all-MiniLM-L6-v2 with its sentiment head) to each stage, in
headless Chromium; the first view is our contributions shown for the first example after it
is clicked.

| stage (s from launch) | {' | '.join(f'run {k + 1}' for k in range(len(runs)))} | median |
|---|{'---|' * (len(runs) + 1)}
{rows}

Seconds from clicking another example to each method's values shown (LIME, integrated
gradients and the layer maps opened at once, so they queue behind each other on the model):

| method | s |
|---|---|
{methods_rows}
""", encoding="utf-8")
    print(json.dumps(result["median"]), json.dumps(methods))
    return 0


if __name__ == "__main__":
    sys.exit(main())
