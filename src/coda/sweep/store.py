"""Finished cells on disk, each under a key of everything that determines its result.

A cell's key hashes its configuration (which the caller makes complete: the simulator config with
its seed, the workload's identity, the cost profile's content) together with Coda's version and a
hash of its source files, so a rerun finds exactly the cells whose inputs are unchanged and
recomputes every other one.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from coda import __version__
from coda.shell import strict_json


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(config: Mapping[str, Any]) -> bytes:
    """``config`` as JSON with sorted keys: equal configurations give equal bytes."""
    return msgspec.json.encode(msgspec.json.decode(strict_json.dumps(config)), order="sorted")


@functools.cache
def code_digest() -> str:
    """A hash of Coda's own source files: a development checkout edited without a version bump
    still gets new keys, so a rerun never reads back what older code computed."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def file_digest(path: str | Path) -> str:
    """A hash of one source file (an evaluation script's, for the keys of the cells it computes)."""
    return _digest(Path(path).read_bytes())[:16]


def cell_key(config: Mapping[str, Any]) -> str:
    """The store key of a cell: a hash of its configuration, Coda's version and its source."""
    return _digest(canonical({"coda_version": __version__, "coda_code": code_digest(), "config": config}))[:32]


def profile_digest(name_or_path: str | Path) -> str:
    """A hash of a cost profile's content (a built-in name or a file), so editing a profile file
    under the same name changes the key of every cell that reads it."""
    from coda.cost.profile import profile_data

    return _digest(canonical(profile_data(name_or_path)))[:16]


def workload_identity(spec: str, fmt: str | None = None) -> dict[str, Any]:
    """What identifies a workload: a synth spec is its own identity (the generator is Coda's, so
    its version is in the key); a file is identified by a hash of its bytes."""
    if spec.startswith("synth"):
        return {"spec": spec}
    path = Path(spec)
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return {"file": path.name, "format": fmt, "sha256": h.hexdigest()}


class CellStore:
    """Results of finished cells as gzipped JSON files named by key under ``root``; each file
    holds the cell's label and configuration too, so a stored result says what produced it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json.gz"

    def get(self, key: str) -> Any | None:
        """The stored result of ``key``, or None (also for a file left unreadable by a killed run)."""
        path = self._path(key)
        if not path.exists():
            return None
        try:
            with gzip.open(path, "rb") as fh:
                return msgspec.json.decode(fh.read())["result"]
        except (OSError, EOFError, msgspec.DecodeError, KeyError):
            return None

    def put(self, key: str, label: str, config: Mapping[str, Any], result: Any) -> None:
        """Store ``result`` atomically: a run killed mid-write leaves no partial file under the key."""
        self.root.mkdir(parents=True, exist_ok=True)
        payload = strict_json.dumps({"key": key, "label": label, "config": config, "result": result}).encode()
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
                fh.write(payload)
            os.replace(tmp, self._path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
