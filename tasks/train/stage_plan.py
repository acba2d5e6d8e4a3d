"""Pipeline parallelism, planning the cut: a model is cut only where one tensor alone crosses
from the layers before to the layers after (`cut_points`). Its training footprint (weights,
the optimizer's two Adam slots, the accumulated gradients, and the activations a step keeps
for its backward pass) is estimated per layer from the built model's shapes
(`layer_costs`), and so is its compute. `plan_stages` cuts the layers into S stages that
balance compute while each stage's footprint stays within a device's memory;
`fit_to_memory` is the choice `auto` makes from it (the fewest stages that hold the model)
and the refusal a data-parallel strategy gets."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from tfscale.tasks.core.errors import UsageError

OPTIMIZER_SLOTS = 2  # Adam: first and second moments, each the size of the weights


MB = 1 << 20


@dataclass(frozen=True)
class LayerCost:
    """One operation of a functional model: what it costs to train, per example."""

    index: int  # its place in `model.operations` (0 is the input)
    name: str
    flops: float  # multiply-adds x 2 per example, forward (an estimate from shapes)
    weight_bytes: int
    activation_bytes: int  # its output, per example, kept for the backward pass


@dataclass(frozen=True)
class Footprint:
    """Bytes one device needs to train a stage (or the whole model) at a batch."""

    weights: int
    optimizer: int
    gradients: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.optimizer + self.gradients + self.activations

    def describe(self) -> str:
        return (
            f"{mb(self.total)} (weights {mb(self.weights)}, optimizer {mb(self.optimizer)}, "
            f"gradients {mb(self.gradients)}, activations {mb(self.activations)})"
        )


def mb(n: float) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):,.2f} GB"
    return f"{n / MB:,.{2 if n < 10 * MB else 1}f} MB"


def footprint(costs: list[LayerCost], batch: int) -> Footprint:
    """The training footprint of these layers at `batch` examples kept for backward."""
    weights = sum(c.weight_bytes for c in costs)
    return Footprint(
        weights=weights,
        optimizer=OPTIMIZER_SLOTS * weights,
        gradients=weights,
        activations=batch * sum(c.activation_bytes for c in costs),
    )


@dataclass(frozen=True)
class StagePlan:
    """Where a model is cut: stage s holds operations `bounds[s][0]..bounds[s][1]`."""

    bounds: tuple[tuple[int, int], ...]
    names: tuple[str, ...]  # each stage's first and last layer, for people
    flops: tuple[float, ...]  # each stage's estimated forward compute per example
    footprints: tuple[Footprint, ...]  # each stage's at the batch it keeps

    @property
    def stages(self) -> int:
        return len(self.bounds)

    @property
    def cut_after(self) -> list[int]:
        return [hi for _, hi in self.bounds[:-1]]

    def describe(self) -> str:
        return "; ".join(
            f"stage {s + 1}: {name} ({fp.describe()})"
            for s, (name, fp) in enumerate(zip(self.names, self.footprints, strict=True))
        )

    def to_dict(self) -> dict:
        return {
            "cut_after": self.cut_after,
            "stages": [
                {"layers": name, "flops_per_example": f, **asdict(fp), "total": fp.total}
                for name, f, fp in zip(self.names, self.flops, self.footprints, strict=True)
            ],
        }


def _flat(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _elements(tensor: Any) -> int:
    return math.prod(int(d) for d in tensor.shape[1:])


def graph_of(model: Any) -> Any:
    """The functional graph of a model: itself, or the one a built `keras.Sequential`
    holds (a user's chain of layers), its operations in order from the input."""
    functional = getattr(model, "_functional", None)
    graph = functional if functional is not None else model
    if not hasattr(graph, "operations"):
        raise UsageError(
            f"The model {model.name} ({type(model).__name__}) is a subclassed keras.Model: its "
            "layers are called in code, so it cannot be cut into pipeline stages or split "
            "by columns",
            "train it whole (--strategy mirrored, one_device or multi_worker), or write it as "
            "a functional model or a keras.Sequential, which are cut where one tensor crosses",
        )
    return graph


def layer_costs(model: Any) -> list[LayerCost]:
    """Every operation of a built functional model, with its estimated costs per example
    (float32 bytes: what a float32 copy of the weights and slots takes)."""
    costs = []
    for i, op in enumerate(graph_of(model).operations):
        if i == 0:
            continue
        out = _flat(op.output)[0]
        weights = getattr(op, "weights", [])  # keras.ops in a functional model have none
        kernel = next((w for w in weights if w.path.endswith("kernel")), None)
        per_position = _elements(out) // max(int(out.shape[-1]), 1) if out.shape[1:] else 1
        flops = 2.0 * math.prod(kernel.shape) * per_position if kernel is not None else 0.0
        costs.append(
            LayerCost(
                index=i,
                name=op.name,
                flops=flops + _elements(out),
                weight_bytes=sum(4 * math.prod(w.shape) for w in weights),
                activation_bytes=4 * _elements(out),
            )
        )
    return costs


def cut_points(model: Any) -> list[int]:
    """The operations after which one tensor alone crosses to the rest of the model: where a
    stage may end (never after the last operation)."""
    ops = graph_of(model).operations
    last_use: dict[int, int] = {}
    for i, op in enumerate(ops):
        for tensor in _flat(op.input):
            last_use[id(tensor)] = i
    cuts = []
    for k in range(1, len(ops) - 1):
        live = {
            id(t) for op in ops[: k + 1] for t in _flat(op.output) if last_use.get(id(t), -1) > k
        }
        if len(live) == 1:
            cuts.append(k)
    return cuts


def plan_stages(
    model: Any,
    stages: int,
    batch: int,
    budget_bytes: int = 0,
    cut_after: tuple[int, ...] = (),
) -> StagePlan:
    """The cut of `model` into `stages` contiguous stages: `cut_after` when given, else the
    one whose heaviest stage (estimated compute) is lightest among those whose every stage
    fits `budget_bytes` (0: no budget) at `batch` examples kept for backward.

    Raises:
        UsageError: more stages than the model has places to cut, a `cut_after` that is not
            such a place, or no cut that fits the budget.
    """
    costs = layer_costs(model)
    cuts = cut_points(model)
    name = model.name
    if stages > len(cuts) + 1:
        raise UsageError(
            f"train.stages ({stages}) is more than model {name} can be cut into: "
            f"{len(cuts) + 1} stages at most (it can be cut after {len(cuts)} of its layers)",
            f"set train.stages to {len(cuts) + 1} or fewer.",
        )
    by_index = {c.index: c for c in costs}
    if cut_after:
        chosen = _given_cut(cut_after, cuts, stages, name)
    else:
        chosen = _balanced(costs, cuts, stages, batch, budget_bytes)
        if chosen is None:
            whole = footprint(costs, batch)
            raise UsageError(
                f"model {name} needs {mb(whole.total)} to train at batch {batch}, and no cut "
                f"into {stages} stages keeps every stage within a device's "
                f"{mb(budget_bytes)}",
                "raise train.device_memory_mb, lower the batch, or use more stages (and devices).",
            )
    edges = [0, *chosen, costs[-1].index]
    bounds = tuple((edges[s] + 1, edges[s + 1]) for s in range(stages))
    parts = [[by_index[i] for i in range(lo, hi + 1) if i in by_index] for lo, hi in bounds]
    return StagePlan(
        bounds=bounds,
        names=tuple(f"{p[0].name}..{p[-1].name}" if len(p) > 1 else p[0].name for p in parts),
        flops=tuple(sum(c.flops for c in p) for p in parts),
        footprints=tuple(footprint(p, batch) for p in parts),
    )


def _given_cut(cut_after: tuple[int, ...], cuts: list[int], stages: int, name: str) -> list[int]:
    """`train.cut_after`, checked: `stages - 1` increasing places where the model can be cut."""
    bad = [k for k in cut_after if k not in cuts]
    if bad or len(cut_after) != stages - 1 or list(cut_after) != sorted(set(cut_after)):
        raise UsageError(
            f"train.cut_after {list(cut_after)} is not {stages - 1} increasing places "
            f"where model {name} can be cut (after layer {', '.join(map(str, cuts))})",
            f"give {stages - 1} of those, in order, or leave train.cut_after empty to "
            "balance the stages.",
        )
    return list(cut_after)


def _balanced(
    costs: list[LayerCost], cuts: list[int], stages: int, batch: int, budget: int
) -> list[int] | None:
    """The cut points (stages - 1 of `cuts`) that minimise the heaviest stage's compute with
    every stage's footprint within `budget` (0: none), or None when none fits."""
    last = costs[-1].index
    by_index = {c.index: c for c in costs}
    ends = [*cuts, last]

    def segment(lo: int, hi: int) -> tuple[float, int]:  # operations lo+1..hi
        part = [by_index[i] for i in range(lo + 1, hi + 1) if i in by_index]
        return sum(c.flops for c in part), footprint(part, batch).total

    # best[s][e]: (heaviest stage, cuts) for the first s stages ending at operation e
    best: list[dict[int, tuple[float, list[int]]]] = [{0: (0.0, [])}]
    for s in range(1, stages + 1):
        row: dict[int, tuple[float, list[int]]] = {}
        for end in ends if s < stages else [last]:
            for start, (heaviest, chosen) in best[s - 1].items():
                if start >= end:
                    continue
                flops, size = segment(start, end)
                if budget and size > budget:
                    continue
                candidate = (max(heaviest, flops), chosen + ([end] if end != last else []))
                if end not in row or candidate[0] < row[end][0]:
                    row[end] = candidate
        best.append(row)
    found = best[stages].get(last)
    return found[1] if found else None


def batches_that_fit(
    model_name: str, manifest: Any, device_memory_mb: float, batches: tuple[int, ...]
) -> tuple[int, ...]:
    """The per-replica batches at which the whole model (weights, Adam's slots and the
    activations kept for backward, `footprint`) fits a device of `device_memory_mb`."""
    from tfscale.tasks.train.models import model_for_data

    costs = layer_costs(model_for_data(model_name, manifest.spec).model)
    budget = device_memory_mb * MB
    return tuple(b for b in batches if footprint(costs, b).total <= budget)


def fit_to_memory(choice: Any, cfg: Any, manifest: Any) -> Any:
    """`choice`, or, when the model does not fit one device's memory (`choice.device_memory_mb`;
    0: not checked), the fewest pipeline stages that hold it where the strategy is `auto`. A
    pipeline's own cut is checked here, before any work.

    Raises:
        UsageError: a strategy that keeps the whole model on each device (asked for by
            name) and a model that does not fit; or no cut into the devices there are fits.
    """
    from tfscale.tasks.train.models import model_for_data

    budget = int(choice.device_memory_mb * MB)
    if choice.spec.splits and len(manifest.spec.features) > 1:
        raise UsageError(
            f"{choice.kind} cuts a model with one input, and this data has "
            f"{len(manifest.spec.features)} features, each an input of its own",
            "train it with a strategy that keeps the whole model on each device (auto, "
            "mirrored, multi_worker, parameter_server), or give the features as one array",
        )
    if choice.spec.splits == "columns" or (not budget and not choice.spec.staged):
        return choice  # a column split is not checked against the budget
    model = model_for_data(cfg.model, manifest.spec).model
    if choice.spec.staged:  # its cut, checked before any work (the training cuts it again)
        plan_stages(model, choice.stages, cfg.per_replica_batch, budget, choice.cut_after)
        return choice
    per_replica = cfg.per_replica_batch * cfg.grad_accum_steps
    whole = footprint(layer_costs(model), per_replica)
    if whole.total <= budget:
        return choice
    needs = f"model {cfg.model} needs {whole.describe()} to train at batch {per_replica}"
    if cfg.strategy != "auto":
        raise UsageError(
            f"{needs}, and {choice.kind} keeps the whole model on each device, which has "
            f"{mb(budget)} (train.device_memory_mb)",
            "train it as pipeline stages (--strategy pipeline, or auto, which cuts it), or "
            "lower the batch.",
        )
    return _fewest_stages(choice, cfg, model, budget, needs)


def _fewest_stages(choice: Any, cfg: Any, model: Any, budget: int, needs: str) -> Any:
    """`choice` made the pipeline of the fewest stages whose every stage fits `budget`."""
    import dataclasses

    from tfscale.tasks.settings.kinds import STAGED

    for stages in range(2, choice.stages + 1):
        try:
            plan = plan_stages(model, stages, cfg.per_replica_batch, budget)
        except UsageError:
            continue
        reason = (
            f"{needs}; a device has {mb(budget)}: {stages} pipeline stages of "
            f"{cfg.micro_batches} micro-batches ({plan.describe()})"
        )
        return dataclasses.replace(
            choice,
            kind=STAGED.name,
            replicas=1,
            workers=1,
            stages=stages,
            micro_batches=cfg.micro_batches,
            reason=f"{reason}; {choice.reason.split('; ', 1)[-1]}",
        )
    raise UsageError(
        f"{needs}; a device has {mb(budget)}, and no cut into {choice.stages} stages or fewer "
        "fits it",
        "raise train.stages (one device each) or train.device_memory_mb, lower the batch, "
        "or split its widest layer by columns (--strategy tensor_parallel).",
    )


def schedule_bubble(stages: int, micro_batches: int) -> float:
    """GPipe's idle share of a step with balanced stages: (S-1)/(M+S-1)."""
    return (stages - 1) / (micro_batches + stages - 1)
