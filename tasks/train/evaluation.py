"""Evaluating a trained model on the held-out split: loss, accuracy, per class, confusion."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.data.inputs import build_dataset
from tasks.data.manifest import Manifest


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
