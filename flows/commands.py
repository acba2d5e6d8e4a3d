"""What each `tfscale` subcommand does once its config is loaded.

Each command imports what it uses inside its own function: a DVC stage runs one command
and depends on exactly the modules that command imports (`dvc.yaml` lists them and
`tests/flows/test_dvc.py` checks the list), so `prepare` does not re-run when the
forecast's code changes; and TensorFlow (about 8 s to import), Prefect and MLflow are paid
only by the commands that use them."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tfscale.tasks.settings.config import Config


def prepare(config: Config, args: argparse.Namespace) -> int:
    from tfscale.tasks.data.preparation import format_prepared, prepare_dataset

    result = prepare_dataset(config, force=args.force, progress=not args.no_progress)
    print(format_prepared(result))
    return 0


def verify(config: Config, args: argparse.Namespace) -> int:
    from tfscale.tasks.data.manifest import verify_shards
    from tfscale.tasks.data.preparation import dataset_dir

    manifest = verify_shards(dataset_dir(config), config.prepare.dataset)
    print(
        f"ok: {len(manifest.shards)} shards of {manifest.dataset} in {dataset_dir(config)} "
        f"match their sizes and sha256"
    )
    return 0


def hardware(config: Config, args: argparse.Namespace) -> int:
    from tfscale.tasks.distribute.hardware import detect_hardware, format_report
    from tfscale.tasks.distribute.strategy import select_strategy

    report = detect_hardware()
    choice = select_strategy(report, config.train)
    if args.json:
        print(
            json.dumps(
                {
                    "hardware": report.to_dict(),
                    "choice": choice.to_dict(),
                    "fingerprint": report.fingerprint,
                },
                indent=2,
            )
        )
    else:
        print(format_report(report))
        print(f"strategy  {choice.kind}, {choice.shape}, {choice.precision}")
        print(f"because   {choice.reason}")
    return 0


def train(config: Config, args: argparse.Namespace) -> int:
    from tfscale.tasks.core.process import set_up_devices
    from tfscale.tasks.data.manifest import verify_shards
    from tfscale.tasks.data.preparation import dataset_dir
    from tfscale.tasks.distribute import cluster
    from tfscale.tasks.distribute.cluster import CHIEF, EVALUATOR, SERVER, role_of
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.distribute.strategy import baseline_choice, select_strategy

    if args.against_baseline:  # the baseline it joins, named before any work
        from tfscale.tasks.execute.run_files import load_exported

        load_exported(Path(args.against_baseline))
    data_dir = dataset_dir(config)
    manifest = verify_shards(data_dir, config.prepare.dataset)
    report = detect_hardware()
    proposed = select_strategy(report, config.train)
    role = role_of(report.cluster, (baseline_choice(proposed) if args.baseline else proposed).spec)
    if report.cluster is not None:
        cluster.join(report.cluster)
    if role == SERVER:
        cluster.serve_task(report.cluster, config.cluster.chief_wait_s)
        return 0
    set_up_devices(proposed.logical_cpus)
    planned = Run(config, manifest, str(data_dir), proposed, report)
    if role == CHIEF and report.cluster is None:
        planned = _settle(planned, args)
    baseline_of = planned  # what a baseline is the baseline of
    if args.baseline:
        planned = planned.with_choice(baseline_choice(planned.choice))
    choice = planned.choice
    if role == EVALUATOR:
        from tfscale.tasks.execute.trainings import evaluate_as_sidecar

        print(f"evaluator: evaluating each new checkpoint of {manifest.dataset}", flush=True)
        evaluate_as_sidecar(planned)
        return 0
    print(
        f"training {config.train.model} on {manifest.dataset}: {choice.kind}, "
        f"{choice.shape}, {choice.precision} ({choice.reason})",
        flush=True,
    )
    _train_tracked(planned, args, tracked=role == CHIEF, baseline_of=baseline_of)
    return 0


def _settle(run: Any, args: argparse.Namespace) -> Any:
    """What `auto` left open, measured (`tasks.measure.autotune`). A baseline, or a run compared
    with one (`--against-baseline`, as the DVC stages are), keeps the proposed replicas and
    settles precision and XLA for them, so that both sides share them and one measurement."""
    from tfscale.tasks.execute.trainings import settle_auto
    from tfscale.tasks.measure.autotune import settled_line

    in_a_study = args.baseline or args.against_baseline is not None
    run, settled = settle_auto(run, for_study=in_a_study)
    if settled.timed:
        print(f"auto: {settled_line(settled)}", flush=True)
    return run


def _train_tracked(run: Any, args: argparse.Namespace, *, tracked: bool, baseline_of: Any) -> None:
    """Trains and diagnoses `run`, logged as an MLflow run of its own when `tracked` (a
    cluster's chief, or a run of one process), then exports and reports it. A baseline
    opens the study run its comparison nests under (`baseline_of`: the run it is the
    baseline of); a run `--against-baseline DIR` joins the study of the baseline in DIR."""
    from tfscale.tasks.execute.run_files import export_run
    from tfscale.tasks.execute.trainings import train_and_diagnose
    from tfscale.tasks.measure.diagnosis import format_diagnosis
    from tfscale.tasks.track import command_runs as mlflow_runs
    from tfscale.tasks.track import records
    from tfscale.tasks.track.tracking import EpochLog
    from tfscale.tasks.train.to_target import ToTarget

    choice, manifest = run.choice, run.manifest
    kind = "baseline" if args.baseline else "train"
    tracker, tags = (
        mlflow_runs.command_tracker(run.config, strategy=choice.kind, precision=choice.precision)
        if tracked
        else (None, {})
    )
    params = records.study_params(run)  # what a training's run and its study's row show
    against = Path(args.against_baseline) if args.against_baseline else None
    study = mlflow_runs.study_run(
        tracker, baseline_of, tags, params, baseline=args.baseline, against=against
    )
    name = (
        ("baseline" if args.baseline else "distributed")
        if study
        else f"{kind}-{manifest.dataset}-{choice.kind}"
    )
    with mlflow_runs.training_run(tracker, name, tags, study) as run_id:
        live = EpochLog(tracker, run_id) if tracker else None
        probe_steps = 0 if args.no_diagnose else min(30, run.train.measure_steps)
        result, diagnosis = train_and_diagnose(
            run, probe_steps, on_epoch=live, label=kind, epoch_lines=True
        )
        if tracker:
            mlflow_runs.log_trained(tracker, run_id, result, diagnosis, params, study)
    if diagnosis is not None:
        print(format_diagnosis(diagnosis))
    if args.export_dir:
        export_run(result, Path(args.export_dir))
    if result.to_target:
        print(f"held-out:   {ToTarget(**result.to_target).text()}")
    print(
        f"{result.examples_per_s:,.0f} examples/s (after the first epoch), global batch "
        f"{result.global_batch}; outputs in {result.run_dir}"
    )


def evaluate(config: Config, args: argparse.Namespace) -> int:
    from tfscale.tasks.core.errors import MissingInput
    from tfscale.tasks.data.manifest import verify_shards
    from tfscale.tasks.data.preparation import dataset_dir
    from tfscale.tasks.execute.run_files import latest_run, study_of, trained_by
    from tfscale.tasks.track import command_runs as mlflow_runs
    from tfscale.tasks.train.evaluation import recorded_or_evaluated, write_evaluation

    if args.baseline:  # the baseline it compares with, named before any work
        from tfscale.tasks.execute.run_files import load_exported

        load_exported(Path(args.baseline))
    data_dir = dataset_dir(config)
    manifest = verify_shards(data_dir, config.prepare.dataset)
    model_path = (
        args.model_path or latest_run(config.train.runs_dir, manifest.dataset)["model_path"]
    )
    if not Path(model_path).exists():
        raise MissingInput(f"No model at {model_path}", "train one with 'tfscale train'.")
    model_dir = Path(model_path).parent
    trained = {**trained_by(model_dir), "dataset": manifest.dataset}
    setup, links = mlflow_runs.split_setup(trained)
    tracker, tags = mlflow_runs.command_tracker(config, **links)
    study = study_of(model_dir)  # the training's study, if a stage
    name = "evaluate" if study else f"evaluate-{manifest.dataset}"
    with tracker.run(name, tags, nested_under=study) as run_id:
        tracker.log(run_id, params=setup)
        mlflow_runs.describe_evaluation(tracker, run_id, trained, manifest.dataset)
        result, kept = recorded_or_evaluated(
            model_path,
            manifest,
            str(data_dir),
            config.evaluate.batch_size,
            trained.get("model", ""),
        )
        by = " (as its training evaluated it: model and shards unchanged)" if kept else ""
        path = write_evaluation(result, model_dir, manifest.feature["class_names"])
        tracker.log_result(run_id, result)
        tracker.log_artifacts(run_id, [path])
        print(f"{result.text()} ({result.examples} examples){by}; written to {path}")
        if args.baseline:
            baseline = Path(args.baseline)
            _compare(config, baseline, model_dir, result, (tracker, run_id), manifest)
    return 0


def _compare(
    config: Config,
    baseline: Path,
    model_dir: Path,
    result: Any,
    logged_on: tuple[Any, str],
    manifest: Any,
) -> None:
    """`tfscale evaluate --baseline DIR`: the evaluated model's run against the baseline's
    exported one, logged on the evaluation's run (`logged_on`: the tracker and the run's
    id) and its study."""
    from tfscale.tasks.execute.run_files import study_of
    from tfscale.tasks.report.summary import compare_exported
    from tfscale.tasks.track import command_runs as mlflow_runs
    from tfscale.tasks.train.to_target import target_of

    target = target_of(config.evaluate, manifest.spec.label)
    summary = compare_exported(baseline, model_dir, result, config.train.scaling, target)
    tracker, run_id = logged_on
    mlflow_runs.log_comparison(
        tracker, run_id, study_of(model_dir), result, summary, manifest.dataset
    )
    print(
        f"speedup {summary.speedup_text} over the single-device baseline, scaling "
        f"efficiency {summary.scaling_efficiency:.2f}; written to {model_dir / 'scaling.json'}"
    )


def run(config: Config, args: argparse.Namespace) -> int:
    from tfscale.tasks.track.tracking import Tracker

    summary = _run_flow("tfscale.flows.study", "scaling_study", config)
    from tfscale.tasks.report.console_summary import format_summary

    print()
    print(format_summary(summary, open_ui_line(Tracker.for_config(config.track))))
    return 0


def open_ui_line(tracker: Any) -> str:
    """Where to see the results: the runs table on the UI showing the store now (a `tfscale
    ui` at any port, or the tracking server), else how to start one and where it will be."""
    results = tracker.results_url(tracker.ui_base)
    if tracker.live_ui:
        return results
    return f"tfscale ui, then {results} (or the address 'tfscale ui --port N' prints)"


def _run_flow(module: str, name: str, config: Config) -> Any:
    """Runs a flow against a Prefect API that boots (unless PREFECT_API_URL names one)
    while the flow's module imports TensorFlow (`startup_imports`, with what it imports)."""
    from tfscale.flows.prefect_api import api_url, temporary_api
    from tfscale.tasks.core.process import import_tensorflow, startup_imports
    from tfscale.tasks.core.progress import status

    with temporary_api() as api:
        started = "while a Prefect API starts" if api.process else f"(Prefect API {api_url()})"
        status("start", f"loading TensorFlow {started}")
        with startup_imports():
            import_tensorflow()
            flow = getattr(importlib.import_module(module), name)
        api.wait()
        return flow(config)


