"""How a result's fields are tracked, declared beside the fields themselves.

A result is a dataclass; `tasks.track.tracking` logs it by the type of each field: numbers are
metrics, strings and flags are tags, and a field whose metadata is `PARAM` (how a run was
set up) is a param. Results mark their fields here, so they never import the tracker.
"""

from __future__ import annotations

import dataclasses
from typing import Any

PARAM = {"track": "param"}  # metadata of a result field that says how the run was set up
# metadata of a result field not logged on its own: its words are part of another's (the
# summary's `proposed` is the end of its `strategy_reason`), or they are for the console
UNTRACKED = {"track": "no"}


# metadata of a mapping of names to numbers logged as one metric each, `<prefix>_<name>`
EACH = {"track": "each"}


def tracked_as(name: str) -> dict[str, str]:
    """Metadata of a result field tracked under another name: a run-level figure whose
    field name a per-epoch curve also uses (one name would draw both on one chart)."""
    return {"name": name}


def fields_by_type(result: Any, prefix: str = "") -> tuple[dict, dict, dict]:
    """(metrics, params, tags) of a result dataclass, each keyed `prefix + field name`.

    Numbers are metrics, strings and flags tags, fields whose metadata is `PARAM` params.
    None, empty strings, lists and mappings are left out (an empty tag says nothing on a run
    page), but for a mapping marked `EACH`; a nested dataclass adds its own fields.
    """
    metrics: dict[str, float] = {}
    params: dict[str, str] = {}
    tags: dict[str, str] = {}
    for field in dataclasses.fields(result):
        value = getattr(result, field.name)
        key = prefix + field.metadata.get("name", field.name)
        if dataclasses.is_dataclass(value):
            nested = fields_by_type(value, f"{key}_")
            for into, part in zip((metrics, params, tags), nested, strict=True):
                into.update(part)
        elif field.metadata.get("track") == "no":
            continue
        elif field.metadata.get("track") == "each":
            metrics.update({f"{key}_{k}": float(v) for k, v in (value or {}).items()})
        elif value is None or value == "" or isinstance(value, list | tuple | dict):
            continue
        elif field.metadata.get("track") == "param":
            params[key] = str(value)
        elif isinstance(value, bool | str):
            tags[key] = str(value)
        elif isinstance(value, int | float):
            metrics[key] = float(value)
    return metrics, params, tags
