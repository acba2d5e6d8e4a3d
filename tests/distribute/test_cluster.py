"""Clusters as a cluster manager launches them: every task runs `tfscale train` on a host of
its own (a network namespace with its own address) with the `TF_CONFIG` a TFJob sets, or
the `SLURM_*` variables Slurm sets. Faults: preemption, a killed worker, a cut link, a lost
worker or ps task of a parameter-server cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml
from helpers import BIN, DEFAULTS, INNER_LIMIT_S, ROOT, needs, scaled

from tfscale.tasks.core.network import free_ports
from tfscale.tasks.distribute import netlab

TRAIN = ["--model", "mlp", "--precision", "float32"]
QUIET = ["--no-diagnose"]  # the runs that test something else skip the diagnosis probes
# work no claim of these tests reads: the held-out split evaluated while training (the
# evaluator's sidecar evaluates on its own) and the gradient noise scale recorded in the step
LEAST_WORK = ["--evaluate-every", "0", "--noise-scale", "false"]

COLLECTIVE_TIMEOUT_S = 12  # a lost peer fails the others after this long (a step takes ms)
# what a task may take past the collective timeout to fail and exit (its teardown: work,
# so scaled by the pace); measured 1.2-3 s past the event, 10-21 s for a cut link
FAIL_MARGIN_S = 15
# the fault tests' trainings: each fault lands a few epochs in (a task's first epoch holds
# its start-up, a later one a second or less), and each test checks that it landed mid-run;
# the rerun trains the rest (a wait's own limit only keeps a hang finite)
EPOCHS = 9

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def hosts():
    """Five hosts on one switch for the whole module, deleted at its end. They need root
    and iproute2: elsewhere the tests are skipped, on CI they fail."""
    needs(netlab.available(), "namespace hosts for the cluster tests")
    with netlab.namespace_hosts(5) as made:
        yield made


class Cluster:
    """The tasks of one cluster, each `tfscale train` on its own namespace host."""

    def __init__(self, hosts, jobs: dict[str, list[int]], digits, tmp: Path, epochs: int):
        self.hosts, self.tmp, self.epochs = hosts, tmp, epochs
        # ports the OS hands out, fresh for each cluster: no clash with another test's or
        # with a port still in TIME_WAIT on a host a cluster before used
        self.spec = {
            job: [
                f"{hosts.address(h)}:{port}"
                for h, port in zip(on, free_ports(len(on)), strict=True)
            ]
            for job, on in jobs.items()
            if job != "evaluator"
        }
        self.placement = {(job, i): h for job, on in jobs.items() for i, h in enumerate(on)}
        self.data_dir = digits[0]["prepare.data_dir"]
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}

    def start(
        self,
        *only: tuple[str, int],
        extra: tuple[str, ...] = (),
        diagnose: bool = False,
        slow_input: tuple[tuple[str, int], ...] = (),
        pinned: bool = False,
    ) -> None:
        """Starts the tasks (all by default); those in `slow_input` with their input
        pipeline slowed (`tests/support/slow_input.py`). `pinned` gives each host a core of its own
        (as separate machines have), so timings are not two hosts fighting over both cores."""
        for task in only or tuple(self.placement):
            job, index = task
            tf_config = {"cluster": self.spec, "task": {"type": job, "index": index}}
            env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), PYTHONPATH=str(ROOT))
            entry = (
                [str(BIN / "python"), str(ROOT / "tests" / "support" / "slow_input.py")]
                if task in slow_input
                else [str(BIN / "tfscale")]
            )
            argv = [*entry, "--params", DEFAULTS, "train", *TRAIN, *LEAST_WORK]
            argv += [] if diagnose else QUIET
            argv += ["--epochs", str(self.epochs), "--data-dir", self.data_dir]
            argv += [
                "--runs-dir",
                str(self.tmp / "runs"),
                "--collective-timeout",
                str(COLLECTIVE_TIMEOUT_S),
                *extra,
            ]
            if pinned:
                core = self.placement[task] % (os.cpu_count() or 1)
                argv = ["taskset", "-c", str(core), *argv]
            log = open(self.log(task), "a")  # noqa: SIM115 (closed with the process)
            self.procs[task] = self.hosts.popen(
                self.placement[task], argv, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def log(self, task: tuple[str, int]) -> Path:
        return self.tmp / f"{task[0]}-{task[1]}.log"

    def output(self, task: tuple[str, int]) -> str:
        return self.log(task).read_text(errors="replace")

    def wait(self, task: tuple[str, int], timeout: float = scaled(240)) -> int:
        return self.procs[task].wait(timeout=timeout)

    def signal(self, task: tuple[str, int], sig: int) -> None:
        """Sends `sig` to the task's Python process (the child of `ip netns exec`)."""
        proc = psutil.Process(self.procs[task].pid)
        for target in proc.children(recursive=True) or [proc]:
            target.send_signal(sig)

    def run_dir(self) -> Path:
        (path,) = {p.parent for p in (self.tmp / "runs").glob("digits/*/history.json")}
        return path

    def wait_for_epochs(self, n: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + scaled(timeout)
        while time.monotonic() < deadline:
            done = list((self.tmp / "runs").glob("digits/*/history.json"))
            if done and len(json.loads(done[0].read_text() or "[]")) >= n:
                return
            time.sleep(0.1)
        raise AssertionError(f"{n} epochs not reached; chief log:\n{self.chief_log()}")

    def chief_log(self) -> str:
        chief = ("chief", 0) if "chief" in self.spec else ("worker", 0)
        return self.output(chief)[-3000:]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
                proc.kill()
                proc.wait(timeout=scaled(60))


@pytest.fixture
def cluster(hosts, digits, tmp_path):
    made = []

    def make(jobs: dict[str, list[int]], epochs: int = 3) -> Cluster:
        tmp = tmp_path / f"cluster-{len(made)}"
        tmp.mkdir()
        made.append(Cluster(hosts, jobs, digits, tmp, epochs))
        return made[-1]

    yield make
    for each in made:
        each.stop()


def no_half_written(run_dir: Path) -> list[str]:
    """Temporary files an interrupted write would leave behind."""
    return [p.name for p in run_dir.rglob("*") if ".tmp" in p.name or p.name.startswith(".tmp")]


@pytest.mark.cluster(alone=False)  # nothing timed: weights, outputs, the evaluator's steps
def test_multi_worker_over_two_hosts_with_an_evaluator(cluster):
    """Two hosts train in lock-step and end with identical weights; the chief alone writes
    outputs; an evaluator on a third host evaluates each checkpoint as it appears."""
    epochs = 2
    job = cluster({"worker": [0, 1], "evaluator": [2]}, epochs=epochs)
    job.start()
    codes = {task: job.wait(task) for task in job.procs}
    assert set(codes.values()) == {0}, job.chief_log()
    run_dir = job.run_dir()
    tasks = [json.loads((run_dir / f"task-worker-{i}.json").read_text()) for i in range(2)]
    assert tasks[0]["weights_digest"] == tasks[1]["weights_digest"] != ""
    assert [t["replicas"] for t in tasks] == [2, 2] and tasks[0]["global_batch"] == 64
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["history"][-1]["accuracy"] > 0.8
    assert not list(run_dir.glob(".worker-1-checkpoints"))  # the other worker's are removed
    evaluated = json.loads((run_dir / "evaluator.json").read_text())
    assert evaluated[-1]["step"] == epochs * metrics["steps_per_epoch"]
    assert evaluated[-1]["test_accuracy"] > 0.8


def diagnosis_of(job: Cluster) -> dict:
    return json.loads((job.run_dir() / "diagnosis.json").read_text())


def test_diagnosis_names_the_worker_whose_input_is_slow(cluster):
    """Worker 1's input pipeline is slowed (its host reads slowly); worker 0's is not. The
    diagnosis, gathered from both hosts, is input-bound and names worker 1."""
    job = cluster({"worker": [0, 1]}, epochs=1)  # what is checked: the probes after it
    job.start(diagnose=True, slow_input=(("worker", 1),), pinned=True)
    assert [job.wait(("worker", i)) for i in range(2)] == [0, 0], job.chief_log()
    d = diagnosis_of(job)
    assert d["bottleneck"] == "input-bound", d
    assert "worker 1's input pipeline" in d["evidence"]
    assert "bottleneck: input-bound" in job.output(("worker", 0))  # the chief prints it
    fast_input, slow_input = d["input_examples_per_s_by_worker"]
    assert slow_input < fast_input / 5
    print(f"\ninput-only per worker: {fast_input:,.0f} and {slow_input:,.0f} ex/s; {d['evidence']}")


def test_preemption_a_killed_worker_and_a_cut_link_each_rerun_resumes_where_it_stopped(cluster):
    """One cluster of two hosts, three faults, each followed by a rerun:
    - SIGTERM (what Kubernetes sends on eviction) to one worker: every worker saves a
      checkpoint at the current step and exits 42; the rerun says it resumes from that step;
    - SIGKILL to one worker: the survivor stops within the collective timeout, names the
      lost task and its host, exits 3;
    - the link to one host goes down mid-epoch: both tasks fail within a bounded time,
      each naming the other; with the link back, the rerun restores the checkpoint and
      completes. Nothing in the run directory is ever half-written."""
    job = cluster({"worker": [0, 1]}, epochs=EPOCHS)
    job.start()
    job.wait_for_epochs(2)
    history = json.loads((job.run_dir() / "history.json").read_text())
    sent = time.monotonic()
    job.signal(("worker", 1), signal.SIGTERM)
    codes = [job.wait(("worker", i), timeout=scaled(120)) for i in range(2)]
    stopped_s = time.monotonic() - sent
    assert codes == [42, 42], job.chief_log()
    failed_within_the_collective_timeout(stopped_s, "both workers exited 42")
    (line,) = [x for x in job.output(("worker", 0)).splitlines() if x.startswith("preempted")]
    saved = int(line.split("checkpoint at step ")[1].split()[0])
    logged = len(job.output(("worker", 0)))
    # the epochs recorded when they stopped: one may have ended between the reading above
    # and the signal, and a rerun waited on the earlier count would be read before it began
    stopped_at = len(json.loads((job.run_dir() / "history.json").read_text()))

    job.start()
    job.wait_for_epochs(stopped_at + 1)  # past the epoch the preemption cut
    rerun = job.output(("worker", 0))[logged:]
    (line,) = [x for x in rerun.splitlines() if x.startswith("resuming")]
    assert f"from step {saved} " in line, line  # the step the preemption saved
    killed = time.monotonic()
    job.signal(("worker", 1), signal.SIGKILL)
    assert job.wait(("worker", 0), timeout=scaled(120)) == 3, job.chief_log()
    failed_s = time.monotonic() - killed
    failed_within_the_collective_timeout(failed_s, "the survivor of a killed worker failed")
    output = job.output(("worker", 0))[logged:]
    assert f"task worker:1 ({job.spec['worker'][1]})" in output, output[-2000:]
    assert "fix:" in output and "Traceback" not in output
    assert not no_half_written(job.run_dir())
    killed_at = len(json.loads((job.run_dir() / "history.json").read_text()))

    job.start()
    job.wait_for_epochs(killed_at + 1)
    cut_s = cut_link_mid_run(job, host=1)
    done = len(json.loads((job.run_dir() / "history.json").read_text()))
    job.start()
    assert [job.wait(("worker", i)) for i in range(2)] == [0, 0], job.chief_log()
    metrics = json.loads((job.run_dir() / "metrics.json").read_text())
    steps = metrics["steps_per_epoch"]
    assert len(history) * steps <= saved < EPOCHS * steps  # nothing done lost; mid-run
    assert killed_at < done
    assert_resumed(metrics, done)
    assert not no_half_written(job.run_dir())
    print(
        f"\npreemption: checkpoint at step {saved} (epoch {saved // steps + 1}, step "
        f"{saved % steps} of {steps}); both workers exited 42 {stopped_s:.1f} s after SIGTERM"
        f"\nkilled worker: the survivor failed {failed_s:.1f} s later, naming it"
        f"\ncut link: both tasks failed {cut_s:.1f} s after the cut, naming each other"
    )


def failed_within_the_collective_timeout(seconds: float, what: str) -> None:
    """`what` came within the collective timeout the tasks were given (a timer: wall time,
    not scaled) and a margin for their teardown (scaled): a task that fell back to
    TensorFlow's own 60 s, or hung until the test's limit, fails this at any pace up to
    the suite's clamp (12 + 15 x 3 = 57 s)."""
    bound = COLLECTIVE_TIMEOUT_S + scaled(FAIL_MARGIN_S)
    assert seconds <= bound, (
        f"{what} {seconds:.1f} s after, not within the collective timeout "
        f"({COLLECTIVE_TIMEOUT_S} s) and {bound - COLLECTIVE_TIMEOUT_S:.0f} s to exit"
    )


def cut_link_mid_run(job: Cluster, host: int) -> float:
    """Takes `host`'s link down until both tasks fail, each naming the other; the link is
    back afterwards. Returns how long they took to fail."""
    logged = [len(job.output(("worker", i))) for i in range(2)]
    cut = time.monotonic()
    job.hosts.cut(host)
    try:
        codes = [job.wait(("worker", i), timeout=scaled(120)) for i in range(2)]
        failed_s = time.monotonic() - cut
    finally:
        job.hosts.restore(host)
    assert codes == [3, 3], job.chief_log()
    failed_within_the_collective_timeout(failed_s, "both sides of the cut link failed")
    for me, other in ((0, 1), (1, 0)):
        said = job.output(("worker", me))[logged[me] :]
        assert f"task worker:{other} ({job.spec['worker'][other]})" in said, said[-2000:]
    assert not no_half_written(job.run_dir())
    return failed_s


def assert_resumed(metrics: dict, recorded: int, epochs: int = EPOCHS) -> None:
    """The failure landed mid-run, and the rerun resumed from the last checkpoint: at most
    one epoch behind the history the failed run wrote (an epoch's record is written before
    its checkpoint, which a failure can stop), and its history holds every epoch once."""
    assert recorded < epochs, f"the failure came after all {epochs} epochs"
    assert metrics["resumed_from_epoch"] >= recorded - 1, (metrics["resumed_from_epoch"], recorded)
    assert [h["epoch"] for h in metrics["history"]] == list(range(1, epochs + 1))


def test_parameter_server_absorbs_a_lost_worker_and_a_lost_ps_fails_the_chief(cluster):
    """Chief, two workers and a ps on hosts of their own. One worker killed mid-training:
    the coordinator runs its steps on the other and training goes on. Then the ps killed:
    the chief fails naming it, the live worker stops serving; the rerun (all four tasks)
    resumes and completes."""
    job = cluster({"chief": [0], "worker": [1, 2], "ps": [3]}, epochs=EPOCHS)
    job.start()
    job.wait_for_epochs(2)
    job.signal(("worker", 1), signal.SIGKILL)
    lost_at = len(json.loads((job.run_dir() / "history.json").read_text()))
    job.wait_for_epochs(lost_at + 2)  # absorbed: the epochs go on without worker 1
    killed = time.monotonic()
    job.signal(("ps", 0), signal.SIGKILL)
    code = job.wait(("chief", 0), timeout=scaled(120))
    failed_s = time.monotonic() - killed
    output = job.output(("chief", 0))
    failed_within_the_collective_timeout(failed_s, "the chief of a lost ps task failed")
    from tfscale.tasks.distribute.cluster import TaskLost

    assert code == TaskLost.exit_code, output[-2000:]  # 3: another task of the cluster lost
    assert f"task ps:0 ({job.spec['ps'][0]})" in output, output[-2000:]
    assert job.wait(("worker", 0), timeout=scaled(60)) == 0  # the chief is gone: it stops serving
    done = len(json.loads((job.run_dir() / "history.json").read_text()))
    servers = (("worker", 0), ("worker", 1), ("ps", 0))
    logged = {task: len(job.output(task)) for task in servers}  # the rerun's lines follow
    job.start()
    assert job.wait(("chief", 0), timeout=scaled(INNER_LIMIT_S)) == 0, job.chief_log()
    metrics = json.loads((job.run_dir() / "metrics.json").read_text())
    assert_resumed(metrics, done)
    # the rerun as a parameter-server cluster over four hosts runs: the chief alone runs
    # the loop; the ps and the workers serve until it is done, then exit 0
    for task in servers:
        assert job.wait(task, timeout=scaled(120)) == 0, job.output(task)
        rerun = job.output(task)[logged[task] :]
        assert "the chief" in rerun and "is done" in rerun, rerun
    assert metrics["strategy"] == "parameter_server" and metrics["workers"] == 2
    losses = [h["loss"] for h in metrics["history"]]
    assert losses[-1] < losses[0]
    print(
        f"\nparameter server: worker 1 lost at epoch {lost_at}, {done - lost_at} epochs "
        f"without it; the ps lost then, the chief failed {failed_s:.1f} s later naming it; "
        "the rerun resumed"
    )


def tfjob_tf_config(manifest: dict, service: str = "svc") -> dict[str, list[str]]:
    """The cluster part of the TF_CONFIG Kubeflow's training operator sets for a TFJob: one
    job per replica type (lower-cased), `<name>-<type>-<i>.<service>:2222` per replica."""
    name = manifest["metadata"]["name"]
    return {
        kind.lower(): [f"{name}-{kind.lower()}-{i}.{service}:2222" for i in range(spec["replicas"])]
        for kind, spec in manifest["spec"]["tfReplicaSpecs"].items()
    }


@pytest.mark.cluster(alone=False)  # in this process: no cluster started, nothing timed
def test_tfjob_manifests_describe_the_clusters_the_tests_run():
    """Each TFJob in `flows/cluster/tfjob.yaml` gives a cluster shape the namespace tests run
    (2 workers; chief, 2 workers and a ps), each pod gets the role tested for it, and every
    command is a valid `tfscale train`."""
    from tfscale.flows.cli import build_parser
    from tfscale.tasks.distribute.cluster import role_of
    from tfscale.tasks.distribute.hardware import HardwareReport, cluster_from_environment
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.settings.config import load_config

    train = load_config(None, {"train.precision": "float32"}).train
    found = {}
    for manifest in yaml.safe_load_all((ROOT / "flows/cluster/tfjob.yaml").read_text()):
        spec = tfjob_tf_config(manifest)
        roles = set()
        for job, tasks in spec.items():
            for index in range(len(tasks)):
                tf_config = json.dumps({"cluster": spec, "task": {"type": job, "index": index}})
                cluster = cluster_from_environment({"TF_CONFIG": tf_config})
                report = HardwareReport("cpu", 2, [], [], None, cluster)
                choice = select_strategy(report, train)
                roles.add((f"{job}:{index}", role_of(cluster, choice.spec), choice.kind))
        for replica in manifest["spec"]["tfReplicaSpecs"].values():
            (container,) = replica["template"]["spec"]["containers"]
            assert container["command"][:2] == ["tfscale", "train"]
            build_parser().parse_args(container["command"][1:])  # exits 2 on an unknown flag
        found[manifest["metadata"]["name"]] = roles
    mw, ps = "multi_worker", "parameter_server"
    assert found == {
        "tfscale-train": {("worker:0", "chief", mw), ("worker:1", "worker", mw)},
        "tfscale-train-ps": {
            ("chief:0", "chief", ps),
            ("worker:0", "server", ps),
            ("worker:1", "server", ps),
            ("ps:0", "server", ps),
        },
    }
