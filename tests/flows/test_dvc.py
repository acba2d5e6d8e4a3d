"""`dvc repro` as a new user runs it: in a `git clone` of the project (with this working
tree's changes on top, so uncommitted work is tested too), on tiny params. First repro, a
no-op second one, a param change re-running only its dependents, metrics and plots, an
experiment compared with `dvc exp show`, every module a stage imports among its deps, and a
user's data file that DVC hashes itself."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import INNER_LIMIT_S, ROOT, ROUNDS_AT_LEAST_WORK, prefect_home, scaled, tiny_params

from tfscale.tasks.measure.rounds import ratio_95

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
IMPORT_LOG_SITE = ROOT / "tests" / "support" / "import_log"
STAGES = ("prepare", "baseline", "train", "evaluate", "sweep")
UP_TO_DATE = "Data and pipelines are up to date"


def git(*args: str, cwd: Path) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=scaled(60)
    )
    return proc.stdout


def clone_with_working_tree(dest: Path) -> None:
    """`git clone` of the project, plus the files this working tree adds, changes or
    deletes (what committing it would give), committed in the clone."""
    git("clone", "-q", str(ROOT), str(dest), cwd=ROOT)
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source, target = ROOT / name, dest / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        elif target.exists():
            target.unlink()


class Repo:
    def __init__(self, path: Path, env: dict):
        self.path, self.env = path, env

    def run(self, *args: str) -> str:
        proc = subprocess.run(
            list(args),
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=scaled(INNER_LIMIT_S),
        )
        assert proc.returncode == 0, f"{args}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout + proc.stderr

    def dvc(self, *args: str) -> str:
        return self.run(str(BIN / "dvc"), *args)

    def commit(self, message: str) -> None:
        self.run("git", "add", "-A")
        self.run("git", "commit", "-q", "-m", message)


def ran(output: str) -> set[str]:
    return {stage for stage in STAGES if f"Running stage '{stage}'" in output}


def lean() -> dict:
    """What the stages' work shrinks to, no claim here reading what it drops: no gradient
    noise scale recorded in the step and no held-out evaluation while training (the
    evaluate stage scores the test split itself), the speedup's rounds (still 3: its
    t-interval) in blocks of 10 steps, and the sweep's synthetic cell on 8x8 grey images
    with a test split of 128."""
    synthetic = yaml.safe_load((ROOT / "params.yaml").read_text())["prepare"]["synthetic"]
    return {
        **ROUNDS_AT_LEAST_WORK,  # the t-interval's 3 rounds
        "prepare.synthetic": {
            **synthetic,
            "height": 8,
            "width": 8,
            "channels": 1,
            "test_examples": 128,
        },
    }


def cloned(tmp: Path, **params) -> Repo:
    """A clone (`clone_with_working_tree`) on tiny, lean params (`lean`), its outputs
    inside it, with `params` (dotted keys) set and committed."""
    path = tmp / "repo"
    clone_with_working_tree(path)
    values = {
        "prepare.data_dir": "data/tfrecords",
        "train.runs_dir": "runs",
        "sweep.out_dir": "sweep",
        **lean(),
        **params,
    }
    (path / "params.yaml").write_text(tiny_params(tmp, **values).read_text())
    env = dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        PYTHONPATH=f"{path}:{IMPORT_LOG_SITE}",  # the clone's code, and the import log
        TFSCALE_IMPORT_LOG=str(tmp / "imports.jsonl"),
        PREFECT_HOME=str(prefect_home(tmp / "prefect")),
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="tfscale test",
        GIT_AUTHOR_EMAIL="test@localhost",
        GIT_COMMITTER_NAME="tfscale test",
        GIT_COMMITTER_EMAIL="test@localhost",
    )
    repo = Repo(path, env)
    repo.commit("tiny params")
    return repo


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The module's clone, its sweep a grid of one cell (1 replica, the cell every grid
    has): the tests claim of the sweep stage only that it runs, tracks, plots and imports
    nothing outside its deps; a second cell trains again and shows nothing more (the sweep
    imports the same modules with one cell or two)."""
    return cloned(tmp_path_factory.mktemp("dvc"), **{"sweep.replicas": [1]})


