"""The one page skeleton and the one colour scale (captum_ffb.io.pages): a whole offline page
with its text escaped, and the same colours in Python, in CSS and in the pages' script."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import captum_ffb
from captum_ffb.io.pages import (
    COLOUR_JS,
    DIVERGING,
    MUTED,
    SEQUENTIAL,
    STYLESHEET,
    css,
    diverging,
    gradient,
    ink,
    json_block,
    page,
    ramp,
    sequential,
)


def test_a_page_is_whole_escaped_and_offline():
    evil = "</title><script>alert(1)</script>"
    document = page(evil, "<p>body</p>", header='<div class="meta">facts</div>\n', style=".x { color: red; }",
                    data={"ffb-data": {"token": "</script><b>"}}, script=["var a = 1;", "", "var b = 2;"])
    assert document.startswith("<!DOCTYPE html>\n<html lang=\"en\">") and document.endswith("</html>\n")
    assert "&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt; — captum_ffb</title>" in document
    assert "<h1>&lt;/title&gt;" in document and "alert(1)</script>" not in document
    assert document.count("<style>") == 1 and STYLESHEET + ".x { color: red; }</style>" in document
    assert '<div class="meta">facts</div>\n</header>\n<p>body</p>' in document
    # the data block: "<" escaped, read back whole; one code block with the scripts in order
    assert document.count("</script>") == 2 and "var a = 1;\nvar b = 2;</script>" in document
    blob = re.search(r'<script id="ffb-data" type="application/json">(.*?)</script>', document, re.S)
    assert json.loads(blob.group(1)) == {"token": "</script><b>"}
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|<link|@import|url\(""", document)


def test_a_page_without_data_or_script_has_no_script_element():
    assert "<script" not in page("Report", "<table></table>")
    assert json_block("d", [1, "<"]) == '<script id="d" type="application/json">[1, "\\u003c"]</script>'


def test_no_module_writes_a_page_of_its_own():
    root = Path(captum_ffb.__file__).parent
    own = [str(path.relative_to(root)) for path in root.rglob("*.py") if path.name != "pages.py"
           and re.search(r"<!DOCTYPE|<html[\s>]", path.read_text(encoding="utf-8"), re.I)]
    assert not own, own


def test_the_diverging_scale():
    assert diverging(0.0, 2.0) == DIVERGING[5] == (247, 247, 247)  # white at zero
    assert diverging(2.0, 2.0) == DIVERGING[-1] and diverging(-2.0, 2.0) == DIVERGING[0]
    assert diverging(50.0, 2.0) == DIVERGING[-1] and diverging(-50.0, 2.0) == DIVERGING[0]  # clipped
    assert diverging(0.4, 2.0) == DIVERGING[6]  # a fifth of the way up: the next stop
    assert diverging(1.0, 0.0) == diverging(float("nan"), 1.0) == DIVERGING[5]
    red, blue = diverging(1.0, 1.0), diverging(-1.0, 1.0)
    assert red[0] > red[2] and blue[2] > blue[0]


def test_the_sequential_scale_ramp_and_text_colour():
    assert sequential(0.0, 3.0) == SEQUENTIAL[0] and sequential(3.0, 3.0) == SEQUENTIAL[-1]
    assert sequential(-1.0, 3.0) == SEQUENTIAL[0] and sequential(1.0, 0.0) == SEQUENTIAL[0]
    assert ramp(MUTED, 0.5) == MUTED[2]
    assert ramp(((0, 0, 0), (255, 255, 255)), 0.5) == (128, 128, 128)  # rounded half up, as Math.round
    assert sequential(1.0, 2.0) == SEQUENTIAL[4]
    assert css((1.4, 2.5, 255)) == "rgb(1,3,255)"
    assert ink(DIVERGING[0]) == ink(SEQUENTIAL[-1]) == "#fff" and ink(DIVERGING[5]) == "#1f2328"
    assert gradient(((0, 0, 0), (1, 2, 3))) == "linear-gradient(to right,rgb(0,0,0),rgb(1,2,3))"
    assert gradient(DIVERGING) in STYLESHEET and gradient(SEQUENTIAL) in STYLESHEET


def test_the_script_holds_the_same_stops():
    for name, stops in (("DIVERGING", DIVERGING), ("SEQUENTIAL", SEQUENTIAL), ("MUTED", MUTED)):
        found = re.search(rf"{name} = (\[\[.*?\]\])", COLOUR_JS)
        assert [tuple(s) for s in json.loads(found.group(1))] == list(stops)


CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)),
                None)


@pytest.mark.browser
def test_the_script_colours_as_python_does(tmp_path):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed")
    values = [-3.0, -1.0, -0.37, 0.0, 0.05, 0.5, 0.99, 1.0, 7.0]
    script = ("var v = " + json.dumps(values) + ", r = [];\n"
              "v.forEach(function (x) { var d = ffbColour.diverging(x, 1), s = ffbColour.sequential(x, 1);"
              " r.push([ffbColour.css(d), ffbColour.ink(d), ffbColour.css(s), ffbColour.ink(s)]); });\n"
              'document.getElementById("out").textContent = JSON.stringify(r);')
    path = tmp_path / "colours.html"
    path.write_text(page("Colours", '<pre id="out"></pre>', script=[COLOUR_JS, script]), encoding="utf-8")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}",
                          "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    found = json.loads(re.search(r'<pre id="out">(.*?)</pre>', dom, re.S).group(1))
    expected = [[css(diverging(x, 1)), ink(diverging(x, 1)), css(sequential(x, 1)), ink(sequential(x, 1))]
                for x in values]
    assert found == expected
