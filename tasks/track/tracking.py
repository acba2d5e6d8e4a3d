"""The MLflow store's client for tfscale: where the store is, its runs opened, logged,
finished and linked to, its models logged and registered. The domain's logging (a
training's, a study's, a forecast's, a plan's, a sweep's run) is `tasks.track.records`,
over this client; the only other reader of the store is the UI's runs-table defaults
(`tasks.track.ui.table_defaults`, in the server).

A `Tracker` owns the store (the SQLite store under `track.store_dir`, or the server at
`MLFLOW_TRACKING_URI`), its client and the system-metric monitors of the runs it opened.
It logs result dataclasses by the type of each field (`fields_by_type`): numbers are
metrics, strings and flags are tags, fields marked `PARAM` (how a run was set up) are
params; lists and mappings (per-epoch history, per-class accuracy) are logged their own
way or kept in the artifacts. A field added to a result is logged without touching this
module.

Per scaling study: a parent run with child runs `baseline` and `distributed`, each opened
when its training starts and fed its epochs as they end (`EpochLog`); the model is logged
on the parent and registered. Per sweep: a parent with a child per cell. `tfscale train`
and `evaluate` (and so the DVC stages) log a run each, tagged with the DVC stage.

The experiment is a model-training one (MLflow's experiment kind), and carries a saved
view of the runs table whose columns are the results (`RESULT_COLUMNS`); `tfscale ui`
prints the address that opens it (`Tracker.results_url`). Metrics shown to people are
rounded to `SIGNIFICANT` digits; the JSON artifacts keep every digit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfscale.tasks.core.errors import UserError
from tfscale.tasks.core.fields import fields_by_type
from tfscale.tasks.core.files import write_json_atomic

if TYPE_CHECKING:
    from tfscale.tasks.settings.config import TrackConfig

_BATCH = 900  # MLflow takes at most 1000 metrics in one call
SIGNIFICANT = 4
SHORT_ID = 6  # a top-level run's name begins with this many characters of its id
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
TRAINING_PAGE = "workflowType=machine_learning"  # MLflow's UI: a page in model-training mode
VIEW_KEY = "tfscale-results"
VIEW_TAG = "mlflow.sharedViewState." + VIEW_KEY
# the runs table's columns, in order: what a user came for
RESULT_COLUMNS = (
    ("metrics", "speedup"),
    ("metrics", "speedup_low"),
    ("metrics", "speedup_high"),
    ("metrics", "time_to_target_speedup"),
    ("metrics", "scaling_efficiency"),
    ("metrics", "test_accuracy"),
    ("params", "strategy"),
    ("params", "replicas"),
    ("params", "precision"),
    ("tags", "bottleneck"),
    ("params", "dataset"),
    ("params", "model"),
    ("tags", "dvc_stage"),
)


class TrackingError(UserError, RuntimeError):
    """The tracking server cannot be reached or refused what was logged."""


def rounded(value: float) -> float:
    """`value` to `SIGNIFICANT` significant digits (1.3180673662 -> 1.318)."""
    return float(f"{value:.{SIGNIFICANT}g}")


@functools.cache
def _rounded_monitor() -> type:
    """MLflow's system-metrics monitor, logging its figures rounded (`rounded`): 0.03264 MB
    received, not 0.032642000001942506."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    class RoundedMonitor(SystemMetricsMonitor):
        def aggregate_metrics(self) -> dict[str, float]:
            return {name: rounded(v) for name, v in super().aggregate_metrics().items()}

    return RoundedMonitor


def results_view() -> dict[str, Any]:
    """The runs table's saved view: result columns, newest first, each study collapsed
    to its parent row."""
    columns = [f"{kind}.`{name}`" for kind, name in RESULT_COLUMNS]
    return {
        "selectedColumns": columns,
        "columnOrder": columns,
        "orderByKey": "attributes.start_time",
        "orderByAsc": False,
    }


