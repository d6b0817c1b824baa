"""Time to first view of ``captum-ffb app``, and the screenshot of docs/app.md.

From the moment the command is launched (the bundled all-MiniLM-L6-v2 by default) to the
moment the browser shows the first explanation of a typed sentence: the server answers, the
page loads, the sentence is typed, Explain is pressed and the summary appears. A headless
Chromium (Selenium) is started before the clock starts. Needs the [app] extra, selenium and
Chromium with its driver.

    python benchmarks/app_first_view.py [--model DIR] [--runs 3] [--screenshot docs/app.png]

With ``--screenshot``, the last run also saves the Layer maps tab beside it (``app_maps.png``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SENTENCE = "a charming and often affecting journey."


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def browser(width: int = 1400, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={width},{height}",
                 "--disable-background-networking", "--disable-component-update", "--no-first-run"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def wait(driver, condition, timeout: float = 600):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)


def explain(driver, text: str) -> None:
    box = driver.find_element("css selector", "#ffb-text textarea")
    box.clear()
    box.send_keys(text)
    driver.find_element("css selector", "#ffb-explain").click()
    wait(driver, lambda d: any(f"“{text}”" in s.text for s in d.find_elements("id", "ffb-summary")))


def one_run(model: str | None, screenshot: str | None) -> dict[str, float | list[str]]:
    """Launch the app, open it, explain the sentence; the times in seconds from the launch."""
    script = Path(sys.executable).with_name("captum-ffb")  # this Python's console script
    command = [str(script)] if script.exists() else [sys.executable, "-m", "captum_ffb.cli"]
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    driver = browser()
    start = time.perf_counter()
    server = subprocess.Popen([*command, "app", "--port", str(port), "--quiet",
                               *(["--model", model] if model else [])])
    try:
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"captum-ffb app ended with {server.returncode}") from None
                time.sleep(0.05)
        served = time.perf_counter() - start
        driver.get(url)
        wait(driver, lambda d: d.find_elements("css selector", "#ffb-text textarea"))
        loaded = time.perf_counter() - start
        explain(driver, SENTENCE)
        first = time.perf_counter() - start
        again = time.perf_counter()
        explain(driver, "a dull , lifeless movie .")
        second = time.perf_counter() - again
        requested = set()
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                requested.add(message["params"]["request"]["url"])
        if screenshot:
            explain(driver, SENTENCE)
            time.sleep(1.0)
            driver.set_window_size(1400, 1500)
            time.sleep(0.5)
            driver.save_screenshot(screenshot)
            next(b for b in driver.find_elements("css selector", "button[role=tab]")
                 if b.text.strip() == "Layer maps").click()
            time.sleep(2.0)
            path = Path(screenshot)
            driver.save_screenshot(str(path.with_name(f"{path.stem}_maps{path.suffix}")))
        return {"server_answers_s": served, "page_loaded_s": loaded, "first_explanation_s": first,
                "next_explanation_s": second,
                "outside_requests": sorted(u for u in requested
                                           if not u.startswith((url, "data:", "blob:", "about:")))}
    finally:
        driver.quit()
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model folder; the bundled MiniLM by default")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--screenshot", default=None,
                        help="save a screenshot of the last run here (and of its Layer maps tab)")
    args = parser.parse_args()
    runs = [one_run(args.model, args.screenshot if k == args.runs - 1 else None) for k in range(args.runs)]
    summary = {key: statistics.median(run[key] for run in runs)
               for key in ("server_answers_s", "page_loaded_s", "first_explanation_s", "next_explanation_s")}
    print(json.dumps({"runs": runs, "median": summary}, indent=1))


if __name__ == "__main__":
    main()
