"""Shared fixtures: small, seeded configs whose outputs live under a temporary directory.

The session owns its state: its home folder, Prefect's home (its temporary server's
database), Keras's and matplotlib's configuration live in a temporary folder, every test
runs in a temporary working directory, and the session checks at its end that the
repository is as it found it and that nothing but tfscale's cache was written under `~`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_STATE = Path(tempfile.mkdtemp(prefix="tfscale-tests-"))
atexit.register(shutil.rmtree, _STATE, ignore_errors=True)  # each session's, at its end
# before Prefect, Keras or matplotlib is imported: they read these when they start
for _name, _dir in (("PREFECT_HOME", "prefect"), ("KERAS_HOME", "keras"), ("MPLCONFIGDIR", "mpl")):
    os.environ[_name] = str(_STATE / _dir)
# the session's own home folder: whatever a test's code writes under `~` lands there, where
# the session's end looks (`home_written`), and another process's use of the developer's
# home (a Prefect server in ~/.prefect) is never mistaken for a test's; uv's downloads stay
# the machine's (a clone's `uv run` installs from its cache)
_REAL_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
os.environ.setdefault("UV_CACHE_DIR", str(_REAL_CACHE / "uv"))
for _name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
    os.environ.pop(_name, None)
HOME = _STATE / "home"
HOME.mkdir()
os.environ["HOME"] = str(HOME)
# addresses and cluster descriptions of the caller's own: a developer's tracking server,
# Prefect server or cluster must never receive a test's runs (a test that needs one sets it)
OUTSIDE = ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "PREFECT_API_KEY", "TF_CONFIG", "SLURM_CONF")
for _name in OUTSIDE + tuple(name for name in os.environ if name.startswith("SLURM_")):
    os.environ.pop(_name, None)
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # else MLflow writes ~/.config/mlflow

from hang_watchdog import pytest_runtest_protocol  # noqa: E402, F401 (a hook of this session's)

from tfscale.tasks.core.process import set_up_process  # noqa: E402
from tfscale.tasks.settings.config import load_config  # noqa: E402

set_up_process()  # the test session is a process entry too


def pytest_report_header(config):
    import pace

    return f"pace: timeouts x{pace.current():.2f} ({pace.VARIABLE}, measured by tests/suite.py)"


TIERS = ("unit", "integration", "cluster")
# the modules that take longest in the parallel phase (measured on 2 cores, slowest first,
# each 45 s or more), collected first: it hands out whole modules in collection order, and
# a long one started last would run alone at the end
SLOWEST_FIRST = (
    "test_dvc",
    "test_pool",
    "test_slurm",  # three Slurm jobs on namespace hosts, one requeued (moved from serial)
    "test_schedules",
    "test_caching",
    "test_training",
    "test_bad_input",
    "test_stages",
    "test_autotune",
    "test_sweep",
    "test_study",
    "test_user_models",  # with a study on 2 worker processes (moved from serial)
)


FAST_TIER = "unit"


def fast_tier_workers(markexpr: str, numprocesses, environ=os.environ) -> int | None:
    """How many xdist workers `pytest -m unit` takes where the command named none: the
    fast tier on both cores (`TFSCALE_TEST_WORKERS`, default 2), as the suite's parallel
    phase runs (in one process it took 2:04-2:10 on 2 cores, over its 2 minutes; on two,
    69 s). None where anything else was asked: another marker expression, or `-n` given
    (`-n 0`: one process)."""
    import pace

    if markexpr.strip() != FAST_TIER or numprocesses is not None:
        return None
    return pace.workers(environ)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Before xdist reads `-n` (this initial conftest's hook runs first): the fast tier's
    workers (`fast_tier_workers`), where xdist is there to take them (not under
    `-p no:xdist`) and this is not one of the workers (xdist resets a worker's `-n` to
    none, which this would read as not given: each worker would start two more)."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    workers = fast_tier_workers(config.getoption("markexpr"), config.getoption("numprocesses"))
    if workers:
        config.option.numprocesses = workers


def pytest_collection_modifyitems(items):
    """A test marked neither `integration` nor `cluster` is `unit`: the fast tier
    (`pytest -m unit`) is everything that stays in this process. A `cluster` test is also
    `serial`: it runs in the suite's second phase, alone on the machine (`tests/suite.py`),
    unless marked `cluster(alone=False)` (local worker processes, no speed measured).
    `TFSCALE_TEST_ORDER=reversed` runs the tests last to first: no test may depend on
    another having run before it."""

    def rank(item) -> int:
        name = item.module.__name__ if item.module else ""
        return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable: file order otherwise
    if os.environ.get("TFSCALE_TEST_ORDER") == "reversed":
        items.reverse()
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.unit)
        cluster = item.get_closest_marker("cluster")
        if cluster and cluster.kwargs.get("alone", True):  # (alone=False): may run beside others
            item.add_marker(pytest.mark.serial)


# a test's CPU-seconds from its setup's start (`cpu_seconds`), read at its teardown's end
CPU_AT_SETUP = pytest.StashKey[float]()


def cpu_seconds() -> float:
    """This process's CPU-seconds with those of the child processes it waited for (theirs,
    in turn, hold their own children's); a child not waited for is not counted."""
    import resource

    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[CPU_AT_SETUP] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Each test's CPU-seconds, its fixtures' and its processes' with it, as the `cpu_s`
    property of its JUnit record: in the parallel phase a test's time is partly its
    neighbours', its CPU its own (`tests/suite.py` lists the ten that took most)."""
    yield
    if CPU_AT_SETUP in item.stash:
        spent = cpu_seconds() - item.stash[CPU_AT_SETUP]
        item.user_properties.append(("cpu_s", round(spent, 2)))


