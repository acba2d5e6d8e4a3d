"""What users get wrong, through the `tfscale` command's own entry, one row each.

Every row runs the command in a project directory of its own (digits prepared once and
copied in), and checks what a user sees and what is left behind: the documented exit
code (2 config and usage, 1 at run time), an `error:` line naming the thing (and a `fix:`
line, or the fix inside it), no traceback, nothing half-written (no manifest over partial
shards, no run directory for a job that never started, no MLflow run left RUNNING).

Rows run in this process through `flows.cli.main` (argv, working directory, environment
and standard streams as the command would have them), one after another; the killed
worker's row too, its workers real processes, one of them killed while it trains. Where
the command's own process is the claim, a row runs the installed console script: one row
per exit code. Those run beside the in-process rows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from helpers import BIN, DEFAULTS, ROOT, free_port, on_ci, run_main, scaled, tiny_params

pytestmark = pytest.mark.integration

Setup = Callable[[Path], None]


@dataclass
class Case:
    name: str
    argv: list[str]
    code: int
    says: tuple[str, ...]  # fragments of the error output, in any order
    setup: Setup | None = None
    env: dict[str, str] = field(default_factory=dict)  # {port}: a free port; {{ }}: braces
    # acts on the job while it runs (told whether it still runs), in a thread of its own
    during: Callable[[Callable[[], bool], Path], None] | None = None
    mount: str = ""  # "ro" (read-only runs dir), "ro-store" (read-only mlflow/) or "tiny"
    no_manifest: bool = False  # a failed prepare leaves no manifest
    process: bool = False  # through the installed console script, in a process of its own
    # nothing new in the project (no mlflow/, runs/ or data): errors found before any work
    writes_nothing: bool = False


def params(**changes: dict) -> Setup:
    """Rewrites params.yaml: {section: {key: value}} merged in."""

    def setup(project: Path) -> None:
        path = project / "params.yaml"
        raw = yaml.safe_load(path.read_text())
        for section, values in changes.items():
            raw.setdefault(section, {}).update(values)
        path.write_text(yaml.safe_dump(raw))

    return setup


def params_text(text: str) -> Setup:
    def setup(project: Path) -> None:
        (project / "params.yaml").write_text(text)

    return setup


def shard(damage: str) -> Setup:
    """Damages the first training shard: flipped bytes, cut short, or gone."""

    def setup(project: Path) -> None:
        data = project / "tfrecords" / "digits"
        manifest = json.loads((data / "manifest.json").read_text())
        path = data / next(s["file"] for s in manifest["shards"] if s["split"] == "train")
        if damage == "corrupted":
            raw = bytearray(path.read_bytes())
            raw[100:110] = bytes(b ^ 0xFF for b in raw[100:110])
            path.write_bytes(bytes(raw))
        elif damage == "truncated":
            path.write_bytes(path.read_bytes()[:-100])
        else:
            path.unlink()

    return setup


def write(name: str, text: str) -> Setup:
    """A file of the user's in the project."""
    return lambda project: (project / name).write_text(text)


def npz(**arrays: tuple) -> Setup:
    """An .npz of seeded arrays of the given shapes."""

    def setup(project: Path) -> None:
        import numpy as np

        rng = np.random.default_rng(0)
        np.savez(project / "arrays.npz", **{k: rng.random(v) for k, v in arrays.items()})

    return setup


GROWING_MODEL = """
import keras


class Grow(keras.layers.Layer):
    # its scale grows 1e4-fold each training step: finite at first, then past float32

    def build(self, shape):
        self.scale = self.add_weight(shape=(), initializer="ones", trainable=False)

    def call(self, x, training=False):
        if training:
            self.scale.assign(self.scale * 1e4)
        return x * self.scale


def build(spec):
    feature = spec.features[0]
    x = keras.Input(shape=feature.shape, name=feature.name)
    return keras.Model(x, Grow()(keras.layers.Dense(10)(keras.layers.Flatten()(x))))
"""


def other_model(inputs: tuple[int, ...], outputs: int) -> Setup:
    """A model of another data's shape, saved as other.keras."""

    def setup(project: Path) -> None:
        import keras

        x = keras.Input(shape=inputs)
        y = keras.layers.Dense(outputs)(keras.layers.Flatten()(x))
        keras.Model(x, y).save(project / "other.keras")

    return setup


def mixed_column(project: Path) -> None:
    """A column of numbers in the table's first block (4 MiB) and text after it."""
    rows = ["a,b,label"] + [f"{i % 97},{i % 13},{i % 2}" for i in range(600_000)]
    rows.append("x,7,1")
    (project / "mixed.csv").write_text("\n".join(rows) + "\n")


