"""Driving a LIT page in headless Chromium with selenium, as a person would: pick an example
or type a text, then read the salience methods' values (shown to 3 significant digits)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

#: ``deepAll(selector, root)``: every match under ``root``, inside shadow roots too (LIT's
#: modules are web components).
DEEP_QUERY = """
window.methodRows = function () {
  var module = deepAll('salience-map-module')[0];
  return module ? deepAll('.method-row', module.shadowRoot) : [];
};
window.methodRow = function (name) {
  return methodRows().find(function (r) { return deepAll('expansion-panel', r)[0].label === name; });
};
window.deepAll = function (selector, root) {
  var out = [];
  (function walk(node) {
    out.push.apply(out, node.querySelectorAll(selector));
    node.querySelectorAll('*').forEach(function (el) { if (el.shadowRoot) walk(el.shadowRoot); });
  })(root || document);
  return out;
};
"""


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or ``None``."""
    import importlib.util

    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install 'captum_ffb[dev]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    return None


def chromium(width: int = 1600, height: int = 1000, log_requests: bool = False) -> Any:
    """A headless Chromium under selenium (``log_requests``: keep the performance log, which
    :func:`requested_urls` reads)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={width},{height}",
                 "--disable-background-networking", "--no-first-run"):
        options.add_argument(flag)
    if log_requests:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def requested_urls(driver: Any) -> set[str]:
    """Every URL the page asked for since the last call (a driver made with ``log_requests``)."""
    import json

    urls = set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.add(message["params"]["request"]["url"])
    return urls


#: The elements drawn in an icon font, with their text and width against their font size.
ICONS = """
return deepAll('*').filter(function (el) {
  var family = getComputedStyle(el).fontFamily;
  return /Material Icons/.test(family) && el.childElementCount === 0 && el.textContent.trim()
    && el.getBoundingClientRect().width > 0;
}).map(function (el) {
  return [el.textContent.trim(), el.getBoundingClientRect().width,
          parseFloat(getComputedStyle(el).fontSize)];
});"""


def wait_for(probe: Callable[[], Any], timeout: float, what: str, every: float = 0.1,
             seen: Callable[[], Any] | None = None) -> Any:
    """``probe()`` once it is truthy; an AssertionError naming ``what`` after ``timeout`` s
    (with ``seen()``, what the page showed instead, when given)."""
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            shown = "" if seen is None else f"; the page showed {seen()!r}"
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{shown}")
        time.sleep(every)


def run_js(driver: Any, script: str, *args: Any) -> Any:
    return driver.execute_script(DEEP_QUERY + script, *args)


def open_lit(driver: Any, url: str, timeout: float = 60) -> None:
    """Load LIT's page and wait for its data table."""
    driver.get(url)
    wait_for(lambda: run_js(driver, "return deepAll('tbody tr').length"), timeout, "LIT's data table")


def select_example(driver: Any, index: int, timeout: float = 10) -> None:
    """Click row ``index`` of the data table (in the Examples tab)."""
    show_tab(driver, "Examples")
    wait_for(lambda: run_js(driver, "return deepAll('tbody tr').length") > index, timeout,
             f"row {index} of the data table")
    run_js(driver, "deepAll('tbody tr')[arguments[0]].click();", index)


def show_tab(driver: Any, name: str) -> None:
    """Click the tab called ``name``."""
    clicked = run_js(driver, """
      var name = arguments[0];
      var tab = deepAll('.tab').find(function (t) { return t.textContent.trim() === name; });
      if (tab) tab.click();
      return !!tab;""", name)
    assert clicked, f"no tab {name!r}"


def enter_text(driver: Any, text: str, timeout: float = 10) -> None:
    """Type ``text`` into the datapoint editor's first text box and add it as a new example
    (LIT selects it; the data table lists it under "Show generated")."""
    show_tab(driver, "Editor")
    editor = "var editor = deepAll('datapoint-editor-module')[0]; "
    wait_for(lambda: run_js(driver, editor + "return editor && deepAll('textarea', "
                                            "editor.shadowRoot).length"), timeout, "the editor")
    # typed again until it stays: the editor may still be redrawing the page's first selection
    button = wait_for(lambda: run_js(driver, editor + """
      var box = deepAll('textarea', editor.shadowRoot)[0];
      if (box.value !== arguments[0]) {
        box.value = arguments[0];
        box.dispatchEvent(new Event('input', {bubbles: true, composed: true}));
        return null;
      }
      var add = deepAll('button#make', editor.shadowRoot)[0];
      return add && !add.disabled ? add : null;""", text), timeout, "the editor's Add button", every=0.3)
    button.click()


