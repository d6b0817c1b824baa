"""LIT's page without outside requests: its icon fonts served from the installed package.

LIT 1.3.1's ``index.html`` loads four stylesheets from ``fonts.googleapis.com``; offline its
icons render as their names (``smart_toy``, ``arrow_drop_down``). :class:`OfflineFonts` wraps
LIT's WSGI application: the page it returns links one local stylesheet instead, which declares
the Material Icons fonts vendored in ``static/fonts`` (Apache-2.0, see the README there); the
text fonts fall back to the browser's own. Every other request goes to LIT unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: Where the local stylesheet and fonts are served.
PREFIX = "/captum_ffb_static/"
FONTS = Path(__file__).resolve().parent / "static" / "fonts"
#: The outside stylesheets of LIT's page.
OUTSIDE_STYLESHEET = re.compile(rb'<link[^>]*href="https://fonts\.googleapis\.com/[^"]*"[^>]*>\s*')

ICONS_CSS = """\
@font-face { font-family: "Material Icons"; font-style: normal; font-weight: 400;
  font-display: block; src: url("material-icons.woff2") format("woff2"); }
@font-face { font-family: "Material Icons Outlined"; font-style: normal; font-weight: 400;
  font-display: block; src: url("material-icons-outlined.woff2") format("woff2"); }
.material-icons, .material-icons-outlined { font-weight: normal; font-style: normal;
  font-size: 24px; line-height: 1; letter-spacing: normal; text-transform: none;
  display: inline-block; white-space: nowrap; word-wrap: normal; direction: ltr;
  font-feature-settings: "liga"; -webkit-font-smoothing: antialiased; }
.material-icons { font-family: "Material Icons"; }
.material-icons-outlined { font-family: "Material Icons Outlined"; }
"""

_TYPES = {".css": "text/css; charset=utf-8", ".woff2": "font/woff2"}


def offline_page(html: bytes) -> bytes:
    """LIT's ``index.html`` with the outside stylesheets replaced by the local one."""
    local = f'<link href="{PREFIX}icons.css" rel="stylesheet">\n  '.encode()
    page, count = OUTSIDE_STYLESHEET.subn(b"", html)
    if count == 0:
        return html
    return page.replace(b"<head>", b"<head>\n  " + local, 1)


class OfflineFonts:
    r"""LIT's WSGI application, serving its page and icon fonts without outside requests.

    Args:
        app (Callable): LIT's application (``lit_nlp.app.LitApp``); its attributes stay
                    reachable through this wrapper.
    """

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        if path.startswith(PREFIX):
            return self._static(path[len(PREFIX):], start_response)
        if path.rstrip("/") in ("", "/index.html"):
            return self._page(environ, start_response)
        return self._without_traceback(environ, start_response)

    def _without_traceback(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        """LIT's answer, but an error's (status 500) body cut to its first line: LIT appends
        the Python traceback, with the server's file paths, to what it sends the browser."""
        captured: dict[str, Any] = {}

        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:
            captured.update(status=status, headers=headers)
            return lambda data: None

        body = b"".join(self.app(environ, keep))
        status, headers = captured["status"], captured["headers"]
        if status.startswith("500"):
            text = body.decode("utf-8", "replace").split("\n\nDetails:", 1)[0].strip()
            body = (text.splitlines()[0] if text else "Internal error").encode()
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(body))))
        start_response(status, headers)
        return [body]

    def _static(self, name: str, start_response: Callable) -> Iterable[bytes]:
        if name == "icons.css":
            body = ICONS_CSS.encode()
        elif "/" not in name and name.endswith(".woff2") and (FONTS / name).is_file():
            body = (FONTS / name).read_bytes()
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"Not found"]
        start_response("200 OK", [("Content-Type", _TYPES[Path(name).suffix]),
                                  ("Content-Length", str(len(body))),
                                  ("Cache-Control", "max-age=3600")])
        return [body]

    def _page(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        captured: dict[str, Any] = {}

        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:
            captured.update(status=status, headers=headers)
            return lambda data: None

        body = b"".join(self.app(environ, keep))
        if captured.get("status", "").startswith("200"):
            body = offline_page(body)
        headers = [(k, v) for k, v in captured.get("headers", []) if k.lower() != "content-length"]
        start_response(captured.get("status", "200 OK"), [*headers, ("Content-Length", str(len(body)))])
        return [body]