@dataclasses.dataclass
class EpochLog:
    """Logs each epoch's figures to one run as it ends (`tasks.core.progress.EpochWatcher`)."""

    tracker: Tracker
    run_id: str

    def __call__(self, epoch: dict[str, float]) -> None:
        self.tracker.log(self.run_id, metrics=epoch_figures(epoch), step=int(epoch["epoch"]))


# an epoch's figures not charted: each epoch's examples are the same (a flat line)
UNCHARTED = ("epoch", "examples")


def epoch_figures(epoch: dict[str, float]) -> dict[str, float]:
    """An epoch's figures as its metric points: rounded as the run's own (`rounded`), the
    epoch number (the step) and the uncharted left out."""
    return {k: rounded(v) for k, v in epoch.items() if k not in UNCHARTED}


def run_tags(**extra: str) -> dict[str, str]:
    """Tags every run carries: the commit, and the DVC stage when `dvc repro` runs it."""
    tags = {"git_commit": git_commit(), **extra}
    if os.environ.get("DVC_STAGE"):
        tags["dvc_stage"] = os.environ["DVC_STAGE"]
    return tags


STORE_LOCK = ".tfscale-store.lock"  # beside the embedded store's database (`_store_lock`)


def ended_as(exc: BaseException) -> str:
    """The MLflow status of a run `exc` ended: KILLED when a signal or Ctrl-C stopped it
    (`process.Stopped` is a KeyboardInterrupt), FAILED otherwise."""
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


