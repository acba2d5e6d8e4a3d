"""Evaluating a trained model on the held-out split: loss, accuracy, per class, confusion.

A training evaluates its final model once before it ends, in its own process, and keeps the
result beside the model (`record_final`, `final_eval.json`, with the model file's sha256 and
the shards' manifest digest). `tfscale evaluate` of that model on the same shards and
batch size then reads it (`recorded`) instead of importing TensorFlow a second time to
compute the same figures; a model file or shards changed since are evaluated again.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tfscale.tasks.core.files import write_json_atomic
from tfscale.tasks.data.manifest import Manifest, sha256_of
from tfscale.tasks.train.to_target import METRIC_NAMES

RECORDED = "final_eval.json"


@dataclass(frozen=True)
class EvalResult:
    test_loss: float
    test_accuracy: float
    examples: int
    per_class_accuracy: dict[str, float]
    confusion_matrix: list[list[int]]
    model_path: str
    seconds: float = 0.0
    # the label kind's metrics by name (accuracy; AUC for binary; the mean absolute error
    # for real values, where `test_accuracy` is not defined: NaN)
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """`test accuracy 0.9639 (loss 0.1085)`, with AUC or the mean absolute error where
        the label's kind reports them."""
        shown = {name: value for name, value in self.metrics.items() if name != "accuracy"}
        parts = [] if math.isnan(self.test_accuracy) else [f"accuracy {self.test_accuracy:.4f}"]
        parts += [f"{METRIC_NAMES.get(n, n)} {v:.4f}" for n, v in shown.items()]
        return f"test {', '.join(parts)} (loss {self.test_loss:.4f})"


def evaluate_model(
    model_path: str,
    manifest: Manifest,
    data_dir: str,
    batch_size: int,
    split: str = "test",
    source: str = "",
) -> EvalResult:
    """Runs the saved model once over every example of `split`, in one process; `source`:
    the function that built it (`train.model`), whose module its custom objects are in."""
    from tfscale.tasks.train.models import load_trained_model

    started = time.perf_counter()
    model = load_trained_model(model_path, source)
    return evaluate_keras_model(model, manifest, data_dir, batch_size, split, model_path, started)


def evaluate_keras_model(
    model: Any,
    manifest: Manifest,
    data_dir: str,
    batch_size: int,
    split: str = "test",
    model_path: str = "",
    started: float | None = None,
) -> EvalResult:
    """Runs a Keras model once over every example of `split`, in one process. `model`: a
    model with its objective as training built them (`tasks.train.objectives.Built`), or a
    model alone, its objective read from its compile."""
    import tensorflow as tf

    from tfscale.tasks.data.inputs import Reading, build_dataset
    from tfscale.tasks.train.keras_meaning import held_out_losses
    from tfscale.tasks.train.model_inputs import as_model_takes
    from tfscale.tasks.train.objectives import Built

    started = time.perf_counter() if started is None else started
    model, objective = model if isinstance(model, Built) else (model, None)
    manifest = as_model_takes(manifest, model)
    if objective is None:  # a model read back from its file: its compile says
        objective = _objective(model, manifest)
    own = _own_metrics(objective, weighted=bool(manifest.spec.weight))
    by_weight = {name for name in own if objective.is_weighted(name)}
    reading = Reading(weighted=True)  # each example's weight, for the weighted metrics
    losses, labels_seen, logits_seen = [], [], []
    for features, labels, *weights in build_dataset(
        manifest, data_dir, split, batch_size, training=False, reading=reading
    ):
        outputs = tf.cast(_outputs(model, features, manifest, model_path), tf.float32)
        losses.append(held_out_losses(model, objective, labels, outputs).numpy())
        for name, metric in own.items():
            weight = weights[0] if weights and name in by_weight else None
            metric.update_state(objective.targets(labels, outputs), outputs, weight)
        labels_seen.append(labels.numpy())
        logits_seen.append(_as_logits(outputs.numpy(), objective))
    labels = np.concatenate(labels_seen)
    logits = np.concatenate(logits_seen)
    fields = _scores(manifest, labels, logits)
    fields["metrics"].update({name: float(m.result()) for name, m in own.items()})
    return EvalResult(
        test_loss=float(np.concatenate(losses).mean()) if len(labels) else 0.0,
        examples=len(labels),
        model_path=model_path,
        seconds=time.perf_counter() - started,
        **fields,
    )