def pipeline(body: str) -> Setup:
    """`mine.py` with `make()` returning what `body` returns."""
    return write("mine.py", "import tensorflow as tf\n\n\ndef make():\n" + body + "\n")


def edit_manifest(project: Path) -> None:
    path = project / "tfrecords" / "digits" / "manifest.json"
    raw = json.loads(path.read_text())
    raw["splits"]["train"] += 100  # a hand edit: the shards did not change
    path.write_text(json.dumps(raw, indent=2))


def kill_worker_one(running: Callable[[], bool], project: Path) -> None:
    """SIGKILL to worker 1 of a local multi-worker job once it is training: its job has
    recorded a first epoch (of 30)."""
    deadline = time.monotonic() + scaled(120)
    while time.monotonic() < deadline and running():
        for pid in _worker_pids():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                here = os.readlink(f"/proc/{pid}/cwd") == str(project)
            except OSError:  # gone already
                continue
            config = next((e for e in environ if e.startswith(b"TF_CONFIG=")), b"")
            if here and b'"index": 1' in config:
                while running() and time.monotonic() < deadline and not _an_epoch_recorded(project):
                    time.sleep(0.1)
                os.kill(pid, signal.SIGKILL)
                return
        time.sleep(0.2)


def _an_epoch_recorded(project: Path) -> bool:
    for history in project.rglob("history.json"):
        try:
            if json.loads(history.read_text() or "[]"):
                return True
        except ValueError:  # written as it is read
            continue
    return False


_HELD: list[socket.socket] = []  # ports held for the module's cases


