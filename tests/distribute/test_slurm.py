"""`flows/cluster/train.sbatch` on a real Slurm cluster (Debian's slurm-wlm 22.05, installed
when missing) on namespace hosts: MultiWorkerMirrored over 2 nodes, a parameter-server job
over 3, and preemption the Slurm way (`scancel --signal=TERM`, then `scontrol requeue`)."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
import slurmlab
from helpers import ROOT, needs, scaled

from tfscale.tasks.distribute import netlab

# no speed measured (a job's state, outputs and resumed step): beside the parallel phase's
# other tests, its waits scaled to the pace and the jobs' collective timeout Slurm's 60 s
pytestmark = pytest.mark.cluster(alone=False)

BIN = Path(sys.executable).parent
SCRIPT = str(ROOT / "flows" / "cluster" / "train.sbatch")
TRAIN = ["--model", "mlp", "--precision", "float32", "--jit-compile", "false"]
EPOCHS = 15  # the preempted job's: the signal lands after 3, the requeued job does the rest


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A 3-node cluster for the module; Slurm installed here (not when the module is
    collected: `pytest -m unit` collects it too, and must not run apt-get)."""
    needs(netlab.available() or slurmlab.install(), "a Slurm cluster on namespace hosts")
    with slurmlab.slurm_cluster(3, tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def submit(slurm, digits, tmp: Path, *args: str, nodes: int = 2, env: dict | None = None) -> str:
    """sbatch of train.sbatch (its outputs under `tmp`); the job id."""
    from helpers import free_port

    env = {
        "DATA_DIR": digits[0]["prepare.data_dir"],
        "RUNS_DIR": str(tmp / "runs"),
        "TFSCALE": str(BIN / "tfscale"),
        "TFSCALE_PORT_BASE": str(free_port()),
        **(env or {}),
    }
    argv = ["sbatch", "--parsable", f"--nodes={nodes}", f"--chdir={tmp}", "-o", "job-%j.out"]
    return slurm.run(*argv, SCRIPT, *TRAIN, *args, env=env).stdout.strip().split(";")[0]


def output(tmp: Path, job: str) -> str:
    return (tmp / f"job-{job}.out").read_text(errors="replace")


def test_sbatch_trains_multi_worker_on_two_slurm_nodes_and_writes_one_run(slurm, digits, tmp_path):
    from mlflow import MlflowClient

    job = submit(slurm, digits, tmp_path, "--epochs", "2")
    assert slurm.wait(job, {"COMPLETED", "FAILED"}) == "COMPLETED", output(tmp_path, job)
    out = output(tmp_path, job)
    assert out.count("the Slurm cluster has 2 workers") == 2, out
    # each node has 1 CPU and shows the task both of this machine's cores: it takes 1
    assert out.count("threads: 1 per TensorFlow pool (Slurm gave this task 1 CPU)") == 2, out
    (metrics_path,) = (tmp_path / "runs").glob("digits/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert (metrics["strategy"], metrics["replicas"], metrics["workers"]) == ("multi_worker", 2, 2)
    tasks = [
        json.loads((metrics_path.parent / f"task-worker-{i}.json").read_text()) for i in (0, 1)
    ]
    assert tasks[0]["weights_digest"] == tasks[1]["weights_digest"]
    assert (metrics_path.parent / "diagnosis.txt").exists()  # probed in place, on the nodes
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].data.params["strategy"] == "multi_worker"  # the chief's


def test_a_parameter_server_job_takes_its_roles_by_rank(slurm, digits, tmp_path):
    jobs = {"TFSCALE_SLURM_JOBS": "chief:1,ps:1,worker:1"}
    job = submit(slurm, digits, tmp_path, "--epochs", "2", "--no-diagnose", nodes=3, env=jobs)
    assert slurm.wait(job, {"COMPLETED", "FAILED"}) == "COMPLETED", output(tmp_path, job)
    out = output(tmp_path, job)
    assert "ps:0 serving" in out and "worker:0 serving" in out, out
    (metrics_path,) = (tmp_path / "runs").glob("digits/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert (metrics["strategy"], metrics["workers"]) == ("parameter_server", 1)
    assert len(metrics["history"]) == 2


def test_scancel_signal_term_checkpoints_at_the_step_and_requeue_resumes_there(
    slurm, digits, tmp_path
):
    job = submit(slurm, digits, tmp_path, "--epochs", str(EPOCHS), "--no-diagnose")
    deadline = time.monotonic() + scaled(180)
    while time.monotonic() < deadline:  # a few epochs in
        found = list((tmp_path / "runs").glob("digits/*/history.json"))
        if found and len(json.loads(found[0].read_text() or "[]")) >= 3:
            break
        time.sleep(0.2)
    else:  # cancelled before 3 epochs, the test would prove nothing of a checkpoint
        raise AssertionError(f"no 3 epochs within {scaled(180):.0f} s: {output(tmp_path, job)}")
    slurm.run("scancel", "--signal=TERM", job)
    assert slurm.wait(job, {"FAILED", "COMPLETED"}) == "FAILED", output(tmp_path, job)
    out = output(tmp_path, job)
    saved = {int(n) for n in re.findall(r"preempted: checkpoint at step (\d+)", out)}
    assert len(saved) == 1 and "exited with exit code 42" in out.lower(), out
    assert "ExitCode=42:0" in slurm.run("scontrol", "show", "job", job).stdout
    slurm.run("scontrol", "requeue", job)
    slurm.wait(job, {"PENDING", "RUNNING"}, restarts=1)  # requeued, not the last run's end
    # Slurm holds a requeued job 120 s; 5 s is enough: a start in the second the nodes
    # revoked the last run's credential fails ("Job credential revoked", exit 1)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now+5")
    final = slurm.wait(job, {"COMPLETED", "FAILED"}, restarts=1)
    assert final == "COMPLETED", output(tmp_path, job)
    (metrics_path,) = (tmp_path / "runs").glob("digits/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    (step,) = saved
    assert metrics["resumed_from_step"] == step and step > 0
    assert step < EPOCHS * metrics["steps_per_epoch"]  # the signal landed mid-run
    assert [h["epoch"] for h in metrics["history"]] == list(range(1, EPOCHS + 1))
    print(f"\nSlurm preemption: checkpoint at step {step}; the requeued job resumed there")
