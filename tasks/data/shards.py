"""Writing a source into sharded TFRecords: planned, atomic, resumable and deterministic.

Each shard is written under a temporary name and renamed; a journal records
finished shards so an interrupted prepare resumes; `manifest.json` is written
last, so it never points at partial files.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tfscale.tasks.core.files import atomic_path, write_text_atomic
from tfscale.tasks.data.datasets import FolderSource
from tfscale.tasks.data.manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    load_manifest,
    sha256_of,
    shard_problems,
)
from tfscale.tasks.data.records import FORMAT, LABEL, encode_chunk, encode_image, key
from tfscale.tasks.data.spec import IMAGE, FeatureSpec
from tfscale.tasks.data.streams import Source
from tfscale.tasks.settings.config import PrepareConfig, config_to_dict

JOURNAL_NAME = ".journal.json"
_RECORD_OVERHEAD = 64  # proto keys, shape and TFRecord framing per example, roughly


@dataclass(frozen=True)
class ShardPlan:
    split: str
    file: str
    start: int
    stop: int


@dataclass(frozen=True)
class PrepareResult:
    """What a prepare did: the manifest, and how many shards were written or reused."""

    manifest: Manifest
    data_dir: str
    written: int
    reused: int
    seconds: float

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.manifest.shards)


def plan_shards(source: Source, cfg: PrepareConfig, min_shards: int) -> list[ShardPlan]:
    """Splits each split into contiguous ranges, one per shard.

    The count is `cfg.num_shards`, or what keeps shards near `cfg.target_shard_mb`,
    and never fewer than `min_shards` (nor more than there are examples).
    """
    spec = source.spec
    per_example = (math.prod(spec.shape) if spec.is_image else spec.example_bytes()) + (
        _RECORD_OVERHEAD
    )
    plan = []
    for split, count in sorted(source.splits.items()):
        wanted = cfg.num_shards or math.ceil(count * per_example / (cfg.target_shard_mb * 2**20))
        n = max(1, min(max(wanted, min_shards), count))
        bounds = [count * k // n for k in range(n + 1)]
        plan += [
            ShardPlan(split, f"{split}-{k:05d}-of-{n:05d}.tfrecord", bounds[k], bounds[k + 1])
            for k in range(n)
        ]
    return plan


def prepare_params(source: Source, cfg: PrepareConfig, plan: list[ShardPlan]) -> dict[str, Any]:
    """The parameters that determine the bytes written: equal params, equal shards."""
    params = config_to_dict(cfg)
    params.pop("data_dir")
    if source.name != "synthetic":
        params.pop("synthetic")
    if not source.named_label:  # an image source: no label to name
        params.pop("label")
        params.pop("label_kind")
    if not params["sample_weight"]:  # none named: as before there was the key
        params.pop("sample_weight")
    if not isinstance(source, FolderSource):  # only a folder's images have a colour mode
        params.pop("color_mode")
    params["shards"] = {s: sum(p.split == s for p in plan) for s in source.splits}
    held_out = getattr(source, "held_out", "")
    if held_out:  # an image folder's test split is not its test/ folder
        params["held_out"] = held_out
    params["source_version"] = source.version
    if not source.spec.is_image:  # named features: their records' layout (`records.FORMAT`)
        params["records"] = FORMAT
    return params


def write_shards(
    source: Source,
    out_dir: Path,
    plan: list[ShardPlan],
    params: dict[str, Any],
    progress: bool = True,
) -> PrepareResult:
    """Writes the planned shards (skipping ones already finished) and then the manifest."""
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    current = _up_to_date(out_dir, params)
    if current is not None:
        return PrepareResult(current, str(out_dir), 0, len(current.shards), 0.0)
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    done = _read_journal(out_dir, params)
    _remove_strays(out_dir, {p.file for p in plan})
    total = sum(p.stop - p.start for p in plan)
    written = 0
    with _progress_bar(total, source.name, progress) as bar:  # closed before any error shows
        for shard in plan:
            info = done.get(shard.file)
            path = out_dir / shard.file
            if info is None or not path.exists() or path.stat().st_size != info.bytes:
                done[shard.file] = _write_one(source, shard, path)
                written += 1
                write_text_atomic(out_dir / JOURNAL_NAME, _journal_text(params, done))
            bar.update(shard.stop - shard.start)
    manifest = Manifest(
        dataset=source.name,
        version=source.version,
        feature=with_statistics(source.spec, [done[p.file] for p in plan]).to_dict(),
        splits={
            s: sum(done[p.file].examples for p in plan if p.split == s)
            for s in sorted(source.splits)
        },
        shards=[done[p.file] for p in plan],
        params=params,
    )
    write_text_atomic(out_dir / MANIFEST_NAME, manifest.file_text())
    (out_dir / JOURNAL_NAME).unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    return PrepareResult(manifest, str(out_dir), written, len(plan) - written, seconds)


def _write_one(source: Source, shard: ShardPlan, path: Path) -> ShardInfo:
    from tfscale.tasks.core.process import import_tensorflow

    import_tensorflow()  # only when a shard is written: an up-to-date prepare needs none
    import tensorflow as tf

    count = 0
    sums = _Sums(source.spec) if source.named_label else None
    with atomic_path(path) as tmp, tf.io.TFRecordWriter(str(tmp)) as writer:
        for record in _records(source, shard, sums):
            writer.write(record)
            count += 1
    return ShardInfo(
        file=shard.file,
        split=shard.split,
        examples=count,
        bytes=path.stat().st_size,
        sha256=sha256_of(path),
        sums=sums.totals if sums else None,
    )


def _records(source: Source, shard: ShardPlan, sums: _Sums | None) -> Iterator[bytes]:
    """The shard's serialized examples, a chunk at a time (`tasks.data.records`): images
    and their classes in the image format, any other features each under its name; the
    statistics of a source whose label the config names added up on the way (`sums`)."""
    spec = source.spec
    for features, labels in source.batches(shard.split, shard.start, shard.stop):
        if sums is not None:
            sums.add(features, labels)
        if spec.is_image:
            for image, label in zip(features[IMAGE], labels, strict=True):
                yield encode_image(image, int(label))
        else:
            yield from encode_chunk(spec, features, labels)


class _Sums:
    """Per float feature (and a real label): the values seen, their sum and their sum of
    squares, by the records' keys (`records.key`, `LABEL`)."""

    def __init__(self, spec: FeatureSpec):
        self.names = [f.name for f in spec.features if f.dtype.startswith("float")]
        self.label = spec.label.kind == "regression"
        keys = [key(n) for n in self.names] + ([LABEL] if self.label else [])
        self.totals: dict[str, list[float]] = {k: [0, 0.0, 0.0] for k in keys}

    def add(self, features: dict[str, Any], labels: np.ndarray) -> None:
        columns = [(key(n), features[n]) for n in self.names]
        for name, values in columns + ([(LABEL, labels)] if self.label else []):
            if values.dtype == object:  # lengths vary: one array per row
                values = np.concatenate([np.ravel(v) for v in values]) if len(values) else values
            values = np.asarray(values, np.float64)
            values = values[np.isfinite(values)]
            total = self.totals[name]
            total[0] += int(values.size)
            total[1] += float(values.sum())
            total[2] += float(np.square(values).sum())