def ui_port_taken(project: Path) -> None:
    """Something already listens where the UI is configured to serve."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    _HELD.append(held)
    params(track={"ui_url": f"http://127.0.0.1:{held.getsockname()[1]}"})(project)


def _worker_pids() -> list[int]:
    """Worker processes, read from /proc (no subprocess: this runs in a thread beside the
    in-process rows, which change the environment a child would inherit)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if "tfscale.flows.worker" in " ".join(proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


TRAIN = ["train", "--strategy", "one_device", "--no-diagnose"]
CASES = [
    # params.yaml
    Case(
        "unknown key",
        ["run"],
        2,
        ("train.epoch",),
        params(train={"epoch": 3}),
        process=True,
        writes_nothing=True,
    ),
    Case(
        "wrong type",
        ["run"],
        2,
        ("train.epochs", "integer"),
        params(train={"epochs": "two"}),
        writes_nothing=True,
    ),
    Case(
        "out of range",
        ["run"],
        2,
        ("train.epochs", "between"),
        params(train={"epochs": 0}),
        writes_nothing=True,
    ),
    Case(
        "not a number",
        ["train", "--learning-rate", "nan"],
        2,
        ("train.learning_rate", "finite"),
        writes_nothing=True,
    ),
    Case(
        "not a finite test fraction",
        ["prepare"],
        2,
        ("prepare.test_fraction", "finite"),
        params(prepare={"test_fraction": float("nan")}),
        writes_nothing=True,
    ),
    Case("a link of nan", ["plan", "--link", "nan"], 2, ("--link", "finite"), writes_nothing=True),
    Case(
        "no workers to forecast",
        ["forecast", "--workers", ","],
        2,
        ("--workers", "comma-separated"),
        writes_nothing=True,
    ),
    Case(
        "empty params",
        ["run"],
        2,
        ("params.yaml is empty", "fix:"),
        params_text(""),
        writes_nothing=True,
    ),
    Case(
        "invalid YAML",
        ["run"],
        2,
        ("not valid YAML at line", "fix:"),
        params_text("train:\n  epochs: [2\n"),
        writes_nothing=True,
    ),
    Case(
        "a params file that is not there",
        ["--params", "nothing.yaml", "run"],
        2,
        ("--params nothing.yaml: no such file", "leave --params out"),
        writes_nothing=True,
    ),
    Case(
        "a UI address that is not a web address",
        ["ui"],
        2,
        ("track.ui_url: expected a web address", "'localhost:5000'"),
        params(track={"ui_url": "localhost:5000"}),
        writes_nothing=True,
    ),
    Case(
        "empty sweep grid",
        ["sweep"],
        2,
        ("sweep.replicas", "non-empty"),
        params(sweep={"replicas": []}),
        writes_nothing=True,
    ),
    # names
    Case(
        "unknown dataset",
        ["prepare", "--dataset", "nosuchset"],
        1,
        ("Unknown dataset 'nosuchset'", "'digits'"),
        no_manifest=True,
    ),
    # the user's data (prepare.dataset: a table, arrays, a function)
    Case(
        "a table that is not there",
        ["prepare", "--dataset", "sales.csv"],
        1,
        ("sales.csv: no such file", "fix:"),
        no_manifest=True,
    ),
    Case(
        "a file of a kind tfscale does not read",
        ["prepare", "--dataset", "./sales.xlsx"],
        1,
        ("does not read .xlsx files", "(.csv, .parquet)"),
        write("sales.xlsx", "not a table"),
        no_manifest=True,
    ),
    Case(
        "a label column the table does not have",
        ["prepare", "--dataset", "t.csv", "--label", "price"],
        1,
        ("no column 'price'", "its columns: a, b, target", "--label"),
        write("t.csv", "a,b,target\n1,2,0\n3,4,1\n"),
        no_manifest=True,
    ),
    Case(
        "an .npz of one value each",
        ["prepare", "--dataset", "arrays.npz"],
        1,
        ("x, label hold(s) one value, not a row per example", "fix:"),
        npz(x=(), y=()),
        no_manifest=True,
    ),
    Case(
        "--missing drop dropping every row",
        ["prepare", "--dataset", "t.csv", "--missing", "drop"],
        1,
        ("--missing drop leaves 0 example(s) of 6", "--missing mean"),
        write("t.csv", "a,label\n,0\n,1\n,0\n,1\n,0\n,1\n"),
        no_manifest=True,
    ),
    Case(
        "a one-class table",
        ["prepare", "--dataset", "t.csv"],
        1,
        ("every example has the same label", "two classes"),
        write("t.csv", "a,label\n1,yes\n2,yes\n3,yes\n4,yes\n"),
        no_manifest=True,
    ),
    Case("a port past 65535", ["ui", "--port", "70000"], 2, ("--port", "1 to 65535")),
    Case(
        "a sweep's model file that is not there",
        ["sweep", "--model", "nothere.py:build"],
        2,
        ("nothere.py: no such file", "fix:"),
        writes_nothing=True,
    ),
    Case(  # bound only, never sent to: a documentation address (RFC 5737)
        "a host this machine does not have",
        ["ui", "--host", "203.0.113.7"],
        1,
        ("cannot listen on 203.0.113.7:", "--host an address of this machine"),
    ),
    Case(
        "a table with no rows",
        ["prepare", "--dataset", "t.csv"],
        1,
        ("t.csv has no rows", "fix:"),
        write("t.csv", "a,b,label\n"),
        no_manifest=True,
    ),
    Case(
        "a column of numbers and text",
        ["prepare", "--dataset", "mixed.csv"],
        1,
        ("column 'a' holds values of more than one type", "all numbers", "quote"),
        mixed_column,
        no_manifest=True,
    ),
    Case(
        "an .npz without x and y",
        ["prepare", "--dataset", "arrays.npz"],
        1,
        ("holds a, b: expected x and y", "numpy.savez"),
        npz(a=(10, 3), b=(10,)),
        no_manifest=True,
    ),
    Case(
        "arrays of different lengths",
        ["prepare", "--dataset", "arrays.npz"],
        1,
        ("the arrays differ in length (x 10, label 9)", "fix:"),
        npz(x=(10, 3), y=(9,)),
        no_manifest=True,
    ),
    Case(
        "a function whose module does not import",
        ["prepare", "--dataset", "mine.py:make"],
        1,
        ("mine.py (from --dataset mine.py:make) did not import", "ModuleNotFoundError", "--debug"),
        write("mine.py", "import no_such_package\n"),
        no_manifest=True,
    ),
    Case(
        "a function the module does not define",
        ["prepare", "--dataset", "mine.py:build"],
        1,
        ("mine.py has no function 'build'", "it defines make"),
        pipeline("    return None"),
        no_manifest=True,
    ),
    Case(
        "a function that raises",
        ["prepare", "--dataset", "mine.py:make"],
        1,
        ("mine.py:make raised ValueError: no such table in the warehouse", "--debug"),
        pipeline("    raise ValueError('no such table in the warehouse')"),
        no_manifest=True,
    ),
    Case(
        "a function that returns no dataset",
        ["prepare", "--dataset", "mine.py:make"],
        1,
        ("returned a list, not a tf.data.Dataset", "fix:"),
        pipeline("    return [1, 2, 3]"),
        no_manifest=True,
    ),
    Case(
        "an infinite dataset",
        ["prepare", "--dataset", "mine.py:make"],
        1,
        ("returned an infinite dataset", ".take(n)"),
        pipeline("    return tf.data.Dataset.from_tensor_slices(([1.0, 2.0], [0, 1])).repeat()"),
        no_manifest=True,
    ),
    Case(
        "a feature that varies in more than one dimension",
        ["prepare", "--dataset", "mine.py:make"],
        1,
        ("feature 'x' of mine.py_make varies in shape (?x?x3, up to 5x4x3)", "pads only 1-D"),
        pipeline(
            "    sizes = [(3, 4), (5, 2)]\n"
            "    return tf.data.Dataset.from_generator(\n"
            "        lambda: ((tf.zeros((h, w, 3)), 0) for h, w in sizes),\n"
            "        output_signature=(\n"
            "            tf.TensorSpec([None, None, 3]), tf.TensorSpec([], tf.int64)\n"
            "        ),\n"
            "    )"
        ),
        no_manifest=True,
    ),
    Case("unknown strategy", ["train", "--strategy", "ring"], 2, ("'ring'", "multi_worker")),
    Case("unknown model", [*TRAIN, "--model", "gpt"], 2, ("train.model", "'gpt'")),
    Case("unknown precision", [*TRAIN, "--precision", "fp8"], 2, ("train.precision", "'fp8'")),
    Case("zero replicas", ["train", "--replicas", "0"], 2, ("train.replicas", "got 0")),
    Case(
        "XLA over several replicas",
        [*TRAIN, "--strategy", "mirrored", "--jit-compile", "true"],
        2,
        ("jit_compile: true is not supported with mirrored", "fix:"),
    ),
    Case("XLA neither on nor off", [*TRAIN, "--jit-compile", "maybe"], 2, ("'maybe'", "auto")),
    Case(
        "more pipeline stages than devices",
        ["train", "--strategy", "pipeline", "--stages", "64", "--no-diagnose"],
        2,
        ("train.stages (64) is more than this machine's", "fix:"),
    ),
    Case(
        "micro-batches that do not divide the batch",
        ["train", "--strategy", "pipeline", "--micro-batches", "5", "--no-diagnose"],
        2,
        ("train.micro_batches (5) does not divide the batch of 32", "fix:"),
    ),
    Case(
        "a pipeline whose stages exceed the device memory",
        ["train", "--strategy", "pipeline", "--device-memory-mb", "0.1", "--no-diagnose"],
        2,
        ("model mlp needs", "no cut into 2 stages keeps every stage within", "0.10 MB", "fix:"),
    ),
    Case(
        "a whole model on each device over the device memory",
        ["train", "--strategy", "mirrored", "--device-memory-mb", "0.5", "--no-diagnose"],
        2,
        ("mirrored keeps the whole model on each device", "0.50 MB", "--strategy pipeline"),
    ),
    Case(
        "auto with a device memory no cut meets",
        ["train", "--device-memory-mb", "0.1", "--no-diagnose"],
        2,
        ("model mlp needs", "no cut into 2 stages or fewer fits it", "fix:"),
    ),
    Case(
        "flag of the wrong type", ["prepare", "--num-shards", "two"], 2, ("--num-shards", "'two'")
    ),
    Case(
        "batch larger than the data",
        [*TRAIN, "--batch-size-per-replica", "100000"],
        2,
        ("train split has 1437 examples", "--batch-size-per-replica"),
    ),
    Case(
        "batch larger than the data, mid-pipeline",
        ["run", "--batch-size-per-replica", "100000"],
        2,
        ("train split has 1437 examples",),
    ),
    # data
    Case(
        "missing data dir",
        [*TRAIN, "--data-dir", "elsewhere"],
        1,
        ("No prepared dataset at elsewhere/digits", "tfscale prepare --dataset digits"),
        writes_nothing=True,
    ),
    Case(
        "a training whose loss stops being a number",
        [*TRAIN, "--model", "grow.py:build", "--precision", "float32", "--jit-compile", "false"],
        1,
        ("the training loss became nan in epoch 1", "--learning-rate"),
        write("grow.py", GROWING_MODEL),
    ),
    Case("corrupted shard", TRAIN, 1, ("corrupted", "--force"), shard("corrupted")),
    Case("truncated shard", TRAIN, 1, ("truncated", "--force"), shard("truncated")),
    Case("missing shard", TRAIN, 1, (": missing", "--force"), shard("missing")),
    Case("edited manifest", ["verify"], 1, ("was edited after prepare", "--force"), edit_manifest),
    Case(
        "full disk during prepare",
        ["prepare", "--dataset", "synthetic", "--examples", "4000", "--data-dir", "tiny"],
        1,
        ("No space left", "tiny/synthetic", "fix:"),
        mount="tiny",
        no_manifest=True,
    ),
    # places and servers
    Case(
        "unreachable tracking server",
        TRAIN,
        1,
        (
            "MLflow tracking server http://127.0.0.1:{port} is unreachable",
            "unset MLFLOW_TRACKING_URI",
        ),
        env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:{port}"},
        writes_nothing=True,  # found before any training
    ),
    Case(
        "a tracking store that is not a database",
        [*TRAIN, "--epochs", "1"],
        1,
        ("The MLflow store notes.db is not an SQLite database", "move it aside"),
        setup=lambda project: (project / "notes.db").write_text("results, by hand\n"),
        env={"MLFLOW_TRACKING_URI": "sqlite:///notes.db"},
    ),
    Case(
        "the UI's port already taken",
        ["ui"],
        1,
        ("is already in use", "tfscale ui --port N"),
        ui_port_taken,
    ),
    Case(
        "no Prefect server for serve",
        ["serve"],
        1,
        ("prefect server start", "PREFECT_API_URL"),
        env={"PREFECT_API_URL": ""},
        writes_nothing=True,
    ),
    Case(
        "serve against a Prefect server that is not there",
        ["serve"],
        1,
        ("Prefect server http://127.0.0.1:{port}/api is unreachable", "prefect server start"),
        env={"PREFECT_API_URL": "http://127.0.0.1:{port}/api"},
        writes_nothing=True,
        process=True,  # Prefect reads its API's address once, when imported
    ),
    Case(
        "a sweep on a work pool with no Prefect server",
        ["sweep", "--pool", "gpu-hosts"],
        1,
        ("sweep.work_pool", "PREFECT_API_URL is unset", "prefect server start"),
        env={"PREFECT_API_URL": ""},
    ),
    Case("read-only runs dir", TRAIN, 1, ("Read-only", "runs", "fix:"), mount="ro"),
    Case(
        "read-only MLflow store",
        TRAIN,
        1,
        ("The MLflow store mlflow cannot be written (", "point track.store_dir"),
        mount="ro-store",
    ),
    Case(
        "killed worker",
        [
            "train",
            "--strategy",
            "multi_worker",
            "--workers",
            "2",
            "--epochs",
            "30",
            "--no-diagnose",
        ],
        1,
        ("worker 1 exited with code -9", "worker-1.log"),
        # a first epoch of plain steps: no held-out evaluation, no noise scale to trace
        params(train={"noise_scale": False}, evaluate={"every_epochs": 0}),
        during=kill_worker_one,
    ),
    Case(
        "a TF_CONFIG task outside its cluster",
        ["train", "--no-diagnose"],
        2,
        ("TF_CONFIG's task worker:5 is not in its cluster (1 worker)", "fix:"),
        env={"TF_CONFIG": '{{"cluster": {{"worker": ["127.0.0.1:1"]}}, "task": {{"index": 5}}}}'},
    ),
    Case(  # a serving task: a server of its own, stopped only by its process's end
        "a parameter server whose chief never comes",
        ["train", "--no-diagnose"],
        1,
        ("the chief 127.0.0.1:1 did not answer within 1 s", "cluster.chief_wait_s"),
        params(cluster={"chief_wait_s": 1}),
        env={
            "TF_CONFIG": '{{"cluster": {{"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:1"], '
            '"ps": ["127.0.0.1:{port}"]}}, "task": {{"type": "ps", "index": 0}}}}'
        },
        process=True,
    ),
    Case(
        "a TF_CONFIG that is not JSON",
        ["train", "--no-diagnose"],
        2,
        ("TF_CONFIG is not a valid cluster description", "unset it"),
        env={"TF_CONFIG": '{{"cluster": {{"worker": ["127.0.0.1:1"]'},  # cut short
    ),
    # models and runs
    Case(
        "missing model path",
        ["evaluate", "--model-path", "nowhere/model.keras"],
        1,
        ("No model at nowhere/model.keras", "tfscale train"),
    ),
    Case(
        "evaluate a model trained on other data",
        ["evaluate", "--model-path", "other.keras"],
        2,
        ("other.keras does not take the features of digits", "a model trained on digits"),
        other_model((3,), 10),
    ),
    Case(
        "evaluate a model of another label",
        ["evaluate", "--model-path", "other.keras"],
        2,
        ("other.keras gives 2 output(s) per example", "(class) needs 10"),
        other_model((8, 8, 1), 2),
    ),
    Case("evaluate before any training", ["evaluate"], 1, ("No trained model for 'digits'",)),
    Case(
        "a model path that is not a model",
        ["evaluate", "--model-path", "params.yaml"],
        1,
        ("params.yaml is not a Keras model tfscale can load", "model.keras"),
    ),
    Case(  # named before any work: here nothing is trained, and that is not what it says
        "evaluate against a baseline that is not there",
        ["evaluate", "--baseline", "nowhere"],
        1,
        ("No training metrics at nowhere/train_metrics.json", "--baseline"),
    ),
    Case(
        "train against a baseline that is not there",
        [*TRAIN, "--against-baseline", "nowhere"],
        1,
        ("No training metrics at nowhere/train_metrics.json", "--baseline"),
    ),
    Case("forecast with no run", ["forecast"], 1, ("with all-reduce measurements", "fix:")),
    Case("forecast, unknown preset", ["forecast", "--preset", "warp"], 2, ("'warp'", "fix:")),
    Case(
        "an emulated link without worker processes",
        [*TRAIN, "--strategy", "mirrored", "--link-gbit", "1"],
        2,
        ("train.link_gbit (1)", "--strategy multi_worker"),
    ),
    Case(
        "a sweep link axis without worker processes",
        ["sweep"],
        2,
        ("sweep.link_gbit [1.0]", "sweep.strategy: multi_worker"),
        params(sweep={"link_gbit": [1.0], "replicas": [2]}),
        writes_nothing=True,  # refused as the command starts: no server, no flow run
    ),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A project with digits prepared (in this process), copied into each case."""
    root = tmp_path_factory.mktemp("prepared")
    tiny_params(root)
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["prepare"]["data_dir"] = "tfrecords"
    raw["train"]["runs_dir"] = "runs"
    raw["sweep"]["out_dir"] = "sweep"
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    from tfscale.tasks.data.preparation import prepare_dataset
    from tfscale.tasks.settings.config import load_config

    config = load_config(root / "params.yaml", {"prepare.data_dir": str(root / "tfrecords")})
    prepare_dataset(config, progress=False)
    return root


ROOT_NEEDED = "mounting a tmpfs needs root"


def runnable(case: Case) -> bool:
    """A case that mounts a tmpfs runs only as root; the others run anywhere."""
    return not case.mount or os.geteuid() == 0


RAISED: dict[str, str] = {}  # case name: the class of the UserError it was reported as


@pytest.fixture(scope="module")
def outcomes(prepared, tmp_path_factory) -> dict[str, dict]:
    """Every runnable case: those of a process of their own in threads, beside the
    in-process ones, which run one after another (they share the working directory, the
    environment and the standard streams)."""
    base = tmp_path_factory.mktemp("cases")
    cases = [case for case in CASES if runnable(case)]
    environ = dict(os.environ)  # the processes' environment, before any case changes it
    # MLflow and Prefect set up their logging once, when imported, closing the handlers
    # they find: here, before any case redirects the standard streams
    import tfscale.flows.deployments  # noqa: F401, E401

    with ThreadPoolExecutor(2) as pool:
        running = {
            case.name: pool.submit(run_case, case, prepared, base, environ)
            for case in cases
            if case.process
        }
        found = {
            case.name: run_case(case, prepared, base, environ) for case in cases if not case.process
        }
        found.update({name: future.result() for name, future in running.items()})
    return found


def run_case(case: Case, prepared: Path, base: Path, environ: dict[str, str]) -> dict:
    project = base / case.name.replace(" ", "-").replace(",", "")
    shutil.copytree(prepared, project)
    mounted = _mount(case.mount, project)
    try:
        if case.setup:
            case.setup(project)
        port = free_port()
        env = {k: v.format(port=port) for k, v in case.env.items()}
        before = {path.name for path in project.iterdir()}
        if case.process:
            code, out, err = _in_a_process(case, project, dict(environ, **env))
        else:
            code, out, err = _in_this_process(case, project, env)
        return {
            "code": code,
            "err": err,
            "out": out,
            "port": port,
            "new": sorted({path.name for path in project.iterdir()} - before),
            "manifests": [
                str(p) for p in project.rglob("manifest.json") if "digits" not in p.parts
            ],
            "partial": [str(p) for p in project.rglob("*.tmp")],
            "running": _running_runs(project / "mlflow" / "mlflow.db"),
        }
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mounted)], check=False, timeout=scaled(60))


def _in_a_process(case: Case, project: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = subprocess.Popen(
        [str(BIN / "tfscale"), *case.argv],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    if case.during:
        case.during(lambda: proc.poll() is None, project)
    try:
        out, err = proc.communicate(timeout=scaled(240))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += "\n(the test stopped it: no exit within 240 s)"
    return proc.returncode, out, err


def _in_this_process(case: Case, project: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """`tfscale ARGV` through `flows.cli.main` in `project` (`helpers.run_main`), the class
    of the error it reported recorded; `case.during` acts on it from a thread meanwhile."""
    import threading

    ended = threading.Event()
    beside = None
    if case.during:
        running = lambda: not ended.is_set()  # noqa: E731
        beside = threading.Thread(target=case.during, args=(running, project), daemon=True)
        beside.start()
    try:
        return run_main(
            case.argv, project, env, lambda exc: RAISED.__setitem__(case.name, type(exc).__name__)
        )
    finally:
        ended.set()
        if beside is not None:
            beside.join(timeout=scaled(30))


def _mount(kind: str, project: Path) -> Path | None:
    """A read-only runs dir or MLflow store, or a data dir on a tmpfs too small for the data."""
    if not kind:
        return None
    target = project / {"ro": "runs", "ro-store": "mlflow", "tiny": "tiny"}[kind]
    target.mkdir(parents=True, exist_ok=True)
    options = "size=256k" if kind == "tiny" else "ro,size=64k"
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
        check=True,
        timeout=scaled(60),
    )
    return target


def _running_runs(db: Path) -> list[str]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select name from runs where status = 'RUNNING'").fetchall()
    return [name for (name,) in rows]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_user_mistake_gets_one_clear_error(case, outcomes):
    if not runnable(case):
        if on_ci():  # `CI=false` is no CI (docs/testing.md)
            pytest.fail(f"CI runs every case as root: {ROOT_NEEDED}")
        pytest.skip(ROOT_NEEDED)
    result = outcomes[case.name]
    err = result["err"]
    assert result["code"] == case.code, err[-2000:]
    assert "Traceback" not in err and "Traceback" not in result["out"], err[-2000:]
    assert "this is a bug in tfscale" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith(("error:", "fix:"))]
    assert lines and lines[0].startswith("error:"), err[-2000:]
    for fragment in case.says:
        fragment = fragment.replace("{port}", str(result["port"]))
        assert fragment in err, (fragment, err[-2000:])
    if case.writes_nothing:  # refused before any work
        assert not result["new"], f"written before the error: {result['new']}"
    assert not result["running"], f"MLflow runs left RUNNING: {result['running']}"
    if case.no_manifest:
        assert not result["manifests"], result["manifests"]
    assert not result["partial"], result["partial"]  # no half-written file left behind


@pytest.mark.unit
def test_each_exit_code_has_a_row_through_the_console_script():
    """The installed `tfscale` script's own exit status is checked for each documented code
    (2 config and usage, 1 at run time): an in-process row checks what `main` returns."""
    assert {case.code for case in CASES if case.process} == {1, 2}


# errors a user meets where this table cannot reach them, and where each is checked
CHECKED_ELSEWHERE = {  # the test file that raises or catches it, by name, and what it does
    "TaskLost": ("tests/distribute/test_cluster.py", "a lost ps task: the chief's exit code"),
    "ChiefNeverCame": ("tests/distribute/test_strategy.py", "a chief that never answers"),
    "RunInUse": ("tests/train/test_training.py", "a run directory in use"),
    "PoolError": ("tests/flows/test_pool.py", "a pool with no live worker: its exit code"),
    "NotShared": ("tests/flows/test_pool.py", "a data dir the pool's hosts cannot read"),
    "WorkerError": ("tests/train/test_training.py", "a worker process killed"),
    "ModelError": ("tests/train/test_user_models.py", "a user's function returning no model"),
    "ModelRaised": ("tests/train/test_user_models.py", "a user's model function that raises"),
    "UnknownStrategy": ("tests/distribute/test_strategy.py", "a kind no registry has"),
    "CallbackRaised": ("tests/train/test_callbacks.py", "a model's callback that raises"),
    "CallbackRefused": ("tests/train/test_callbacks.py", "--callbacks giving no callbacks"),
}


def names_outside_imports(path: Path, name: str) -> bool:
    """Whether `path` uses `name` on a line that is not an import (raised, caught, its
    exit code): a file that only imports it, or names it nowhere, checks nothing of it."""
    pattern = rf"^(?!\s*(from|import)\s).*\b{name}\b"
    return re.search(pattern, path.read_text(), re.MULTILINE) is not None


@pytest.mark.unit
def test_each_kind_of_error_checked_elsewhere_is_named_where_it_is_said_to_be():
    unchecked = [
        f"{name} ({path})"
        for name, (path, _) in CHECKED_ELSEWHERE.items()
        if not names_outside_imports(ROOT / path, name)
    ]
    assert not unchecked, f"said to be checked elsewhere, never named there: {unchecked}"


def test_every_kind_of_user_error_has_a_row(outcomes):
    """Each `UserError` class tfscale defines is the one some row was reported as (or is
    checked elsewhere, named above): a new kind of error with no row fails here."""
    import importlib

    from tfscale.tasks.core.errors import UserError

    for path in sorted([*ROOT.glob("tasks/**/*.py"), *ROOT.glob("flows/*.py")]):
        importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    defined, todo = set(), [UserError]
    while todo:
        cls = todo.pop()
        defined.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    assert len(defined) > 10, defined
    missing = defined - set(RAISED.values()) - set(CHECKED_ELSEWHERE)
    assert not missing, f"no row is reported as {sorted(missing)}"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("prepare", "finished shards are kept and the next prepare writes only the rest"),
        ("train", "a training goes on from its last checkpoint when this is run again"),
        (
            "sweep",
            "a training goes on from its last checkpoint when this is run again; "
            "finished cells are reused",
        ),
        ("forecast", "nothing more was done"),
    ],
)
def test_ctrl_c_says_what_the_interrupted_command_leaves(command, said, tmp_path, monkeypatch):
    """Ctrl-C exits 130 with one line about what that command keeps: shards for a prepare,
    checkpoints for a training (where a resumed training says where it goes on)."""
    from tfscale.flows import commands

    def interrupted(config, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, command, interrupted)
    monkeypatch.setattr("tfscale.flows.cli.import_tensorflow", lambda: None)
    code, out, err = run_main(["--params", str(tiny_params(tmp_path)), command], tmp_path)
    assert code == 130 and err.strip() == f"interrupted; {said}", err
    if command == "train":  # Keras's fit is checkpointed at its epochs' ends
        argv = ["--params", str(tiny_params(tmp_path)), command, "--loop", "fit"]
        code, out, err = run_main(argv, tmp_path)
        assert "--loop fit training goes on from its last finished epoch" in err, err


IMPORTS_TENSORFLOW = (
    "import sys\n"
    "from flows.cli import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    "print('tensorflow imported:', 'tensorflow' in sys.modules)\n"
    "sys.exit(code)\n"
)


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["plan", "--devices", "0"], 2),
        (["run", "--bogus"], 2),
        (["--help"], 0),
        (["run", "--help"], 0),
    ],
    ids=["plan", "argument error", "help", "run help"],
)
def test_a_command_whose_work_needs_no_tensorflow_never_imports_it(argv, code, tmp_path):
    """`tfscale plan`, `--help` and an argument error answer without TensorFlow (its import
    alone takes seconds and writes its C++ start-up lines): the process is the claim, so
    each runs in one of its own (this one may have imported TensorFlow for other tests),
    and an error is said once, an `error:` line and a `fix:` line."""
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS_TENSORFLOW, "--params", DEFAULTS, *argv],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),  # this checkout's code, wherever installed
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "tensorflow imported: False" in proc.stdout, proc.stderr[-2000:]
    said = [line.split(":")[0] for line in proc.stderr.splitlines() if line.strip()]
    assert said == (["error", "fix"] if code else []), proc.stderr


@pytest.mark.unit
@pytest.mark.parametrize("command", ["prepare", "train", "evaluate", "plan", "forecast"])
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_stops_every_command_with_one_line_and_its_exit_code(
    command, signame, tmp_path, monkeypatch
):
    """The signal `timeout`, Kubernetes, Slurm and systemd send ends each command as Ctrl-C
    does: one line saying what it leaves, exit 128+N, never a silent -15."""
    from tfscale.flows import commands

    signum = getattr(signal, signame)

    def signalled(config, args):
        os.kill(os.getpid(), signum)  # delivered to this, the main thread
        time.sleep(5)  # the handler raises before this ends
        raise AssertionError("the signal did not stop the command")

    monkeypatch.setattr(commands, command, signalled)
    monkeypatch.setattr("tfscale.flows.cli.import_tensorflow", lambda: None)
    code, out, err = run_main(["--params", str(tiny_params(tmp_path)), command], tmp_path)
    assert code == 128 + signum and err.startswith("stopped by signal; "), err
    assert signal.getsignal(signum) is signal.SIG_DFL  # put back after the command