def pytest_runtest_logreport(report):
    """A failure is written out the moment it happens, with how long it took, not only in
    the summary at the end: a run stopped later (a CI time limit) still shows it."""
    if report.failed:
        import sys

        text = report.longreprtext[-4000:]
        sys.stderr.write(
            f"\nFAILED {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{text}\n"
        )
        sys.stderr.flush()


# what a `unit` test may not do: start a process, train a model, time real steps in rounds
# (`pytest -m unit` is the in-process tier to run while working; those are `integration`)
NOT_IN_UNIT = (
    ("tfscale.tasks.train.training", "train_model", "trains a model"),
    ("tfscale.tasks.measure.probes", "measure_rounds", "times real steps in rounds"),
)


@pytest.fixture(autouse=True)
def kerass_default_dtype_policy():
    """Every test starts from Keras's default dtype policy, float32: a training sets the
    policy its run chose for the whole process (`process.use_precision`; `auto` takes
    mixed_bfloat16 on a CPU with AMX), which a model a later test builds in the same worker
    would otherwise take (a float32 gradient norm then off by bfloat16's 3e-3)."""
    import sys

    if "keras" in sys.modules:
        sys.modules["keras"].mixed_precision.set_global_policy("float32")
    yield


@pytest.fixture(autouse=True)
def tracking_and_api_as_found():
    """Every test ends with MLflow's tracking URI and `PREFECT_API_URL` as it found them
    (`helpers.tracking_and_api_restored`)."""
    from helpers import tracking_and_api_restored

    with tracking_and_api_restored():
        yield


@pytest.fixture(autouse=True)
def prefect_home_migrated(request):
    """The session's Prefect home holds a migrated database before a test that may start
    a Prefect server (`helpers.prefect_home`): every process of the session shares the
    migrations' one run. A `unit` test starts none."""
    if request.node.get_closest_marker("unit") is None:
        from helpers import prefect_home

        prefect_home(_STATE / "prefect")
    yield


