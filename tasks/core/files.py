"""Writing a file so that a reader never sees half of it: write beside it, then rename."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` to write to; renamed over `path` when the block
    ends, removed if it raised (an interrupted write leaves the old file or none)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json_atomic(path: Path, value: Any) -> Path:
    return write_text_atomic(path, json.dumps(value, indent=2, default=str))
