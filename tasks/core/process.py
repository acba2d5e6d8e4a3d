"""Process-wide state, set in one place.

TensorFlow, Keras and Prefect keep state per process: the C++ log level and Prefect's
telemetry switch (read when they are imported), log levels, GPU memory growth and logical
CPU devices (fixed once TensorFlow starts), and Keras's global dtype policy. Each is set
here and nowhere else:

- `set_up_process()` once at each process entry (the `tfscale` command, a deployment's
  flow run, the test session), before TensorFlow or Prefect is imported; worker
  processes inherit its environment from the command that launches them; then
  `import_tensorflow()` where TensorFlow is first needed, so its start-up lines stay
  off the console;
- `console()` around work started from a process whose entry is not tfscale's (a
  notebook's `study`): the same console for the block, the caller's after it;
- `set_up_devices(choice.logical_cpus)` once the strategy is chosen, before TensorFlow
  starts: the logical CPU devices, each with its share of the cores (`share_cores`);
- `set_up_worker(core, threads)` at a worker process's entry: its core and its share of
  threads;
- `fail_fast_rpcs()` before a parameter-server coordinator starts;
- `wait_for_peers_at_exit(timeout_s)` once the process joins a collective cluster
  (MultiWorkerMirrored): `exit_now` then ends it only when every task is done;
- `stops_noted()` around long work in the main thread (a training), which then
  `raise_if_stopped()` at each step: a stop whose exception was swallowed on its way
  still ends the work; `stop_scope()` around a command, which checks at its end;
- `use_precision(policy)` before a training run builds its model (a sweep changes it
  between cells);
- `collector_paused()` around a process's first import of TensorFlow (`import_tensorflow`;
  a worker process's set-up and imports; `startup_imports()` for a flow's module, which
  leaves the collector alone where TensorFlow was imported already): Python's garbage
  collector paused for them, and what they made frozen after, a quarter of the import's
  CPU saved.

Two blocks change process-wide state for their own span, elsewhere, and put it back:
`flows.prefect_api.temporary_api()` points PREFECT_API_URL at the server it owns
(`tasks.core.servers`) and, should the server die, quiets Prefect's clients and logging;
`console()` above swaps the console. The one change that stays is the user's own folder on
`sys.path` (`tasks.core.user_code`), where their model's and dataset's modules import
their siblings for as long as the process runs their code.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, NoReturn

from tfscale.tasks.core.errors import UserError

QUIET_ENVIRONMENT = {
    "TF_CPP_MIN_LOG_LEVEL": "3",  # TensorFlow's C++ notices (and cuInit on a GPU-less host)
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # database set-up, system-metric start and stop
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # no network here for telemetry
    # tfscale starts Prefect's server itself (flows.prefect_api); a flow called with no API
    # (the tests' in-process flows) has Prefect start its own, given a slow, busy
    # machine's start (Prefect waits 20 s, which 2 busy cores can exceed)
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}
VERBOSE_ENVIRONMENT = {**QUIET_ENVIRONMENT, "TF_CPP_MIN_LOG_LEVEL": "0"}
VERBOSE_VARIABLE = "TFSCALE_VERBOSE"  # worker processes and flow runs inherit the choice
NOISY_LOGGERS = ("tensorflow", "absl", "httpx")
# harmless warnings every run would print: a Keras model saved without a signature, and
# pip's version unknown to MLflow in a uv environment
HARMLESS_LOGGERS = ("mlflow.keras.save", "mlflow.utils.environment", "mlflow.models.model")
OWN_LOGGERS = ("tfscale",)  # its modules' loggers are tfscale.tasks.*, tfscale.flows.*
STATUS_MARK = "tfscale_status"  # set on status lines (tasks.core.progress)


class ConsoleFormat(logging.Formatter):
    """tfscale's own lines as they are; a library's with its level and name."""

    def format(self, record: logging.LogRecord) -> str:
        own = record.name.startswith(OWN_LOGGERS) or getattr(record, STATUS_MARK, False)
        if own and record.levelno == logging.INFO:
            return record.getMessage()
        return f"{record.levelname} {record.name}: {record.getMessage()}"


# TensorFlow's warning that a function was traced again: the diagnosis builds an epoch
# runner per configuration it compares, each traced once, on purpose
EXPECTED_WARNINGS = ("triggered tf.function retracing",)


# the messages of the user errors Prefect has reported (`_reports_user_error`)
_USER_ERRORS_REPORTED: set[str] = set()


def _reports_user_error(record: logging.LogRecord) -> bool:
    """Whether `record` is one of Prefect's errors that only reports a tfscale `UserError`
    raised in a task or flow ("Task run failed with exception: ModelError(...)", "Finished
    in state Failed(...)", "Encountered exception during execution: ..."): the command
    says that error itself, once, with its fix. Prefect's records of it carry the
    exception (`exc_info`), and the state's record after them its message: a message
    reported so is remembered. An error Prefect reports about anything else (a crash, its
    server) is not one."""
    if record.levelno < logging.ERROR or not record.name.startswith("prefect"):
        return False
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, UserError):
        _USER_ERRORS_REPORTED.add(exc.message)
        return True
    if exc is not None:
        return False
    text = record.getMessage()
    return any(message in text for message in _USER_ERRORS_REPORTED)


# Prefect's words for a run a stop ended (its crashed state's message): the command says
# the stop itself, once, with what it leaves (`Stopped`, `stopped_by_signals`)
_STOP_STATES = ("aborted by an interrupt signal", "aborted by a termination signal")


def _reports_a_stop(record: logging.LogRecord) -> bool:
    """Whether `record` is Prefect's report of a flow or task run that Ctrl-C or a signal
    stopped ("Crash detected! Execution was aborted by a termination signal.", and its
    Crashed state's line); kept in the run's own log on the server, off the console."""
    if not record.name.startswith("prefect"):
        return False
    exc = record.exc_info[1] if record.exc_info else None
    return isinstance(exc, KeyboardInterrupt) or any(
        text in record.getMessage() for text in _STOP_STATES
    )


def _quiet_console(record: logging.LogRecord) -> bool:
    """tfscale's own progress lines, and anyone's warnings and errors but the expected and
    Prefect's reports of a user error (`_reports_user_error`) or of a stop
    (`_reports_a_stop`)."""
    if record.levelno >= logging.WARNING:
        if _reports_user_error(record) or _reports_a_stop(record):
            return False
        return not any(text in record.getMessage() for text in EXPECTED_WARNINGS)
    return record.name.startswith(OWN_LOGGERS) or getattr(record, STATUS_MARK, False)


class Stopped(KeyboardInterrupt):
    """A stop by signal (SIGTERM, SIGHUP), raised in the main thread as Ctrl-C raises
    KeyboardInterrupt: every `finally` runs on the way out, so a command's servers stop
    with it. `exit_code` is the shell's for that signal (143 for SIGTERM)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.exit_code = signum, 128 + signum


class StopRequest:
    """The signal that stopped the process's work, once one has (`signum`): noted by
    `stopped_by_signals` and `stops_noted` blocks, whichever handler then has the signal.
    A stop's exception is raised once, wherever the main thread is then, and code that
    catches every exception can swallow it (seen once in 1,150 placements inside MLflow's
    store set-up; a Prefect flow run's `TerminationSignal` once in CI, the study trained
    on to its end): a wait checks `signum`, and long work `raise_if_stopped` at each of
    its steps, so a stop never depends on the exception arriving."""

    def __init__(self) -> None:
        self.signum: int | None = None


_STOPS = StopRequest()  # the process's own: the main thread alone sets it
_SCOPES = [0]  # how many stop scopes are open (`stop_scope`)


def forget_stops() -> None:
    """A stop the work honoured as asked (`tfscale ui` ends with 0 on SIGTERM) is not
    raised again at the command's end."""
    _STOPS.signum = None


def raise_if_stopped() -> None:
    """Raises `Stopped` once a stop was noted in this process whose exception did not end
    the work (`StopRequest`): at a training's next graph call, at a command's end."""
    if _STOPS.signum == 2:  # SIGINT: Ctrl-C's own exception
        raise KeyboardInterrupt
    if _STOPS.signum is not None:
        raise Stopped(_STOPS.signum)


@contextmanager
def stop_scope() -> Iterator[StopRequest]:
    """The span a noted stop belongs to: a command's (`flows.cli.main`), else the
    outermost `stopped_by_signals` or `stops_noted` block. A stop noted before it (an
    earlier command's in this process: a test's, a notebook's) is forgotten at its start,
    and its own at its end, so no later work meets it."""
    outermost = _SCOPES[0] == 0
    if outermost:
        forget_stops()
    _SCOPES[0] += 1
    try:
        yield _STOPS
    finally:
        _SCOPES[0] -= 1
        if outermost:
            forget_stops()


@contextmanager
def stops_noted() -> Iterator[None]:
    """For the block (in the main thread; elsewhere a signal cannot be handled), a SIGTERM
    or SIGHUP is noted in the process (`raise_if_stopped`) before the handler in place
    runs: a Prefect flow run's, which raises its `TerminationSignal`, `stopped_by_signals`'s,
    or the default action, sent again. An ignored signal stays ignored. The block ends in
    `Stopped` where a stop was noted and the block's work went on."""
    import signal
    import threading

    taken = {}

    def note(signum: int, frame: Any) -> None:
        _STOPS.signum = signum
        before = taken[signum]
        if callable(before):
            before(signum, frame)
        else:  # the default action, as if this block had not been
            signal.signal(signum, before)
            os.kill(os.getpid(), signum)

    with stop_scope():
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(signum) not in (signal.SIG_IGN, None):
                    taken[signum] = signal.signal(signum, note)
        try:
            yield
        finally:
            for signum, before in taken.items():
                signal.signal(signum, before)
        raise_if_stopped()


@contextmanager
def stopped_by_signals() -> Iterator[StopRequest]:
    """Within the block, SIGTERM and SIGHUP raise `Stopped` in the main thread, so that the
    block's `finally` (a server it owns) runs; their handlers are put back after. Only
    where the signals still have their default action and this is the main thread: a
    training's own handler (a preemption's checkpoint) is left alone, and so is a process
    whose main thread may wait in TensorFlow's C++ (a worker), which a Python handler
    could not interrupt where the default action ends it. Ctrl-C (SIGINT, where Python's
    own handler has it) still raises KeyboardInterrupt; every stop is also noted in the
    process's `StopRequest`, which the block gets."""
    import signal
    import threading

    def stop(signum: int, frame: object) -> None:
        _STOPS.signum = signum
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signum)

    taken = {}
    with stop_scope() as request:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
                if signal.getsignal(signum) is default:
                    taken[signum] = signal.signal(signum, stop)
        try:
            yield request
        finally:
            for signum, before in taken.items():
                signal.signal(signum, before)


def verbose() -> bool:
    return os.environ.get(VERBOSE_VARIABLE) == "1"


def set_up_process(verbose_output: bool | None = None) -> None:
    """Environment defaults (a value the user set wins) and the console's log handler.

    Quiet (the default): tfscale's own lines and every warning and error but Prefect's
    reports of a user error, which the command says once itself; library notices
    (Prefect's task states, MLflow's set-up, TensorFlow's C++ lines) are left out of the
    console (Prefect's own server still gets its flow-run logs, those reports too). Verbose
    (`--verbose`, or `TFSCALE_VERBOSE=1`): everything.
    """
    if verbose_output is None:
        verbose_output = verbose()
    if verbose_output:
        os.environ[VERBOSE_VARIABLE] = "1"
        os.environ.update(VERBOSE_ENVIRONMENT)
    else:
        for key, value in QUIET_ENVIRONMENT.items():
            os.environ.setdefault(key, value)
    logging.basicConfig(level=logging.INFO, handlers=[_console_handler(verbose_output)], force=True)
    _library_levels(verbose_output)


def _console_handler(verbose_output: bool) -> logging.Handler:
    handler = logging.StreamHandler()
    handler.setFormatter(ConsoleFormat())
    if not verbose_output:
        handler.addFilter(_quiet_console)
    return handler


def _library_levels(verbose_output: bool) -> None:
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in HARMLESS_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING if verbose_output else logging.ERROR)


