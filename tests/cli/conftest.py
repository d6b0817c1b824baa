"""What the command-line tests share: weights that must not load, and the one-line error."""

from __future__ import annotations

import pytest

import captum_ffb.explained.models


def _refuse(*args, **kwargs):
    raise AssertionError("the weights were loaded")


@pytest.fixture()
def no_weights(monkeypatch):
    """Loading weights becomes an error that is no user error (it would end in a traceback),
    so a test shows that a check comes before the weights load."""
    monkeypatch.setattr(captum_ffb.explained.models, "load_model", _refuse)


@pytest.fixture()
def no_model(monkeypatch):
    """As :func:`no_weights`, and reading the model's configuration is refused too."""
    monkeypatch.setattr(captum_ffb.explained.models, "model_config", _refuse)
    monkeypatch.setattr(captum_ffb.explained.models, "load_model", _refuse)
