"""The temporary Prefect API that `tfscale run` and `tfscale sweep` boot during imports."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import requests
from helpers import scaled

from tfscale.flows import prefect_api
from tfscale.flows.errors import ServerUnavailable

pytestmark = pytest.mark.integration


def test_temporary_api_answers_points_prefect_at_itself_and_stops():
    from prefect.settings import PREFECT_API_URL

    assert PREFECT_API_URL.value() is None
    with prefect_api.temporary_api() as api:
        api.wait()
        assert requests.get(f"{api.url}/health", timeout=scaled(5)).ok
        assert PREFECT_API_URL.value() == api.url
    assert api.process.poll() is not None  # stopped with the block
    assert PREFECT_API_URL.value() is None


def test_a_server_that_exits_is_reported_with_its_log_and_the_fix(monkeypatch):
    def dies(port, log):
        script = "print('address already in use'); raise SystemExit(3)"
        return subprocess.Popen([sys.executable, "-c", script], stdout=log)

    monkeypatch.setattr(prefect_api, "_start_server", dies)
    with pytest.raises(ServerUnavailable) as error:
        with prefect_api.temporary_api() as api:
            api.wait(timeout_s=scaled(30))
    message = str(error.value)
    assert "exited with code 3" in message
    assert "address already in use" in message
    assert "PREFECT_API_URL" in message


def test_a_configured_server_is_used_as_is():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        with prefect_api.temporary_api() as api:
            api.wait()
            assert api.process is None
            assert PREFECT_API_URL.value() == "http://127.0.0.1:4200/api"


def test_a_stop_that_prefect_turned_into_its_own_error_ends_as_the_stop():
    """A SIGTERM landing as a task run is being created: Prefect's handler raises
    `TerminationSignal`, its task engine fails to record the crash ("Task run is not set")
    and never sends the signal on. The block ends as the stop (exit 143 in the CLI), the
    server stopped with it; another error passes as it is."""
    from prefect.exceptions import TerminationSignal

    from tfscale.tasks.core.process import Stopped

    with pytest.raises(Stopped) as stop:
        with prefect_api.temporary_api() as api:
            api.wait()
            try:
                raise TerminationSignal(signal.SIGTERM)
            except TerminationSignal:
                raise ValueError("Task run is not set")  # noqa: B904 (as Prefect raises it)
    assert stop.value.exit_code == 128 + signal.SIGTERM
    assert api.process.poll() is not None

    with pytest.raises(ValueError):
        with prefect_api.temporary_api() as api:
            try:
                raise KeyError("not a signal")
            except KeyError:
                raise ValueError("another error") from None


@pytest.mark.unit
def test_a_lost_bind_is_seen_behind_a_long_failed_shutdown(tmp_path):
    """Uvicorn logs the failed bind, then Prefect's shutdown can fail with a traceback
    longer than the error's tail (seen in CI): the start is still one to try again."""
    api = prefect_api.TemporaryAPI(log=tmp_path / "api.log")
    shutdown = "  File 'triggers.py', line 58, in stop\n" * 200
    api.log.write_text(f"[Errno 98] address already in use\n{shutdown}AssertionError\n")
    api.process = type("Exited", (), {"poll": lambda self: 3})()
    assert "address already in use" not in api.log_tail()
    assert api.crowded_out()
