"""Errors of the orchestration layer (kept apart so the CLI can catch them cheaply)."""


class ServerUnavailable(RuntimeError):
    """No reachable Prefect server to serve deployments against."""
