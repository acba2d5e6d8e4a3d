"""Config loading: defaults, overrides, and errors that name the key."""

from __future__ import annotations

import pytest

from flows.cli import main
from tasks.config import ConfigError, load_config


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
    ],
)
def test_bad_values_name_key_expected_and_got(tmp_path, yaml_text, fragments):
    path = tmp_path / "params.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_cli_exits_2_on_bad_config_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "params.yaml"
    path.write_text(f"prepare:\n  data_dir: {tmp_path / 'out'}\n  target_shard_mb: -1\n")
    assert main(["--params", str(path), "prepare"]) == 2
    assert "prepare.target_shard_mb" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_flag_type_error_exits_nonzero(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["--params", str(tmp_path / "none.yaml"), "prepare", "--num-shards", "two"])
    assert info.value.code == 2
