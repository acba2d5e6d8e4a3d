"""The pipeline with real parts: a Prefect flow, a SQLite MLflow store read back through
MlflowClient, `dvc repro` in a temporary git repository, a real Prefect server serving the
deployments, and `tfscale ui` serving the store."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from tasks import tracking
from tasks.config import load_config

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = {
    "train.model": "mlp",
    "train.epochs": 2,
    "train.precision": "float32",
    "train.replicas": 2,
    "train.strategy": "auto",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def wait_until_healthy(url: str, timeout_s: float = 120) -> None:
    """Polls `<url>/health` until the server answers, for at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            requests.get(f"{url}/health", timeout=2).raise_for_status()
            return
        except requests.RequestException:
            time.sleep(0.5)
    raise AssertionError(f"{url}/health did not answer within {timeout_s:.0f} s")


def tfscale(args: list[str], cwd: Path, env: dict | None = None, check: bool = True):
    proc = subprocess.run(
        [str(BIN / "tfscale"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory):
    """One real flow run (and a second, to see the baseline cached) into a temporary store."""
    from flows.pipeline import pipeline

    tmp = tmp_path_factory.mktemp("flow")
    store = tmp / "mlflow"
    old_store = tracking.STORE_DIR
    tracking.STORE_DIR = store
    tracking._client_for.cache_clear()
    try:
        config = load_config(tiny_params(tmp))
        first = pipeline(config)
        baseline_metrics = next((tmp / "runs" / "digits").glob("one_device-*/metrics.json"))
        stamp = baseline_metrics.stat().st_mtime_ns
        second = pipeline(config)
        reused = baseline_metrics.stat().st_mtime_ns == stamp
        # cached results whose files are gone: the shards and the baseline's run directory
        shutil.rmtree(tmp / "tfrecords")
        shutil.rmtree(baseline_metrics.parent)
        third = pipeline(config)
        yield {
            "tmp": tmp,
            "store": store,
            "summaries": (first, second, third),
            "baseline_reused": reused,
            "baseline_retrained": baseline_metrics.exists(),
            "reprepared": (tmp / "tfrecords" / "digits" / "manifest.json").exists(),
        }
    finally:
        tracking.STORE_DIR = old_store
        tracking._client_for.cache_clear()


def test_flow_logs_parent_and_children_with_metrics_and_artifacts(flow_run):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{flow_run['store']}/mlflow.db")
    experiment = client.get_experiment_by_name("tfscale")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 3
    parent = parents[0]
    children = {
        r.info.run_name: r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    assert set(children) == {"baseline", "distributed"}
    for key in (
        "dataset",
        "shards",
        "model",
        "strategy",
        "replicas",
        "workers",
        "precision",
        "per_replica_batch",
        "global_batch",
        "scaling",
        "epochs",
        "learning_rate",
    ):
        assert key in children["distributed"].data.params, key
    assert children["distributed"].data.params["strategy"] == "mirrored"
    assert children["baseline"].data.params["strategy"] == "one_device"
    for key in (
        "hardware_fingerprint",
        "strategy",
        "strategy_reason",
        "git_commit",
        "manifest_hash",
    ):
        assert parent.data.tags[key]
    history = client.get_metric_history(children["distributed"].info.run_id, "loss")
    assert [m.step for m in history] == [1, 2]
    metrics = parent.data.metrics
    for key in (
        "speedup",
        "scaling_efficiency",
        "test_accuracy",
        "test_loss",
        "time_to_accuracy_s_baseline",
    ):
        assert key in metrics, key
    assert metrics["speedup"] == pytest.approx(
        metrics["distributed_examples_per_s"] / metrics["baseline_examples_per_s"]
    )
    assert metrics["scaling_efficiency"] == pytest.approx(metrics["speedup"] / 2)
    assert any(k.startswith("system/") for k in metrics)
    assert parent.data.tags["bottleneck"] in (
        "input-bound",
        "compute-bound",
        "communication-bound",
        "overhead-bound",
    )
    for key in ("input", "compute", "end_to_end"):
        assert metrics[f"diagnosis_{key}_examples_per_s"] > 0
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {
        "hardware.json",
        "manifest.json",
        "speedup.png",
        "confusion_matrix.png",
        "eval.json",
        "summary.json",
    } <= artifacts
    models = client.search_logged_models([experiment.experiment_id])
    distributed_id = children["distributed"].info.run_id
    (model,) = [m for m in models if m.source_run_id == distributed_id and m.name == "model"]
    from mlflow.artifacts import download_artifacts

    requirements = Path(download_artifacts(f"{model.artifact_location}/requirements.txt"))
    assert "tensorflow==" in requirements.read_text()  # pinned, not inferred


def test_summary_speedup_matches_logged_throughputs(flow_run):
    summary = flow_run["summaries"][0]
    assert summary.speedup == pytest.approx(
        summary.distributed_examples_per_s / summary.baseline_examples_per_s
    )
    assert summary.replicas == 2 and 0 <= summary.test_accuracy <= 1


def test_second_flow_run_reuses_the_cached_baseline(flow_run):
    first, second, _ = flow_run["summaries"]
    assert flow_run["baseline_reused"]
    assert first.baseline_examples_per_s == second.baseline_examples_per_s


def test_cached_results_whose_files_were_deleted_are_made_again(flow_run):
    assert flow_run["reprepared"]
    assert flow_run["baseline_retrained"]  # and the third run tracked it: three parents


def test_ui_serves_the_store(flow_run):
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "tfscale"), "ui", "--port", str(port)],
        cwd=flow_run["tmp"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(url)
        experiment = requests.get(
            f"{url}/api/2.0/mlflow/experiments/get-by-name",
            params={"experiment_name": "tfscale"},
            timeout=10,
        ).json()
        found = requests.post(
            f"{url}/api/2.0/mlflow/runs/search",
            timeout=10,
            json={"experiment_ids": [experiment["experiment"]["experiment_id"]]},
        ).json()
        names = {r["info"]["run_name"] for r in found["runs"]}
        assert {"baseline", "distributed"} <= names
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
    assert f"127.0.0.1:{port}" in out


def test_dvc_repro_runs_once_skips_then_reruns_only_train_and_evaluate(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("tasks", "flows", "dvc.yaml"):
        source = ROOT / name
        copy = shutil.copytree if source.is_dir() else shutil.copy
        copy(source, repo / name)
    params = yaml.safe_load(tiny_params(tmp_path).read_text())
    params["prepare"]["data_dir"] = "data/tfrecords"
    params["train"]["runs_dir"] = "runs"
    params["sweep"]["out_dir"] = "sweep"
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", DVC_NO_ANALYTICS="1")

    def run(*args):
        proc = subprocess.run(list(args), cwd=repo, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc.stdout

    run("git", "init", "-q")
    run(str(BIN / "dvc"), "init", "-q")
    first = run(str(BIN / "dvc"), "repro")
    for stage in ("prepare", "train", "evaluate", "sweep"):
        assert f"Running stage '{stage}'" in first
    assert json.loads((repo / "models/digits/eval.json").read_text())["examples"] == 360
    assert "Running stage" not in run(str(BIN / "dvc"), "repro")
    params["train"]["epochs"] = 3
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    third = run(str(BIN / "dvc"), "repro")
    assert "Running stage 'train'" in third and "Running stage 'evaluate'" in third
    assert "Running stage 'prepare'" not in third and "Running stage 'sweep'" not in third
    history = (repo / "models/digits/history.csv").read_text().splitlines()
    assert len(history) == 1 + 3


def test_bad_params_exit_2_and_write_nothing(tmp_path):
    path = tiny_params(tmp_path)
    path.write_text(path.read_text().replace("epochs: 2", "epochs: two"))
    proc = tfscale(["--params", str(path), "run"], cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "train.epochs: expected an integer" in proc.stderr
    assert not (tmp_path / "tfrecords").exists() and not (tmp_path / "mlflow").exists()


def test_unreachable_tracking_server_fails_clearly_before_training(tmp_path):
    path = tiny_params(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    proc = tfscale(
        ["--params", str(path), "run"], cwd=tmp_path, check=False, env={"MLFLOW_TRACKING_URI": url}
    )
    assert proc.returncode == 1
    assert f"MLflow tracking server {url} is unreachable" in proc.stderr
    assert "unset MLFLOW_TRACKING_URI" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_missing_dataset_is_a_clear_error(tmp_path):
    path = tiny_params(tmp_path)
    proc = tfscale(
        ["--params", str(path), "train", "--dataset", "digits"], cwd=tmp_path, check=False
    )
    assert proc.returncode == 1
    assert "run 'tfscale prepare --dataset digits' first" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_serve_without_a_server_says_how_to_start_one(tmp_path):
    proc = tfscale(["serve"], cwd=tmp_path, check=False, env={"PREFECT_API_URL": ""})
    assert proc.returncode == 1
    assert "prefect server start" in proc.stderr and "PREFECT_API_URL" in proc.stderr


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A real Prefect server (SQLite) on a free localhost port."""
    home = tmp_path_factory.mktemp("prefect")
    port = free_port()
    env = dict(
        os.environ,
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
    )
    proc = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/api"
    wait_until_healthy(url)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_served_deployments_are_scheduled_and_run_on_demand(prefect_server, tmp_path):
    env = {"PREFECT_API_URL": prefect_server, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    params = tiny_params(tmp_path)
    serve = subprocess.Popen(
        [str(BIN / "tfscale"), "--params", str(params), "serve"],
        cwd=tmp_path,
        env=dict(os.environ, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deployments = wait_for_deployments(prefect_server, 2)
        nightly = deployments["nightly-scaling"]
        assert nightly["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
        assert nightly["schedules"][0]["active"]
        run = requests.post(
            f"{prefect_server}/deployments/{deployments['on-demand-train']['id']}/create_flow_run",
            json={"parameters": {"params_path": str(params), "overrides": {"train.epochs": 1}}},
            timeout=10,
        )
        assert run.ok, f"create_flow_run answered {run.status_code}: {run.text[:2000]}"
        state = wait_for_flow_run(prefect_server, run.json()["id"])
        assert state == "COMPLETED"
        assert list((tmp_path / "runs" / "digits").glob("mirrored-*/summary.json"))
    finally:
        serve.terminate()
        serve.wait(timeout=30)


def wait_for_deployments(url: str, count: int) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = requests.post(f"{url}/deployments/filter", json={}, timeout=10).json()
        if len(found) >= count:
            return {d["name"]: d for d in found}
        time.sleep(1)
    raise AssertionError("deployments never registered")


def wait_for_flow_run(url: str, run_id: str) -> str:
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        state = requests.get(f"{url}/flow_runs/{run_id}", timeout=10).json()["state"]["type"]
        if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return state
        time.sleep(2)
    raise AssertionError("the on-demand flow run never finished")