def method_names(driver: Any) -> list[str]:
    """The salience methods listed by the Salience Maps module, in order."""
    return run_js(driver, """
      return methodRows().map(function (r) { return deepAll('expansion-panel', r)[0].label; });""")


def expand_method(driver: Any, name: str) -> None:
    """Open (and so run) the method ``name``'s row."""
    run_js(driver, """
      var row = methodRow(arguments[0]);
      var panel = deepAll('expansion-panel', row)[0];
      var bar = deepAll('.expansion-header', panel.shadowRoot)[0] || panel;
      bar.click();""", name)


def apply_settings(driver: Any, name: str, choices: dict[str, str]) -> None:
    """In method ``name``'s settings (⚙), pick each dropdown's option and press Apply (which
    runs the method again)."""
    missing = run_js(driver, """
      var controls = deepAll('lit-interpreter-controls', methodRow(arguments[0]))[0];
      var choices = arguments[1], missing = [];
      Object.keys(choices).forEach(function (field) {
        var holder = deepAll('.control-holder', controls.shadowRoot).find(function (h) {
          return h.querySelector('.control-name').textContent.trim().replace(/^[*]/, '') === field; });
        var select = holder && holder.querySelector('select');
        var index = select ? Array.from(select.options).findIndex(function (o) {
          return o.textContent.trim() === choices[field]; }) : -1;
        if (index < 0) { missing.push(field); return; }
        select.selectedIndex = index;
        select.dispatchEvent(new Event('change', {bubbles: true, composed: true}));
      });
      if (!missing.length) deepAll('button.filled-button', controls.shadowRoot)[0].click();
      return missing;""", name, choices)
    assert not missing, f"no such settings of {name}: {missing}"


def salience(driver: Any, name: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """Method ``name``'s groups as shown: ``(title, [(token, value), ...])`` per group (one,
    untitled, for most methods), the values as LIT shows them (3 significant digits)."""
    return run_js(driver, """
      var row = methodRow(arguments[0]);
      if (!row) return [];
      return Array.from(row.querySelectorAll('.tokens-group')).map(function (group) {
        var title = Array.from(group.querySelectorAll('.tokens-group-title')).map(function (t) {
          return t.textContent.trim(); });
        var chips = deepAll('lit-tooltip', group).map(function (t) {
          return [t.textContent.trim(), t.content]; });
        return [title.length ? title[0] : '', chips];
      });""", name)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def start_lit(argv: list[str], timeout: float) -> tuple[subprocess.Popen, str]:
    """``captum-ffb lit ARGV`` on a free port of 127.0.0.1, once its page answers."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "captum_ffb.cli", "lit", *argv, "--port",
                               str(port), "--quiet"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(lambda: server.poll() is not None or _answers(url), timeout,
                          "the LIT server", every=0.5)
    except AssertionError:
        server.kill()
        raise
    if server.poll() is not None:
        raise AssertionError(f"captum-ffb lit ended: {server.stdout.read()}")
    return server, url


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


# --- LIT's Sequence Salience module (causal LMs) ---------------------------------------------

SEQUENCE = "var module = deepAll('sequence-salience-module')[0]; "
CHIPS = SEQUENCE + "var chips = deepAll('sequence-salience-chips', module.shadowRoot)[0]; "


def choose_response(driver: Any, timeout: float = 120) -> str:
    """Choose the model's own continuation as the sequence to explain; its text."""
    options = SEQUENCE + "var options = deepAll('.interstitial-target-option', module.shadowRoot); "
    text = wait_for(lambda: run_js(driver, options + "return options.length >= 2 && "
                                                     "options[options.length - 1].textContent.trim()"),
                    timeout, "the model's continuation")
    run_js(driver, options + "options[options.length - 1].click();")
    return text


def press(driver: Any, label: str) -> None:
    """Press the Sequence Salience button labelled ``label`` (a granularity or a method)."""
    pressed = run_js(driver, SEQUENCE + """
      var label = arguments[0];
      var button = deepAll('button', module.shadowRoot).find(function (b) {
        return b.textContent.trim() === label; });
      if (button) button.click();
      return !!button;""", label)
    assert pressed, f"no button {label!r} in Sequence Salience"


def sequence_chips(driver: Any) -> list[tuple[str, str]]:
    """The segments Sequence Salience shows, with their values as shown."""
    return run_js(driver, CHIPS + """
      if (!chips) return [];
      return deepAll('lit-tooltip', chips.shadowRoot).map(function (t) {
        return [t.textContent, t.content]; });""")


def click_chip(driver: Any, index: int) -> None:
    """Click segment ``index``: it becomes the target to explain."""
    run_js(driver, CHIPS + "deepAll('.salient-token', chips.shadowRoot)[arguments[0]].click();", index)
