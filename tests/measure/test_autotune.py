"""`auto` settled by measuring (`tasks.measure.autotune`): the candidates each config leaves open,
the fastest chosen from given speeds, its cache, and `tfscale train` measuring for real."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from helpers import PLAIN_CPU, report, run_main, tiny_params

from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.data.manifest import Manifest
from tfscale.tasks.distribute.hardware import ClusterInfo
from tfscale.tasks.distribute.strategy import select_strategy
from tfscale.tasks.measure.autotune import Candidate, Timed, candidates, fastest, settle
from tfscale.tasks.settings.config import ConfigError, load_config

AMX = [*PLAIN_CPU, "amx_bf16"]


def config(tmp_path=None, **train):
    values = {f"train.{k}": v for k, v in train.items()}
    if tmp_path is not None:
        values["train.runs_dir"] = str(tmp_path / "runs")
    return load_config(None, values).train


def options(hw, for_study=False, **train):
    cfg = config(**train)
    return candidates(select_strategy(hw, cfg), cfg, hw, for_study=for_study)


def labels(found: list[Candidate]) -> list[str]:
    return [c.label for c in found]


def tfscale(argv: list[str], cwd) -> subprocess.CompletedProcess:
    """`tfscale ARGV` run to its end in this process (`helpers.run_main`: what it measures
    and trains is the claim, not its process), its streams as a process's would be."""
    code, out, err = run_main(argv, cwd)
    assert code == 0, err[-3000:]
    return subprocess.CompletedProcess(argv, code, out, err)


def test_a_cpu_without_bf16_measures_devices_and_xla_on_one_device():
    """XLA compiles one device's step: replicas are measured without it."""
    assert labels(options(report())) == [
        "one device, float32, XLA off",
        "one device, float32, XLA on",
        "2 replicas, float32, XLA off",
    ]


def test_a_study_keeps_its_replicas_and_amx_adds_bfloat16():
    assert labels(options(report(flags=AMX), for_study=True)) == [
        "2 replicas, float32, XLA off",
        "2 replicas, mixed_bfloat16, XLA off",
    ]
    assert labels(options(report(flags=AMX), replicas=1)) == [
        "one device, float32, XLA off",
        "one device, float32, XLA on",
        "one device, mixed_bfloat16, XLA off",
        "one device, mixed_bfloat16, XLA on",
    ]


@pytest.mark.parametrize(
    ("hw", "train"),
    [
        (report(), {"strategy": "mirrored", "precision": "float32", "jit_compile": False}),
        (report(), {"replicas": 1, "jit_compile": True}),
        (report(), {"workers": 2}),  # worker processes: not measured here
        (report(tpu="grpc://10.0.0.2:8470"), {}),
        (report(cluster=ClusterInfo("TF_CONFIG", ["a:1", "b:1"])), {}),
    ],
)
def test_nothing_to_measure_keeps_the_proposal(hw, train):
    cfg = config(**train)
    choice = select_strategy(hw, cfg)
    found = candidates(choice, cfg, hw, for_study=False)
    assert found == [Candidate(choice.kind, choice.replicas, choice.precision, choice.jit_compile)]


def test_an_auto_batch_is_measured_while_an_epoch_keeps_its_updates():
    """On 8,192 examples, 2 replicas at 64 per replica make 64 updates an epoch (kept) and
    at 128, 32 (left out); one device keeps 128 too. On digits (1,437) only 32 is left:
    nothing about the batch to measure, and the labels do not name it."""
    hw = report(flags=AMX)
    cfg = config()
    pipeline = candidates(select_strategy(hw, cfg), cfg, hw, for_study=True, examples=8192)
    assert labels(pipeline) == [
        "2 replicas, float32, XLA off, batch 32",
        "2 replicas, float32, XLA off, batch 64",
        "2 replicas, mixed_bfloat16, XLA off, batch 32",
        "2 replicas, mixed_bfloat16, XLA off, batch 64",
    ]
    one = config(replicas=1, precision="float32", jit_compile=False)
    found = candidates(select_strategy(hw, one), one, hw, for_study=False, examples=8192)
    assert [c.batch for c in found] == [32, 64, 128]
    digits = candidates(select_strategy(hw, cfg), cfg, hw, for_study=True, examples=1437)
    assert {c.batch for c in digits} == {0}
    assert labels(digits) == ["2 replicas, float32, XLA off", "2 replicas, mixed_bfloat16, XLA off"]
    named = config(batch_size_per_replica=16)
    assert {
        c.batch
        for c in candidates(select_strategy(hw, named), named, hw, for_study=True, examples=8192)
    } == {0}

    def batches_of(**train):
        cfg_ = config(**train)
        return sorted(
            {
                c.batch
                for c in candidates(
                    select_strategy(hw, cfg_), cfg_, hw, for_study=True, examples=8192
                )
            }
        )

    assert batches_of(device_memory_mb=64.0) == [0]  # a memory budget checked at 32
    # updates are counted per optimizer step: 64 x 2 replicas x 2 micro-batches, 32 of them
    assert batches_of(grad_accum_steps=2) == [0]
    assert batches_of(scaling="strong") == [32, 64, 128]  # global: 256, 128 and 64 updates


