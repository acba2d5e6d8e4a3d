"""Starting Prefect's temporary API server while TensorFlow imports.

With no PREFECT_API_URL, a flow's first API call starts a temporary server and waits
for it (about 6-9 s on 2 cores). `tfscale run` and `tfscale sweep` start it in a thread
first, so the server boots in its own process while this one imports TensorFlow.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


def _start() -> None:
    from prefect.server.api.server import SubprocessASGIServer

    SubprocessASGIServer().start()  # the same instance the flow's client asks for


@contextmanager
def api_starting_in_background() -> Iterator[None]:
    """Boots the temporary server during the block; it is up (or failed) when the block ends.

    A server given by PREFECT_API_URL is left alone. A failed start is not raised here:
    the flow's own client retries it and reports the error in Prefect's words.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        yield
        return

    def start() -> None:
        try:
            _start()
        except Exception:  # noqa: S110 - the flow's own start retries and reports it
            pass

    thread = threading.Thread(target=start, name="prefect-api-start", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