@pytest.fixture(scope="module")
def repro_runs(clone):
    """First repro, a second (timed), then the stages a repro would run after a train param
    changed (`dvc repro --dry`: the experiment test runs such a repro for real)."""
    repo = clone
    first = repo.dvc("repro")
    status_after_first = repo.run("git", "status", "--porcelain")
    started = time.monotonic()
    second = repo.dvc("repro")
    second_s = time.monotonic() - started
    print(f"no-op dvc repro took {second_s:.1f} s")
    status = repo.dvc("status")
    path = repo.path / "params.yaml"
    kept = path.read_text()
    params = yaml.safe_load(kept)
    params["train"]["epochs"] = 3
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    would_run = ran(repo.dvc("repro", "--dry"))
    path.write_text(kept)  # as the repros left it
    head = repo.run("git", "rev-parse", "HEAD").strip()  # what the repros ran at
    # the workspace as the repros left it (a later test's experiment or run rewrites it)
    files = {
        name: (repo.path / name).read_text()
        for name in (
            "models/digits/history.csv",
            "models/digits/scaling.json",
            "models/digits/eval.json",
            "models/digits/diagnosis.json",
            "models/digits/baseline/train_metrics.json",
        )
    }
    shown = json.loads(repo.dvc("metrics", "show", "--json"))
    return {
        "outputs": (first, second),
        "dvc status": status,
        "would run": would_run,
        "status": status_after_first,
        "commit": head,
        "files": files,
        "metrics shown": shown,
    }


def test_first_repro_runs_every_stage_and_leaves_only_dvc_lock_changed(repro_runs):
    assert ran(repro_runs["outputs"][0]) == set(STAGES)
    # each epoch as it ends, not a table after training (here no terminal: a line each)
    assert "train       epoch 1/2" in repro_runs["outputs"][0]
    assert "baseline    epoch 2/2" in repro_runs["outputs"][0]
    # outputs are ignored: the only change git sees is the lock file DVC rewrote
    changed = [line[3:] for line in repro_runs["status"].splitlines()]
    assert set(changed) <= {"dvc.lock"}, repro_runs["status"]


def test_second_repro_runs_nothing_and_status_says_up_to_date(repro_runs):
    """On a fresh clone, the first repro's dvc.lock holds every dep DVC hashed (the user's
    files too: no stage is always changed), so the second finds nothing to run."""
    second = repro_runs["outputs"][1]
    assert ran(second) == set() and UP_TO_DATE in second, second
    assert UP_TO_DATE in repro_runs["dvc status"], repro_runs["dvc status"]


def test_a_train_param_reruns_its_dependents_only(repro_runs):
    """`train.epochs` changed: the two stages that read it would run again, prepare and the
    sweep not (a dry run does not change the models, so it cannot show evaluate following
    them; the experiment's real repro shows that: train, then evaluate)."""
    assert repro_runs["would run"] == {"baseline", "train"}
    history = repro_runs["files"]["models/digits/history.csv"].splitlines()
    assert len(history) == 1 + 2  # the repro's own training: two epochs, a line each


def test_metrics_show_the_speedup_efficiency_and_accuracy(repro_runs):
    files = {
        name: json.loads(text) for name, text in repro_runs["files"].items() if ".json" in name
    }
    metrics = {}
    for found in repro_runs["metrics shown"][""]["data"].values():
        metrics.update(found["data"])
    scaling = files["models/digits/scaling.json"]
    eval_json = files["models/digits/eval.json"]
    # the throughputs are the medians of the rounds the train stage's diagnosis measured,
    # the speedup the median of the rounds' own ratios
    rates = files["models/digits/diagnosis.json"]["rounds"]["rates"]
    base, run = (rates[k] for k in ("one_device_replica_batch", "end_to_end"))
    assert (scaling["baseline_examples_per_s"], scaling["distributed_examples_per_s"]) == (
        statistics.median(base),
        statistics.median(run),
    )
    per_round = [r / b for r, b in zip(run, base, strict=True)]
    assert scaling["speedup"] == pytest.approx(statistics.median(per_round))
    # its range: a 95% interval of it, the order statistics' from 6 rounds, a t-interval on
    # the logs of the rounds' ratios below (the tests' 3), never their lowest to highest
    expected = ratio_95(run, base)
    assert (scaling["speedup_low"], scaling["speedup_high"]) == pytest.approx(
        (expected.low, expected.high)
    )
    assert scaling["scaling_efficiency"] == pytest.approx(scaling["speedup"] / 2)
    assert scaling["test_accuracy"] == eval_json["test_accuracy"]
    assert eval_json["examples"] == 360
    for key in ("speedup", "scaling_efficiency", "test_accuracy"):
        assert key in metrics, key
    baseline = files["models/digits/baseline/train_metrics.json"]
    assert baseline["strategy"] == "one_device" and baseline["replicas"] == 1