class Tracker:
    """The tracking store, its client, and the monitors of the runs this tracker opened."""

    def __init__(
        self,
        store_dir: str | Path = "mlflow",
        experiment: str = "tfscale",
        uri: str = "",
        ui_url: str = "http://127.0.0.1:5000",
    ):
        self.store_dir = Path(store_dir)
        self.experiment = experiment
        self.ui_url = ui_url
        self.uri = (
            uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{self.store_dir.resolve()}/mlflow.db"
        )
        self._client: Any = None
        self._monitors: dict[str, Any] = {}

    @classmethod
    def for_config(cls, track: TrackConfig) -> Tracker:
        return cls(track.store_dir, track.experiment, ui_url=track.ui_url)

    def __getstate__(self) -> dict:  # the store, not the connection (Prefect hashes inputs)
        return {
            "store_dir": self.store_dir,
            "experiment": self.experiment,
            "uri": self.uri,
            "ui_url": self.ui_url,
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @property
    def local(self) -> bool:
        return self.uri.startswith("sqlite:///")

    @property
    def database(self) -> Path:
        """The embedded store's SQLite file (meaningful where `local`)."""
        return Path(self.uri.removeprefix("sqlite:///"))

    @property
    def artifact_root(self) -> str:
        return (self.store_dir / "artifacts").resolve().as_uri()

    def check_reachable(self, timeout_s: float = 7.0) -> None:
        """Fails fast, after retrying for `timeout_s`, when a remote server does not answer.

        Raises:
            TrackingError: naming the URI and how to fix it.
        """
        if not self.uri.startswith(("http://", "https://")):
            return
        from tfscale.tasks.core.network import wait_healthy

        problem = wait_healthy(self.uri.rstrip("/") + "/health", timeout_s, interval_s=1.0)
        if problem is not None:
            raise TrackingError(
                f"MLflow tracking server {self.uri} is unreachable ({problem})",
                "start it, or unset MLFLOW_TRACKING_URI to use the embedded store under "
                f"{self.store_dir}/.",
            )

    def check(self) -> None:
        """The store can be used, checked before any work: a server answers, or the
        embedded store's file is a database (`check_reachable`, `check_store`)."""
        self.check_reachable()
        self.check_store()

    def check_store(self) -> None:
        """Fails when the embedded store's file exists and is not an SQLite database (a
        stray file, or a store copied in half): MLflow would fail deep in its migrations.

        Raises:
            TrackingError: naming the file and how to fix it.
        """
        if not self.local:
            return
        path = self.database
        if path.is_dir():
            kind = "a directory, not an SQLite database"
        elif path.is_file() and path.stat().st_size:
            with path.open("rb") as file:
                if file.read(16) == b"SQLite format 3\x00":
                    return
            kind = "not an SQLite database"
        else:
            return
        raise TrackingError(
            f"The MLflow store {path} is {kind}",
            "move it aside (a new store is made in its place), point track.store_dir at "
            "another directory, or set MLFLOW_TRACKING_URI to a tracking server.",
        )

    @contextlib.contextmanager
    def _store_lock(self) -> Iterator[None]:
        """The embedded store held by this process alone while it is made, migrated and
        given its experiment: two commands starting at once on a fresh store (a served
        schedule's run beside one on demand) each ran MLflow's migrations, and one failed
        ("table _alembic_tmp_experiments already exists"). A lock file beside the
        database (`run_lock.waited`); nothing to hold for a tracking server."""
        if not self.local:
            yield
            return
        from tfscale.tasks.core.run_lock import waited

        with waited(self.store_dir / STORE_LOCK):
            yield

    @property
    def client(self) -> Any:
        """The MlflowClient, made once, with the experiment created if it is new (under
        `_store_lock`)."""
        if self._client is None:
            try:
                with self._store_lock():
                    self._client = self._made_client()
            except Exception as exc:
                unwritable = self._unwritable(exc)
                if unwritable is None:
                    raise
                raise unwritable from None
        return self._client

    def _unwritable(self, exc: BaseException) -> TrackingError | None:
        """The error for an embedded store this process cannot write (a read-only or full
        file system, a forbidden directory, met by Python or by SQLite), naming the store
        and track.store_dir; None for anything else."""
        from tfscale.tasks.core.errors import system_error

        text = str(exc)
        sqlite = "readonly database" in text or "unable to open database file" in text
        if not self.local or not (system_error(exc) or sqlite):
            return None
        return TrackingError(
            f"The MLflow store {self.store_dir} cannot be written "
            f"({text.splitlines()[0][:200] if text else type(exc).__name__})",
            "make it writable, point track.store_dir in params.yaml at a directory that is, "
            "or set MLFLOW_TRACKING_URI to a tracking server.",
        )

    def _made_client(self) -> Any:
        """The store checked, its client made and the experiment created where new."""
        from mlflow import MlflowClient

        self.check()
        if self.local and not self.database.exists():  # a copy of an empty one (`new_store`)
            from tfscale.tasks.track.new_store import seed

            with contextlib.suppress(OSError):  # no cache to keep one in: MLflow makes it
                seed(self.database)
        client = MlflowClient(self.uri)
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is None:
            root = self.artifact_root if self.local else None
            client.create_experiment(
                self.experiment, artifact_location=root, tags=dict([EXPERIMENT_KIND])
            )
            experiment = client.get_experiment_by_name(self.experiment)
        view = json.dumps(results_view())
        if experiment.tags.get(VIEW_TAG) != view:
            client.set_experiment_tag(experiment.experiment_id, VIEW_TAG, view)
        if EXPERIMENT_KIND[0] not in experiment.tags:
            client.set_experiment_tag(experiment.experiment_id, *EXPERIMENT_KIND)
        return client

    def results_url(self, base: str) -> str:
        """The experiment's runs table at `base` (an MLflow UI), opened on the result
        columns."""
        experiment = self.client.get_experiment_by_name(self.experiment).experiment_id
        query = f"{TRAINING_PAGE}&viewStateShareKey={VIEW_KEY}"
        return f"{base.rstrip('/')}/#/experiments/{experiment}/runs?{query}"

    @property
    def live_ui(self) -> str | None:
        """The UI that shows this store now: the tracking server itself, or the `tfscale ui`
        serving it, at whatever port (`serving_ui`); None when neither."""
        if self.uri.startswith(("http://", "https://")):
            return self.uri
        return serving_ui(self.store_dir)

    @property
    def ui_base(self) -> str:
        """Where a person opens this store: the UI showing it now (`live_ui`), else where
        `tfscale ui` serves by default (`track.ui_url`)."""
        return self.live_ui or self.ui_url

    def latest_study(self) -> str | None:
        """The id of the experiment's latest top-level run (a study's parent), or None."""
        experiment = self.client.get_experiment_by_name(self.experiment).experiment_id
        runs = self.client.search_runs(
            [experiment], order_by=["attributes.start_time DESC"], max_results=50
        )
        tops = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        return tops[0].info.run_id if tops else None

    def run_url(self, base: str, run_id: str) -> str:
        experiment = self.client.get_run(run_id).info.experiment_id
        # the query opens it on model training in any MLflow UI, `tfscale ui`'s or not
        return f"{base.rstrip('/')}/#/experiments/{experiment}/runs/{run_id}?{TRAINING_PAGE}"

    def start_run(
        self,
        name: str,
        tags: dict[str, str],
        parent_id: str | None = None,
        system_metrics: bool = False,
        params: dict[str, Any] | None = None,
    ) -> str:
        """Opens a run (a child of `parent_id` if given); returns its id. A top-level run's
        name begins with the start of its id (`85d88c-digits-cnn-mirrored-2x-10ep`), so two
        runs of one configuration differ in the table, where a long name is cut at its end,
        and match the console's run id."""
        experiment = self.client.get_experiment_by_name(self.experiment).experiment_id
        if parent_id:
            tags = {"mlflow.parentRunId": parent_id, **tags}
        run_id = self.client.create_run(experiment, run_name=name, tags=tags).info.run_id
        if not parent_id:
            self.client.update_run(run_id, name=f"{run_id[:SHORT_ID]}-{name}")
        if params:
            self.log(run_id, params=params)
        if system_metrics:
            monitor = _rounded_monitor()(run_id, sampling_interval=2, tracking_uri=self.uri)
            monitor.start()
            self._monitors[run_id] = monitor
        return run_id

    def log(
        self,
        run_id: str,
        metrics: dict[str, float] | None = None,
        params: dict[str, Any] | None = None,
        tags: dict[str, Any] | None = None,
        step: int = 0,
    ) -> None:
        """Metrics, params and tags in as few calls as MLflow allows."""
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in (metrics or {}).items()]
        self.log_batch(
            run_id,
            items,
            [Param(k, str(v)) for k, v in (params or {}).items()],
            [RunTag(k, str(v)) for k, v in (tags or {}).items()],
        )

    def log_result(
        self, run_id: str, result: Any, prefix: str = "", said: Collection[str] = ()
    ) -> None:
        """Every field of a result dataclass, by its type (`fields_by_type`), numbers
        rounded for the table; a tag whose words are among `said` (the run's or its
        parent's already) is not repeated."""
        metrics, params, tags = fields_by_type(result, prefix)
        tags = {k: v for k, v in tags.items() if v not in said}
        self.log(run_id, {k: rounded(v) for k, v in metrics.items()}, params, tags)

    def log_history(self, run_id: str, history: list[dict[str, float]]) -> None:
        """Per-epoch figures as metric steps, one batched call per 900 points."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [
            Metric(key, value, now, int(epoch["epoch"]))
            for epoch in history
            for key, value in epoch_figures(epoch).items()
        ]
        self.log_batch(run_id, points, [], [])

    def log_artifacts(self, run_id: str, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(run_id, str(path))

    def log_model(self, run_id: str, model_path: str, feature: dict | None = None) -> str:
        """The Keras model as an MLflow logged model of `run_id`, with pinned requirements
        (given rather than inferred: MLflow's inference reloads the model, about 10 s),
        its signature from its inputs (a subclassed model's, which has none: from the
        data's spec, `feature` as the manifest records it). Returns the logged model's id."""
        import mlflow.keras
        import numpy as np
        from mlflow.entities import LoggedModelOutput
        from mlflow.models import infer_signature

        from tfscale.tasks.execute.run_files import trained_by
        from tfscale.tasks.train.models import load_trained_model

        experiment = self.client.get_run(run_id).info.experiment_id
        logged = self.client.create_logged_model(experiment, name="model", source_run_id=run_id)
        model = load_trained_model(model_path, trained_by(Path(model_path).parent).get("model", ""))
        example = _example_input(model, feature)
        signature = infer_signature(example, np.asarray(model(example)))
        with tempfile.TemporaryDirectory(prefix="tfscale-model-") as tmp:
            local = Path(tmp) / "model"
            local.mkdir()  # MLflow writes the input example before it makes the directory
            mlflow.keras.save_model(
                model,
                str(local),
                signature=signature,
                input_example=example,
                pip_requirements=_model_requirements(),
            )
            self.client.log_model_artifacts(logged.model_id, str(local))
        self.client.finalize_logged_model(logged.model_id, "READY")
        # the run's "Logged models" column and its outputs name the model
        self.client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
        return logged.model_id

    def describe(self, run_id: str, markdown: str) -> None:
        """The run's description on its MLflow page (markdown, within a tag's 8,000
        characters)."""
        self.log(run_id, tags={"mlflow.note.content": markdown[:8000]})

    def register_model(self, name: str, model_id: str, run_id: str, tags: dict) -> str:
        """A new version of registered model `name` from a logged model; its version."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(
                name, description="tfscale's distributed model, with its speedup and accuracy"
            )
        version = self.client.create_model_version(
            name,
            source=self.client.get_logged_model(model_id).artifact_location,
            run_id=run_id,
            model_id=model_id,
            tags={k: str(v) for k, v in tags.items()},
        )
        # the logged model's page links its registered versions by this tag, which
        # `mlflow.register_model` sets and the client's create_model_version does not
        from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

        logged = self.client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS)
        versions = [*json.loads(logged or "[]"), {"name": name, "version": version.version}]
        self.client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(versions)})
        return version.version

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        """Stops the run's system metrics (if any) and closes it."""
        monitor = self._monitors.pop(run_id, None)
        if monitor is not None:
            monitor.finish()
        self.client.set_terminated(run_id, status=status)

    def fail(self, run_id: str, error: str, status: str = "FAILED") -> None:
        """Marks a run and every child still running as FAILED (or `status`: KILLED for a
        run a signal or Ctrl-C stopped, `ended_as`), with the error as a tag."""
        experiment = self.client.get_run(run_id).info.experiment_id
        children = self.client.search_runs(
            [experiment],
            filter_string=f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'",
        )
        for child in children:
            self.finish(child.info.run_id, status=status)
        self.log(run_id, tags={"error": error[:4000]})
        self.finish(run_id, status=status)

    @contextlib.contextmanager
    def run(
        self, name: str, tags: dict[str, str], nested_under: str | None = None
    ) -> Iterator[str]:
        """A run around a command's work: FINISHED when the block ends, FAILED (with the
        error) when it raises, KILLED when a signal or Ctrl-C stops it. With `nested_under`
        (a study's run, `open_study`), a child of it, and the study ends as its latest
        stage did."""
        run_id = self.start_run(name, tags, parent_id=nested_under)
        try:
            yield run_id
        except BaseException as exc:
            self.fail(run_id, repr(exc), ended_as(exc))
            if nested_under:
                self.fail(nested_under, f"stage {name}: {exc!r}", ended_as(exc))
            raise
        self.finish(run_id)
        if nested_under:
            if "error" in self.client.get_run(nested_under).data.tags:  # an earlier stage's
                self.client.delete_tag(nested_under, "error")
            self.finish(nested_under)

    def join_study(
        self, baselines: str | None, name: str, tags: dict[str, str], params: dict[str, Any]
    ) -> str:
        """The study run a training compared with a baseline nests under: the baseline's
        own (`baselines`) while it was opened for the same configuration (`params`) and has
        no compared training yet; otherwise a new one (a baseline DVC kept from an earlier
        repro serves another configuration), which `tags` link to the baseline."""
        if baselines:
            run = self.client.get_run(baselines)
            same = all(run.data.params.get(k) == str(v) for k, v in params.items())
            stages = self.client.search_runs(
                [run.info.experiment_id], f"tags.mlflow.parentRunId = '{baselines}'"
            )
            if same and not any(s.info.run_name == "distributed" for s in stages):
                return baselines
        return self.open_study(name, tags, params)

    def open_study(self, name: str, tags: dict[str, str], params: dict[str, Any]) -> str:
        """The parent of a study whose stages run as separate commands (`dvc
        repro`: baseline, train, evaluate): each stage's run nests under it (`run`'s
        `nested_under`), and the evaluation puts the result on it."""
        own = dict(tags)
        if "dvc_stage" in own:  # not one stage: the repro's, in the table's stage column
            own["dvc_stage"] = "repro"
        run_id = self.start_run(name, {**own, "kind": "study"})
        self.log(run_id, params=params)
        self.describe(
            run_id,
            "The stages of one scaling study, each a child run: the single-device "
            "baseline, the training compared with it, and the evaluation that compares them.",
        )
        return run_id

    def log_batch(self, run_id: str, metrics: list, params: list, tags: list) -> None:
        for start in range(0, max(len(metrics), 1), _BATCH):
            first = start == 0
            self.client.log_batch(
                run_id,
                metrics=metrics[start : start + _BATCH],
                params=params if first else [],
                tags=tags if first else [],
            )


