"""A sweep's cells: every combination of its grid (`plan_cells`), each cell's config
(`cell_config`) and devices, and a cell trained and diagnosed where it runs (`train_cell`:
in the sweep's process, or on a work pool's worker). Their table, charts and forecasts:
`tasks.report.scaling_grid`."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

from tfscale.tasks.settings.config import Config, ConfigError
from tfscale.tasks.settings.kinds import BASELINE, kind_of


@dataclass(frozen=True)
class Cell:
    size: int  # synthetic training examples; 0 means the configured dataset
    batch: int
    scaling: str
    precision: str
    replicas: int
    # the workers' emulated link in Gbit/s (0: full speed); None: localhost, and always for
    # one replica (it has no link)
    link_gbit: float | None = None
    # a pipeline cell: micro-batches per step (its `replicas` are then its stages, a device
    # each); None for every other cell
    micro_batches: int | None = None

    @property
    def group(self) -> tuple:
        """Cells that share a 1-replica cell (the baseline their speedup divides by)."""
        return (self.size, self.batch, self.scaling, self.precision)

    @property
    def line(self) -> tuple:
        """Cells that differ only in replicas: one line on the chart (its group first)."""
        return (self.group, self.link_gbit, self.micro_batches)

    @classmethod
    def of(cls, row: dict) -> Cell:
        """The cell a table row (`tabulate`) describes."""
        return cls(**{k: row[k] for k in CELL_FIELDS})

    @property
    def run_name(self) -> str:
        """`cell-<size>-b<batch>-r<replicas>[-<link>][-m<micro-batches>]`."""
        name = f"cell-{self.size}-b{self.batch}-r{self.replicas}"
        if self.link_gbit is not None:
            name += f"-{self.link_gbit:g}gbit" if self.link_gbit else "-fullspeed"
        if self.micro_batches:
            name += f"-m{self.micro_batches}"
        return name

    @property
    def label(self) -> str:
        data = f"{self.size} examples" if self.size else "dataset"
        micro = f", {self.micro_batches} micro-batches" if self.micro_batches else ""
        return (
            f"{data}, batch {self.batch}, {self.scaling}, {self.precision}"
            + link_label(self.link_gbit)
            + micro
        )


CELL_FIELDS = ("size", "batch", "scaling", "precision", "replicas", "link_gbit", "micro_batches")


def link_label(link_gbit: float | None) -> str:
    if link_gbit is None:
        return ""
    return ", full-speed link" if link_gbit == 0 else f", {link_gbit:g} Gbit/s link"


def plan_cells(config: Config) -> list[Cell]:
    """Every combination, always with 1 replica (the baseline each speedup divides by); with
    links, each cell of more replicas once per link rate.

    Raises:
        ConfigError: links asked for cells that are not worker processes.
    """
    s = config.sweep
    if s.link_gbit and not kind_of(s.strategy).takes_workers:
        raise ConfigError(
            f"sweep.link_gbit {list(s.link_gbit)} emulates links between worker processes, "
            f"and sweep.strategy is {s.strategy}",
            "set sweep.strategy: multi_worker, or sweep.link_gbit: [].",
        )
    replicas = sorted({1, *s.replicas})
    links: tuple = tuple(dict.fromkeys(s.link_gbit)) or (None,)
    # a pipeline sweep: its replicas are stages, each count once per micro-batch count
    micros: tuple = tuple(dict.fromkeys(s.micro_batches)) if kind_of(s.strategy).staged else (None,)
    cells = []
    for size, batch, scaling, precision, n in itertools.product(
        s.dataset_sizes, s.batch_sizes, s.scaling, s.precision, replicas
    ):
        for link, micro in itertools.product((None,) if n == 1 else links, micros):
            if n == 1 and micro != micros[0]:
                continue  # one baseline per group
            cells.append(Cell(size, batch, scaling, precision, n, link, micro if n > 1 else None))
    return cells


def cell_config(config: Config, cell: Cell) -> Config:
    """The full config of one cell's training run."""
    prepare = config.prepare
    if cell.size:
        synthetic = dataclasses.replace(prepare.synthetic, train_examples=cell.size)
        prepare = dataclasses.replace(prepare, dataset="synthetic", synthetic=synthetic)
    kind = kind_of(config.sweep.strategy)
    multi = cell.replicas > 1 and kind.takes_workers
    staged = cell.replicas > 1 and kind.staged
    train = dataclasses.replace(
        config.train,
        model=config.sweep.model,
        epochs=config.sweep.epochs,
        batch_size_per_replica=cell.batch,
        scaling=cell.scaling,
        precision=cell.precision,
        replicas=cell.replicas,
        workers=cell.replicas if multi else 1,
        strategy=BASELINE.name if cell.replicas == 1 else kind.name,
        link_gbit=cell.link_gbit if multi else None,
        stages=cell.replicas if staged else config.train.stages,
        micro_batches=cell.micro_batches if staged else config.train.micro_batches,
    )
    if staged:  # one copy of the model, cut over `replicas` devices
        train = dataclasses.replace(train, replicas=1)
    return dataclasses.replace(config, prepare=prepare, train=train)


def cell_devices(config: Config, report: Any) -> int:
    """The logical CPU devices a process that trains the sweep's cells sets up before
    TensorFlow starts (0: none; cells of worker processes or on GPUs need none)."""
    here = kind_of(config.sweep.strategy).runs_here and not report.gpus
    return max(config.sweep.replicas) if here else 0


def train_cell(run: Any, host: str) -> dict[str, Any]:
    """One cell trained and diagnosed: the figures its row and child run take, and the
    host that trained it."""
    from tfscale.tasks.execute.trainings import train_and_diagnose

    result, diagnosis = train_and_diagnose(run, probe_steps=10)
    return dict(
        result.to_dict(),
        bottleneck=diagnosis.bottleneck,
        diagnosis=diagnosis.to_dict(),
        host=host,
    )