def test_every_stage_that_trains_or_evaluates_logs_an_mlflow_run(clone, repro_runs):
    from mlflow import MlflowClient

    repo = clone
    client = MlflowClient(f"sqlite:///{repo.path}/mlflow/mlflow.db")
    experiment = client.get_experiment_by_name("tfscale")
    runs = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'")
    by_stage: dict[str, list] = {}
    for run in runs:  # the repros' runs (an experiment may have run since, at the same commit)
        if run.data.tags.get("git_commit") == repro_runs["commit"]:
            by_stage.setdefault(run.data.tags.get("dvc_stage"), []).append(run)
    assert {"baseline", "train", "evaluate", "sweep"} <= set(by_stage)
    (train, *_) = sorted(by_stage["train"], key=lambda r: r.info.start_time)
    assert [m.step for m in client.get_metric_history(train.info.run_id, "loss")] == [1, 2]
    # the first repro's: the earliest (the experiment's, if it ran, came later)
    evaluate = min(by_stage["evaluate"], key=lambda r: r.info.start_time).data
    assert {"speedup", "scaling_efficiency", "test_accuracy"} <= set(evaluate.metrics)
    # the evaluate run names and links the training run it evaluated, and shows its setup
    trained = evaluate.tags["training_run_id"]
    assert trained in {r.info.run_id for r in by_stage["train"]}
    link = f"/runs/{trained}?workflowType=machine_learning"  # opens on model training
    assert evaluate.tags["training_run_url"].endswith(link)
    assert trained in evaluate.tags["mlflow.note.content"]
    setup = evaluate.params  # params, as a training's; never also tags
    assert (setup["dataset"], setup["model"]) == ("digits", "mlp")
    assert setup["strategy"] == "mirrored" and setup["replicas"] == "2"
    assert not set(evaluate.params) & set(evaluate.tags)


def test_each_repro_nests_its_stages_under_one_study_run(clone, repro_runs):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{clone.path}/mlflow/mlflow.db")
    experiment = client.get_experiment_by_name("tfscale").experiment_id
    runs = client.search_runs([experiment], f"tags.git_commit = '{repro_runs['commit']}'")
    parents = [  # not the experiment's (test_an_experiment_..., 1 replica, the same commit)
        r
        for r in runs
        if r.data.tags.get("kind") == "study"
        and r.data.tags.get("dvc_stage") == "repro"
        and r.data.params.get("replicas") == "2"
    ]
    assert len(parents) == 1  # the first repro's (the second did nothing)
    for parent in parents:
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        stages = {r.info.run_name: r.data.tags["dvc_stage"] for r in children}
        assert stages == {"baseline": "baseline", "distributed": "train", "evaluate": "evaluate"}
        assert all(r.info.status == "FINISHED" for r in [parent, *children])
        # the pipeline's row in the results table: its setup and its result
        assert parent.info.run_name[7:].startswith("digits-mlp-mirrored-2x-")
        params = parent.data.params
        assert (params["strategy"], params["replicas"]) == ("mirrored", "2")
        assert {"speedup", "scaling_efficiency", "test_accuracy"} <= set(parent.data.metrics)
        assert parent.data.tags["dvc_stage"] == "repro" and parent.data.tags["bottleneck"]
        description = parent.data.tags["mlflow.note.content"]  # the result, then the stages
        assert "on 2 replicas (mirrored, float32), efficiency" in description
    assert {p.info.run_name.split("-")[5] for p in parents} == {"2ep"}  # after the id


def test_plots_show_renders_the_curves(clone, repro_runs):
    repo = clone
    plots = json.loads(repo.dvc("plots", "show", "--json"))["data"]
    assert "models/digits/history.csv" in plots
    assert "models/digits/baseline/history.csv" in plots
    assert "sweep/speedup.png" in plots


