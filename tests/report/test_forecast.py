"""The forecast's cost model: fitted to measurements made from known constants, and
`tfscale forecast` with input it cannot use."""

from __future__ import annotations

import json
import math

import pytest
from helpers import DEFAULTS

from tfscale.flows.cli import main
from tfscale.tasks.report.console_plan import format_plan
from tfscale.tasks.report.forecast import CostModel, fit_cost_model, links_from, predict_speedups
from tfscale.tasks.report.forecast_report import format_forecast

C0, C1 = 0.001, 5e-6  # compute: 1 ms + 5 us per example
ALPHA, BANDWIDTH = 100e-6, 1.25e8  # 100 us per hop, 1 Gbit/s
SYNC, GRADIENTS, BATCH = 0.0005, 204_800, 32


def truth(workers: int = 2) -> CostModel:
    return CostModel(C0, C1, 0.0, ALPHA, BANDWIDTH, 0.0, SYNC, 50_000.0, GRADIENTS, BATCH, 2)


def synthetic_probes() -> dict:
    """What a two-worker run would measure if the constants above were the machine."""
    model = truth()

    def comm(size: float) -> float:
        return 2 * ALPHA + size / BANDWIDTH  # two workers: 2 hops, all the bytes

    return {
        "workers": 2,
        "replica_examples": BATCH,
        "gradient_bytes": GRADIENTS,
        "local_step_s_by_batch": [[b, model.compute_s(b)] for b in (16, 32, 64)],
        "comm_s_by_bytes": [[s, comm(s)] for s in (GRADIENTS / 4, GRADIENTS, 4 * GRADIENTS)],
        "step_s": model.compute_s(BATCH) + comm(GRADIENTS) + SYNC,
        "local_step_s": model.compute_s(BATCH),
        "comm_s": comm(GRADIENTS),
        "input_examples_per_s": [50_000.0, 60_000.0],
    }


def test_the_fit_recovers_known_constants_within_one_percent():
    fitted = fit_cost_model(synthetic_probes())
    for name, expected in (
        ("compute_fixed_s", C0),
        ("compute_per_example_s", C1),
        ("latency_s", ALPHA),
        ("bandwidth_bytes_per_s", BANDWIDTH),
        ("sync_s", SYNC),
    ):
        assert getattr(fitted, name) == pytest.approx(expected, rel=0.01), name
    assert fitted.compute_fit_error < 0.01 and fitted.comm_fit_error < 0.01
    assert fitted.input_examples_per_s == 50_000.0  # the slowest worker's


def test_a_model_fitted_on_two_workers_predicts_steps_it_never_saw():
    """Fitted on a two-worker run's probes, the model gives the step of 4, 16 and 64
    workers, and of a batch it never timed, as the true constants make them."""
    fitted = fit_cost_model(synthetic_probes())
    for n, batch in ((4, 32), (16, 32), (64, 128)):
        hops = 2 * (n - 1)
        truth_step = C0 + C1 * batch + hops * ALPHA + hops / n * GRADIENTS / BANDWIDTH + SYNC
        predicted = fitted.predict(n, None, "strong", global_batch=batch * n).step_s
        assert predicted == pytest.approx(truth_step, rel=0.01), n


def test_predictions_follow_the_ring_formula():
    """On the measured link a byte costs the hosts' time (1 / BANDWIDTH); on a named link
    of L bytes/s, that plus its wire time (1 / L), and the wire time overlaps the step's
    waiting (SYNC): a slow wire hides it, a fast one is hidden by it."""
    model = truth()
    for link in (1.25e9, 1.25e7):  # 10 Gbit/s: wire time under SYNC; 100 Mbit/s: over it
        for n in (1, 2, 8, 64):
            hops = 2 * (n - 1)
            wire = hops / n * GRADIENTS / link
            for on, extra in ((None, 0.0), (link, wire)):
                comm = hops * ALPHA + hops / n * GRADIENTS / BANDWIDTH if n > 1 else 0.0
                step = C0 + C1 * BATCH + comm + (max(SYNC, extra) if n > 1 else 0)
                p = model.predict(n, on, "weak")
                assert p.step_s == pytest.approx(step), (link, n, on)
                assert p.speedup == pytest.approx(n * (C0 + C1 * BATCH) / step)
    # strong scaling keeps the global batch (64 here): 8 workers get 8 examples each
    strong = model.predict(8, None, "strong", global_batch=64)
    assert strong.step_s == pytest.approx(
        C0 + C1 * 8 + 14 * ALPHA + 1.75 * GRADIENTS / BANDWIDTH + SYNC
    )
    # a faster link helps only the wire time; the per-hop latency and the hosts' time stay,
    # and a wire faster than the waiting it overlaps costs nothing more
    slow, fast, faster = (
        model.predict(64, b, "weak").step_s for b in (BANDWIDTH / 10, BANDWIDTH, 100 * BANDWIDTH)
    )
    assert slow > fast > faster == model.predict(64, None, "weak").step_s


