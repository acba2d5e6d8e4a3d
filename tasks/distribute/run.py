"""A training run as one value: its config, prepared data, hardware report, strategy
choice and this process's role, from which its run directory follows.

Every step of a run (training, measuring, tracking) takes a `Run`. The run directory is
keyed by what makes a result (the training config, the data, the strategy and the code
version, `tasks.core.provenance`), so the same run resumes or is reused, and a change to any of
them trains afresh.

Ownership: the CLI, the flows and a worker process create a Run; nothing changes one
(`dataclasses.replace` makes a new one, as `with_choice` does for the baseline).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfscale.tasks.core import class_weights
from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.core.progress import status
from tfscale.tasks.core.provenance import code_version
from tfscale.tasks.core.run_layout import METRICS
from tfscale.tasks.core.user_code import model_fingerprint
from tfscale.tasks.data.manifest import Manifest, load_manifest
from tfscale.tasks.distribute.hardware import HardwareReport, report_from_dict
from tfscale.tasks.distribute.strategy import StrategyChoice
from tfscale.tasks.settings.config import Config, TrainConfig, config_from_dict, config_to_dict
from tfscale.tasks.settings.kinds import LOCAL_WORKERS


@dataclass(frozen=True)
class Role:
    """This process's part in a run: the chief writes the outputs; a preemptible process
    (the main thread of a worker or cluster task) saves a checkpoint on SIGTERM and exits."""

    chief: bool = True
    preemptible: bool = False


@dataclass(frozen=True)
class Run:
    """What every step of one training run needs."""

    config: Config
    manifest: Manifest
    data_dir: str
    choice: StrategyChoice
    report: HardwareReport
    role: Role = field(default_factory=Role)
    # what the model is made of (`model_fingerprint`), taken once as the run is made: an
    # edit to the model's file while it trains changes neither its directory nor its
    # workers' (they take it with the run's spec)
    made_of: str = ""

    def __post_init__(self) -> None:
        if not self.made_of:
            object.__setattr__(self, "made_of", model_fingerprint(self.config.train.model))
        _refuse_unweighable(self.config.train, self.manifest, self.choice)
        if self.config.train.class_weight != "none":
            weighted = with_class_weights(self.config, self.manifest, self.data_dir)
            object.__setattr__(self, "config", weighted)

    @property
    def train(self) -> TrainConfig:
        return self.config.train

    @property
    def writes_outputs(self) -> bool:
        """This process writes the run's outputs: a run of its own, or a cluster's chief."""
        cluster = self.report.cluster
        return cluster is None or cluster.is_chief

    @property
    def run_dir(self) -> Path:
        """`runs/<dataset>/<strategy>-<replicas>x-<precision>-<key>`: the same config, data,
        strategy (its precision and XLA too) and code (a user's model file too) give the
        same directory."""
        train = config_to_dict(self.config.train)
        train.pop("runs_dir")
        if train.get("link_gbit") is None or self.choice.spec.runs != LOCAL_WORKERS:
            train.pop("link_gbit", None)  # only local workers have links
        choice = self.choice.to_dict()
        for words in ("reason", "measured", "measured_verdict", "proposed"):
            choice.pop(words)  # what was measured and said of it, not what trains
        parts = [train, self.manifest.digest, choice, code_version()]
        if self.made_of != self.config.train.model:  # a user's model: its file's contents too
            parts.append(self.made_of)
        key = json.dumps(parts, sort_keys=True)
        digest = hashlib.sha256(key.encode()).hexdigest()[:10]
        name = f"{self.choice.kind}-{self.choice.replicas}x-{self.choice.precision}-{digest}"
        return Path(self.config.train.runs_dir) / self.manifest.dataset / name

    @property
    def is_complete(self) -> bool:
        """Whether the run directory holds its metrics and model (a cached result whose
        files were deleted must train again)."""
        return (self.run_dir / METRICS).exists() and (self.run_dir / "model.keras").exists()

    def with_choice(self, choice: StrategyChoice) -> Run:
        return dataclasses.replace(self, choice=choice)

    def with_train(self, train: TrainConfig) -> Run:
        """This run on another training config (as `auto` settles its batch); another
        model is taken as it is now."""
        made_of = self.made_of if train.model == self.train.model else ""
        config = dataclasses.replace(self.config, train=train)
        return dataclasses.replace(self, config=config, made_of=made_of)

    def with_role(self, role: Role) -> Run:
        return dataclasses.replace(self, role=role)

    def to_spec(self) -> dict[str, Any]:
        """A JSON-ready form a worker process rebuilds the run from (`from_spec`)."""
        return {
            "config": config_to_dict(self.config),
            "data_dir": self.data_dir,
            "choice": self.choice.to_dict(),
            "report": self.report.to_dict(),
            "made_of": self.made_of,
        }

    @classmethod
    def from_spec(cls, spec: dict[str, Any], role: Role) -> Run:
        return cls(
            config_from_dict(spec["config"]),
            load_manifest(spec["data_dir"]),
            spec["data_dir"],
            StrategyChoice(**spec["choice"]),
            report_from_dict(spec["report"]),
            role,
            spec.get("made_of", ""),
        )


def _refuse_unweighable(train: TrainConfig, manifest: Manifest, choice: StrategyChoice) -> None:
    """Data that weighs its examples (`prepare.sample_weight`) trains only where its weights
    are honoured as `fit` honours them.

    Raises:
        UsageError: class weights asked for too (Keras's `fit` takes one or the other:
            "You cannot `class_weight` and `sample_weight` at the same time"); a strategy
            whose stages run the label kind's loss alone (pipeline, tensor_parallel).
    """
    weight = manifest.spec.weight
    if not weight:
        return
    if train.class_weight != "none":
        raise UsageError(
            f"train.class_weight {train.class_weight}: the data already weighs each example "
            f"by its {weight}, and Keras's fit takes class weights or sample weights, never "
            "both",
            "leave train.class_weight none (--class-weight none), or prepare the data again "
            "without its sample weights",
        )
    if choice.spec.staged:
        raise UsageError(
            f"the {choice.kind} strategy cuts the model into stages that do not carry the "
            f"examples' weights ({weight}), and would train unweighted",
            "train it under another strategy (--strategy auto), or prepare the data again "
            "without its sample weights",
        )


def with_class_weights(config: Config, manifest: Manifest, data_dir: str) -> Config:
    """The config with its class weights checked against the label (refused before any
    work where they cannot apply) and `balanced` made the weights it comes to on this
    data's training split, said once, so that every process that trains it (the baseline,
    worker processes, cluster tasks, the measuring rounds) takes the same weights from
    the run's config without reading the data again."""
    train, label = config.train, manifest.spec.label
    names = label.class_names
    if class_weights.parsed(train.class_weight) != "balanced":
        class_weights.resolved(train.class_weight, label.kind, names)
        return config
    from tfscale.tasks.data.inputs import class_counts

    weighable = label.kind in ("class", "binary")  # others are refused, naming the kind
    counts = class_counts(manifest, data_dir, len(names)) if weighable else []
    weights = class_weights.resolved("balanced", label.kind, names, counts)
    status(
        "weights",
        f"balanced over {sum(counts):,} training examples: {class_weights.said(weights, names)}",
    )
    pairs = ",".join(f"{i}={w!r}" for i, w in enumerate(weights))
    return dataclasses.replace(config, train=dataclasses.replace(train, class_weight=pairs))
