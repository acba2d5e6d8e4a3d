"""One process at a time per run directory: two runs of one configuration in one checkout
would resume each other's checkpoints and measure while each took half the machine from
the other. The lock is a file beside the run directory, held with `flock` (the kernel
releases it when its holder ends, however it ends), and says who holds it.

Ownership: `hold` takes the lock for the block it wraps; a process that already holds a
directory's lock passes through (training, then its diagnosis, in one process). `waited`
is the same kind of lock for a short step that a second process waits for rather than
refuses (the embedded MLflow store's making, `tasks.track.tracking`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tfscale.tasks.core.errors import UserError

_HELD: set[Path] = set()


class RunInUse(UserError):
    """Another process is training or measuring in the same run directory."""


def lock_path(run_dir: Path) -> Path:
    """`runs/<dataset>/.<name>.lock`: beside the directory, which a fresh run deletes."""
    return run_dir.parent / f".{run_dir.name}.lock"


@contextlib.contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    """The run directory's lock for the block.

    Raises:
        RunInUse: another live process holds it, naming that process and the fix.
    """
    key = run_dir.resolve()
    if key in _HELD:
        yield
        return
    path = lock_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RunInUse(
                f"run directory {run_dir} is in use by {holder}",
                "wait for that run to finish, or give this one its own --runs-dir.",
            ) from None
        handle.seek(0)
        handle.truncate()
        started = time.strftime("%H:%M:%S")
        command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {started}: {command}")
        handle.flush()
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)
            handle.truncate(0)  # released: a later reader finds no holder's name


@contextlib.contextmanager
def waited(path: Path) -> Iterator[None]:
    """The lock file `path` for the block, once any other holder has let it go."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
