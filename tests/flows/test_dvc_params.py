"""Every setting a DVC stage's command reads is among the stage's params: otherwise a
changed value leaves `dvc repro` saying "up to date" over results of the old one. Each key
of the sections a stage reads is a declared param (itself or its section) or is named here,
with the reason it does not change the stage's outputs; a key added to the config is thus
classified once, here, before it can go stale in silence."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from helpers import ROOT

from tfscale.tasks.settings.config import Config

# the config sections each stage's command reads
READS = {
    "prepare": ("prepare",),
    "baseline": ("train", "evaluate"),
    "train": ("train", "evaluate"),
    "evaluate": ("evaluate",),
    "sweep": ("prepare", "train", "evaluate", "sweep"),
}
ONE_DEVICE = "the baseline is one device training the model whole"
DEP_PATH = "the path of a dep: DVC hashes the file it names"
RUN_SEEDS = "`tfscale run`'s extra seeds: a stage trains once"
GRID = "a cell takes it from the sweep's grid (sweep.*)"
# a sweep's cells train on synthetic data of their sizes; only a size of 0 reads the
# prepared dataset, which few grids have (the user's file then re-runs prepare, not it)
SYNTHETIC = "read only by a cell of size 0 (sweep.dataset_sizes): cells are synthetic"
PREPARED_KEYS = "dataset files test_fraction label label_kind missing color_mode"
GRID_KEYS = (
    "model epochs batch_size_per_replica scaling precision replicas workers strategy link_gbit"
    " stages micro_batches"
)
NOT_INPUTS = {
    "prepare": {"prepare.files": DEP_PATH},
    "baseline": {
        **{
            f"train.{key}": ONE_DEVICE
            for key in "replicas workers strategy link_gbit stages micro_batches cut_after".split()
        },
        "train.files": DEP_PATH,
        "evaluate.seeds": RUN_SEEDS,
    },
    "train": {"train.files": DEP_PATH, "evaluate.seeds": RUN_SEEDS},
    "evaluate": {},
    "sweep": {
        **{f"train.{key}": GRID for key in GRID_KEYS.split()},
        **{f"prepare.{key}": SYNTHETIC for key in PREPARED_KEYS.split()},
        "train.files": DEP_PATH,
        "evaluate.seeds": RUN_SEEDS,
    },
}


def keys(section: str) -> list[str]:
    """The dotted keys of one section of the config (`prepare.synthetic` as one)."""
    (kind,) = [f.default_factory for f in dataclasses.fields(Config) if f.name == section]
    return [f"{section}.{f.name}" for f in dataclasses.fields(kind)]


def unlisted(stage: dict, name: str) -> list[str]:
    """The keys `name` reads that neither its params nor `NOT_INPUTS` name."""
    declared = [p for p in stage.get("params", []) if isinstance(p, str)]

    def covered(key: str) -> bool:
        return any(key == p or key.startswith(p + ".") for p in declared)

    read = [key for section in READS[name] for key in keys(section)]
    return [key for key in read if not covered(key) and key not in NOT_INPUTS[name]]


@pytest.mark.parametrize("name", sorted(READS))
def test_every_setting_a_stage_reads_is_a_param_or_named_as_no_input(name):
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert unlisted(stages[name], name) == [], f"dvc.yaml: add them to {name}'s params"


@pytest.mark.parametrize("name", sorted(READS))
def test_every_param_a_stage_lists_is_in_params_yaml(name):
    """DVC refuses a stage whose param is missing from params.yaml (a key left at its
    default there): every one it lists is written out."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][name]
    written = yaml.safe_load((ROOT / "params.yaml").read_text())
    for key in (p for p in stage["params"] if isinstance(p, str)):
        node = written
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"params.yaml has no {key}"
            node = node[part]


def test_the_check_sees_a_key_a_stage_leaves_out():
    stage = {"params": ["prepare.dataset", "train", "evaluate.batch_size"]}
    missing = unlisted(stage, "train")
    assert "evaluate.every_epochs" in missing and "evaluate.target_accuracy" in missing
    assert not any(key.startswith("train.") for key in missing)
    assert "evaluate.seeds" not in missing  # named: not an input of a stage
