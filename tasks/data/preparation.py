"""The `prepare` step: a dataset, by name, into verified shards, with a summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfscale.tasks.core.label_kinds import describe
from tfscale.tasks.data.arrays import npz_source
from tfscale.tasks.data.datasets import (
    NAMED_SOURCES,
    DatasetError,
    dataset_slug,
    folder_source,
)
from tfscale.tasks.data.manifest import shards_present, verify_shards
from tfscale.tasks.data.pipelines import pipeline_source
from tfscale.tasks.data.shards import (
    PrepareResult,
    plan_shards,
    prepare_params,
    remove_written,
    write_shards,
)
from tfscale.tasks.data.streams import Source, StreamSource
from tfscale.tasks.data.tables import table_source
from tfscale.tasks.data.tfds_source import tfds_source
from tfscale.tasks.data.user_sources import (
    ARRAY_SUFFIXES,
    TABLE_SUFFIXES,
    is_function_ref,
    is_user_file,
    source_fingerprint,  # noqa: F401 - what a cached prepare keys on (flows.study)
)
from tfscale.tasks.settings.config import Config, PrepareConfig


def open_source(cfg: PrepareConfig) -> Source:
    """The source `cfg.dataset` names: a built-in one, an image folder, a table, arrays, a
    tf.data pipeline's function, or a TFDS dataset.

    Raises:
        DatasetError: the name is none of them, or its data cannot be read.
    """
    if cfg.dataset in NAMED_SOURCES:
        return NAMED_SOURCES[cfg.dataset](cfg)
    if Path(cfg.dataset).is_dir():
        return folder_source(Path(cfg.dataset), cfg)
    if is_user_file(cfg.dataset) or is_function_ref(cfg.dataset):
        return user_source(cfg)
    if Path(cfg.dataset).suffix and "/" in cfg.dataset or Path(cfg.dataset).is_file():
        raise DatasetError(
            f"{cfg.dataset}: tfscale does not read {Path(cfg.dataset).suffix or 'such'} files",
            "give a table (.csv, .parquet), arrays (.npz), an image folder, a function "
            "(pkg.module:function or file.py:function), or a dataset name",
        )
    return tfds_source(cfg.dataset, cfg)


def user_source(cfg: PrepareConfig) -> StreamSource:
    """The source a table, an `.npz` or a function names."""
    if is_function_ref(cfg.dataset):
        return pipeline_source(cfg)
    path = Path(cfg.dataset)
    if not path.is_file():
        raise DatasetError(
            f"{path}: no such file",
            "check the path (relative to where tfscale runs), or give a dataset name: "
            "digits, synthetic, an image folder or a tensorflow-datasets name",
        )
    if path.suffix.lower() in ARRAY_SUFFIXES:
        return npz_source(path, cfg)
    return table_source(path, cfg)


def dataset_dir(config: Config) -> Path:
    """Where the configured dataset's shards and manifest live (synthetic: one per size)."""
    slug = dataset_slug(config.prepare.dataset)
    if config.prepare.dataset == "synthetic":
        s = config.prepare.synthetic
        slug += f"-{s.train_examples}-{s.height}x{s.width}x{s.channels}"
        if (s.signal, s.label_noise) != (0.75, 0.0):  # a task of another difficulty
            slug += f"-signal{s.signal:g}-noise{s.label_noise:g}"
    return Path(config.prepare.data_dir) / slug


def shards_reusable(config: Config) -> bool:
    """Whether the configured dataset's shards are on disk to be reused: the manifest and
    every shard at its size, each shard's sha256 then checked (a shard corrupted in place
    is named here, before any training reads it; digits' 8 shards take milliseconds, a
    gigabyte about a second).

    Raises:
        ShardError: a shard's sha256 does not match the manifest, naming it and the fix.
    """
    out_dir = dataset_dir(config)
    if not shards_present(out_dir):
        return False
    verify_shards(out_dir)
    return True


def prepare_dataset(config: Config, *, force: bool = False, progress: bool = True) -> PrepareResult:
    """Writes (or reuses) the shards for `config.prepare.dataset`.

    Args:
        config: the loaded config; `config.min_shards` bounds the shard count below.
        force: rewrite every shard even when the existing ones are up to date.
        progress: show a progress bar while writing.
    """
    out_dir = dataset_dir(config)
    _refuse_inside_the_data(config.prepare.dataset, out_dir)
    source = open_source(config.prepare)
    if force:
        remove_written(out_dir)  # its own files only: whatever else is there stays
    plan = plan_shards(source, config.prepare, config.min_shards)
    return write_shards(
        source, out_dir, plan, prepare_params(source, config.prepare, plan), progress
    )


