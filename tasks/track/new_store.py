"""A new embedded MLflow store, made from a copy of an empty one.

MLflow makes a new SQLite store by running its schema's migrations one after another:
about 2-3 s of CPU, and with a commit and a disk sync each, up to 10 s on a busy disk,
paid by every new project, every `tfscale run` in a fresh directory. tfscale keeps one
empty store per MLflow version in the user's cache directory (`$XDG_CACHE_HOME/tfscale`,
else `~/.cache/tfscale`), made by MLflow itself the first time, and copies it for each
new store (`seed`). The copy is what MLflow would have made here: its Default experiment
is given the artifact location and creation time MLflow gives it, and MLflow checks the
schema's version when it opens the store, as it does any store's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

DEFAULT_EXPERIMENT = 0  # MLflow's experiment id 0, "Default"


def cache_dir() -> Path:
    """Where tfscale keeps what it can make again: `$XDG_CACHE_HOME/tfscale`, else
    `~/.cache/tfscale`."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "tfscale"


def empty_store() -> Path:
    """The cached empty store of the installed MLflow version: made by MLflow (in a
    directory of its own beside it, moved into place whole) where it is not there yet."""
    import mlflow

    path = cache_dir() / f"mlflow-{mlflow.__version__}-empty.db"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        made = Path(tmp) / "empty.db"
        _made_by_mlflow(made)
        os.replace(made, path)  # two at once: each moves a whole store, the last stays
    return path


def _made_by_mlflow(path: Path) -> None:
    from mlflow import MlflowClient

    MlflowClient(f"sqlite:///{path}").search_experiments()  # MLflow creates and migrates it


def default_artifact_location() -> str:
    """Where MLflow puts the Default experiment's artifacts in a store it makes from this
    working directory (`./mlruns`, resolved)."""
    return str(Path(os.path.abspath("mlruns")) / str(DEFAULT_EXPERIMENT))


def seed(db: Path) -> None:
    """Makes `db`, which does not exist, a new empty MLflow store: a copy of `empty_store`
    written beside it and moved into place whole, its Default experiment set as MLflow
    sets it for a store made now, from here."""
    db.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{db.name}.", dir=db.parent)
    os.close(fd)
    try:
        shutil.copyfile(empty_store(), name)
        now = int(time.time() * 1000)
        with contextlib.closing(sqlite3.connect(name)) as store, store:
            store.execute(
                "UPDATE experiments SET artifact_location = ?, creation_time = ?,"
                " last_update_time = ? WHERE experiment_id = ?",
                (default_artifact_location(), now, now, DEFAULT_EXPERIMENT),
            )
        os.replace(name, db)
    finally:
        Path(name).unlink(missing_ok=True)
