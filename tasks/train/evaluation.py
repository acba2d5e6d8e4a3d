"""Evaluating a trained model on the held-out split: loss, accuracy, per class, confusion.

A training evaluates its final model once before it ends, in its own process, and keeps the
result beside the model (`record_final`, `final_eval.json`, with the model file's sha256 and
the shards' manifest digest). `tfscale evaluate` of that model on the same shards and
batch size then reads it (`recorded`) instead of importing TensorFlow a second time to
compute the same figures; a model file or shards changed since are evaluated again.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.core.files import write_json_atomic
from tasks.data.manifest import Manifest, sha256_of

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

    def to_dict(self) -> dict:
        return asdict(self)


def evaluate_model(
    model_path: str, manifest: Manifest, data_dir: str, batch_size: int, split: str = "test"
) -> EvalResult:
    """Runs the saved model once over every example of `split`, in one process."""
    from tasks.train.models import load_trained_model

    started = time.perf_counter()
    model = load_trained_model(model_path)
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
    """Runs a Keras model once over every example of `split`, in one process."""
    import keras
    import tensorflow as tf

    from tasks.data.inputs import build_dataset

    started = time.perf_counter() if started is None else started
    n = manifest.num_classes
    confusion = np.zeros((n, n), dtype=np.int64)
    loss_sum = 0.0
    for images, labels in build_dataset(manifest, data_dir, split, batch_size, training=False):
        logits = tf.cast(model(images, training=False), tf.float32)
        loss_sum += float(
            tf.reduce_sum(
                keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            )
        )
        predicted = np.argmax(logits.numpy(), axis=-1)
        np.add.at(confusion, (labels.numpy(), predicted), 1)
    examples = int(confusion.sum())
    names = manifest.feature["class_names"]
    per_class = {
        names[c]: float(confusion[c, c] / confusion[c].sum()) if confusion[c].sum() else 0.0
        for c in range(n)
    }
    return EvalResult(
        test_loss=loss_sum / max(examples, 1),
        test_accuracy=float(np.trace(confusion)) / examples,
        examples=examples,
        per_class_accuracy=per_class,
        confusion_matrix=confusion.tolist(),
        model_path=model_path,
        seconds=time.perf_counter() - started,
    )


def record_final(
    model: Any, model_path: Path, manifest: Manifest, data_dir: str, batch_size: int
) -> Path:
    """Evaluates a training's final `model` (saved at `model_path`) on the test split and
    keeps the result beside it, keyed to the model file and the shards."""
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
    model_path: str, manifest: Manifest, data_dir: str, batch_size: int
) -> tuple[EvalResult, bool]:
    """The test split's evaluation of `model_path`: the one its training recorded
    (`recorded`), else computed now, TensorFlow imported quietly only then; and whether it
    was the recorded one."""
    result = recorded(model_path, manifest, batch_size)
    if result is not None:
        return result, True
    from tasks.core.process import import_tensorflow

    import_tensorflow()
    return evaluate_model(model_path, manifest, data_dir, batch_size), False


def write_evaluation(result: EvalResult, out_dir: Path, class_names: list[str]) -> Path:
    """Writes `eval.json` and `confusion_matrix.png` into `out_dir`; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "eval.json"
    path.write_text(json.dumps(result.to_dict(), indent=2))
    plot_confusion(np.array(result.confusion_matrix), class_names, out_dir / "confusion_matrix.png")
    return path


def plot_confusion(matrix: np.ndarray, names: list[str], path: Path) -> None:
    from tasks.core.plots import pyplot

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
