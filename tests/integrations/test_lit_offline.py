"""LIT's page served without outside requests (no LIT needed: a stand-in WSGI application)."""

from __future__ import annotations

from captum_ffb.integrations._lit_offline import FONTS, PREFIX, OfflineFonts, offline_page

PAGE = b"""<html>
  <head>
  <link href="https://fonts.googleapis.com/css?family=Material+Icons|Material+Icons+Outlined&display=block" rel="stylesheet">
  <link href="https://fonts.googleapis.com/css?family=Roboto" rel="stylesheet">
  <link rel="shortcut icon" href="static/favicon.png">
</head><body><lit-app></lit-app></body></html>"""


class StandIn:
    """A WSGI app answering every path with LIT's page shape, and a name to reach through."""

    name = "lit"

    def __init__(self):
        self.paths = []

    def __call__(self, environ, start_response):
        self.paths.append(environ["PATH_INFO"])
        start_response("200 OK", [("Content-Type", "text/html"), ("Content-Length", str(len(PAGE)))])
        return [PAGE]


def _get(app, path):
    answer = {}

    def start_response(status, headers, exc_info=None):
        answer.update(status=status, headers=dict(headers))

    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": "GET"}, start_response))
    return answer["status"], answer["headers"], body


def test_the_page_links_the_local_icons_only():
    page = offline_page(PAGE)
    assert b"googleapis" not in page
    assert f'href="{PREFIX}icons.css"'.encode() in page and b"favicon.png" in page
    assert offline_page(b"<html><head></head></html>") == b"<html><head></head></html>"


def test_the_wrapper_serves_page_css_and_fonts_and_passes_the_rest():
    inner = StandIn()
    app = OfflineFonts(inner)
    assert app.name == "lit"
    status, headers, body = _get(app, "/")
    assert status.startswith("200") and b"googleapis" not in body
    assert headers["Content-Length"] == str(len(body))
    status, headers, css = _get(app, PREFIX + "icons.css")
    assert status.startswith("200") and headers["Content-Type"].startswith("text/css")
    assert b'font-family: "Material Icons"' in css and b"material-icons.woff2" in css
    for name in ("material-icons.woff2", "material-icons-outlined.woff2"):
        status, headers, font = _get(app, PREFIX + name)
        assert status.startswith("200") and headers["Content-Type"] == "font/woff2"
        assert font == (FONTS / name).read_bytes() and font[:4] == b"wOF2"
    for bad in ("../README.md", "LICENSE", "missing.woff2"):
        assert _get(app, PREFIX + bad)[0].startswith("404")
    status, _, body = _get(app, "/main.js")
    assert body == PAGE and inner.paths[-1] == "/main.js"


def test_the_vendored_fonts_carry_their_license():
    assert (FONTS / "LICENSE").read_text().startswith("\n                                 Apache License")
    assert "material-icons" in (FONTS / "README.md").read_text()
