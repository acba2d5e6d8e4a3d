"""The console's status lines (`tasks.core.progress.status_line`): each stage's name, then
its text within 100 columns, wrapped under the text's own column."""

from __future__ import annotations

import pytest

from tfscale.tasks.core.progress import status_line

pytestmark = pytest.mark.unit

BASELINE = (
    "6,653 examples/s over epochs 2-10, 1 replica, global batch 32, train accuracy 0.9844; "
    "held-out 0.96 at 7,200 examples (5.0 epochs, 225 steps), 4.9 s"
)


def test_a_long_stage_line_wraps_under_its_text_within_100_columns():
    assert status_line("baseline", BASELINE) == (
        "baseline    6,653 examples/s over epochs 2-10, 1 replica, global batch 32, train "
        "accuracy 0.9844;\n"
        "            held-out 0.96 at 7,200 examples (5.0 epochs, 225 steps), 4.9 s"
    )
    assert status_line("strategy", "mirrored, 2 replicas") == "strategy    mirrored, 2 replicas"


def test_a_path_longer_than_the_room_is_never_split_and_a_broken_text_stays_broken():
    path = "sqlite:///" + "/very-long-folder" * 6 + "/mlflow.db"
    lines = status_line("track", f"MLflow run abc in {path}").split("\n")
    assert lines == ["track       MLflow run abc in", f"            {path}"]
    assert status_line("weights", "one\ntwo") == "weights     one\n            two"
