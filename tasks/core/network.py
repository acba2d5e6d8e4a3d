"""Free localhost ports and waiting for a server's health check: one way each."""

from __future__ import annotations

import time
from collections.abc import Callable


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct free localhost ports (portpicker remembers what it handed out)."""
    import portpicker

    return [portpicker.pick_unused_port() for _ in range(n)]


def bind_problem(host: str, port: int) -> str | None:
    """Why a server cannot bind `host:port`: `in use` (something listens there), or the
    system's reason (an address this machine does not have, a name that does not resolve,
    a port it may not take); None where it can."""
    import errno
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use"
            return exc.strerror or str(exc)
    return None


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens on `host:port` (a server cannot bind there)."""
    return bind_problem(host, port) == "in use"


def wait_healthy(
    url: str,
    timeout_s: float,
    interval_s: float = 0.2,
    alive: Callable[[], bool] = lambda: True,
) -> str | None:
    """Polls `url` until it answers with a 2xx status: None then, else why not (the last
    error, a timeout, or the server's process ending: `alive()` false)."""
    import requests

    deadline = time.monotonic() + timeout_s
    problem = f"no answer in {timeout_s:.0f} s"
    while time.monotonic() < deadline:
        if not alive():
            return "its process ended"
        try:
            requests.get(url, timeout=min(5.0, timeout_s)).raise_for_status()
            return None
        except requests.RequestException as exc:
            problem = str(exc)
        time.sleep(interval_s)
    return problem


def host_name(toward: str | None = None) -> str:
    """This host as a table names it: its host name, and with `toward` (a URL of a server
    other hosts reach too) the address it reaches that server from, which tells apart hosts
    that share a name (containers, network namespaces)."""
    import socket
    from urllib.parse import urlsplit

    name = socket.gethostname()
    server = urlsplit(toward).hostname if toward else None
    if not server:
        return name
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((server, 9))  # a datagram socket sends nothing on connect
            address = probe.getsockname()[0]
        except OSError:
            return name
    return name if address.startswith("127.") else f"{name} ({address})"