@pytest.fixture(autouse=True)
def unit_tests_stay_in_process(request, monkeypatch):
    """A `unit` test that starts a process, trains a model or times steps in rounds fails,
    naming what it did: mark it `integration` (or `cluster`)."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    import sys

    def refuse(what: str):
        def refused(*args, **kwargs):
            raise AssertionError(
                f"a unit test {what}: mark {request.node.name} integration (tests/conftest.py)"
            )

        return refused

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("starts a process"))
    refused = {}
    for module_name, name, what in NOT_IN_UNIT:
        if module_name not in sys.modules:
            __import__(module_name)
        original = getattr(sys.modules[module_name], name)
        refused[name] = (original, refuse(what))
        for module in _ours():
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, refused[name][1])
    yield
    # a module first imported during the test took the refusal by name: it gets the original
    for module in _ours():
        for name, (original, refusal) in refused.items():
            if getattr(module, name, None) is refusal:
                setattr(module, name, original)


def _ours() -> list:
    import sys

    return [
        m for m in list(sys.modules.values())
        if getattr(m, "__name__", "").startswith(("tfscale.tasks.", "tfscale.flows."))
    ]  # fmt: skip


OUTPUTS = ("mlflow", "runs", "data", "models", "sweep")  # the repository's ignored outputs
# what may be under the session's home at its end: tfscale's documented cache (an empty
# MLflow store, copied for each new store: tasks/track/new_store.py)
HOME_KEPT = (".cache/tfscale",)


def home_written(home: Path, kept: tuple[str, ...] = HOME_KEPT) -> list[str]:
    """The files under `home` (the session's own home folder) outside the folders `kept`:
    what a test's code wrote under `~`."""
    return sorted(
        str(path.relative_to(home))
        for path in home.rglob("*")
        if path.is_file() and not any(path.relative_to(home).is_relative_to(k) for k in kept)
    )


def footprint() -> dict:
    """What a test must not change: the repository's git status and its output folders."""
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    files = {
        str(path): path.stat().st_mtime_ns
        for place in (ROOT / name for name in OUTPUTS)
        for path in ([place] if place.is_file() else place.rglob("*"))
        if path.is_file()
    }
    return {"git status": status.splitlines(), "files": files}


@pytest.fixture(scope="session", autouse=True)
def leaves_repository_and_home_as_found(tmp_path_factory):
    """Tests run in a temporary working directory (a command's default `mlflow/`, `runs/`
    and `data/` land there); at the end, the repository is unchanged and the session's own
    home folder holds nothing but tfscale's cache."""
    before = footprint()
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(here)
    after = footprint()
    changed = sorted(
        path
        for path in before["files"].keys() | after["files"].keys()
        if before["files"].get(path) != after["files"].get(path)
    )
    status = sorted(set(before["git status"]) ^ set(after["git status"]))
    written = home_written(HOME)
    found = {
        f"the repository's git status changed: {status}": status,
        f"changed in the repository's outputs: {changed}": changed,
        f"written under the home folder (~ is {HOME}): {written}": written,
    }
    assert not any(found.values()), "\n".join(what for what, seen in found.items() if seen)


@pytest.fixture
def make_config(tmp_path):
    """Builds a Config from dotted overrides, with data under `tmp_path`."""

    def make(**overrides):
        values = {"prepare.data_dir": str(tmp_path / "tfrecords")}
        values.update({k.replace("__", "."): v for k, v in overrides.items()})
        return load_config(None, values)

    return make


@pytest.fixture(scope="session", autouse=True)
def two_logical_cpus():
    """Mirrored tests need 2 logical CPU devices, configured before TensorFlow starts."""
    from tfscale.tasks.core.process import logical_cpus, set_up_devices

    set_up_devices(2)
    return logical_cpus(2)


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """The digits dataset prepared once for the session: (config overrides, manifest, dir)."""
    from tfscale.tasks.data.preparation import prepare_dataset

    root = tmp_path_factory.mktemp("digits")
    overrides = {"prepare.data_dir": str(root / "tfrecords"), "train.runs_dir": str(root / "runs")}
    result = prepare_dataset(load_config(None, overrides), progress=False)
    return overrides, result.manifest, result.data_dir