def test_an_epochs_fixed_cost_sets_the_dataset_size_below_which_it_binds():
    """e0 is fitted from the history (the traced first epoch left out); D* = e0 * rate."""
    probes = dict(synthetic_probes(), step_examples=2 * BATCH, end_to_end_s=0.002)
    e0 = 0.25
    history = [
        {"seconds": 5.0 + steps * 0.002, "examples": steps * 2 * BATCH} for steps in (100,)
    ] + [
        {"seconds": e0 + jitter + steps * 0.002, "examples": steps * 2 * BATCH}
        for steps, jitter in ((100, 0.01), (50, -0.01), (100, 0.0))
    ]
    model = fit_cost_model(probes, history)
    assert model.epoch_overhead_s == pytest.approx(e0)
    for n in (1, 8, 64):
        p = model.predict(n, None, "weak")
        assert p.epoch_bound_below == pytest.approx(e0 * p.examples_per_s)
    # more workers, more throughput: a dataset of a given size is epoch-bound sooner
    points = [model.predict(n, None, "weak").epoch_bound_below for n in (1, 8, 64)]
    assert points == sorted(points)
    assert fit_cost_model(probes).epoch_overhead_s == 0.0  # no history: unknown, not guessed


def test_a_slow_input_pipeline_caps_the_forecast():
    model = truth()
    starved = CostModel(**{**model.__dict__, "input_examples_per_s": 1000.0})
    p = starved.predict(4, None, "weak")
    assert p.bottleneck == "input" and p.step_s == pytest.approx(BATCH / 1000.0)


def test_links_and_presets():
    links = links_from([10], ["pcie4-x16"], truth())
    assert links == {"measured": pytest.approx(1.0), "10 Gbit/s": 10, "pcie4-x16": 252.0}
    result = predict_speedups(truth(), links, [1, 2, 4])
    assert [p.workers for p in result.predictions["pcie4-x16"]] == [1, 2, 4]


