"""Where the viz tests find headless Chromium and its driver, and why they skip without them."""

from __future__ import annotations

import importlib.util
import shutil

CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)),
                None)
CHROMEDRIVER = shutil.which("chromedriver")


def missing() -> str | None:
    """Why Chromium cannot be driven here (``None``: it can)."""
    if importlib.util.find_spec("selenium") is None:
        return "driving Chromium needs selenium (it comes with [dev])"
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "Chromium and its driver are not installed (apt-get install chromium chromium-driver)"
    return None
