"""A run's folder: its settings (``run.json``) and one shard per finished batch.

Shards are written atomically (a temporary file, flushed, then renamed), so a shard on disk
is always complete; a run with other settings in the same folder is refused unless asked to
overwrite it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from captum_ffb.io.files import atomic_open, check_out_dir, to_json


def atomic_write(path: Path, write: Callable[[Any], None], binary: bool = True) -> None:
    """Write ``path`` through a temporary file that is flushed to disk and renamed once
    complete (:func:`captum_ffb.io.files.atomic_open`)."""
    with atomic_open(path, "wb" if binary else "w", fsync=True) as handle:
        write(handle)


class ShardStore:
    r"""The shards of one run in ``folder/shards/`` and its settings in ``folder/run.json``.

    Args:
        folder (str or Path): the run's output folder (created if needed).
        version (int): the shard format; shards of another version count as missing.
    """

    def __init__(self, folder: str | os.PathLike, version: int = 1) -> None:
        self.folder = check_out_dir(folder, "the run folder")
        self.shards = self.folder / "shards"
        self.version = version

    def check(self, settings: dict[str, Any], overwrite: bool = False) -> bool:
        """Whether the folder holds a run with other ``settings`` (to be discarded with
        ``overwrite``); a ``ValueError`` without ``overwrite``. Nothing is written, so that a
        refused run leaves the finished one as it was."""
        run_file = self.folder / "run.json"
        if not run_file.exists():
            return False
        try:
            previous = json.loads(run_file.read_text(encoding="utf-8")).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            previous = None
        if previous == settings["fingerprint"]:
            return False
        if not overwrite:
            raise ValueError(f"{self.folder} holds a run with other settings or data; use another "
                             "--out or --overwrite")
        return True

    def open(self, settings: dict[str, Any], overwrite: bool = False) -> None:
        """Start or resume the run with these ``settings`` (must hold a ``fingerprint``)."""
        stale = self.check(settings, overwrite)
        self.folder.mkdir(parents=True, exist_ok=True)
        if stale:
            shutil.rmtree(self.shards, ignore_errors=True)
        self.shards.mkdir(exist_ok=True)
        text = to_json(settings, indent=2, default=str)
        atomic_write(self.folder / "run.json", lambda h: h.write(text), binary=False)

    def path(self, index: int) -> Path:
        return self.shards / f"batch-{index:05d}.npz"

    def save(self, index: int, shard: dict[str, np.ndarray]) -> None:
        """Write one batch's shard (atomically)."""
        shard = {**shard, "shard_version": np.asarray(self.version), "shard_index": np.asarray(index)}
        atomic_write(self.path(index), lambda h: np.savez(h, **shard))

    def load(self, index: int) -> dict[str, np.ndarray] | None:
        """One shard, or ``None`` if it is missing, unreadable (truncated, damaged) or of
        another version: such a batch is computed again."""
        try:
            with np.load(self.path(index), allow_pickle=False) as data:
                shard = {key: data[key] for key in data.files}
        except Exception:  # any unreadable file: BadZipFile, EOFError, zlib.error, ...
            return None
        if int(shard.pop("shard_version", -1)) != self.version:
            return None
        if int(shard.pop("shard_index", -1)) != index:
            return None
        return shard

    def done(self, count: int) -> set[int]:
        """The batches among ``range(count)`` whose shard is on disk and readable."""
        return {k for k in range(count) if self.load(k) is not None}

    def load_all(self, count: int) -> list[dict[str, np.ndarray]]:
        """Every shard, in batch order; an error if one is missing."""
        shards = [self.load(k) for k in range(count)]
        missing = [k for k, shard in enumerate(shards) if shard is None]
        if missing:
            raise RuntimeError(f"batch shards {missing[:5]} are missing; run the command again")
        return shards