@pytest.mark.parametrize(
    ("argv", "expected", "exit_code"),
    [  # 2: usage (the flags are wrong); 1: an input is missing
        (["--preset", "pcie9"], "unknown link preset 'pcie9'", 2),
        (["--workers", "0,2"], "worker counts must be 1 or more", 2),
        (["--link-gbit", "-1"], "a rate must be above 0", 2),
        (["--workers", "two"], "expected a comma-separated list", 2),
        (["--dataset", "nothing-here"], "no run of 'nothing-here' with all-reduce", 1),
        (["--run-dir", "/nonexistent/run"], "no completed run in /nonexistent/run", 1),
    ],
)
def test_bad_forecast_input_is_one_line_naming_the_fix(argv, expected, exit_code, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "digits" / "mw"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps({"probes": synthetic_probes()}))
    args = ["--params", DEFAULTS, "forecast", "--runs-dir", str(tmp_path / "runs"), "--no-track"]
    try:
        code = main([*args, *argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == exit_code, (code, err)
    assert expected in err and "Traceback" not in err
    assert err.startswith("error: ") or "error: argument" in err
    assert not (run_dir / "forecast.json").exists()  # nothing half-written


def test_forecast_writes_its_table_json_and_charts(tmp_path, capsys):
    """The newest run of `--dataset` under `--runs-dir` (not the params' digits), forecast
    and not tracked (`--no-track`)."""
    run_dir = tmp_path / "runs" / "synthetic" / "mw"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps({"probes": synthetic_probes()}))
    code = main(
        [
            "--params",
            DEFAULTS,
            "forecast",
            "--dataset",
            "synthetic",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--workers",
            "1,2,4",
            "--preset",
            "ethernet-10g",
            "--no-track",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "tracked:" not in out
    assert "ethernet-10g" in out and "measured (1 Gbit/s)" in out
    assert "epoch-bound below" in out and "an epoch's fixed cost 0 ms" in out  # no history
    saved = json.loads((run_dir / "forecast.json").read_text())
    assert [p["workers"] for p in saved["predictions"]["ethernet-10g"]] == [1, 2, 4]
    assert (run_dir / "forecast_speedup.png").stat().st_size > 10_000
    assert (run_dir / "forecast_efficiency.png").stat().st_size > 10_000


def test_forecast_writes_its_json_and_charts_to_the_out_dir_leaving_the_run_as_it_was(
    tmp_path, capsys
):
    run_dir, out_dir = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text(json.dumps({"probes": synthetic_probes()}))
    argv = ["--params", DEFAULTS, "forecast", "--run-dir", str(run_dir), "--workers", "1,2"]
    assert main([*argv, "--out-dir", str(out_dir), "--no-track"]) == 0
    charts = ["forecast_speedup.png", "forecast_efficiency.png"]
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(["forecast.json", *charts])
    assert [p.name for p in run_dir.iterdir()] == ["metrics.json"]
    assert f"written: {out_dir / 'forecast.json'}" in capsys.readouterr().out


def test_a_rate_with_no_cost_per_byte_reads_so_and_is_null_in_json():
    """Devices in one process: the all-reduce did not grow with its size."""
    flat = dict(synthetic_probes(), comm_s_by_bytes=[[1e4, 2e-4], [1e5, 2e-4], [1e6, 2e-4]])
    model = fit_cost_model(flat)
    result = predict_speedups(model, links_from([], ["ethernet-1g"], model), [1, 2])
    assert "no cost per byte measured" in format_forecast(result)
    assert json.loads(json.dumps(result.to_dict()))["links_gbit"]["measured"] is None
    assert model.predict(2, 1.25e7, "weak").step_s > model.predict(2, None, "weak").step_s


def test_each_prediction_gains_its_time_to_target_from_the_runs_noise_scale():
    """A 2-worker run at global batch 2 x BATCH, its rate linear's 2x, reached the target
    in 100 steps with noise scale phi = BATCH (constant), its baseline beside it putting
    the base rate at 0.5 of its optimum: at N workers (weak) a step makes
    rule_progress(phi, B, N B, min(N, 2), 0.5) of a base step (the rate never above the
    run's), so the steps are the run's 100 times its progress over theirs; the time to
    target against one device's is theirs times the predicted steps' times."""
    from tfscale.tasks.report.forecast_report import format_forecast, headline, with_time_to_target
    from tfscale.tasks.train.noise_estimates import rule_progress

    window = {"end_step": 50, "steps": 10, "small_batch": BATCH, "big_batch": 2 * BATCH}
    window |= {"small": 1 + BATCH / BATCH, "big": 1 + BATCH / (2 * BATCH)}  # |G|^2 1, phi B
    metrics = {
        "global_batch": 2 * BATCH,
        "learning_rate": 0.002,
        "lr_scaling": "linear",
        "to_target": {"reached": True, "steps": 100},
        "gradient_noise": [window],
        "optimizer": "SGD (momentum 0.9)",  # the quadratic model's own (`Gain`)
    }
    model = truth()
    study = _study(phi=float(BATCH))
    predicted = predict_speedups(model, {"ethernet-10g": 10.0}, [1, 2, 4, 8])
    result = with_time_to_target(predicted, metrics, study)
    points = result.predictions["ethernet-10g"]

    def steps_at(workers: int) -> float:
        run = rule_progress(BATCH, BATCH, 2 * BATCH, 2.0, HEADROOM)
        made = rule_progress(BATCH, BATCH, workers * BATCH, min(workers, 2), HEADROOM)
        return 100 * run / made

    one_device = steps_at(1) * model.compute_s(BATCH)
    for p in points:
        assert p.steps_to_target == pytest.approx(steps_at(p.workers), rel=1e-6)
        assert p.time_to_target_speedup == pytest.approx(
            one_device / (steps_at(p.workers) * p.step_s), rel=1e-6
        )
    assert points[0].time_to_target_speedup == pytest.approx(1.0)  # one device is itself
    # past the noise scale, time to target gains less than examples/s
    assert points[-1].time_to_target_speedup < points[-1].speedup
    assert "to target" in format_forecast(result)
    line = headline(result, counts=(2, 8))
    assert "to the target)" in line
    unreached = with_time_to_target(predict_speedups(model, {"ethernet-10g": 10.0}, [1, 2]), {})
    assert unreached.predictions["ethernet-10g"][1].time_to_target_speedup is None
    # no baseline beside it: linear's headroom is unknown, so adascale is priced, whose
    # steps the noise scale gives alone (its gain here never passes the run's 2)
    from tfscale.tasks.train.noise_estimates import step_progress

    alone = with_time_to_target(predict_speedups(model, {"ethernet-10g": 10.0}, [1, 2, 8]), metrics)
    adascale = 100 * step_progress(BATCH, BATCH, 2 * BATCH) / step_progress(BATCH, BATCH, 8 * BATCH)
    assert alone.predictions["ethernet-10g"][-1].steps_to_target == pytest.approx(adascale)


def _planned_run(noise_scale: float = 64.0) -> dict:
    """The metrics of a 2-worker run at global batch 64 measured from the constants above:
    96% reached at step 100, its windows at a constant noise scale."""
    window = {"end_step": 50, "steps": 10, "small_batch": BATCH, "big_batch": 2 * BATCH}
    window |= {"small": 1 + noise_scale / BATCH, "big": 1 + noise_scale / (2 * BATCH)}
    return {
        "run_dir": "runs/x",
        "probes": synthetic_probes(),
        "global_batch": 2 * BATCH,
        "learning_rate": 0.002,
        "lr_scaling": "linear",
        "to_target": {"target": 0.96, "reached": True, "steps": 100},
        "evaluations": [
            {"steps": 60, "accuracy": 0.9},
            {"steps": 100, "accuracy": 0.96},
            {"steps": 140, "accuracy": 0.97},
        ],
        "gradient_noise": [window],
        "optimizer": "SGD (momentum 0.9)",  # the quadratic model's own (`Gain`)
    }


HEADROOM = 0.5  # the base rate's share of its optimum the study below implies


def _study(rule: str = "linear", phi: float = 64.0, run_batch: int = 2 * BATCH) -> dict:
    """The run's summary.json: its baseline (one device at 32, the base rate) reached the
    target in the steps a base rate at `HEADROOM` of its optimum gives, against the run's
    100 at 64 with the rule's gain."""
    from tfscale.tasks.train.noise_estimates import planned_gain, rule_progress

    gain = planned_gain(rule, run_batch / BATCH, phi, BATCH)
    base_steps = 100 * rule_progress(phi, BATCH, run_batch, gain, HEADROOM)
    return {
        "examples_to_target_baseline": base_steps * BATCH,
        "examples_to_target_distributed": 100 * run_batch,
        "target_accuracy": 0.96,
        "seeds": 1,
    }


# The steps to target at each global batch M of the plan below, worked by hand: noise scale
# 64, base batch 32, headroom h = 0.5, linear's gain g = M/32 held at 2. The share-keeping
# gain is g* = (M/32)(64 + 32)/(64 + M), the rate's share of its optimum r = h g/g*, and a
# step makes g* (2r - r^2)/(2h - h^2) = g* (2r - r^2)/0.75 of a base step:
#   M = 16: g = 0.5, g* = 0.6, r = 5/12, 0.6 (95/144)/0.75 = 19/36
#   M = 32: g = g* = 1, r = 0.5: 1
#   M >= 64: g = 2, r = 1/g* = (64 + M)/(3M): (4/3)(2 - (64 + M)/(3M)) = 4(5M - 64)/(9M),
#     16/9 at the run's 64. The run took 100 steps at 64, so M takes 100 (16/9) / that:
#   16: 6400/19, 32: 1600/9, and from 64 on 400M/(5M - 64): 100, 800/9, 1600/19, 3200/39,
#   6400/79, 12800/159, 25600/319
STEPS_AT_HALF = {
    16: 6400 / 19, 32: 1600 / 9, 64: 100.0, 128: 800 / 9, 256: 1600 / 19, 512: 3200 / 39,
    1024: 6400 / 79, 2048: 12800 / 159, 4096: 25600 / 319,
}  # fmt: skip


def test_a_plan_prices_every_device_count_and_batch_as_steps_times_step_time():
    """Noise scale 64, the rule linear calibrated from the study (the base rate at 0.5 of
    its optimum): at global batch M a step makes rule_progress(64, 32, M, gain, 0.5) of a
    base step, its gain M/32 held at the run's 2 (the highest rate measured to reach the
    target), so the steps to 96% are the run's 100 times the run's progress over the row's;
    the step time is the cost model's on the link; one device at 32 is the reference (its
    time to target 1.00x), and the fastest row has the least time."""
    from tfscale.tasks.report.plan import make_plan

    plan = make_plan(_planned_run(), 8, "ethernet-10g", 10.0, study=_study())
    assert sorted({r.devices for r in plan.rows}) == [1, 2, 4, 8]
    model = fit_cost_model(synthetic_probes())
    for r in plan.rows:
        gain = min(r.global_batch / BATCH, 2.0)
        assert r.steps == pytest.approx(STEPS_AT_HALF[r.global_batch], rel=1e-3)
        priced = CostModel(**{**model.__dict__, "per_replica_batch": r.per_replica_batch})
        step = priced.predict(r.devices, 10.0 * 1e9 / 8, "weak").step_s
        assert r.step_s == pytest.approx(step) and r.time_s == pytest.approx(r.steps * step)
        assert r.past_noise_scale == (r.global_batch > 64)
        assert r.learning_rate == pytest.approx(0.001 * gain)
        assert r.rate_capped == (r.global_batch > 64)
    (one,) = [r for r in plan.rows if (r.devices, r.per_replica_batch) == (1, BATCH)]
    assert one.time_speedup == pytest.approx(1.0) and one.examples_per_s_speedup == 1.0
    assert plan.fastest.time_s == min(r.time_s for r in plan.rows)
    assert "the run's 100 steps to 0.96 at global batch 64" in plan.sources["steps to target"]
    assert "puts the base rate at 0.50 of its optimum" in plan.sources["learning rate"]
    assert (
        "one pair, two unknowns: assumed the noise scale as measured"
        in plan.sources["learning rate"]
    )
    assert "never above 0.002, the highest rate measured" in plan.sources["learning rate"]
    table = format_plan(plan)
    assert "the rate scaled linear" in table.splitlines()[0]
    assert "* the rule's rate held at the highest measured to reach the target" in " ".join(
        table.split()
    )
    # another target: the first evaluation at or above it
    assert (
        "the run's 60 steps to 0.9"
        in make_plan(_planned_run(), 2, "measured", 0.0, 0.9).sources["steps to target"]
    )


def test_a_plan_without_a_baseline_to_calibrate_its_rule_prices_adascale_up_to_its_rate():
    """No study beside the run: how near its optimum linear's base rate was is unknown, so
    its steps at other batches are too. The plan prices adascale instead (its gain keeps
    the rate's share of its optimum, so the noise scale alone predicts its steps), and
    leaves out the batches whose adascale rate would pass the run's, saying why."""
    from tfscale.tasks.report.plan import make_plan
    from tfscale.tasks.train.noise_estimates import planned_gain, step_progress

    plan = make_plan(_planned_run(), 8, "ethernet-10g", 10.0)
    assert plan.rule == "adascale"
    cap = planned_gain("linear", 2.0, 64.0, BATCH)
    for r in plan.rows:
        assert planned_gain("adascale", r.global_batch / BATCH, 64.0, BATCH) <= cap
        run = step_progress(64.0, BATCH, 64)
        assert r.steps == pytest.approx(100 * run / step_progress(64.0, BATCH, r.global_batch))
    assert max(r.global_batch for r in plan.rows) == 128  # adascale's gain at 128: 1.33 < 2
    assert "linear not calibrated: no baseline at batch 32" in plan.sources["learning rate"]
    assert "so priced as adascale" in plan.sources["learning rate"]
    assert "left out: their rate would pass 0.002" in plan.sources["batches"]


def test_a_plan_to_another_target_than_the_studys_does_not_calibrate_from_it():
    """The study compared its trainings at 0.96; a plan to 0.9 cannot take its pair for
    that target's, so its rule is not calibrated and it prices adascale."""
    from tfscale.tasks.report.plan import make_plan

    assert make_plan(_planned_run(), 4, "ethernet-10g", 10.0, study=_study()).rule == "linear"
    other = make_plan(_planned_run(), 4, "ethernet-10g", 10.0, 0.9, study=_study())
    assert other.rule == "adascale" and "linear not calibrated" in other.sources["learning rate"]


def test_a_plan_counts_gradient_accumulation_once():
    """A run of 2 workers at 16 per replica accumulating 2 micro-batches a step (64
    examples a step, the base rate for 32) is the run of 2 workers at 32 without: each row
    at 16 per replica accumulating is the row at 32 without, to the step and the rate."""
    from tfscale.tasks.report.plan import make_plan

    plain = make_plan(_planned_run(), 8, "ethernet-10g", 10.0, study=_study())
    accumulating = {**_planned_run(), "global_batch": BATCH, "grad_accum_steps": 2}
    halves = make_plan(accumulating, 8, "ethernet-10g", 10.0, study=_study())
    by_shape = {(r.devices, r.per_replica_batch): r for r in plain.rows}
    compared = 0
    for r in halves.rows:
        same = by_shape.get((r.devices, 2 * r.per_replica_batch))
        if same is None:
            continue
        compared += 1
        assert (r.steps, r.step_s, r.learning_rate) == pytest.approx(
            (same.steps, same.step_s, same.learning_rate)
        )
    assert compared >= 8
    assert "each step accumulates 2 micro-batches" in halves.sources["batches"]


def test_a_plans_time_takes_its_evaluations_and_epochs():
    """The run's clock: 50 ms between evaluations beyond their steps (after the first
    epoch, which traces), an evaluation every 640 examples; an epoch's fixed cost from its
    history. Each row's time is its steps' seconds plus an evaluation every 640 of its
    examples and the epochs they make."""
    from tfscale.tasks.report.plan import evaluation_seconds, make_plan

    step_s = 0.004
    evaluations = [
        {"steps": s, "seconds": 1.0 + s * step_s + i * 0.05, "accuracy": 0.9 + i * 0.02}
        for i, s in enumerate((20, 40, 60, 80, 100, 120))
    ]
    metrics = {
        **_planned_run(),
        "evaluations": evaluations,
        "steps_per_epoch": 20,
        "to_target": {"target": 0.96, "reached": True, "steps": 100, "every_examples": 640},
        "history": [{"seconds": 2.0, "examples": 1280}]
        + [{"seconds": 20 * step_s, "examples": 1280}] * 5,
    }
    assert evaluation_seconds(metrics, step_s) == pytest.approx(0.05)
    plan = make_plan(metrics, 2, "ethernet-10g", 10.0, study=_study())
    model = fit_cost_model(metrics["probes"], metrics["history"])
    for r in plan.rows:
        examples = r.steps * r.global_batch
        fixed = examples / 640 * plan_eval(plan) + examples / 1280 * model.epoch_overhead_s
        assert r.time_s == pytest.approx(r.steps * r.step_s + fixed, rel=1e-6)
    assert "an evaluation 50 ms every 640 examples" in plan.sources["fixed costs"]


def plan_eval(plan) -> float:
    text = plan.sources["fixed costs"]
    return float(text.split("an evaluation ")[1].split(" ms")[0]) / 1000


def test_a_plan_never_prices_a_global_batch_that_leaves_few_steps_an_epoch():
    """A run of 22 steps an epoch at global batch 64 had 1,408 training examples: a global
    batch over 176 would leave fewer than 8 steps an epoch (8 devices at 256 not even one),
    so no row has more than 176, the sources say how many were left out, and data too
    small for any is refused."""
    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.report.plan import MIN_STEPS_PER_EPOCH, make_plan

    run = {**_planned_run(), "steps_per_epoch": 22}
    plan = make_plan(run, 8, "ethernet-10g", 10.0, study=_study())
    assert plan.rows and max(r.global_batch for r in plan.rows) <= 1408 // MIN_STEPS_PER_EPOCH
    shapes = {(r.devices, r.per_replica_batch) for r in plan.rows}
    assert (8, 256) not in shapes and (1, 256) not in shapes and (1, 128) in shapes
    assert (
        "a global batch over 176 leaves fewer than 8 steps an epoch of the 1,408"
        in (plan.sources["batches"])
    )
    everything = make_plan(_planned_run(), 8, "ethernet-10g", 10.0, study=_study())
    assert len(everything.rows) > len(plan.rows)
    with pytest.raises(UsageError, match="fewer than 8 steps an epoch of the run's 64 training"):
        make_plan({**_planned_run(), "steps_per_epoch": 1}, 8, "ethernet-10g", 10.0, None, (128,))


def test_a_plan_refuses_a_target_its_run_never_reached_or_a_run_without_a_noise_scale():
    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.report.plan import make_plan

    with pytest.raises(UsageError, match=r"did not reach 99% held-out accuracy \(best 0.9700\)"):
        make_plan(_planned_run(), 8, "measured", 0.0, 0.99)
    with pytest.raises(UsageError, match="recorded no gradient noise scale"):
        make_plan({**_planned_run(), "gradient_noise": []}, 8, "measured", 0.0)
    # every window's |G|^2 at or below zero: (64 x 1.4 - 32 x 3) / 32 < 0
    noise_only = {"end_step": 50, "steps": 10, "small_batch": BATCH, "big_batch": 2 * BATCH}
    noise_only |= {"small": 3.0, "big": 1.4}
    with pytest.raises(UsageError, match=r"no measurable gradient noise scale.*at or below zero"):
        make_plan({**_planned_run(), "gradient_noise": [noise_only]}, 8, "measured", 0.0)


def test_a_plans_interval_comes_from_the_noise_scales_bounds_not_from_its_point():
    """A noise scale steady over the run (150-250 about 200): at each batch the steps at the
    noise scale's two bounds, held constant, lie either side of the point (so no bound was
    widened to hold it), and each side of the interval is at least those bounds' deviation
    and the seed doubt in quadrature (95% intervals of independent doubts in logs)."""
    from tfscale.tasks.report.plan import pricing_of

    windows = []
    for end, phi in zip((20, 40, 60, 80, 100), (150, 250, 200, 180, 220), strict=True):
        window = {"end_step": end, "steps": 10, "small_batch": BATCH, "big_batch": 2 * BATCH}
        windows.append(window | {"small": 1 + phi / BATCH, "big": 1 + phi / (2 * BATCH)})
    run = {**_planned_run(), "gradient_noise": windows}
    pricing, _ = pricing_of(run, 100, BATCH, _study())
    for batch in (16, 32, 128, 256, 512):
        point = pricing.point(batch)
        ends = sorted(pricing.point(batch, q) for q in (pricing.noise[0], pricing.noise[2]))
        assert ends[0] < point * (1 - 1e-4) and point * (1 + 1e-4) < ends[1], batch
        _, low, high = pricing.steps(batch)
        seed = pricing.seed_doubt
        assert math.log(high / point) >= math.hypot(math.log(ends[1] / point), seed) - 1e-9
        assert math.log(point / low) >= math.hypot(math.log(point / ends[0]), seed) - 1e-9


def test_a_plans_point_lies_inside_its_interval_when_the_noise_scale_rises():
    """A noise scale rising from 50 to 800 over the run: each row's steps, predicted along
    it, lie inside the row's interval (the noise scale's bounds held constant, widened to
    the point, and by the run's own steps' seed doubt), and the run's own batch, whose
    steps were measured, still has an interval: one seed's steps are not known exactly."""
    from tfscale.tasks.report.plan import make_plan
    from tfscale.tasks.train.to_target import SEED_SPREAD

    windows = []
    for end, phi in zip((20, 40, 60, 80, 100), (50, 100, 200, 400, 800), strict=True):
        window = {"end_step": end, "steps": 10, "small_batch": BATCH, "big_batch": 2 * BATCH}
        windows.append(window | {"small": 1 + phi / BATCH, "big": 1 + phi / (2 * BATCH)})
    run = {**_planned_run(), "gradient_noise": windows}
    plan = make_plan(run, 8, "ethernet-10g", 10.0, study=_study())
    for r in plan.rows:
        assert r.steps_low < r.steps < r.steps_high, r
        assert r.time_low_s < r.time_s < r.time_high_s
    (own,) = [r for r in plan.rows if (r.devices, r.per_replica_batch) == (2, BATCH)]
    doubt = math.exp(1.96 * SEED_SPREAD)
    assert own.steps == pytest.approx(100)
    assert (own.steps_low, own.steps_high) == pytest.approx((100 / doubt, 100 * doubt))
    # a study of 5 seeds beside it: the steps are their MLPerf mean (100 here), a mean of
    # the middle 3, so their doubt is a seed's over sqrt(3): e^(1.96 x 0.37/sqrt(3)) = 1.5200
    five = make_plan(run, 8, "ethernet-10g", 10.0, study={**_study(), "seeds": 5})
    (same,) = [r for r in five.rows if (r.devices, r.per_replica_batch) == (2, BATCH)]
    assert (same.steps_low, same.steps_high) == pytest.approx((100 / 1.5200, 152.00), rel=1e-4)


def test_plan_json_prints_plan_json_in_place_of_the_table(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text(json.dumps(_planned_run()))
    argv = ["--params", DEFAULTS, "plan", "--run-dir", str(run_dir), "--devices", "2"]
    assert main([*argv, "--json", "--no-track"]) == 0
    printed = json.loads(capsys.readouterr().out)  # the JSON alone: no table, no other line
    assert printed == json.loads((run_dir / "plan.json").read_text())
    assert {row["devices"] for row in printed["rows"]} == {1, 2}


def test_a_plan_searches_only_the_batches_that_fit_a_devices_memory():
    """The digits CNN's footprint (weights, Adam's slots, activations kept for backward)
    grows with the batch: a device between its size at 32 and at 64 takes 16 and 32 only,
    and the plan says so; a device too small for any is refused."""
    from types import SimpleNamespace

    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.data.spec import FeatureSpec
    from tfscale.tasks.report.plan import make_plan
    from tfscale.tasks.train.models import build_model
    from tfscale.tasks.train.stage_plan import MB, batches_that_fit, footprint, layer_costs

    spec = FeatureSpec.image((8, 8, 1), tuple("0123456789"))
    manifest = SimpleNamespace(shape=(8, 8, 1), num_classes=10, spec=spec)
    costs = layer_costs(build_model("cnn", manifest.shape, manifest.num_classes))
    between = (footprint(costs, 32).total + footprint(costs, 64).total) / 2 / MB
    assert batches_that_fit("cnn", manifest, between, (16, 32, 64, 128)) == (16, 32)
    assert batches_that_fit("cnn", manifest, 0.01, (16, 32)) == ()
    plan = make_plan(_planned_run(), 2, "measured", 0.0, None, (16, 32))
    assert {r.per_replica_batch for r in plan.rows} == {16, 32}
    assert plan.sources["batches"] == "16, 32 (those that fit --device-memory-mb)"
    with pytest.raises(UsageError, match="no per-replica batch of 16, 32, 64"):
        make_plan(_planned_run(), 2, "measured", 0.0, None, ())


@pytest.mark.parametrize(
    "followed, asked, expected",
    [
        ("linear", "linear", lambda m: 0.001 * m / BATCH),
        ("sqrt", "sqrt", lambda m: 0.002 / 2**0.5 * (m / BATCH) ** 0.5),
        # AdaScale's gain at the noise scale 64: (M/M0)(64 + M0)/(64 + M)
        ("adascale", "adascale", lambda m: 0.002 * (m / BATCH) * (64 + BATCH) / (64 + m)),
        ("auto", "auto", lambda m: 0.002 * ((m / BATCH) * (64 + BATCH) / (64 + m)) ** 0.5),
    ],
)
def test_a_plans_rate_column_follows_the_runs_rule(followed, asked, expected):
    """Each row's rate is the base rate times the gain the run's rule gives its batch (the
    gain AdaScale's rules settle at where they adapt: their recorded rate is the base),
    never above the run's own: the highest measured to reach the target."""
    from tfscale.tasks.report.plan import make_plan

    metrics = {**_planned_run(), "lr_scaling": followed, "lr_scaling_rule": asked}
    plan = make_plan(metrics, 4, "ethernet-10g", 10.0, study=_study(asked))
    run_rate = expected(2 * BATCH)
    for r in plan.rows:
        rate = min(expected(r.global_batch), run_rate)
        assert r.learning_rate == pytest.approx(rate), (r.global_batch, asked)
    assert asked in plan.sources["learning rate"] and plan.rule == asked


def test_a_plan_from_a_run_at_the_base_batch_prices_no_rate_above_it():
    """A run at the base batch followed `none` (its config asked for linear): no pair to
    calibrate from and no rate above the base measured, so only batches whose adascale
    rate stays at the base are priced."""
    from tfscale.tasks.report.plan import make_plan

    metrics = {**_planned_run(), "lr_scaling": "none", "lr_scaling_rule": "linear"}
    metrics["global_batch"] = BATCH
    plan = make_plan(metrics, 4, "ethernet-10g", 10.0)
    assert {r.global_batch for r in plan.rows} == {16, 32}
    assert all(r.learning_rate <= 0.002 + 1e-12 for r in plan.rows)


def test_the_track_keys_name_the_store_and_the_experiment_a_command_tracks_into(
    tmp_path, monkeypatch, capsys
):
    """`track.store_dir` and `track.experiment` in params.yaml: `tfscale forecast` (which
    tracks unless `--no-track`) writes its MLflow run into that store, under that
    experiment, and nothing into the working directory's default store."""
    from helpers import tiny_params

    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text(json.dumps({"probes": synthetic_probes()}))
    store = tmp_path / "elsewhere" / "store"
    keys = {"track.store_dir": str(store), "track.experiment": "capacity-planning"}
    params = tiny_params(tmp_path, **keys)
    argv = ["--params", str(params), "forecast", "--run-dir", str(run_dir), "--workers", "1,2"]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    client = MlflowClient(f"sqlite:///{store}/mlflow.db")
    experiment = client.get_experiment_by_name("capacity-planning")
    assert experiment is not None, [e.name for e in client.search_experiments()]
    assert len(client.search_runs([experiment.experiment_id])) == 1
    assert not (tmp_path / "mlflow").exists()