def _outputs(model: Any, features: Any, manifest: Manifest, model_path: str) -> Any:
    """The model's outputs on a batch; a model that does not take the data's features, or
    gives another number of outputs than its label needs (a model trained on other data),
    refused by name.

    Raises:
        UsageError: naming the model, the data and what each has.
    """
    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.core.user_code import one_line
    from tfscale.tasks.train.user_models import features_of, inputs_of, output_width

    spec, named = manifest.spec, model_path or "the model"
    fix = (
        f"evaluate it on the data it was trained on (--dataset), or give --model-path a "
        f"model trained on {manifest.dataset}"
    )
    try:
        outputs = model(features, training=False)
    except Exception as exc:  # noqa: BLE001 - the model's own call: whatever it raises
        raise UsageError(
            f"{named} does not take the features of {manifest.dataset} ({type(exc).__name__}: "
            f"{one_line(exc)}): its inputs are {inputs_of(model)}, the data's features "
            f"{features_of(spec)}",
            fix,
        ) from None
    width = output_width(outputs)
    if width != spec.label.outputs:
        raise UsageError(
            f"{named} gives {width} output(s) per example; the label of {manifest.dataset} "
            f"({spec.label.kind}) needs {spec.label.outputs}",
            fix,
        )
    return outputs


def _objective(model: Any, manifest: Manifest) -> Any:
    """The model's objective as Keras reads the model: its compile where it has one, else
    the label kind's, on its outputs as its last activation says (probabilities after a
    softmax or sigmoid, logits otherwise), a model read back uncompiled included."""
    from tfscale.tasks.train.user_models import objective_from

    return objective_from(model, manifest.spec)


def _own_metrics(objective: Any, weighted: bool) -> dict[str, Any]:
    """The model's compiled metrics other than those `_scores` computes (where the data is
    `weighted`, its weighted metrics all), fresh, by name."""
    import keras

    names = [
        n
        for n in objective.metric_names()[2:]
        if n not in ("accuracy", "acc", "auc") or (weighted and objective.is_weighted(n))
    ]
    found = {name: objective.metric(name) for name in names}
    return {n: m for n, m in found.items() if isinstance(m, keras.metrics.Metric)}


def _as_logits(outputs: np.ndarray, objective: Any) -> np.ndarray:
    """Probabilities (a sigmoid's) as logits, for the thresholds at 0 `_scores` takes."""
    if objective.from_logits or objective.kind in ("class", "regression"):
        return outputs
    clipped = np.clip(outputs, 1e-7, 1 - 1e-7)
    return np.log(clipped / (1 - clipped))


def _scores(manifest: Manifest, labels: np.ndarray, logits: np.ndarray) -> dict[str, Any]:
    """Accuracy, per class (or label) and the confusion matrix, and the kind's metrics."""
    label = manifest.spec.label
    names = list(label.class_names)
    if label.kind == "regression":
        error = np.abs(logits.reshape(len(labels), -1) - labels.reshape(len(labels), -1))
        mae = float(error.mean()) if error.size else 0.0
        return dict(
            test_accuracy=math.nan,
            per_class_accuracy={},
            confusion_matrix=[],
            metrics={"mean_absolute_error": mae},
        )
    if label.kind == "multi_label":
        right = (logits > 0) == (labels > 0.5)
        per_label = right.mean(axis=0) if len(right) else np.zeros(label.outputs)
        accuracy = float(right.mean()) if right.size else 0.0
        return dict(
            test_accuracy=accuracy,
            per_class_accuracy={str(i): float(v) for i, v in enumerate(per_label)},
            confusion_matrix=[],
            metrics={"accuracy": accuracy},
        )
    if label.kind == "binary":
        predicted = (logits.reshape(-1) > 0).astype(np.int64)
    else:
        predicted = np.argmax(logits, axis=-1)
    n = max(label.num_classes, 2 if label.kind == "binary" else 0)
    confusion = np.zeros((n, n), dtype=np.int64)
    np.add.at(confusion, (labels.astype(np.int64), predicted), 1)
    examples = int(confusion.sum())
    per_class = {
        names[c] if c < len(names) else str(c): (
            float(confusion[c, c] / confusion[c].sum()) if confusion[c].sum() else 0.0
        )
        for c in range(n)
    }
    accuracy = float(np.trace(confusion)) / max(examples, 1)
    metrics = {"accuracy": accuracy}
    if label.kind == "binary":
        metrics["auc"] = _auc(labels, logits.reshape(-1))
    return dict(
        test_accuracy=accuracy,
        per_class_accuracy=per_class,
        confusion_matrix=confusion.tolist(),
        metrics=metrics,
    )


