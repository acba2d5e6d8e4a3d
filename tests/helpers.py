"""Helpers the test modules share: tiny params, free ports, health waits."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

try:
    import pace
except ModuleNotFoundError:  # imported as tests.helpers, by a script a test's process runs
    from tests import pace

from tfscale.tasks.core.network import free_ports, wait_healthy
from tfscale.tasks.distribute.hardware import GpuInfo, HardwareReport

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEFAULTS = str(ROOT / "tests" / "support" / "defaults.yaml")  # --params: the defaults only
TINY = {
    "train.model": "mlp",
    "train.epochs": 2,
    "train.precision": "float32",
    "train.jit_compile": False,  # nothing for `auto` to measure (test_autotune measures)
    "train.replicas": 2,
    "train.strategy": "auto",
    # the measuring rounds after training, at a few blocks' effort: the tests that check
    # the measurement itself set their own (the defaults: 11 rounds of up to 300 steps)
    "train.measure_rounds": 3,
    "train.measure_steps": 30,
    # plain steps: the tests that read the gradient noise scale turn it on (test_study)
    "train.noise_scale": False,
}
# a run whose figures no claim of its test reads, at its least work: one measuring round of
# few steps, plain steps (no gradient noise scale recorded), no held-out evaluation while
# training (over `TINY`)
LEAST_WORK = {
    "train.measure_rounds": 1,
    "train.measure_steps": 10,
    "train.noise_scale": False,
    "evaluate.every_epochs": 0,
}
# the same with the rounds a speedup's t-interval needs (TINY's 3), for the tests that read
# how the speedup is made of its rounds, never how fast a step is
ROUNDS_AT_LEAST_WORK = {**LEAST_WORK, "train.measure_rounds": TINY["train.measure_rounds"]}


PACE = pace.current()  # how much slower than the reference machine (tests/suite.py)


# the longest a wait or subprocess inside one test may take, on the reference machine:
# below the per-test limit (tests/suite.py's TIMEOUT_S, 300 s), so that the wait's own
# message (which command, how long) comes first, not pytest-timeout's
INNER_LIMIT_S = 270


def scaled(seconds: float) -> float:
    """A wait or subprocess limit on the reference machine, scaled to this one's pace: a
    limit detects a hang, never a slow machine."""
    return seconds * PACE


def on_ci() -> bool:
    """Whether this is CI (`CI` true, as CI services set it; `CI=false` is not)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def needs(missing: str | None, what: str) -> None:
    """Skips the calling test where `missing` says what this machine lacks; on CI (where
    nothing is skipped) fails it, naming `what` it needs."""
    import pytest

    if missing and on_ci():
        pytest.fail(f"CI needs {what}: {missing}")
    if missing:
        pytest.skip(missing)


def free_port() -> int:
    """A port free now: another process may bind it before the server started on it does;
    start servers through `on_a_free_port`, which starts them again on another."""
    return free_ports(1)[0]


ADDRESS_IN_USE = ("address already in use", "errno 98")


def on_a_free_port(
    start: Callable[[int], subprocess.Popen], up: Callable[[int, subprocess.Popen], str | None]
) -> tuple[int, subprocess.Popen]:
    """A server started by `start(port)` on a free port and serving (`up(port, process)`:
    None, else why not, with what the process printed), started again on another port when
    it lost its port to another process between the port's choice and its bind (it says
    the address is in use), at most 3 times; any other failure fails at once."""
    for attempt in range(1, 4):
        port = free_port()
        process = start(port)
        problem = up(port, process)
        if problem is None:
            return port, process
        if process.poll() is None:
            process.kill()
        process.wait(timeout=scaled(30))
        lost = any(words in problem.lower() for words in ADDRESS_IN_USE)
        if not lost or attempt == 3:
            raise AssertionError(f"the server on port {port} did not start: {problem}")
    raise AssertionError("unreachable")


LEAKY = ("MLFLOW_TRACKING_URI", "PREFECT_API_URL")  # what a test's flow run or store sets