UI_RECORD = "ui.json"  # {"url": ..., "pid": ...} while `tfscale ui` serves the store


def serving_ui(store_dir: Path) -> str | None:
    """The address a `tfscale ui` serving `store_dir` now recorded (`UI_RECORD`), or None:
    no record, or its process is gone (a record a killed UI left behind is not trusted)."""
    record = _ui_record(store_dir)
    try:
        os.kill(int(record["pid"]), 0)
        return str(record["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record_serving_ui(store_dir: Path, url: str) -> None:
    """`tfscale ui` (this process) serves `store_dir` at `url`: links a run writes point
    there (`serving_ui`) until `forget_serving_ui`."""
    Path(store_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(store_dir) / UI_RECORD, {"url": url, "pid": os.getpid()})


def forget_serving_ui(store_dir: Path) -> None:
    """This process's record of serving `store_dir` goes (another UI's is left alone)."""
    if _ui_record(store_dir).get("pid") == os.getpid():
        (Path(store_dir) / UI_RECORD).unlink(missing_ok=True)


def _ui_record(store_dir: Path) -> dict:
    try:
        record = json.loads((Path(store_dir) / UI_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def write_json_artifact(folder: str | Path, name: str, value: Any) -> Path:
    """`value` as JSON in `folder`/`name`, to log: a folder its caller removes once logged."""
    path = Path(folder) / name
    path.write_text(json.dumps(value, indent=2, default=str))
    return path


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _model_requirements() -> list[str]:
    """What loading the model needs, pinned to what trained it."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("tensorflow", "keras", "mlflow")]


def _example_input(model: Any, feature: dict | None = None) -> Any:
    """One example of zeros (empty text) of the model's input: an array, or a dict of them
    by feature where the model takes several; for a subclassed model (no declared inputs),
    one of the data's spec (`feature`, as the manifest records it)."""
    import numpy as np
    import tensorflow as tf

    try:
        declared = model.input
    except (AttributeError, ValueError):
        from tfscale.tasks.data.spec import FeatureSpec
        from tfscale.tasks.train.user_models import example_batch

        if feature is None:
            raise
        return example_batch(FeatureSpec.from_dict(feature))

    def zero(tensor: Any) -> Any:
        shape = (1, *[d or 1 for d in tensor.shape[1:]])
        if str(tensor.dtype) == "string":  # a string tensor: Keras takes no object array
            return tf.fill(shape, "")
        return np.zeros(shape, dtype=str(tensor.dtype))

    return tf.nest.map_structure(zero, declared)
