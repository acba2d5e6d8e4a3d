"""A training's files, each named once (`tasks.core.run_layout`), written and read back by
`tasks.execute.run_files` with nothing heavy imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT, scaled

READ_BACK = """
import json, sys
from pathlib import Path
from tfscale.tasks.execute.run_files import latest_run, load_exported, trained_by
export, runs = Path(sys.argv[1]), sys.argv[2]
result = load_exported(export)
print(json.dumps({
    "global_batch": result.global_batch,
    "latest": latest_run(runs, "digits")["run_dir"],
    "tags": trained_by(export),
    "heavy": sorted(m for m in ("tensorflow", "keras") if m in sys.modules),
}))
"""


@pytest.mark.integration
def test_a_runs_results_are_read_back_in_a_process_that_imports_no_tensorflow(tmp_path):
    """`write_metrics`' two files and an export's copy, read back by a fresh interpreter
    (the process is the claim: what it imports) without TensorFlow or Keras."""
    from helpers import epoch_history, train_result

    from tfscale.tasks.core.run_layout import EXPORTED_METRICS, LATEST, METRICS

    run = tmp_path / "runs" / "digits" / "mirrored-2x"
    run.mkdir(parents=True)
    result = train_result(run_dir=str(run), model_path=str(run / "model.keras"),
                          history=epoch_history(10.0))  # fmt: skip
    metrics = dict(result.to_dict(), dataset="digits", model="cnn")
    (run / METRICS).write_text(json.dumps(metrics))
    (run.parent / LATEST).write_text(json.dumps({"run_dir": str(run)}))
    export = tmp_path / "export"
    export.mkdir()
    (export / EXPORTED_METRICS).write_text((run / METRICS).read_text())
    out = subprocess.run(
        [sys.executable, "-c", READ_BACK, str(export), str(tmp_path / "runs")],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=scaled(120),
    )  # fmt: skip
    read = json.loads(out.stdout)
    assert read["global_batch"] == result.global_batch
    assert read["latest"] == str(run)
    assert read["tags"]["dataset"] == "digits" and read["tags"]["model"] == "cnn"
    assert read["heavy"] == []