@contextlib.contextmanager
def tracking_and_api_restored():
    """MLflow's tracking URI (its variable and the process-wide one `set_tracking_uri`
    keeps) and `PREFECT_API_URL` put back as the block found them, whatever it set: a flow
    run sets the API URL to its own server (`flows.prefect_api`), and the next test in the
    worker would otherwise talk to a server that is gone, or track into another test's
    store (conftest's `tracking_and_api_as_found` wraps every test in it)."""
    saved = {name: os.environ.get(name) for name in LEAKY}
    utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
    uri = getattr(utils, "_tracking_uri", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
        if utils is not None and utils._tracking_uri != uri:
            utils._tracking_uri = uri


PREFECT_DB = "prefect.db"  # Prefect's database in its home, unless told otherwise


def migrated_prefect_db() -> Path:
    """An empty Prefect database, migrated by Prefect itself (`prefect server database
    upgrade`), made once per Prefect version on this machine under a lock the suite's
    processes share: a server's first start in a new home runs those migrations, about
    17 s of CPU each time."""
    import shutil
    import tempfile
    from importlib.metadata import version

    from tfscale.tasks.core.run_lock import waited

    path = Path(tempfile.gettempdir()) / f"tfscale-tests-prefect-{version('prefect')}.db"
    with waited(Path(f"{path}.lock")):
        if not path.exists():
            with tempfile.TemporaryDirectory(dir=path.parent) as home:
                subprocess.run(
                    [str(BIN / "prefect"), "server", "database", "upgrade", "-y"],
                    env=dict(os.environ, PREFECT_HOME=home), capture_output=True, check=True,
                    timeout=scaled(INNER_LIMIT_S),
                )  # fmt: skip
                shutil.move(Path(home) / PREFECT_DB, f"{path}.new")
            os.replace(f"{path}.new", path)
    return path


def prefect_home(home: Path) -> Path:
    """`home`, made a Prefect home whose database is migrated already
    (`migrated_prefect_db`): what a server's first start there would make of it."""
    import shutil

    home.mkdir(parents=True, exist_ok=True)
    if not (home / PREFECT_DB).exists():
        shutil.copyfile(migrated_prefect_db(), home / PREFECT_DB)
    return home


def tiny_params(tmp: Path, **extra) -> Path:
    """A params.yaml for tiny, fast runs with every output under `tmp`."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["data_dir"] = str(tmp / "tfrecords")
    params["train"].update(
        {k.split(".")[1]: v for k, v in TINY.items()}, runs_dir=str(tmp / "runs")
    )
    params["sweep"].update(
        replicas=[1, 2], dataset_sizes=[256], model="mlp", epochs=1, out_dir=str(tmp / "sweep")
    )
    for key, value in extra.items():
        section, name = key.split(".")
        params[section][name] = value
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def clone_as_it_is(clone: Path) -> None:
    """A clone of this checkout as its working tree is, not as its last commit: HEAD, then
    each tracked file changed or deleted here and each untracked one git does not ignore,
    committed in the clone (its git status clean, as a fresh clone's). A clone of HEAD alone
    tested the last commit, never the change being made."""
    import shutil

    def git(*args: str, cwd: Path = ROOT) -> str:
        command = ["git", "-c", "user.name=tests", "-c", "user.email=tests@localhost", *args]
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True)
        return done.stdout

    git("clone", "-q", str(ROOT), str(clone))
    changed = git("ls-files", "-z", "--modified", "--others", "--exclude-standard").split("\0")
    deleted = set(git("ls-files", "-z", "--deleted").split("\0"))
    for name in filter(None, changed):
        if name not in deleted:
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    for name in filter(None, deleted):
        (clone / name).unlink(missing_ok=True)
    if git("status", "--porcelain", cwd=clone):
        git("add", "-A", cwd=clone)
        git("commit", "-q", "-m", "the working tree as the tests found it", cwd=clone)


def wait_until_healthy(url: str, timeout_s: float = 120) -> None:
    """Polls `<url>/health` until the server answers, for at most `timeout_s` (scaled to the
    machine's pace)."""
    timeout_s = scaled(timeout_s)
    problem = wait_healthy(f"{url}/health", timeout_s, interval_s=0.5)
    assert problem is None, f"{url}/health did not answer within {timeout_s:.0f} s: {problem}"


def slowed(dataset, seconds: float):
    """`dataset` of (images, labels) batches with `seconds` of extra work per batch: an
    input pipeline slowed on purpose, as on a host that reads or decodes slowly."""
    import time

    import tensorflow as tf

    def slow(images):
        time.sleep(seconds)
        return images

    def apply(images, labels):
        out = tf.py_function(slow, [images], images.dtype)
        out.set_shape(images.shape)
        return out, labels

    return dataset.map(apply)


_EXECVE = os.execve


class StandInTerminal(io.StringIO):
    """A captured stream that says it is a terminal (`isatty()`): what a progress bar asks
    before it shows (tqdm, `tasks.core.progress`), where the test session's streams are
    none. (A bar on a real pseudo-terminal: tests/track/test_tracking.py.)"""

    def isatty(self) -> bool:
        return True


def run_main(
    argv: list[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    on_error: Callable[[Exception], None] | None = None,
    terminal: bool = False,
) -> tuple[int, str, str]:
    """`tfscale ARGV` as `flows.cli.main` runs it, in this process: in `cwd` with `env` set,
    its standard streams and log lines captured, `on_error` told of each error it reports;
    the working directory, environment and logging put back after. (A process of its own
    costs a TensorFlow import; a test pays for one only where the process is the claim.)
    With `terminal`, its captured standard error stands in for a terminal (`StandInTerminal`).

    MLflow and Prefect set up their logging once, when first imported, closing every
    handler they find: they are imported here first, before any stream is redirected."""
    import tfscale.flows.prefect_api  # noqa: F401
    import tfscale.tasks.track.tracking  # noqa: F401
    from tfscale.flows import cli

    report = cli._report

    def reported(exc):
        if on_error:
            on_error(exc)
        return report(exc)

    def no_exec(*args):  # `tfscale ui` would replace the test session with a server
        raise AssertionError(f"tfscale {' '.join(argv)} went on to start {args[1][:4]}")

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    saved_log = (root.handlers[:], root.level)
    out, err = io.StringIO(), (StandInTerminal() if terminal else io.StringIO())
    try:
        os.chdir(cwd)
        os.environ.update(env or {})
        cli._report, os.execve = reported, no_exec
        root.handlers[:] = []  # `main` sets up its own, and closes those it finds (pytest's)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code
    finally:
        cli._report, os.execve = report, _EXECVE
        os.chdir(saved_cwd)
        for name in set(os.environ) - set(saved_env):  # key by key: a thread may fork
            del os.environ[name]
        for name, value in saved_env.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        root.handlers[:], root.level = saved_log
    return code, out.getvalue(), err.getvalue()


PLAIN_CPU = ["avx2", "avx512f", "fma"]


def report(gpus=(), flags=PLAIN_CPU, tpu=None, cluster=None) -> HardwareReport:
    """A hardware report of an 8-core CPU with `flags`, and GPUs of the given compute
    capabilities (the narrowest boundary a GPU or TPU path is tested at)."""
    return HardwareReport(
        "test cpu",
        8,
        list(flags),
        [GpuInfo(f"gpu{i}", cc) for i, cc in enumerate(gpus)],
        tpu,
        cluster,
    )


def run_of(config, manifest, data_dir: str, choice, flags=()):
    """A `Run` of these parts, on a CPU with `flags` (`report`): what the measuring steps
    take (`diagnose_run`, `measure_rounds`)."""
    from tfscale.tasks.distribute.run import Run

    return Run(config, manifest, data_dir, choice, report(flags=flags))


def tfscale(args: list[str], cwd: Path, env: dict | None = None, check: bool = True):
    """The installed `tfscale` command run to its end, its output captured."""
    proc = subprocess.run(
        [str(BIN / "tfscale"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        timeout=scaled(INNER_LIMIT_S),
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def epoch_history(*rates: float) -> list[dict]:
    """A training's history of one-second epochs at these examples/s (epoch 1 first)."""
    return [
        {"epoch": i, "examples_per_s": r, "seconds": 1.0, "accuracy": 0.5}
        for i, r in enumerate(rates, 1)
    ]


def train_result(**changes):
    """A `TrainResult` of one device at batch 16 (rate 0.001, 10 steps an epoch) with no
    figures measured, each field in `changes` set: the summaries' tests build their pairs
    from it."""
    from tfscale.tasks.train.result import TrainResult

    one_device = TrainResult(
        run_dir="b",
        model_path="b",
        strategy="one_device",
        reason="",
        replicas=1,
        workers=1,
        precision="float32",
        per_replica_batch=16,
        global_batch=16,
        grad_accum_steps=1,
        learning_rate=0.001,
        steps_per_epoch=10,
    )
    return dataclasses.replace(one_device, **changes)


def _continued(lines: list[str], i: int, first: str, indent: str) -> str:
    """Line `i`'s text `first`, and the lines after it that start with `indent` (its
    continuations, wrapped within 100 columns), joined by spaces."""
    parts = [first.strip()]
    for more in lines[i + 1 :]:
        if not more.startswith(indent) or not more.strip():
            break
        parts.append(more.strip())
    return " ".join(parts)


def stage_lines(out: str, name: str) -> list[str]:
    """Each status line of the stage `name` in a command's output (`name` padded to 11,
    its text wrapped within 100 columns, each continuation under the text's column:
    `progress.status_line`), its continuations joined by spaces, without the name."""
    lines = out.splitlines()
    return [
        _continued(lines, i, line[12:], " " * 12)
        for i, line in enumerate(lines)
        if line.startswith(f"{name:<11} ")
    ]


def console_row(out: str, label: str) -> str:
    """The value of the summary's row `label` in a command's output, its lines (wrapped
    within the console's 100 columns, each continuation under the value's column) joined
    by spaces; "" where no row has that label."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"{label}  ") or line == label:
            return _continued(lines, i, line[len(label) :], "  ")
    return ""