def with_statistics(spec: FeatureSpec, shards: list[ShardInfo]) -> FeatureSpec:
    """The spec with each float feature's mean and standard deviation over the training
    shards (what a built-in model normalises it by)."""
    train = [s.sums for s in shards if s.split == "train" and s.sums]
    if not train:
        return spec
    features = []
    for feature in spec.features:
        moments = _moments([t[key(feature.name)] for t in train if key(feature.name) in t])
        features.append(replace(feature, mean=moments[0], std=moments[1]) if moments else feature)
    label = spec.label
    if label.kind == "regression":
        moments = _moments([t[LABEL] for t in train if LABEL in t])
        if moments:
            label = replace(label, mean=moments[0], std=moments[1])
    return replace(spec, features=tuple(features), label=label)


def _moments(parts: list[list[float]]) -> tuple[float, float] | None:
    """The mean and standard deviation of the values that shards' [count, sum, sum of
    squares] describe, to 6 places (None: no values)."""
    count = sum(p[0] for p in parts)
    if not count:
        return None
    mean = sum(p[1] for p in parts) / count
    variance = max(sum(p[2] for p in parts) / count - mean * mean, 0.0)
    return round(mean, 6), round(math.sqrt(variance), 6)


def _up_to_date(out_dir: Path, params: dict[str, Any]) -> Manifest | None:
    if not (out_dir / MANIFEST_NAME).exists():
        return None
    try:
        manifest = load_manifest(out_dir)
    except Exception:  # noqa: BLE001 - an unreadable manifest is simply rewritten
        return None
    same = json.loads(json.dumps(params)) == manifest.params
    intact = not shard_problems(manifest, out_dir, hashes=False)
    return manifest if same and intact else None


def _read_journal(out_dir: Path, params: dict[str, Any]) -> dict[str, ShardInfo]:
    path = out_dir / JOURNAL_NAME
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if raw.get("params") != json.loads(json.dumps(params)):
        return {}
    return {f: ShardInfo(**info) for f, info in raw.get("done", {}).items()}


def _journal_text(params: dict[str, Any], done: dict[str, ShardInfo]) -> str:
    return json.dumps({"params": params, "done": {f: asdict(i) for f, i in done.items()}})


# the names tfscale writes in a dataset's folder: its shards, their temporary names while
# written (`core.files.atomic_path`), its journal and manifest; nothing else there is ours
SHARD_NAME = re.compile(r"[a-z_]+-\d{5}-of-\d{5}\.tfrecord")
TEMPORARY_NAME = re.compile(r"\.(.+)\.tmp")


def written_by_tfscale(name: str) -> bool:
    """Whether a file of this name in a dataset's folder is one tfscale writes."""
    if name in (MANIFEST_NAME, JOURNAL_NAME) or SHARD_NAME.fullmatch(name):
        return True
    temporary = TEMPORARY_NAME.fullmatch(name)
    return temporary is not None and written_by_tfscale(temporary.group(1))


def _remove_ours(out_dir: Path, keep: set[str] = frozenset()) -> None:
    """Removes the files of tfscale's own names (`written_by_tfscale`) in a dataset's
    folder but those in `keep`; any other file stays."""
    for path in out_dir.iterdir():
        if path.is_file() and written_by_tfscale(path.name) and path.name not in keep:
            path.unlink()


def _remove_strays(out_dir: Path, keep: set[str]) -> None:
    """Removes the shards of an earlier plan and interrupted writes."""
    _remove_ours(out_dir, {*keep, MANIFEST_NAME, JOURNAL_NAME})


def remove_written(out_dir: Path) -> None:
    """Removes what tfscale wrote in a dataset's folder, and the folder once empty: a file
    tfscale did not write is never deleted."""
    if not out_dir.is_dir():
        return
    _remove_ours(out_dir)
    if not any(out_dir.iterdir()):
        out_dir.rmdir()


def _progress_bar(total: int, name: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=f"writing {name}",
        unit="ex",
        unit_scale=True,
        disable=None if enabled else True,  # None: only on a terminal
        mininterval=0.5,
        dynamic_ncols=True,
    )
