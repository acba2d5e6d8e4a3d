"""Config loading: defaults, overrides, and errors that name the key."""

from __future__ import annotations

import pytest
from helpers import DEFAULTS

from tfscale.flows.cli import main
from tfscale.tasks.settings.config import Config, ConfigError, key_table, load_config


def test_defaults_load_and_are_frozen():
    config = load_config(None)
    assert config.prepare.dataset == "digits"
    with pytest.raises(AttributeError):
        config.prepare.dataset = "mnist"


def test_yaml_values_and_overrides_apply(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("prepare:\n  dataset: synthetic\n  synthetic:\n    classes: 3\n")
    config = load_config(path, {"prepare.num_shards": 6, "prepare.seed": None})
    assert config.prepare.dataset == "synthetic"
    assert config.prepare.synthetic.classes == 3
    assert config.prepare.num_shards == 6
    assert config.prepare.seed == 42


@pytest.mark.parametrize(
    ("yaml_text", "fragments"),
    [
        ("prepare:\n  datset: digits\n", ["prepare.datset", "unknown key", "dataset"]),
        ("prepare:\n  num_shards: many\n", ["prepare.num_shards", "an integer", "'many'"]),
        ("prepare:\n  min_shards: 0\n", ["prepare.min_shards", "between 1 and", "got 0"]),
        ("prepare:\n  synthetic:\n    classes: 1\n", ["prepare.synthetic.classes", "between 2"]),
        ("train:\n  strategy: magic\n", ["train.strategy", "mirrored", "'magic'"]),
        ("train:\n  cache: 3\n", ["train.cache", "true or false", "3"]),
        ("prepare: [1, 2]\n", ["prepare", "a mapping", "a list"]),
        ("sweeep: {}\n", ["sweeep", "unknown key"]),
        ("train:\n  batch_size_per_replica: big\n", ["an integer or auto", "'big'"]),
        ("train:\n  batch_size_per_replica: 0\n", ["train.batch_size_per_replica", "got 0"]),
        ("train:\n  batch_size_per_replica: true\n", ["an integer or auto", "True"]),
    ],
)
def test_bad_values_name_key_expected_and_got(tmp_path, yaml_text, fragments):
    path = tmp_path / "params.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert "params.yaml" in info.value.fix  # every config error gets a fix: line


def test_cli_exits_2_on_bad_config_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "params.yaml"
    path.write_text(f"prepare:\n  data_dir: {tmp_path / 'out'}\n  target_shard_mb: -1\n")
    assert main(["--params", str(path), "prepare"]) == 2
    assert "prepare.target_shard_mb" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_flag_type_error_exits_nonzero(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["--params", DEFAULTS, "prepare", "--num-shards", "two"])
    assert info.value.code == 2


def test_an_error_the_user_caused_is_one_line_with_the_fix_and_its_exit_code(
    digits, tmp_path, capsys
):
    """A batch larger than the data: exit 2, the message and the fix, no traceback; with
    --debug, the traceback."""
    overrides, _, _ = digits
    args = [
        "train",
        "--data-dir",
        overrides["prepare.data_dir"],
        "--runs-dir",
        str(tmp_path / "runs"),
        "--strategy",
        "one_device",
        "--precision",
        "float32",
        "--batch-size-per-replica",
        "100000",
    ]
    params = DEFAULTS
    assert main(["--params", params, *args]) == 2
    err = capsys.readouterr().err
    assert "error: train split has 1437 examples" in err
    assert "lower --batch-size-per-replica" in err and "Traceback" not in err
    from tfscale.tasks.core.errors import UsageError

    with pytest.raises(UsageError):
        main(["--debug", "--params", params, *args])


def test_an_unknown_strategy_lists_the_known_ones(tmp_path, capsys):
    assert main(["--params", DEFAULTS, "hardware", "--strategy", "ring"]) == 2
    err = capsys.readouterr().err
    assert "train.strategy" in err and "'ring'" in err
    assert "multi_worker" in err and "parameter_server" in err


def test_every_error_a_user_can_cause_is_a_user_error():
    from tfscale.flows.errors import ServerUnavailable
    from tfscale.tasks.core.errors import MissingInput, UsageError, UserError
    from tfscale.tasks.data.datasets import DatasetError
    from tfscale.tasks.data.manifest import ShardError
    from tfscale.tasks.distribute.launch import WorkerError
    from tfscale.tasks.settings.kinds import UnknownStrategy
    from tfscale.tasks.track.tracking import TrackingError

    for error in (DatasetError, ShardError, WorkerError, TrackingError, ServerUnavailable):
        assert issubclass(error, UserError) and error.exit_code == 1
    for error in (ConfigError, UnknownStrategy):
        assert issubclass(error, UsageError) and error.exit_code == 2
    assert issubclass(MissingInput, UserError) and issubclass(MissingInput, FileNotFoundError)


def test_the_batch_is_a_number_or_auto_which_trains_at_32_until_measured():
    assert load_config(None).train.batch_size_per_replica == "auto"
    assert load_config(None).train.per_replica_batch == 32
    named = load_config(None, {"train.batch_size_per_replica": 48}).train
    assert (named.batch_size_per_replica, named.per_replica_batch) == (48, 48)


def test_the_batch_flag_takes_auto_or_a_number(tmp_path, capsys):
    from tfscale.flows.cli import build_parser

    parser = build_parser()
    for given, expected in (("auto", "auto"), ("AUTO", "auto"), ("64", 64)):
        args = parser.parse_args(["train", "--batch-size-per-replica", given])
        assert getattr(args, "train.batch_size_per_replica") == expected
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["train", "--batch-size-per-replica", "many"])
    assert info.value.code == 2
    assert "expected auto or an integer; got 'many'" in capsys.readouterr().err


def test_the_configuration_page_lists_every_key_as_the_classes_define_it():
    """docs/configuration.md's key table is `key_table()` (regenerate it from there), and
    that table has a row for every key `params.yaml` may hold."""
    import dataclasses
    import re

    from helpers import ROOT

    page = (ROOT / "docs" / "configuration.md").read_text()
    shown = re.search(r"<!-- keys -->\n(.*?)<!-- /keys -->", page, re.S)
    assert shown and shown[1] == key_table(), "paste key_table() into docs/configuration.md"

    def keys(prefix: str, value) -> list[str]:
        if not dataclasses.is_dataclass(value):
            return [prefix]
        return [
            key
            for f in dataclasses.fields(value)
            for key in keys(f"{prefix}.{f.name}".strip("."), getattr(value, f.name))
        ]

    rows = re.findall(r"^\| `([\w.]+)` \|", key_table(), re.M)
    assert rows == keys("", Config()) and len(rows) > 50


def test_a_flag_is_never_taken_for_another_by_its_prefix(capsys):
    """`evaluate --model x.py:f` (train's flag, given to evaluate) is refused as unknown,
    not read as evaluate's `--model-path`, which argparse's prefix matching would do; the
    top-level parser matches whole flags too (`--verb` is not `--verbose`)."""
    from tfscale.flows.cli import build_parser

    for argv, unknown in (
        (["evaluate", "--model", "x.py:f"], "--model x.py:f"),
        (["--verb", "hardware"], "--verb"),
    ):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert f"error: unrecognized arguments: {unknown}" in err, err
        assert "fix: see 'tfscale" in err