@contextmanager
def console(verbose_output: bool = False) -> Iterator[None]:
    """The console of `set_up_process` for the block, in a process whose entry is not
    tfscale's (a notebook's kernel): the root logger's handlers and level, and the levels
    of the loggers it sets, are the caller's again after it, so a block entered again adds
    no handler. TensorFlow's logger keeps no handler of its own in the block: TensorFlow
    gives it one when it is first used before the root logger has one, and its lines
    (retracing warnings) would reach the notebook through it unfiltered, and twice."""
    if not verbose_output:
        for key, value in QUIET_ENVIRONMENT.items():
            os.environ.setdefault(key, value)
    root, tensorflow = logging.getLogger(), logging.getLogger("tensorflow")
    saved = root.handlers[:], root.level, tensorflow.handlers[:]
    named = {n: logging.getLogger(n) for n in NOISY_LOGGERS + HARMLESS_LOGGERS}
    levels = {n: logger.level for n, logger in named.items()}
    root.handlers[:], tensorflow.handlers[:] = [_console_handler(verbose_output)], []
    root.setLevel(logging.INFO)
    _library_levels(verbose_output)
    try:
        yield
    finally:
        for n, level in levels.items():
            named[n].setLevel(level)
        root.handlers[:], level, tensorflow.handlers[:] = saved
        root.setLevel(level)


