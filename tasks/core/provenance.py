"""Which code made a result: a digest of the project's own sources and the versions of the
libraries that train (TensorFlow, Keras), so a cached result or a run directory is never
reused by code that would not have made it."""

from __future__ import annotations

import functools
import hashlib
from importlib.metadata import version
from pathlib import Path

# the packages whose sources make a result, and the libraries whose versions do
SOURCES = ("tasks", "flows")
LIBRARIES = ("tensorflow", "keras")


PROJECT = Path(__file__).resolve().parents[2]  # tasks/core/provenance.py -> the project


def source_files() -> list[Path]:
    """Every `.py` file of `SOURCES`, subpackages included, in a fixed order."""
    return [path for package in SOURCES for path in sorted((PROJECT / package).rglob("*.py"))]


@functools.cache
def code_version() -> str:
    """A short digest of every `.py` file of `SOURCES` (the copies this process imports)
    and the installed `LIBRARIES` versions: any edit to the code or upgrade changes it."""
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(str(path.relative_to(PROJECT)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    for name in LIBRARIES:
        digest.update(f"{name}=={version(name)}\0".encode())
    return digest.hexdigest()[:12]