def test_a_larger_batch_is_kept_only_when_clearly_faster_in_every_round():
    """A larger batch trades updates for speed: 4% faster in every round is not enough
    (BATCH_GAIN, 5%); 6% is. A smaller batch after a larger needs only to be faster."""
    from tfscale.tasks.measure.autotune import reason

    small, large = (Candidate("mirrored", 2, "float32", False, b) for b in (32, 64))
    bf16_small = Candidate("mirrored", 2, "mixed_bfloat16", False, 32)
    slightly = timed({small: [1000, 1010, 990], large: [1040, 1050, 1030]})
    assert fastest(slightly).candidate == small
    assert "kept of 2: none was faster than it in every round (a larger batch: by 5%)" in (
        reason(slightly)
    )
    clearly = timed({small: [1000, 1010, 990], large: [1060, 1071, 1050]})
    assert fastest(clearly).candidate == large
    after = timed({small: [1000] * 3, large: [1100] * 3, bf16_small: [1101] * 3})
    assert fastest(after).candidate == bf16_small


def test_settle_gives_the_config_at_the_batch_it_settled_on(tmp_path):
    """The settled training config names a number, never auto: the measured batch, or 32
    when there was nothing to measure."""
    hw = report(flags=AMX)
    big = Manifest(
        dataset="synthetic",
        version="1",
        feature={"shape": [32, 32, 3], "num_classes": 10},
        splits={"train": 8192, "test": 1024},
        shards=[],
    )
    cfg = config(tmp_path)
    speeds = {32: 1000.0, 64: 1200.0}

    def measure(found):
        return [Timed(c, (speeds[c.batch] * (1 + c.jit_compile),) * 5) for c in found]

    settled = settle(select_strategy(hw, cfg), cfg, hw, big, measure, for_study=True)
    assert settled.train.batch_size_per_replica == 64
    assert "2 replicas, float32, XLA off, batch 64: 1,200 ex/s" in settled.choice.reason
    workers = config(tmp_path, workers=2)
    kept = settle(select_strategy(hw, workers), workers, hw, big, measure)
    assert kept.train.batch_size_per_replica == 32 and not kept.timed


def timed(label_rates: dict[Candidate, list[float]]) -> list[Timed]:
    return [Timed(c, tuple(r)) for c, r in label_rates.items()]


ONE = Candidate("one_device", 1, "float32", False)
ONE_XLA = Candidate("one_device", 1, "float32", True)
TWO = Candidate("mirrored", 2, "float32", False)
TWO_XLA = Candidate("mirrored", 2, "float32", True)


def test_one_lucky_round_does_not_make_a_candidate_the_fastest():
    found = timed({ONE: [1000, 1010, 990], TWO: [1600, 900, 950]})  # TWO: one lucky round
    assert fastest(found).candidate == ONE
    assert fastest(timed({ONE: [1000] * 3, TWO: [1200] * 3})).candidate == TWO


def test_a_simpler_candidate_is_kept_unless_another_is_faster_in_every_round():
    """TWO's median is higher, but ONE was faster in round 2: the first (simpler) candidate
    stays, and the words say so; faster in every round, TWO replaces it, and a third must
    then beat TWO (not ONE) in every round."""
    from tfscale.tasks.measure.autotune import reason

    close = timed({ONE: [1000, 1100, 1000], TWO: [1080, 1050, 1090]})
    assert fastest(close).candidate == ONE
    assert reason(close).startswith(
        "measured (5 rounds of up to 20 steps), kept of 2: none was faster than it in every "
        "round: one device, float32, XLA off: 1,000 ex/s"
    )
    clear = timed({ONE: [1000, 1100, 1000], TWO: [1080, 1150, 1090], TWO_XLA: [1050] * 3})
    assert fastest(clear).candidate == TWO
    assert ", the fastest of 3: 2 replicas" in reason(clear)


@pytest.fixture
def manifest():
    return Manifest(
        dataset="digits",
        version="1",
        feature={"shape": [8, 8, 1], "num_classes": 10},
        splits={"train": 1437, "test": 360},
        shards=[],
    )


