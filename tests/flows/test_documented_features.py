"""What README.md promises of the command, each claim in this process at the narrowest
boundary that proves it (issue 61, item 2): `tfscale --verbose` (and `TFSCALE_VERBOSE=1`)
shows every library's log lines, `tfscale hardware --json` prints the report and the
choice as JSON, and `tfscale evaluate` reads a recorded evaluation back without loading
TensorFlow."""

from __future__ import annotations

import json
import logging

import pytest
from helpers import run_main

from tfscale.tasks.core.process import HARMLESS_LOGGERS, NOISY_LOGGERS


@pytest.fixture
def logger_levels():
    """The library loggers' levels, put back after the test (`set_up_process` sets them)."""
    named = [logging.getLogger(n) for n in NOISY_LOGGERS + HARMLESS_LOGGERS]
    levels = [logger.level for logger in named]
    yield
    for logger, level in zip(named, levels, strict=True):
        logger.setLevel(level)


@pytest.mark.unit
@pytest.mark.parametrize(
    "argv, env, shown",
    [
        (["hardware"], {}, False),
        (["--verbose", "hardware"], {}, True),
        (["hardware"], {"TFSCALE_VERBOSE": "1"}, True),
    ],
    ids=["quiet", "--verbose", "TFSCALE_VERBOSE"],
)
def test_verbose_shows_every_librarys_log_lines_and_quiet_keeps_them_off(
    argv, env, shown, tmp_path, monkeypatch, logger_levels
):
    """Quiet (the default): tfscale's own lines and every warning reach the console, a
    library's notices do not, and TensorFlow's C++ lines are off; `--verbose` (or
    `TFSCALE_VERBOSE=1`) shows the notices and TensorFlow's C++ lines too."""
    import os

    from tfscale.flows import commands

    seen = {}

    def hardware(config, args):
        logging.getLogger("prefect.flow_runs").info("a library's notice")
        logging.getLogger("tfscale.tasks.own").info("tfscale's own line")
        logging.getLogger("mlflow.store").warning("a library's warning")
        seen["cpp"] = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
        return 0

    monkeypatch.delenv("TFSCALE_VERBOSE", raising=False)
    monkeypatch.setattr(commands, "hardware", hardware)
    code, _, err = run_main(argv, tmp_path, env)
    assert code == 0, err
    assert "tfscale's own line" in err and "a library's warning" in err
    assert ("a library's notice" in err) is shown, err
    assert seen["cpp"] == ("0" if shown else "3")


@pytest.mark.unit
def test_hardware_json_prints_the_report_and_the_strategy_it_would_pick(tmp_path):
    """`tfscale hardware --json`: one JSON document of the detected hardware, the strategy
    the flags would pick and the hardware's fingerprint, as the table shows them."""
    from tfscale.tasks.distribute.hardware import detect_hardware, format_report

    code, out, err = run_main(["hardware", "--json", "--strategy", "one_device"], tmp_path)
    assert code == 0, err
    shown = json.loads(out)
    assert set(shown) == {"hardware", "choice", "fingerprint"}
    report = detect_hardware()
    assert shown["hardware"] == json.loads(json.dumps(report.to_dict()))
    assert shown["fingerprint"] == report.fingerprint
    assert shown["choice"]["kind"] == "one_device"
    code, table, _ = run_main(["hardware", "--strategy", "one_device"], tmp_path)
    assert code == 0 and table.startswith(format_report(report)) and "one_device" in table


@pytest.mark.unit
def test_evaluate_reads_a_recorded_evaluation_back_without_tensorflow(
    digits, tmp_path, monkeypatch
):
    """A model whose training recorded its evaluation (the same file, shards and batch
    size) is read back with neither TensorFlow's import nor an evaluation; another batch
    size is evaluated, TensorFlow imported first. `evaluate` is not among the commands
    that import TensorFlow up front."""
    import keras

    from tfscale.flows import cli
    from tfscale.tasks.core import process
    from tfscale.tasks.train import evaluation

    _, manifest, data_dir = digits
    inputs = keras.Input(manifest.spec.shape)
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs)))
    path = tmp_path / "model.keras"
    model.save(path)
    evaluation.record_final(model, path, manifest, data_dir, 64)
    recorded = json.loads((tmp_path / evaluation.RECORDED).read_text())["result"]
    calls = []

    def refused(*args, **kwargs):
        calls.append(args[:1])
        return "evaluated"

    monkeypatch.setattr(process, "import_tensorflow", refused)
    monkeypatch.setattr(evaluation, "evaluate_model", refused)
    result, kept = evaluation.recorded_or_evaluated(str(path), manifest, data_dir, 64)
    assert kept and calls == [] and result.to_dict() == {**recorded, "model_path": str(path)}
    assert evaluation.recorded_or_evaluated(str(path), manifest, data_dir, 32) == (
        "evaluated",
        False,
    )
    assert calls == [(), (str(path),)]  # TensorFlow imported, then the model evaluated
    assert "evaluate" not in cli.TENSORFLOW_COMMANDS


@pytest.mark.unit
def test_an_exported_model_keeps_its_recorded_evaluation_and_drops_a_stale_one(
    digits, tmp_path, monkeypatch
):
    """`tfscale train --export-dir` copies the training's recorded evaluation beside the
    exported model, so DVC's evaluate stage reads it back instead of evaluating again; a
    later export of a run without one leaves none of the earlier export's behind."""
    import keras
    from helpers import epoch_history, train_result

    from tfscale.tasks.core import process
    from tfscale.tasks.execute.run_files import export_run
    from tfscale.tasks.train import evaluation

    _, manifest, data_dir = digits
    run, export = tmp_path / "run", tmp_path / "export"
    run.mkdir()
    inputs = keras.Input(manifest.spec.shape)
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs)))
    model.save(run / "model.keras")
    evaluation.record_final(model, run / "model.keras", manifest, data_dir, 64)
    (run / "metrics.json").write_text("{}")
    result = train_result(
        run_dir=str(run), model_path=str(run / "model.keras"), history=epoch_history(10.0)
    )
    export_run(result, export)
    monkeypatch.setattr(process, "import_tensorflow", None)  # reading it back needs none
    read, kept = evaluation.recorded_or_evaluated(str(export / "model.keras"), manifest, "", 64)
    assert kept and read.model_path == str(export / "model.keras")
    (run / evaluation.RECORDED).unlink()
    export_run(result, export)
    assert not (export / evaluation.RECORDED).exists()