def ui(config: Config, args: argparse.Namespace) -> int:
    from tfscale.tasks.core.errors import UserError
    from tfscale.tasks.core.network import bind_problem
    from tfscale.tasks.track.tracking import Tracker
    from tfscale.tasks.track.ui_server import serve_ui, server_command

    tracker = Tracker.for_config(config.track)
    configured = urlsplit(config.track.ui_url)  # links point there: serve there unless told
    host = args.host or configured.hostname or "127.0.0.1"
    port = args.port or configured.port or 5000
    base = f"http://{host}:{port}"
    problem = bind_problem(host, port)
    if problem not in (None, "in use"):  # an address this machine does not have, say
        raise UserError(
            f"the MLflow UI cannot listen on {host}:{port}: {problem}",
            "give --host an address of this machine (127.0.0.1, or 0.0.0.0 for every one) "
            "and a --port it may take (1024 and up without root)",
        )
    if problem == "in use":  # uvicorn would say so in a log line and exit 0
        raise UserError(
            f"{host}:{port} is already in use (another 'tfscale ui' or MLflow server?), so "
            "the MLflow UI cannot start there",
            f"open {base} if it is this store's UI, stop what holds the port, or serve on "
            "another with 'tfscale ui --port N' (the links a run writes while it serves "
            "point there).",
        )
    command, env = server_command(tracker, host, port)
    # links name where a browser reaches it: this machine, when it listens on every address
    reach = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return serve_ui(tracker, command, env, f"http://{reach}:{port}")