def test_settle_chooses_from_given_speeds_names_them_and_caches(tmp_path, manifest):
    hw, cfg = report(), config(tmp_path)
    speeds = {ONE: 2410, ONE_XLA: 1200, TWO: 1730, TWO_XLA: 900}
    calls = []

    def measure(found):
        calls.append(found)
        return [Timed(c, (speeds[c] * 0.98, speeds[c], speeds[c] * 1.03)) for c in found]

    first = settle(select_strategy(hw, cfg), cfg, hw, manifest, measure)
    assert (first.choice.kind, first.choice.replicas, first.choice.jit_compile) == (
        "one_device",
        1,
        False,
    )
    # the reason names each figure, the chosen first
    assert first.choice.reason.startswith(
        "measured (5 rounds of up to 20 steps), the fastest of 3: one device, float32, XLA off: "
        "2,410 ex/s "
        "(2,362-2,482); one device, float32, XLA on: 1,200 ex/s"
    )
    assert re.search(
        r"2 replicas, float32, XLA off: 1,730 ex/s \(1,695-1,782\) \(proposed from",
        first.choice.reason,
    )
    assert not first.cached and len(calls) == 1
    second = settle(select_strategy(hw, cfg), cfg, hw, manifest, measure)
    assert second.cached and len(calls) == 1 and second.choice == first.choice
    # another batch is another measurement
    other = config(tmp_path, batch_size_per_replica=64)
    assert not settle(select_strategy(hw, other), other, hw, manifest, measure).cached
    assert len(calls) == 2


def test_a_study_after_train_reuses_the_replicas_rounds_train_timed(tmp_path, manifest):
    """`tfscale train` times one device and 2 replicas; a study after it (`for_study`: the
    replicas stay) needs only the 2-replica candidates, which that measurement holds, in
    rounds of one session: reused, in the study's order. The other way round, `train`
    needs candidates the study never timed, and measures."""
    hw, cfg = report(flags=[*PLAIN_CPU, "avx512_bf16"]), config(tmp_path)  # 2 precisions
    calls = []

    def measure(found):
        calls.append(found)
        return [Timed(c, tuple(1000.0 + 10 * i + r for r in range(3))) for i, c in enumerate(found)]

    train = settle(select_strategy(hw, cfg), cfg, hw, manifest, measure)
    study = settle(select_strategy(hw, cfg), cfg, hw, manifest, measure, for_study=True)
    assert len(calls) == 1 and study.cached
    wanted = [t.candidate for t in study.timed]
    assert all(c.replicas == 2 for c in wanted) and wanted != [t.candidate for t in train.timed]
    assert set(study.timed) <= set(train.timed)
    other = config(tmp_path / "other")  # a study first: train must still measure its own
    settle(select_strategy(hw, other), other, hw, manifest, measure, for_study=True)
    assert not settle(select_strategy(hw, other), other, hw, manifest, measure).cached


def test_an_unreadable_cache_is_measured_again(tmp_path, manifest):
    hw, cfg = report(), config(tmp_path, precision="float32")
    measure = lambda found: [Timed(c, (100.0 + c.jit_compile,)) for c in found]  # noqa: E731
    settle(select_strategy(hw, cfg), cfg, hw, manifest, measure)
    (path,) = (tmp_path / "runs" / "autotune").glob("*/*.json")
    path.write_text("{not json")
    again = settle(select_strategy(hw, cfg), cfg, hw, manifest, measure)
    assert not again.cached and again.choice.kind == "one_device" and again.choice.jit_compile
    assert json.loads(path.read_text())[0]["examples_per_s"] == [100.0]


def test_jit_compile_takes_auto_true_or_false_only():
    assert config(jit_compile=True).jit_compile is True
    assert config().jit_compile == "auto"
    with pytest.raises(ConfigError, match="train.jit_compile: expected one of auto, true, false"):
        config(jit_compile=1)
    for strategy in ("mirrored", "parameter_server", "multi_worker"):
        with pytest.raises(UsageError, match=f"jit_compile: true is not supported with {strategy}"):
            select_strategy(report(), config(strategy=strategy, workers=2, jit_compile=True))
    assert select_strategy(report(), config(strategy="one_device", jit_compile=True)).jit_compile