def test_an_experiment_changes_replicas_and_exp_show_compares(clone, repro_runs):
    repo = clone
    output = repo.dvc("exp", "run", "-S", "train.replicas=1")
    assert ran(output) == {"train", "evaluate"}  # the baseline: not on replicas
    table = list(csv.DictReader(io.StringIO(repo.dvc("exp", "show", "--csv"))))
    replicas = {row["train.replicas"] for row in table if row.get("speedup")}
    assert {"1", "2"} <= replicas
    assert all(row.get("scaling_efficiency") for row in table if row.get("speedup"))
    # the kept baseline served 2 replicas; 1 replica is a study run of its own, linked
    # to it, not a second compared training under the baseline's
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo.path}/mlflow/mlflow.db")
    experiment = client.get_experiment_by_name("tfscale").experiment_id
    head = repo.run("git", "rev-parse", "HEAD").strip()
    runs = client.search_runs([experiment], f"tags.git_commit = '{head}'")
    (pipeline,) = [  # the experiment's (the repro's own, at the same commit, has 2 replicas)
        r
        for r in runs
        if r.data.tags.get("kind") == "study" and r.data.params.get("replicas") == "1"
    ]
    assert pipeline.data.params["replicas"] == "1" and "speedup" in pipeline.data.metrics
    stages = {
        r.info.run_name
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == pipeline.info.run_id
    }
    assert stages == {"distributed", "evaluate"}
    baseline = client.get_run(pipeline.data.tags["baseline_run_id"])
    assert baseline.info.run_name == "baseline" and baseline.data.params["replicas"] == "1"
    assert baseline.data.tags["mlflow.parentRunId"] != pipeline.info.run_id


def test_every_module_a_stage_imports_is_among_its_deps(clone, repro_runs):
    repo = clone
    stages = yaml.safe_load((repo.path / "dvc.yaml").read_text())["stages"]
    by_command = {}
    for name, stage in stages.items():
        argv = stage["cmd"].split()
        by_command[(argv[1], "--baseline" in argv)] = name
    seen = set()
    log = (Path(repo.env["TFSCALE_IMPORT_LOG"])).read_text().splitlines()
    for line in map(json.loads, log):
        if not line["argv"][0].endswith("tfscale"):
            continue
        stage = by_command.get((line["argv"][1], "--baseline" in line["argv"]))
        if stage is None:
            continue  # a command run beside the stages (tfscale run)
        seen.add(stage)
        deps = stages[stage]["deps"]
        for module in line["modules"]:
            path = module.replace(".", "/") + ".py"
            if not (repo.path / path).exists():
                continue  # a package (empty __init__)
            covered = any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)
            assert covered, f"stage {stage!r} imports {module} but {path} is not in its deps"
    assert seen == set(STAGES)


def test_an_edited_data_file_reruns_the_stages_that_read_it_only(tmp_path_factory):
    """The user's table named by `prepare.files`: DVC hashes it itself, so a second
    `dvc repro prepare` skips, and an edit changes prepare's deps only (the stages after it
    follow through the shards, as any changed output), so that a repro reruns prepare, not
    its readers' readers (`--dry`: DVC's own decision, without a second preparation to
    show it). Prepare alone: a stage that trains costs minutes and shows nothing more."""
    tmp = tmp_path_factory.mktemp("dvc-table")
    rows = [f"{i % 7},{(i * 3) % 11},{i % 2}" for i in range(200)]
    table = "a,b,label\n" + "\n".join(rows) + "\n"
    repo = cloned(tmp)
    (repo.path / "table.csv").write_text(table)
    params = yaml.safe_load((repo.path / "params.yaml").read_text())
    params["prepare"].update(dataset="table.csv", files="table.csv")
    (repo.path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    repo.commit("a user's table")
    assert ran(repo.dvc("repro", "prepare")) == {"prepare"}
    again = repo.dvc("repro", "prepare")
    assert ran(again) == set() and "Stage 'prepare' didn't change, skipping" in again, again
    (repo.path / "table.csv").write_text(table + "6,10,1\n")
    status = json.loads(repo.dvc("status", "--json"))
    reading = {
        stage
        for stage, changes in status.items()
        for change in changes
        if isinstance(change, dict) and "table.csv" in change.get("changed deps", {})
    }
    assert reading == {"prepare"}, status
    assert ran(repo.dvc("repro", "prepare", "--dry")) == {"prepare"}