def serve(config: Config, args: argparse.Namespace) -> int:
    from tfscale.flows.deployments import serve_deployments

    serve_deployments(args.params or "params.yaml", args.cron)
    return 0


def forecast(config: Config, args: argparse.Namespace) -> int:
    from tfscale.tasks.report.forecast import check_request
    from tfscale.tasks.report.forecast_report import forecast_run, format_forecast, probed_run
    from tfscale.tasks.track.records import log_forecast
    from tfscale.tasks.track.tracking import Tracker

    check_request(args.workers, args.link_gbit, args.preset)  # usage errors first
    run_dir = probed_run(config.train.runs_dir, config.prepare.dataset, args.run_dir)
    result, written = forecast_run(
        run_dir, args.workers, args.link_gbit, args.preset, args.scaling, args.out_dir
    )
    print(f"forecast from the measurements of {run_dir}")
    print(format_forecast(result))
    print(f"written: {', '.join(str(path) for path in written)}")
    if not args.no_track:
        run_id = log_forecast(Tracker.for_config(config.track), result, written, run_dir)
        print(f"tracked: MLflow run {run_id} ('tfscale ui' shows it)")
    return 0


def plan(config: Config, args: argparse.Namespace) -> int:
    from tfscale.tasks.core.files import write_json_atomic
    from tfscale.tasks.core.run_layout import METRICS
    from tfscale.tasks.report.console_plan import format_plan
    from tfscale.tasks.report.forecast import link_named
    from tfscale.tasks.report.forecast_report import probed_run
    from tfscale.tasks.report.plan import BATCHES, check_devices, make_plan
    from tfscale.tasks.track.records import log_plan
    from tfscale.tasks.track.tracking import Tracker

    check_devices(args.devices)  # usage errors first
    name, gbit = link_named(args.link)
    run_dir = probed_run(config.train.runs_dir, config.prepare.dataset, args.run_dir)
    metrics = json.loads((Path(run_dir) / METRICS).read_text())
    batches = BATCHES
    if args.device_memory_mb:  # the model's footprint: built, so TensorFlow, quietly
        from tfscale.tasks.core.process import import_tensorflow
        from tfscale.tasks.data.manifest import load_manifest
        from tfscale.tasks.data.preparation import dataset_dir
        from tfscale.tasks.train.stage_plan import batches_that_fit

        import_tensorflow()
        manifest = load_manifest(dataset_dir(config))
        batches = batches_that_fit(metrics["model"], manifest, args.device_memory_mb, BATCHES)
    study_path = Path(run_dir) / "summary.json"  # the baseline beside it calibrates its rule
    study = json.loads(study_path.read_text()) if study_path.exists() else None
    result = make_plan(metrics, args.devices, name, gbit, args.target, batches, study)
    path = write_json_atomic(Path(run_dir) / "plan.json", result.to_dict())
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_plan(result))
    if not args.json:
        print(f"written: {path}")
    if not args.no_track:
        run_id = log_plan(Tracker.for_config(config.track), result, path)
        if not args.json:
            print(f"tracked: MLflow run {run_id} ('tfscale ui' shows it)")
    return 0


def sweep(config: Config, args: argparse.Namespace) -> int:
    """The sweep's flow run; a grid it cannot plan (`plan_cells`: links without worker
    processes), or a work pool with no server other hosts reach or no live worker, is
    refused first, before a Prefect API starts or TensorFlow imports."""
    from tfscale.tasks.execute.sweep_cells import plan_cells
    from tfscale.tasks.report.scaling_grid import CriticalBatch, format_table
    from tfscale.tasks.train.user_models import check_ref

    plan_cells(config)
    check_ref(config.sweep.model)  # a model file that is not there: before anything starts
    if config.sweep.work_pool:
        from tfscale.flows.pool import check_live_worker, check_server

        check_server()  # before the flow: the pool's workers cannot reach a temporary one
        check_live_worker(config.sweep.work_pool)  # the flow asks again (a deployment's)
    rows = _run_flow("tfscale.flows.sweep", "sweep_flow", config)
    print()
    print(format_table(rows))
    critical = json.loads((Path(config.sweep.out_dir) / "critical_batch.json").read_text())
    for fitted in critical:
        print(f"critical batch: {CriticalBatch(**fitted).text()}")
    print(f"table and charts in {config.sweep.out_dir}/; open the MLflow UI with 'tfscale ui'")
    return 0