@pytest.mark.integration
def test_tfscale_train_measures_the_candidates_once_and_trains_the_fastest(tmp_path, digits):
    """A real `tfscale train --strategy auto` on digits: it times one device with XLA off
    and on, and two replicas, trains the fastest as measured, and a second run
    reuses the measurement."""

    data_dir = digits[0]["prepare.data_dir"]  # the session's digits, prepared once
    params = tiny_params(
        tmp_path, **{"train.jit_compile": "auto", "train.epochs": 1, "prepare.data_dir": data_dir}
    )
    train = ["--params", str(params), "train", "--no-diagnose"]
    first_run = tfscale(train, cwd=tmp_path)
    first = first_run.stdout
    (cache,) = (tmp_path / "runs" / "autotune").glob("*/*.json")
    rows = json.loads(cache.read_text())
    assert len(rows) == 3 and all(len(r["examples_per_s"]) == 5 for r in rows)
    assert all(min(r["examples_per_s"]) > 0 for r in rows)  # XLA's steps ran too
    found = [Timed(Candidate(**r["candidate"]), tuple(r["examples_per_s"])) for r in rows]
    (metrics,) = (tmp_path / "runs" / "digits").glob("*/metrics.json")
    trained = json.loads(metrics.read_text())
    said = first.split("auto: ")[1].split(":")[0]  # the label of the candidate it kept
    (kept,) = [t for t in found if t.candidate.label == said]
    assert (trained["strategy"], trained["replicas"]) == (
        kept.candidate.kind,
        kept.candidate.replicas,
    )
    assert_kept_by_the_rule(found, kept)
    highest = max(t.rate.median for t in found)
    verdict = "the fastest of 3" if kept.rate.median >= highest else "kept of 3: none was faster"
    assert verdict in first
    # what it is timing said as the rounds begin (a stage line), and not when nothing is
    assert "measuring   auto's 3 candidates, 5 rounds of up to 20 steps: " in first_run.stderr
    second_run = tfscale(train, cwd=tmp_path)
    second = second_run.stdout
    assert "measured before" in second and cache.read_text() == json.dumps(rows, indent=2)
    assert "measuring" not in second_run.stderr
    # `tfscale evaluate` then reads the evaluation the training recorded, with no second
    # import of TensorFlow (the process is the claim)
    evaluate = (
        "import sys; from flows.cli import main; "
        f"code = main(['--params', {str(params)!r}, 'evaluate']); "
        "print('tensorflow imported:', 'tensorflow' in sys.modules); sys.exit(code)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", evaluate], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "as its training evaluated it" in proc.stdout
    assert "tensorflow imported: False" in proc.stdout


@pytest.mark.integration
def test_tfscale_train_measures_the_batch_it_was_left_and_trains_at_the_one_kept(tmp_path):
    """A real `tfscale train --replicas 1` on 6,400 synthetic examples with the batch left
    to `auto`: it times 32, 64 and 128 per replica (an epoch keeps 200, 100 and 50
    updates), trains at the batch `fastest` keeps from those figures, and says so."""
    import yaml

    from tfscale.tasks.data.preparation import prepare_dataset

    synthetic = {"train_examples": 6400, "test_examples": 64, "height": 8, "width": 8}
    params = tiny_params(tmp_path, **{"train.replicas": 1, "train.epochs": 1})
    values = yaml.safe_load(params.read_text())
    values["prepare"].update(dataset="synthetic")
    values["prepare"]["synthetic"].update(synthetic)
    params.write_text(yaml.safe_dump(values))
    prepare_dataset(load_config(params), progress=False)  # in this process: not the claim
    out = tfscale(["--params", str(params), "train", "--no-diagnose"], cwd=tmp_path).stdout
    (cache,) = (tmp_path / "runs" / "autotune").glob("*/*.json")
    found = [
        Timed(Candidate(**r["candidate"]), tuple(r["examples_per_s"]))
        for r in json.loads(cache.read_text())
    ]
    assert [t.candidate.batch for t in found] == [32, 64, 128]
    (metrics,) = (tmp_path / "runs" / "synthetic").glob("*/metrics.json")
    batch = json.loads(metrics.read_text())["global_batch"]
    (kept,) = [t for t in found if t.candidate.batch == batch]
    assert_kept_by_the_rule(found, kept)
    assert f"auto: one device, float32, XLA off, batch {batch}: " in out


def assert_kept_by_the_rule(found: list[Timed], kept: Timed) -> None:
    """`auto`'s rule (`tasks.measure.autotune.fastest`'s docstring), checked on the figures a real
    run measured without calling it: the candidate kept is the first, or beat every one kept
    before it in every round (a larger batch by BATCH_GAIN); none after it beat it so."""
    from tfscale.tasks.measure.autotune import BATCH_GAIN

    def beats(a: Timed, b: Timed) -> bool:
        gain = BATCH_GAIN if a.candidate.batch > b.candidate.batch else 1.0
        return all(x > y * gain for x, y in zip(a.examples_per_s, b.examples_per_s, strict=True))

    at = found.index(kept)
    assert at == 0 or beats(kept, found[0]), (kept, found[0])
    assert not [t for t in found[at + 1 :] if beats(t, kept)], found
