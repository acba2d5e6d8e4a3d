"""Errors of the orchestration layer (kept apart so the CLI can catch them cheaply)."""

from tfscale.tasks.core.errors import UserError


class ServerUnavailable(UserError, RuntimeError):
    """No reachable Prefect server for what needs one (serve, a sweep on a work pool)."""