def _refuse_inside_the_data(dataset: str, out_dir: Path) -> None:
    """The shards never go into the user's own data folder (a rerun would read them as a
    class folder, and the folder is theirs).

    Raises:
        DatasetError: `out_dir` is the dataset's folder or inside it.
    """
    folder = Path(dataset)
    if not folder.is_dir():
        return
    folder, target = folder.resolve(), out_dir.resolve()
    if target == folder or folder in target.parents:
        raise DatasetError(
            f"the shards of {dataset} would be written into the dataset's own folder ({target})",
            "give a --data-dir (prepare.data_dir) outside the dataset's folder",
        )


def prepared_line(result: PrepareResult, *, reused: bool = False) -> str:
    """One line: the dataset, its splits and whether shards were written (`reused`: a
    cached result, nothing written this time)."""
    m = result.manifest
    splits = ", ".join(f"{count} {split}" for split, count in m.splits.items())
    written = result.written and not reused
    done = f"{result.written} shards written" if written else "shards reused"
    line = f"{m.dataset}: {splits} examples in {len(m.shards)} shards ({done})"
    if note := held_out_note(m.params):
        line += f"; {note}"
    if m.spec.label.read_as:  # the user's data: the kind its label was read as, the way out
        line += f"; {label_text(m)}"
    return line


def label_text(m: Any) -> str:
    """`label target: binary (0/1); --label-kind (prepare.label_kind) to change`: a table's
    label by its column's name."""
    label = m.spec.label
    table = Path(m.params.get("dataset", "")).suffix.lower() in TABLE_SUFFIXES
    name = f" {m.params.get('label')}" if table else ""
    return f"label{name}: {describe(label.kind, label.read_as)}"


def weight_note(spec: Any) -> str:
    """What weighs each example in the training loss, or a feature whose name says weight
    that does not ('' where neither): the way to make it the weights."""
    if spec.weight:
        return f"each example's loss weighed by its {spec.weight}, as fit(sample_weight=)"
    named = [f.name for f in spec.features if f.name.lower() in ("weight", "weights")]
    if named:
        return (
            f"{named[0]!r} is a feature the model trains on; if it weighs the examples, "
            f"prepare with --sample-weight {named[0]}"
        )
    return ""


def held_out_note(params: dict) -> str:
    """Where an image folder's test split came from, from its manifest's `params`, where not
    its `test/` folder: its `validation/` folder, or a seeded draw from each class of a flat
    folder ('' otherwise)."""
    held_out = params.get("held_out")
    if held_out == "validation":
        return "validation/ held out as the test split"
    if held_out == "drawn":
        return (
            f"test split drawn from each class folder (test_fraction {params['test_fraction']:g}, "
            f"seed {params['seed']})"
        )
    return ""


def format_prepared(result: PrepareResult) -> str:
    """A one-screen summary of a prepare."""
    m = result.manifest
    mb = result.total_bytes / 2**20
    lines = [
        f"dataset    {m.dataset} {m.version}",
        f"features   {m.spec.describe()}",
        f"location   {result.data_dir}",
    ]
    if m.spec.label.read_as:
        lines.insert(2, f"{'label':<10} {label_text(m).removeprefix('label').lstrip(': ')}")
    if note := weight_note(m.spec):
        lines.append(f"{'weights':<10} {note}")
    for split, count in m.splits.items():
        lines.append(f"{split:<10} {count} examples in {len(m.files(split))} shards")
    if note := held_out_note(m.params):
        lines.append(f"held out   {note}")
    if result.written:
        rate = mb / result.seconds if result.seconds else 0.0
        lines.append(
            f"written    {result.written} shards, {mb:.1f} MB in {result.seconds:.1f} s "
            f"({rate:.1f} MB/s); {result.reused} reused"
        )
    else:
        lines.append(f"up to date {result.reused} shards, {mb:.1f} MB; nothing rewritten")
    lines.append(f"manifest   {Path(result.data_dir) / 'manifest.json'} ({m.digest})")
    return "\n".join(lines)