def _auc(labels: np.ndarray, logits: np.ndarray) -> float:
    """The area under the ROC curve (NaN where the split holds one class only)."""
    from sklearn.metrics import roc_auc_score

    if len(np.unique(labels)) < 2:
        return math.nan
    return float(roc_auc_score(labels, logits))


def record_final(
    model: Any, model_path: Path, manifest: Manifest, data_dir: str, batch_size: int
) -> Path:
    """Evaluates a training's final `model` (saved at `model_path`; with its objective:
    `Built`) on the test split and keeps the result beside it, keyed to the model file and
    the shards."""
    result = evaluate_keras_model(model, manifest, data_dir, batch_size, "test", str(model_path))
    path = model_path.parent / RECORDED
    record = {
        "model_sha256": sha256_of(model_path),
        "manifest_digest": manifest.digest,
        "batch_size": batch_size,
        "result": result.to_dict(),
    }
    write_json_atomic(path, record)
    return path


def recorded(model_path: str, manifest: Manifest, batch_size: int) -> EvalResult | None:
    """The evaluation the training of `model_path` recorded, when it is of this model file,
    these shards and this batch size; None otherwise (evaluate it)."""
    path = Path(model_path).parent / RECORDED
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        same = (
            record["manifest_digest"] == manifest.digest
            and record["batch_size"] == batch_size
            and record["model_sha256"] == sha256_of(Path(model_path))
        )
        return EvalResult(**{**record["result"], "model_path": model_path}) if same else None
    except (ValueError, KeyError, TypeError):  # unreadable: evaluated again
        return None


def recorded_or_evaluated(
    model_path: str, manifest: Manifest, data_dir: str, batch_size: int, source: str = ""
) -> tuple[EvalResult, bool]:
    """The test split's evaluation of `model_path`: the one its training recorded
    (`recorded`), else computed now (`evaluate_model`, with the `source` that built it),
    TensorFlow imported quietly only then; and whether it was the recorded one."""
    result = recorded(model_path, manifest, batch_size)
    if result is not None:
        return result, True
    from tfscale.tasks.core.process import import_tensorflow

    import_tensorflow()
    return evaluate_model(model_path, manifest, data_dir, batch_size, source=source), False


def write_evaluation(result: EvalResult, out_dir: Path, class_names: list[str]) -> Path:
    """Writes `eval.json` and `confusion_matrix.png` into `out_dir`; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "eval.json"
    path.write_text(json.dumps(result.to_dict(), indent=2))
    if result.confusion_matrix:  # classes: a confusion matrix to look at
        plot_confusion(
            np.array(result.confusion_matrix), class_names, out_dir / "confusion_matrix.png"
        )
    return path


def plot_confusion(matrix: np.ndarray, names: list[str], path: Path) -> None:
    from tfscale.tasks.core.plots import pyplot

    plt = pyplot()

    size = min(4 + 0.4 * len(names), 20)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(matrix, cmap="Blues")
    if len(names) <= 30:
        ax.set_xticks(range(len(names)), names, rotation=90)
        ax.set_yticks(range(len(names)), names)
        for (i, j), v in np.ndenumerate(matrix):
            ax.text(
                j,
                i,
                str(v),
                ha="center",
                va="center",
                fontsize=8,
                color="white" if v > matrix.max() / 2 else "black",
            )
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"confusion matrix ({matrix.sum()} examples)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
