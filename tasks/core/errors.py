"""The one error type for what users cause, and the kinds of it.

Every error a user can trigger (a bad config, a missing dataset, a damaged shard, a dead
worker, an unreachable server, a batch larger than the data) is a `UserError`: it says
what is wrong (`message`) and what to do about it (`fix`). The `tfscale` command prints
both on one line each and exits with `exit_code` (2 for config and usage errors, 1 for
failures at run time); `--debug` shows the traceback too. A full disk or a read-only or
forbidden directory, met by Python or by TensorFlow, becomes one (`system_error`).
Anything else is a bug.
"""

from __future__ import annotations

import errno
import re


class UserError(Exception):
    """Something the user can fix."""

    exit_code = 1

    def __init__(self, message: str, fix: str = ""):
        super().__init__(message)
        self.message, self.fix = message, fix

    def __str__(self) -> str:
        return f"{self.message}; {self.fix}" if self.fix else self.message


class UsageError(UserError):
    """A config value or a flag is wrong: exit code 2."""

    exit_code = 2


class MissingInput(UserError, FileNotFoundError):
    """An input a step needs (shards, a model, a run's metrics) is not there."""

    def __init__(self, message: str, fix: str = ""):
        UserError.__init__(self, message, fix)


# operating-system failures a user fixes by pointing tfscale elsewhere: errno, the text
# TensorFlow's own file errors carry instead, and what to say
_SYSTEM = (
    (errno.ENOSPC, "No space left on device", "the disk is full"),
    (errno.EDQUOT, "Disk quota exceeded", "the disk quota is used up"),
    (errno.EROFS, "Read-only file system", "the directory is on a read-only file system"),
    (errno.EACCES, "Permission denied", "the directory is not writable"),
)
_SYSTEM_FIX = (
    "free space or make it writable, or point --data-dir (prepare) or --runs-dir "
    "(training) at a directory that is; finished shards and checkpoints are kept and the "
    "next run resumes from them."
)


def system_error(exc: BaseException) -> UserError | None:
    """The `UserError` for a full disk or a read-only or forbidden directory, whether
    Python (an `OSError`) or TensorFlow (its own error types) met it, or for a corrupted
    record TensorFlow met reading a shard; None otherwise."""
    code = exc.errno if isinstance(exc, OSError) else None
    text = str(exc)
    if type(exc).__name__ == "DataLossError" or "corrupted record at" in text:
        found = re.search(r"corrupted record at \d+", text)
        where = found.group(0) if found else text.splitlines()[0][:200] if text else ""
        return UserError(
            f"a shard holds a corrupted record, met while reading it ({where})",
            "find it with 'tfscale verify', then write it again with 'tfscale prepare --force'",
        )
    for number, marker, what in _SYSTEM:
        if code == number or marker in text:
            where = getattr(exc, "filename", None) or text.split(";")[0].strip()
            return UserError(f"{what} ({marker}): {where}", _SYSTEM_FIX)
    return None
