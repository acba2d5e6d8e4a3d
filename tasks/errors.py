"""The one error type for what users cause, and the kinds of it.

Every error a user can trigger (a bad config, a missing dataset, a damaged shard, a dead
worker, an unreachable server, a batch larger than the data) is a `UserError`: it says
what is wrong (`message`) and what to do about it (`fix`). The `tfscale` command prints
both on one line each and exits with `exit_code` (2 for config and usage errors, 1 for
failures at run time); `--debug` shows the traceback too. Anything else is a bug.
"""

from __future__ import annotations


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
