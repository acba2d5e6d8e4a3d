"""docs/testing.md's table of what proves each documented feature, held to the code: every
flag of `tfscale --help` and of each subcommand's `--help` (read from the parser in
`flows/cli.py`, in this process), every key of `params.yaml` (`key_table()`), each with a
row; each test a row names exists (read from the tests' source with `ast`, not by running
pytest)."""

from __future__ import annotations

import argparse
import ast
import functools
import re
from pathlib import Path

import pytest

from tfscale.flows.cli import build_parser
from tfscale.tasks.settings.config import key_table

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## What proves each documented feature"
TEST = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
NONE_YET = "none yet"


def table_rows(text: str) -> list[tuple[str, str]]:
    """The section's rows: (what, tests), the header and its rule left out."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2 and not set(cells[1]) <= {"-"}:
            rows.append((cells[0], cells[1]))
    return rows[1:]


def named_in(rows: list[tuple[str, str]]) -> set[str]:
    """Every backquoted name of the rows' first column: keys, flags, `tfscale CMD --flag`."""
    return {name for what, _ in rows for name in re.findall(r"`([^`]+)`", what)}


def flags_wanted(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """Every flag of `tfscale --help` and of each subcommand's `--help`, but `--help`:
    (command, flag, the config key it sets or "")."""
    wanted = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                wanted += [(command, *flag) for flag in _flags(sub)]
        else:
            wanted += [("", *flag) for flag in _flags_of(action)]
    return wanted


def _flags(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    return [flag for action in parser._actions for flag in _flags_of(action)]


def _flags_of(action: argparse.Action) -> list[tuple[str, str]]:
    key = action.dest if "." in (action.dest or "") else ""
    return [(o, key) for o in action.option_strings if o.startswith("--") and o != "--help"]


def missing_flags(rows: list[tuple[str, str]], parser: argparse.ArgumentParser) -> list[str]:
    """The flags no row covers: a flag that sets a key is covered by the key's row naming
    it (`train.epochs` `--epochs`); any other by `tfscale COMMAND --flag`."""
    names = named_in(rows)
    flags_in = {what: re.findall(r"`(--[\w-]+)`", what) for what, _ in rows}
    missing = []
    for command, flag, key in flags_wanted(parser):
        if key:
            covered = any(f"`{key}`" in what and flag in flags_in[what] for what, _ in rows)
        else:
            covered = " ".join(filter(None, ("tfscale", command, flag))) in names
        if not covered:
            missing.append(f"tfscale {command} {flag}".replace("  ", " ") + f" [{key}]" * bool(key))
    return missing


@functools.cache
def defined_tests() -> dict[str, frozenset[str]]:
    """Each test file's test functions (and methods), by path, from its source."""
    found = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text())
        found[str(path.relative_to(ROOT))] = frozenset(
            node.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test_")
        )
    return found


def problems(text: str, parser: argparse.ArgumentParser, keys: list[str]) -> list[str]:
    """What the table lacks or names wrongly, one line each."""
    rows = table_rows(text)
    names = named_in(rows)
    found = [f"no row for the key {key}" for key in keys if key not in names]
    found += [f"no row for the flag {flag}" for flag in missing_flags(rows, parser)]
    defined = defined_tests()
    for what, tests in rows:
        named = TEST.findall(tests)
        if not named and not tests.startswith(NONE_YET):
            found.append(f"{what}: names no test (or '{NONE_YET}')")
        for path, name in named:
            if name not in defined.get(path, frozenset()):
                found.append(f"{what}: {path}::{name} does not exist")
    return found


def keys_of(table: str) -> list[str]:
    return re.findall(r"^\| `([\w.]+)` \|", table, re.M)


@pytest.mark.unit
def test_every_flag_key_and_form_has_a_row_naming_tests_that_exist():
    """docs/testing.md names, for every flag of every `--help` and every key, a test that
    exists in the tests' source (or says 'none yet')."""
    text = (ROOT / "docs" / "testing.md").read_text()
    found = problems(text, build_parser(), keys_of(key_table()))
    assert not found, "docs/testing.md's feature table:\n" + "\n".join(found)


@pytest.mark.unit
def test_the_check_sees_a_missing_flag_a_missing_key_and_a_test_that_does_not_exist():
    """The check fails on a table without a key's row, without a flag's, and on a row
    naming a test that is not there: it can fail."""
    text = (ROOT / "docs" / "testing.md").read_text()
    rows = text.splitlines()
    without = "\n".join(r for r in rows if not r.startswith(("| `train.epochs`", "| `tfscale ui")))
    found = problems(without, build_parser(), keys_of(key_table()))
    assert "no row for the key train.epochs" in found
    assert "no row for the flag tfscale ui --port" in found
    assert "no row for the flag tfscale train --epochs [train.epochs]" in found
    renamed = text.replace("::test_the_batch_flag_takes_auto_or_a_number", "::test_gone")
    assert any("test_gone does not exist" in p for p in problems(renamed, build_parser(), []))


def plant_problems(text: str, plants, unplanted, root: Path = ROOT) -> list[str]:
    """Where `tests/plants.py` and the table part: a plant that no longer applies, one
    naming a test its row does not name (or a row not in the table), a row with neither a
    plant nor a place in `unplanted`, a row with both."""
    import plants as harness

    rows = dict(table_rows(text))
    planted = {p.row for p in plants}
    found = []
    for p in plants:
        why = harness.problem(p, root)
        if why:
            found.append(f"{p.row}: its plant no longer applies ({why})")
        if p.row not in rows:
            found.append(f"{p.row}: a plant's row that is not in the table")
            continue
        named = {f"{path}::{name}" for path, name in TEST.findall(rows[p.row])}
        found += [
            f"{p.row}: its plant's test {t} is not the row's" for t in p.tests if t not in named
        ]
    found += [
        f"{row}: no plant, and not in UNPLANTED"
        for row in rows
        if row not in planted | set(unplanted)
    ]
    found += [f"{row}: planted, and still in UNPLANTED" for row in planted & set(unplanted)]
    return found


@pytest.mark.unit
def test_every_plant_applies_to_the_code_and_every_row_is_planted_or_listed_as_not_yet():
    """Each of `tests/plants.py`'s plants changes a text found once in its file and names
    tests its row names; each row of the table has a plant, or is in `UNPLANTED`: a gap
    kept in sight, never silently."""
    import plants

    text = (ROOT / "docs" / "testing.md").read_text()
    found = plant_problems(text, plants.PLANTS, plants.UNPLANTED)
    assert not found, "tests/plants.py against docs/testing.md:\n" + "\n".join(found)


@pytest.mark.unit
def test_the_plant_check_sees_a_stale_plant_a_stray_test_and_an_unlisted_row(tmp_path):
    import plants

    text = (ROOT / "docs" / "testing.md").read_text()
    (tmp_path / "a.py").write_text("x = 1\nx = 1\n")
    row = "`train.seed`"
    stale = plants.Plant(row, "a.py", "x = 1", "x = 2", ("tests/x.py::test_y",))
    found = plant_problems(text, (stale,), (), tmp_path)
    assert f"{row}: its plant no longer applies (its text is in a.py 2 times, not once)" in found
    assert f"{row}: its plant's test tests/x.py::test_y is not the row's" in found
    assert "`train.epochs` `--epochs`: no plant, and not in UNPLANTED" in found
    assert f"{row}: planted, and still in UNPLANTED" in plant_problems(
        text, (stale,), (row,), tmp_path
    )


@pytest.mark.unit
@pytest.mark.parametrize("ending", ["an error", "Ctrl-C"])
def test_a_plant_is_taken_out_whatever_ends_its_run(tmp_path, ending):
    """The planted file is back byte for byte, with its modification time (a compiled copy
    of the planted text is never taken for the original's), after an error or Ctrl-C."""
    import os

    import plants

    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    os.utime(path, ns=(1_000_000_000, 2_000_000_000))
    plant = plants.Plant("row", "a.py", "x = 1", "x = 2", ())
    raised = RuntimeError if ending == "an error" else KeyboardInterrupt
    with pytest.raises(raised), plants.planted(plant, tmp_path):
        assert path.read_text() == "x = 2\n"
        raise raised(ending)
    assert path.read_text() == "x = 1\n" and path.stat().st_mtime_ns == 2_000_000_000
