"""The scaling study in one call, for a notebook: your model and your data, tracked as
`tfscale run` tracks it.

    from flows.notebook import study

    result = study(build, (x, y), epochs=5, target_metric="auc", target=0.97)
    print(result.answer)          # the answer line
    result.speedup_text           # '1.21x (1.15-1.27)'
    result.time_to_target_speedup, result.mlflow_run_id

`model`: a function taking the data's spec (or nothing) and returning a `keras.Model`, a
`keras.Model` itself (saved once, and read back by each training so both start from its
weights), or any `--model` form. `data`: a `tf.data.Dataset` of `(features, label)`,
arrays (`(x, y)`, or a dict of named arrays holding the label under `label`), or any
`--dataset` form. Settings are `params.yaml`'s keys by name (`epochs=5`, `replicas=4`), or
dotted (`**{"train.epochs": 5}`).

A function or dataset handed over lives in this process only: the study runs its
trainings here (Mirrored over this machine's devices; OneDevice); worker processes
(`workers` above 1) need the model and data in files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import marshal
import typing
from pathlib import Path
from typing import Any

from tasks.core.errors import UsageError
from tasks.core.user_code import is_registered, register
from tasks.settings.config import DEFAULT_PARAMS, Config, load_config

SECTIONS = ("prepare", "train", "evaluate", "track", "cluster")  # where a bare name is looked up


def study(
    model: Any, data: Any, params: str | Path | None = DEFAULT_PARAMS, **settings: Any
) -> Any:
    """The study's `ScalingSummary` (the answer, the speedup and its interval, the time to
    target, `mlflow_run_id`) for `model` on `data`.

    Raises:
        UsageError: an unknown setting; a model or dataset of this process for worker
            processes.
    """
    from flows.study import scaling_study

    overrides = {_dotted(name): value for name, value in settings.items()}
    config = load_config(params, overrides)
    folder = Path(config.prepare.data_dir).parent / "notebook"
    overrides["prepare.dataset"] = _dataset_ref(data, folder, config.prepare.label)
    overrides["train.model"] = _model_ref(model, folder)
    config = load_config(params, overrides)
    _check_in_process(config)
    return scaling_study(config, return_state=True).result()


def _dotted(name: str) -> str:
    if "." in name:
        return name
    classes = typing.get_type_hints(Config)
    for section in SECTIONS:
        if name in {f.name for f in dataclasses.fields(classes[section])}:
            return f"{section}.{name}"
    raise UsageError(
        f"study(..., {name}=...): no such setting",
        "name a key of params.yaml (epochs, replicas, target_metric, ...) or give it dotted "
        "(**{'train.epochs': 5}); docs/configuration.md lists them",
    )


def _dataset_ref(data: Any, folder: Path, label: str) -> str:
    """A `--dataset` for `data`: arrays written once to an .npz named by their contents; a
    tf.data.Dataset handed over in this process."""
    import numpy as np

    if isinstance(data, (str, Path)):
        return str(data)
    if isinstance(data, tuple) and len(data) == 2:
        data = {"x": data[0], "y": data[1]}
    if isinstance(data, dict):
        arrays = {str(k): np.asarray(v) for k, v in data.items()}
        digest = hashlib.sha256()
        for key in sorted(arrays):
            digest.update(key.encode() + arrays[key].tobytes() + str(arrays[key].dtype).encode())
        path = folder / f"{digest.hexdigest()[:16]}.npz"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            np.savez(path.with_suffix(".tmp.npz"), **arrays)
            path.with_suffix(".tmp.npz").replace(path)
        return str(path)
    import tensorflow as tf

    if isinstance(data, tf.data.Dataset):
        name = f"data_{id(data):x}"
        return register(name, data, f"{name}:{data.element_spec}")
    raise UsageError(
        f"study(model, data): data of type {type(data).__name__}",
        "give a tf.data.Dataset, (x, y) arrays, a dict of named arrays, or a --dataset form",
    )


def _model_ref(model: Any, folder: Path) -> str:
    """A `--model` for `model`: a function handed over in this process (keyed by its code),
    a `keras.Model` saved once to a `.keras` file named by its weights."""
    import keras

    if isinstance(model, (str, Path)):
        return str(model)
    if isinstance(model, keras.Model):
        from tasks.train.training import weights_digest

        path = folder / f"{model.name}-{weights_digest(model)}.keras"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            model.save(path)
        return str(path)
    if callable(model):
        code = getattr(model, "__code__", None)
        made_of = hashlib.sha256(marshal.dumps(code) if code else repr(model).encode())
        name = getattr(model, "__name__", "model").strip("<>") or "model"
        return register(f"model_{name}", model, made_of.hexdigest())
    raise UsageError(
        f"study(model, data): a model of type {type(model).__name__}",
        "give a function returning a keras.Model, a keras.Model, or a --model form",
    )


def _check_in_process(config: Config) -> None:
    handed = [ref for ref in (config.prepare.dataset, config.train.model) if is_registered(ref)]
    if handed and (config.train.workers > 1 or config.train.strategy in ("multi_worker",)):
        raise UsageError(
            f"{', '.join(handed)} lives in this process only, and worker processes train "
            f"this study (train.workers {config.train.workers}, {config.train.strategy})",
            "save the model's function and data in files (model='mine.py:build', "
            "data='table.csv'), or train here (strategy='mirrored', workers=1)",
        )