def import_tensorflow() -> None:
    """Imports TensorFlow with its C++ start-up lines ("Could not find cuda drivers",
    "All log messages before absl::InitializeLog()") kept off the console: they are
    written to file descriptor 2 before any log level applies. A failed import shows
    them. Verbose runs show them always. The import, the process's first of TensorFlow,
    runs `collector_paused`."""
    import sys

    if "tensorflow" in sys.modules:
        return
    if verbose():
        with collector_paused():
            import tensorflow  # noqa: F401

        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink, collector_paused():
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def startup_imports() -> AbstractContextManager[None]:
    """`collector_paused` for a process's first import of TensorFlow (its start); where
    TensorFlow is imported already, a block that leaves the collector alone: a freeze then
    would keep for good whatever garbage the work so far left (a notebook's earlier
    studies, a sweep's cells)."""
    import sys

    return nullcontext() if "tensorflow" in sys.modules else collector_paused()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while the block imports (TensorFlow and
    Keras make 670,000 objects and leave 4,000 in cycles: the collector's passes over them
    were a quarter of the import's CPU, 1.9 of 7.4 CPU-s), then every object the collector
    tracks frozen (`gc.freeze`; the import's own cycles too, garbage from before the block
    collected first): the collector's later passes, while the process trains, skip the
    modules' objects for good. The collector's state as found after. For a process's
    start, where the collection before is of little (`startup_imports`)."""
    import gc

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


# the barrier's timeout of a process in a collective cluster (0: not in one)
_PEERS_AT_EXIT = {"timeout_s": 0.0}
EXIT_BARRIER = "tfscale-exit"


def wait_for_peers_at_exit(timeout_s: float) -> None:
    """A successful exit of this process (`exit_now(0)`) first waits, up to `timeout_s`,
    until every task of its collective cluster is done. The last all-reduce completes
    on one task while a peer still reads that all-reduce's buffers from it; a task that
    ended at once closed the socket under the peer's read ("Socket closed" on the peer,
    which then failed: 2 cluster tests of 17 in one suite run). TensorFlow's own teardown
    waits at such a barrier; `exit_now` skips that teardown."""
    _PEERS_AT_EXIT["timeout_s"] = timeout_s


def _wait_for_peers(code: int) -> None:
    timeout_s = _PEERS_AT_EXIT["timeout_s"]
    if code != 0 or not timeout_s:  # a failed task: its peers learn it from the cluster
        return
    from tfscale.tasks.core.internals import wait_for_cluster_tasks

    try:
        wait_for_cluster_tasks(EXIT_BARRIER, timeout_s)
    except Exception as exc:  # noqa: BLE001 (the work is done: a peer's own exit code tells)
        logging.getLogger(__name__).warning("not every cluster task finished: %s", exc)


def exit_now(code: int) -> NoReturn:
    """Ends the process as Python's own exit would (other threads joined, `atexit` handlers
    run, which shut logging down, and the standard streams flushed) but without freeing
    every object first: after a training that takes 2-3 s of TensorFlow teardown, with
    nothing left to save (every file is written and closed by then). A task of a
    collective cluster first waits for the others (`wait_for_peers_at_exit`)."""
    import sys
    import threading

    from tfscale.tasks.core.internals import run_exit_handlers

    _wait_for_peers(code)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader is gone
            pass
    os._exit(code)


def set_up_devices(logical_cpus: int = 0) -> None:
    """GPU memory growth, and the logical CPU devices a multi-replica CPU run needs
    (`StrategyChoice.logical_cpus`), each with its share of the cores."""
    import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # TensorFlow already started: it keeps what it had
            pass
    if logical_cpus > 1:
        share_cores(logical_cpus)  # first: listing the devices starts TensorFlow
        split_cpu(logical_cpus)


def share_cores(devices: int) -> None:
    """Each of `devices` logical CPU devices gets its share of the cores: TensorFlow's
    intra-op pool (one per process) gets cores // devices threads, as a worker process
    does (`set_up_worker`). A one-device configuration in this process then runs on one
    such share, so it is the baseline the replicas scale from.

    Measured (2 cores, the digits CNN, replicas of batch 32, 1 s blocks alternating):
    2 replicas 28-31k ex/s against 17k with the default pool of 2 threads, and the
    round-to-round spread of their speedup over one device 3-5% against 10-12%: with one
    shared pool, each replica's small ops wait for threads the other replica holds.
    """
    import tensorflow as tf

    threads = max(1, len(os.sched_getaffinity(0)) // devices)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError:  # TensorFlow already started: it keeps its pool
        pass


def split_cpu(n: int) -> list[str]:
    """Splits the CPU into `n` logical devices (before TensorFlow starts); their names.

    Raises:
        UserError: TensorFlow already started with fewer devices.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    have = tf.config.get_logical_device_configuration(cpu) or []
    if len(have) < n:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * n
            )
        except RuntimeError:
            pass
    return logical_cpus(n)


def logical_cpus(n: int) -> list[str]:
    """The names of the first `n` logical CPU devices.

    Raises:
        UserError: fewer exist (they are set up before TensorFlow starts).
    """
    import tensorflow as tf

    devices = tf.config.list_logical_devices("CPU")
    if len(devices) < n:
        raise UserError(
            f"Expected {n} logical CPU devices for {n} replicas, but TensorFlow was "
            f"already initialised with {len(devices)}",
            "start a fresh process (as 'tfscale train' does).",
        )
    return [d.name for d in devices[:n]]


def set_up_worker(core: int | None, threads: int) -> None:
    """A worker process pinned to `core` (when given), with `threads` for TensorFlow's
    intra- and inter-op pools (its share of the cores: more threads than cores slow every
    step), before TensorFlow starts."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def fail_fast_rpcs() -> None:
    """A coordinator's RPCs fail fast on a lost worker, so its steps go to the others."""
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")


def use_precision(policy: str) -> None:
    """Keras's global dtype policy for the run about to build its model."""
    import keras

    keras.mixed_precision.set_global_policy(policy)
