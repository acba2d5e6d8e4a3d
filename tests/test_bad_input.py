"""What users get wrong, through the real `tfscale` command, one row each.

Every row runs the installed command in a project directory of its own (digits prepared
once and copied in), and checks what a user sees and what is left behind: the documented
exit code (2 config and usage, 1 at run time), an `error:` line naming the thing (and a
`fix:` line, or the fix inside it), no traceback, nothing half-written (no manifest over
partial shards, no run directory for a job that never started, no MLflow run left
RUNNING). Rows run two at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from helpers import BIN, free_port, tiny_params

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
    during: Callable[[subprocess.Popen, Path], None] | None = None  # acts on the running job
    mount: str = ""  # "ro" (read-only runs dir) or "tiny" (a 256 KiB data dir)
    no_manifest: bool = False  # a failed prepare leaves no manifest


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


def edit_manifest(project: Path) -> None:
    path = project / "tfrecords" / "digits" / "manifest.json"
    raw = json.loads(path.read_text())
    raw["splits"]["train"] += 100  # a hand edit: the shards did not change
    path.write_text(json.dumps(raw, indent=2))


def kill_worker_one(proc: subprocess.Popen, project: Path) -> None:
    """SIGKILL to worker 1 of a local multi-worker job once it has started training."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        for pid in _worker_pids():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                here = os.readlink(f"/proc/{pid}/cwd") == str(project)
            except OSError:  # gone already
                continue
            config = next((e for e in environ if e.startswith(b"TF_CONFIG=")), b"")
            if here and b'"index": 1' in config:
                time.sleep(1)  # into its training
                os.kill(pid, signal.SIGKILL)
                return
        time.sleep(0.2)


_HELD: list[socket.socket] = []  # ports held for the module's cases


def ui_port_taken(project: Path) -> None:
    """Something already listens where the UI is configured to serve."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    _HELD.append(held)
    params(track={"ui_url": f"http://127.0.0.1:{held.getsockname()[1]}"})(project)


def _worker_pids() -> list[int]:
    found = subprocess.run(["pgrep", "-f", "tasks.worker"], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


TRAIN = ["train", "--strategy", "one_device", "--no-diagnose"]
CASES = [
    # params.yaml
    Case("unknown key", ["run"], 2, ("train.epoch",), params(train={"epoch": 3})),
    Case("wrong type", ["run"], 2, ("train.epochs", "integer"), params(train={"epochs": "two"})),
    Case("out of range", ["run"], 2, ("train.epochs", "between"), params(train={"epochs": 0})),
    Case("empty params", ["run"], 2, ("params.yaml is empty", "fix:"), params_text("")),
    Case(
        "invalid YAML",
        ["run"],
        2,
        ("not valid YAML at line", "fix:"),
        params_text("train:\n  epochs: [2\n"),
    ),
    Case(
        "a params file that is not there",
        ["--params", "nothing.yaml", "run"],
        2,
        ("--params nothing.yaml: no such file", "leave --params out"),
    ),
    Case(
        "a UI address that is not a web address",
        ["ui"],
        2,
        ("track.ui_url: expected a web address", "'localhost:5000'"),
        params(track={"ui_url": "localhost:5000"}),
    ),
    Case(
        "empty sweep grid",
        ["sweep"],
        2,
        ("sweep.replicas", "non-empty"),
        params(sweep={"replicas": []}),
    ),
    # names
    Case(
        "unknown dataset",
        ["prepare", "--dataset", "nosuchset"],
        1,
        ("Unknown dataset 'nosuchset'", "'digits'"),
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
        ("is unreachable", "unset MLFLOW_TRACKING_URI"),
        env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:{port}"},
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
        during=kill_worker_one,
    ),
    Case(
        "a TF_CONFIG task outside its cluster",
        ["train", "--no-diagnose"],
        2,
        ("TF_CONFIG's task worker:5 is not in its cluster (1 worker)", "fix:"),
        env={"TF_CONFIG": '{{"cluster": {{"worker": ["127.0.0.1:1"]}}, "task": {{"index": 5}}}}'},
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
    ),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A project with digits prepared, through the CLI, copied into each case."""
    root = tmp_path_factory.mktemp("prepared")
    tiny_params(root)
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["prepare"]["data_dir"] = "tfrecords"
    raw["train"]["runs_dir"] = "runs"
    raw["sweep"]["out_dir"] = "sweep"
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    proc = subprocess.run(
        [str(BIN / "tfscale"), "prepare", "--no-progress"], cwd=root, capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    return root


ROOT_NEEDED = "mounting a tmpfs needs root"


def runnable(case: Case) -> bool:
    """A case that mounts a tmpfs runs only as root; the others run anywhere."""
    return not case.mount or os.geteuid() == 0


@pytest.fixture(scope="module")
def outcomes(prepared, tmp_path_factory) -> dict[str, dict]:
    """Every runnable case, two at a time."""
    base = tmp_path_factory.mktemp("cases")
    cases = [case for case in CASES if runnable(case)]
    with ThreadPoolExecutor(2) as pool:
        results = pool.map(lambda case: run_case(case, prepared, base), cases)
        return {case.name: result for case, result in zip(cases, results, strict=True)}


def run_case(case: Case, prepared: Path, base: Path) -> dict:
    project = base / case.name.replace(" ", "-").replace(",", "")
    shutil.copytree(prepared, project)
    mounted = _mount(case.mount, project)
    try:
        if case.setup:
            case.setup(project)
        env = {k: v.format(port=free_port()) for k, v in case.env.items()}
        proc = subprocess.Popen(
            [str(BIN / "tfscale"), *case.argv],
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, **env),
        )
        if case.during:
            case.during(proc, project)
        out, err = proc.communicate(timeout=600)
        return {
            "code": proc.returncode,
            "err": err,
            "out": out,
            "manifests": [
                str(p) for p in project.rglob("manifest.json") if "digits" not in p.parts
            ],
            "partial": [str(p) for p in project.rglob("*.tmp")],
            "running": _running_runs(project / "mlflow" / "mlflow.db"),
        }
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mounted)], check=False)


def _mount(kind: str, project: Path) -> Path | None:
    """A read-only runs dir, or a data dir on a tmpfs too small for the data."""
    if not kind:
        return None
    target = project / ("runs" if kind == "ro" else "tiny")
    target.mkdir(parents=True, exist_ok=True)
    options = "ro,size=64k" if kind == "ro" else "size=256k"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], check=True)
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
        if os.environ.get("CI"):
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
        assert fragment in err, (fragment, err[-2000:])
    assert not result["running"], f"MLflow runs left RUNNING: {result['running']}"
    if case.no_manifest:
        assert not result["manifests"], result["manifests"]
    assert not result["partial"], result["partial"]  # no half-written file left behind


def test_the_table_covers_what_users_get_wrong():
    assert len(CASES) >= 45
    assert {c.code for c in CASES} == {1, 2}
