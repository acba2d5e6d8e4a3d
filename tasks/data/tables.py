"""A table as a source: a CSV or Parquet file, `prepare.label` its target column, every
other a feature but the examples' weights (`prepare.sample_weight`), read as a stream
(`tasks.data.streams`) in blocks of rows, never whole.
Numeric columns are stored as float32 (a missing value is NaN), others as text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tfscale.tasks.data.datasets import DatasetError
from tfscale.tasks.data.spec import Feature
from tfscale.tasks.data.streams import WEIGHT, Chunk, StreamSource
from tfscale.tasks.data.user_sources import (
    Reader,
    file_version,
    label_coding_of,
    stream_source,
    weight_name,
)
from tfscale.tasks.settings.config import PrepareConfig

_BLOCK_BYTES = 4 << 20  # a table is read this much at a time


def table_source(path: Path, cfg: PrepareConfig) -> StreamSource:
    """A CSV or Parquet table: `cfg.label` is the target column, every other a feature."""
    types = _table_types(path)
    named = [name.strip() for name in cfg.label.split(",")]
    if cfg.label not in types and len(named) > 1 and all(n in types for n in named):
        raise DatasetError(
            f"{path}: --label names {len(named)} columns ({', '.join(named)}); tfscale trains "
            "a model of one label, and would train something else",
            "name one target column; several 0/1 labels as one multi-label target: save "
            "them as one array of an .npz (--label-kind multi_label), or train with model.fit",
        )
    if cfg.label not in types:
        shown = ", ".join(list(types)[:12]) + (", ..." if len(types) > 12 else "")
        raise DatasetError(
            f"{path}: no column {cfg.label!r} to take the label from (its columns: {shown})",
            "name the target column with --label (prepare.label)",
        )
    weight = weight_name(path, [name for name in types if name != cfg.label], cfg, "column")
    if weight and types[weight] != "number":
        raise DatasetError(
            f"{path}: column {weight!r} holds {types[weight]} values, not the numbers sample "
            "weights are",
            "give each example a number >= 0 as its weight, or name another column",
        )
    raw = _label_column(path, cfg.label, types)
    if len(raw) == 0:
        raise DatasetError(f"{path} has no rows", "give a table with rows under its header")
    coding = label_coding_of(raw, cfg, f"column {cfg.label!r} of {path.name}")
    features = tuple(
        Feature(name, "string" if kind == "string" else "float32", (), date=kind == "date")
        for name, kind in types.items()
        if name not in (cfg.label, weight)
    )
    if not features:
        raise DatasetError(
            f"{path} has only the label column", "give the table its feature columns too"
        )

    def read(split_stream: str | None) -> Iterator[Chunk]:
        for batch in _table_batches(path, types):
            yield _table_chunk(batch, features, cfg.label, weight)

    reader = Reader(read, weight=f"column {weight!r}" if weight else "")
    return stream_source(path.name, file_version(path), features, coding, {None: raw}, cfg, reader)


def _table_types(path: Path) -> dict[str, str]:
    """Each column's kind: `number`, `bool` or `string`, from the file's schema (a CSV's
    first block)."""
    import pyarrow as pa

    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            schema = pq.ParquetFile(path).schema_arrow
        else:
            import pyarrow.csv as pc

            with pc.open_csv(path, read_options=pc.ReadOptions(block_size=_BLOCK_BYTES)) as r:
                schema = r.schema
    except (pa.ArrowInvalid, OSError) as exc:
        first = str(exc).split("\n")[0]
        raise DatasetError(
            f"{path} is not a table tfscale can read ({first})",
            "give a CSV with a header row, or a Parquet file",
        ) from None
    names = [f.name for f in schema]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DatasetError(
            f"{path}: column name(s) {', '.join(map(repr, twice))} appear more than once; "
            "one of each would be lost",
            "give every column a name of its own",
        )
    return {f.name: _kind_of(f.type) for f in schema}


def _kind_of(arrow_type: Any) -> str:
    import pyarrow as pa

    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        return "number"
    if pa.types.is_null(arrow_type):  # empty in the first block: numbers with gaps
        return "number"
    if pa.types.is_temporal(arrow_type) and not pa.types.is_time(arrow_type):
        return "date"  # a date or a time stamp: a number of days since 1970-01-01
    return "bool" if pa.types.is_boolean(arrow_type) else "string"


def _arrow_types(types: dict[str, str]) -> dict[str, Any]:
    import pyarrow as pa

    kinds = {
        "number": pa.float64(),
        "bool": pa.bool_(),
        "string": pa.string(),
        "date": pa.string(),  # parsed as pandas parses it (`_days`): a zone, a fraction
    }
    return {name: kinds[kind] for name, kind in types.items()}


def _table_batches(path: Path, types: dict[str, str], columns: list[str] | None = None):
    """The table's record batches, each column of the type its schema gave (the label's
    inferred type kept, so integer classes stay integers)."""
    import pyarrow as pa

    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            yield from pq.ParquetFile(path).iter_batches(batch_size=65_536, columns=columns)
            return
        import pyarrow.csv as pc

        if columns:  # the label alone: its type as inferred
            convert = pc.ConvertOptions(include_columns=columns)
        else:
            convert = pc.ConvertOptions(
                column_types=_arrow_types(types), include_columns=list(types)
            )
        read = pc.ReadOptions(block_size=_BLOCK_BYTES)
        with pc.open_csv(path, read_options=read, convert_options=convert) as reader:
            yield from reader
    except pa.ArrowInvalid as exc:
        raise _mixed_column(path, str(exc), columns or list(types)) from None


def _mixed_column(path: Path, text: str, names: list[str]) -> DatasetError:
    """What Arrow refused in a table: a row of another number of fields, or a column of
    values of more than one type."""
    fields = re.search(r"Expected (\d+) columns, got (\d+): (.*)", text)
    if fields:
        row = fields.group(3).split("\n")[0][:120]
        return DatasetError(
            f"{path}: a row has {fields.group(2)} fields where the header has "
            f"{fields.group(1)} ({row})",
            "give every row one field per column (quote values that hold a comma)",
        )
    found = re.search(r"column #(\d+)", text)
    column = names[int(found.group(1))] if found and int(found.group(1)) < len(names) else "?"
    detail = text.split(": ", 2)[-1].split("\n")[0]
    return DatasetError(
        f"{path}: column {column!r} holds values of more than one type ({detail}), which one "
        "column of the shards cannot store",
        "make the column all numbers (empty for missing) or all text (quote its values)",
    )


def _label_column(path: Path, label: str, types: dict[str, str]) -> np.ndarray:
    import pyarrow as pa

    parts = [batch.column(0) for batch in _table_batches(path, types, [label])]
    column = pa.chunked_array(parts) if parts else pa.chunked_array([], pa.float64())
    blank = column.null_count
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        import pyarrow.compute as pcomp

        blank += int(pcomp.sum(pcomp.equal(pcomp.utf8_trim_whitespace(column), "")).as_py() or 0)
    if blank:
        raise DatasetError(
            f"{path}: column {label!r} has {blank} empty value(s); every example needs a "
            "label (a blank text would be a class of its own)",
            "fill them or drop those rows",
        )
    return column.to_numpy()


def _table_chunk(batch: Any, features: tuple[Feature, ...], label: str, weight: str) -> Chunk:
    import pyarrow as pa
    import pyarrow.compute as pcomp

    columns = {}
    for feature in features:
        values = batch.column(batch.schema.get_field_index(feature.name))
        if feature.dtype == "string":
            text = pcomp.cast(values, pa.string()).fill_null("")
            columns[feature.name] = np.asarray(text.to_numpy(zero_copy_only=False), object)
        elif feature.date:
            columns[feature.name] = _days(values, feature.name)  # a blank date: NaN
        else:
            numbers = pcomp.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
            columns[feature.name] = numbers.astype(np.float32)
    if weight:  # a blank weight: NaN, refused by name (`user_sources.stream_source`)
        values = batch.column(batch.schema.get_field_index(weight))
        columns[WEIGHT] = pcomp.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
    raw = batch.column(batch.schema.get_field_index(label)).to_numpy(zero_copy_only=False)
    return columns, raw


def _days(values: Any, name: str) -> np.ndarray:
    """Dates or time stamps as float32 days since 1970-01-01 UTC: a CSV's text parsed as
    pandas parses it (`Z`, `+01:00`, fractions of a second; a zone's time as UTC, a time
    without one as given), a Parquet column's own type to the nanosecond. float32 keeps a
    day count of today's to about a minute and a half (`spec.date_resolution_s`).

    Raises:
        DatasetError: a value pandas does not read as a time, naming the column.
    """
    import pandas as pd
    import pyarrow as pa

    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        text = pd.Series(values.to_pandas(), dtype=object).replace("", None)
        try:
            stamps = pd.to_datetime(text, format="ISO8601", utc=True)
        except (ValueError, TypeError) as exc:
            raise DatasetError(
                f"column {name!r} holds a value that is not a date or a time stamp "
                f"({str(exc).splitlines()[0]})",
                "write every value as a date or time stamp (ISO 8601: 2024-05-01, "
                "2024-05-01T10:30:00Z), or leave it empty",
            ) from None
        utc = stamps.dt.tz_convert(None).to_numpy(dtype="datetime64[ns]")
        nanoseconds = utc.astype(np.int64).astype(np.float64)
        nanoseconds[np.isnat(utc)] = np.nan
    else:
        import pyarrow.compute as pcomp

        if pa.types.is_date(values.type):
            values = pcomp.cast(values, pa.timestamp("s"))
        unit = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}[values.type.unit]
        counts = pcomp.cast(values, pa.int64()).to_numpy(zero_copy_only=False)
        nanoseconds = np.asarray(counts, np.float64) * unit
    return (nanoseconds / 86_400e9).astype(np.float32)
