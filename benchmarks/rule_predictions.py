"""Benchmark: the judge of `tfscale plan`'s steps to a target, on seeds it never saw.

For each task (the synthetic task of known difficulty, target 0.73; the digits' CNN of
params.yaml, target 0.96; the README's model of a user's table, breast cancer, compiled
with SGD and momentum 0.9, target 0.95), its optimizer (Adam for the first two, SGD with
momentum for the table) and each learning-rate rule (`linear`, `sqrt`), it trains on one
device, each training to the target (`train_to_target`, evaluated every 0.1 epoch):
- the predictor, as a study has it: 5 seeds at the task's base batch B at its base rate
  and 5 at 2B at the rule's rate (a study's baseline and its run);
- the judge: 10 other seeds at B/2, 2B, 4B and 8B, each at the rate the plan prices the
  batch at (the rule's, held at the pair's where the rule would pass it: the plan's cap).
The trainings' rate is constant from their first step (one device: no ramp), so the plan
is priced with no warm-up. From the predictor alone it prices every batch as `tfscale
plan` does (`pricing_of`: the pair's calibration and its interval, noise-scale bounds,
seed doubt, the finite split), and prints per batch: the judge's MLPerf mean, the plan's
point and 95% interval and whether it covers the mean, a bootstrap 95% interval of
log(predicted / measured) that resamples both seed sets and recalibrates on each draw,
the judge against itself split in halves (the noise floor: its halves' ratio and 95%
interval), and beside them McCandlish's two-point hyperbola through the predictor's pair
and the trivial predictors (steps falling as 1/B; steps constant). 2B is the calibration
point: its row is shown, never counted as a test.

    uv run python benchmarks/rule_predictions.py [--tasks synthetic,digits,table]
        [--optimizers adam,sgd] [--rules linear,sqrt] [--seeds 5] [--judge-seeds 10]
        [--project DIR]    # go on with an earlier run's project: its trainings are kept
        [--results FILE]   # report from saved results, training nothing (with --seeds N,
                           # its first N predictor seeds: 5 by default, as a study has them)
        [--results FILE --pairs 10]  # the default judged: 10 one-seed plans a task and rule
        [--smoke]          # one judged batch (4B), to see it run end to end
        [--judge-from SEED] [--judged 0.5,4,8]  # fresh judge seeds, at these batches
    # in parts, into one project (each part adds to DIR/results.json):
    uv run python benchmarks/rule_predictions.py --project DIR --tasks synthetic --rules sqrt
    # the trainings done so far are kept in benchmarks/results/rule_predictions.json: copied
    # to DIR/results.json, a part on another machine trains only what that file lacks

Goals: the plan's 95% intervals cover the judge's MLPerf mean in at least 90% of the test
rows; where tfscale's point and the hyperbola differ by more than the noise floor (what
tfscale claims beyond the hyperbola: `linear`'s divergence), tfscale's is the closer;
elsewhere tfscale's point is within the noise floor plus 10% of the judge's mean.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAIR = 2  # the run's batch over the base's: a study's 2 replicas
JUDGED = (0.5, 2, 4, 8)  # the judge's batches over the base; 2 is the calibration point
SMOKE = (4,)
DRAWS = 200  # bootstrap draws a row's interval takes
KEPT = ("to_target", "global_batch", "grad_accum_steps", "steps_per_epoch")
PREDICTOR_FROM = 42  # the predictor's first seed, the judge's from 1042 (`--judge-from`)
PREDICTOR_KEPT = ("gradient_noise", "evaluations")  # only the predictor's need them
FLOOR_SLACK = math.log(1.1)  # "within the noise floor plus 10%"

TABLE_MODEL = '''"""The README's model of a user's table (mine.py), compiled with SGD and momentum
at the rate the judge trains it at."""
import keras


def build(spec):
    inputs = keras.Input(shape=(len(spec.numbers),))
    x = keras.layers.Normalization(
        mean=[f.mean for f in spec.numbers], variance=[f.std**2 for f in spec.numbers]
    )(inputs)
    x = keras.layers.Dense(32, activation="relu")(keras.layers.Dense(64)(x))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(
        keras.optimizers.SGD({rate!r}, momentum=0.9), "binary_crossentropy",
        metrics=["accuracy"],
    )
    return model
'''


@dataclass(frozen=True)
class Task:
    """A task the judge trains: its config's changes to params.yaml, the batch and rate
    its base is, its target, its optimizer (as named in the report)."""

    name: str
    optimizer: str
    base_batch: int
    base_rate: float
    target: float
    changes: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.name}-{self.optimizer}"


def _synthetic() -> dict:
    from benchmarks.time_to_accuracy import TASKS

    return TASKS["synthetic"]


TASKS = {
    "synthetic": Task("synthetic", "adam", 32, 0.001, 0.73),
    "digits": Task("digits", "adam", 32, 0.001, 0.96),
    "table": Task("table", "sgd", 16, 0.005, 0.95),
}


def task_params(task: Task, folder: Path) -> dict:
    """params.yaml with the task's changes, its data and store in `folder`, evaluated every
    0.1 epoch to the task's target, for at most 60 epochs (each stops at the target)."""
    from benchmarks.time_to_accuracy import merged

    changes = _synthetic() if task.name == "synthetic" else {}
    if task.name == "table":
        changes = {"prepare": {"dataset": str(folder / "cancer.csv"), "label": "target"}}
    params = merged(yaml.safe_load((ROOT / "params.yaml").read_text()), changes)
    params["prepare"]["data_dir"] = str(folder / "data")
    params["track"]["store_dir"] = str(folder / "mlflow")
    params["train"]["epochs"] = 60
    params["evaluate"].update(every_epochs=0.1, target_accuracy=task.target)
    return params


def prepared(task: Task, folder: Path) -> dict:
    """The task's params, its data prepared in `folder` once (the table written first)."""
    folder.mkdir(parents=True, exist_ok=True)
    params = task_params(task, folder)
    if task.name == "table" and not (folder / "cancer.csv").exists():
        from sklearn.datasets import load_breast_cancer

        load_breast_cancer(as_frame=True).frame.to_csv(folder / "cancer.csv", index=False)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    if not (folder / "data").exists():
        tfscale = str(Path(sys.executable).parent / "tfscale")
        subprocess.run([tfscale, "--params", str(path), "prepare"], cwd=folder, check=True)
    return params


def rule_gain(rule: str, scale: float) -> float:
    """The gain the plan prices a batch `scale` times the base at: the rule's, held at the
    pair's where it would pass it (the highest rate measured to reach the target)."""
    from tfscale.tasks.train.noise_estimates import static_gain

    return min(static_gain(rule, scale), max(static_gain(rule, PAIR), 1.0))


def wanted(task: Task, rule: str, seeds: dict, judged: tuple) -> list[tuple[int, int, float]]:
    """(batch, seed, rate) of every training a (task, rule) needs: the predictor's pair,
    the judge's batches."""
    b = task.base_batch
    out = [(b, s, task.base_rate) for s in seeds["predictor"]]
    out += [(b * PAIR, s, task.base_rate * rule_gain(rule, PAIR)) for s in seeds["predictor"]]
    for scale in judged:
        rate = task.base_rate * rule_gain(rule, scale)
        out += [(round(b * scale), s, rate) for s in seeds["judge"]]
    return out


def train(task: Task, folder: Path, params: dict, key: tuple, keep_all: bool) -> dict:
    """One training to the target on one device; the parts of its metrics.json kept (the
    noise and evaluations only for the predictor's seeds)."""
    from benchmarks.time_to_accuracy import train_to_target

    batch, seed, rate = key
    more = {}
    if task.name == "table":  # the user's compiled SGD sets the rate
        module = folder / f"sgd_lr{rate:.6g}".replace(".", "_").replace("-", "m")
        module = module.with_suffix(".py")
        module.write_text(TABLE_MODEL.format(rate=rate))
        more["model"] = f"{module}:build"
    metrics = train_to_target(
        folder, params, f"{batch}-{seed}-{rate:g}", batch_size_per_replica=batch, seed=seed,
        learning_rate=rate, **more,
    )  # fmt: skip
    kept = KEPT + (PREDICTOR_KEPT if keep_all else ())
    out = {k: v for k, v in metrics.items() if k in kept}
    if "evaluations" in out:
        out["evaluations"] = [
            {"steps": e["steps"], "accuracy": e["accuracy"]} for e in out["evaluations"]
        ]
    return {"task": task.key, "batch": batch, "seed": seed, "rate": rate, **out}


def measure(args: argparse.Namespace, project: Path) -> dict:
    """Every training the asked (task, optimizer, rule)s need, each once, in `project`
    (its finished ones kept), added to `project`/results.json."""
    out = project / "results.json"
    results = json.loads(out.read_text()) if out.exists() else {"trainings": [], "runs": []}
    first = PREDICTOR_FROM if args.predictor_from is None else args.predictor_from
    seeds = {
        "predictor": list(range(first, first + args.seeds)),
        "judge": judge_seeds(args),
    }
    results.update(seeds=seeds, judged=list(SMOKE if args.smoke else args.judged))
    for task in chosen(args):
        folder = project / task.key
        params = prepared(task, folder)
        keys = []
        for rule in args.rules.split(","):
            keys += wanted(task, rule, seeds, tuple(results["judged"]))
            if [task.key, rule] not in results["runs"]:
                results["runs"].append([task.key, rule])
        results["tasks"] = {**results.get("tasks", {}), task.key: asdict(task)}
        done = recorded(results["trainings"])
        keys = [k for k in dict.fromkeys(keys) if (task.key, *k) not in done]
        for i, key in enumerate(keys, 1):
            results["trainings"] = add(results["trainings"], run_one(task, folder, params, key))
            print(progress(task, i, len(keys), results["trainings"][-1]), flush=True)
            out.write_text(json.dumps(results))  # after each: a part cut short reports
    print(f"results: {out}")
    return results


def run_one(task: Task, folder: Path, params: dict, key: tuple) -> dict:
    """`train`, its seconds on the clock kept (0 where it was trained before)."""
    start = time.perf_counter()
    done = train(task, folder, params, key, key[0] in (task.base_batch, task.base_batch * PAIR))
    return {**done, "clock_s": round(time.perf_counter() - start, 1)}


def training_key(t: dict) -> tuple:
    """What tells one training from another: (task, batch, seed, rate)."""
    return t["task"], t["batch"], t["seed"], t["rate"]


def recorded(trainings: list[dict]) -> set[tuple]:
    """The `training_key` of each training results.json holds: a part run on another
    machine from a copy of it (the committed one) trains only what it lacks."""
    return {training_key(t) for t in trainings}


def add(trainings: list[dict], one: dict) -> list[dict]:
    """`trainings` with `one` in place of an earlier record of the same training."""
    return [t for t in trainings if training_key(t) != training_key(one)] + [one]


def progress(task: Task, i: int, n: int, t: dict) -> str:
    reached = t["to_target"]
    return (
        f"[{task.key} {i}/{n}] batch {t['batch']}, seed {t['seed']}, rate {t['rate']:g}: "
        + (f"{reached['steps']:,} steps" if reached.get("reached") else "missed")
        + f", {t['clock_s']:.1f} s"
    )


def chosen(args: argparse.Namespace) -> list[Task]:
    optimizers = args.optimizers.split(",")
    return [TASKS[n] for n in args.tasks.split(",") if TASKS[n].optimizer in optimizers]


def steps_of(t: dict) -> float | None:
    reached = t["to_target"]
    return float(reached["steps"]) if reached.get("reached") else None


def mlperf(values: list[float | None]) -> float:
    """MLPerf's mean (without the fastest and slowest of 3 or more); infinite where a seed
    kept missed the target, NaN where there are none."""
    from tfscale.tasks.train.to_target import over_seeds

    if not values:
        return math.nan
    mean = over_seeds(values).mean
    return math.inf if mean is None else mean


def hyperbola(base_steps: float, pair_steps: float, base: int, batch: float) -> float:
    """McCandlish's two-point hyperbola through the pair alone: B_noise from the steps at
    `base` and twice it (`two_point_noise`), S(b) = S_B (1 + B_noise/b) / (1 + B_noise/B)."""
    from tfscale.tasks.train.noise_estimates import two_point_noise

    noise = two_point_noise(base, base * PAIR, base_steps / pair_steps)
    if math.isinf(noise):
        return base_steps * base / batch
    return base_steps * (1 + noise / batch) / (1 + noise / base)


def quantiles(values: list[float]) -> tuple[float, float]:
    """The 2.5% and 97.5% quantiles of `values` (NaN dropped; none: NaN)."""
    kept = sorted(v for v in values if not math.isnan(v))
    if not kept:
        return math.nan, math.nan
    n = len(kept)
    return kept[int(0.025 * n)], kept[min(int(0.975 * n), n - 1)]


def draw(values: list, rng: random.Random) -> list:
    return [rng.choice(values) for _ in values]


def noise_floor(steps: list[float | None], draws: int, seed: int = 0) -> tuple:
    """The judge against itself: its seeds in halves (the first half against the rest), the
    ratio of their MLPerf means and its bootstrap 95% interval (each half resampled)."""
    half = len(steps) // 2
    a, b = steps[:half], steps[half:]
    rng = random.Random(seed)
    ratios = [mlperf(draw(a, rng)) / mlperf(draw(b, rng)) for _ in range(draws)]
    return (mlperf(a) / mlperf(b), *quantiles(ratios))


def floor_width(floor: tuple) -> float:
    """The noise floor as a half-width in logs: the farther end of the halves' interval."""
    _, low, high = floor
    ends = [abs(math.log(v)) for v in (low, high) if v > 0 and math.isfinite(v)]
    return max(ends) if len(ends) == 2 else math.inf


@dataclass(frozen=True)
class Side:
    """One (task, rule)'s trainings: the predictor's at B and 2B, the judge's by batch."""

    task: dict
    rule: str
    base: list[dict]
    pair: list[dict]
    judge: dict[int, list[dict]]


def side_of(results: dict, key: str, rule: str) -> Side:
    task = results["tasks"][key]
    b, rate = task["base_batch"], task["base_rate"]
    seeds = results["seeds"]

    def trained(batch: int, gain: float, who: str) -> list[dict]:
        return sorted(
            (
                t
                for t in results["trainings"]
                if t["task"] == key and t["batch"] == batch and t["seed"] in seeds[who]
                and math.isclose(t["rate"], rate * gain, rel_tol=1e-5)
            ),
            key=lambda t: t["seed"],
        )  # fmt: skip

    judge = {}
    for scale in results["judged"]:
        batch = round(b * scale)
        judge[batch] = trained(batch, rule_gain(rule, scale), "judge")
    base = trained(b, 1.0, "predictor")
    return Side(task, rule, base, trained(b * PAIR, rule_gain(rule, PAIR), "predictor"), judge)


def study_of(side: Side, base: list[dict], pair: list[dict]) -> dict:
    """The study dict (a run's summary.json) the predictor's seeds make."""
    b = side.task["base_batch"]
    examples = [[s * b if s else None for s in map(steps_of, base)]]
    examples.append([s * b * PAIR if s else None for s in map(steps_of, pair)])
    means = [mlperf(e) for e in examples]
    return {
        "examples_to_target_baseline": means[0] if math.isfinite(means[0]) else None,
        "examples_to_target_distributed": means[1] if math.isfinite(means[1]) else None,
        "examples_to_target_by_seed": examples,
        "target_accuracy": side.task["target"],
        "seeds": len(base),
    }


def plan_pricer(side: Side, base: list[dict], pair: list[dict]) -> Callable | None:
    """The plan's steps at a batch, `(point, low, high)`, priced from these predictor
    trainings (`pricing_of`; the run is the pair's first); None where it cannot price."""
    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.report.plan import pricing_of

    run = pair[0]
    if steps_of(run) is None:
        return None
    metrics = {
        **run,
        "learning_rate": run["rate"],
        "lr_scaling": side.rule,
        "lr_scaling_rule": side.rule,
        "warmup_epochs": 0,  # one device: the rate is the rule's from the first step
        "optimizer": side.task["optimizer"],  # `Gain`: Adam's step is priced as Adam's
    }
    try:
        pricing, _ = pricing_of(metrics, int(steps_of(run)), side.task["base_batch"],
                                study_of(side, base, pair))  # fmt: skip
    except UsageError:
        return None
    return pricing.steps


Pricer = Callable[[Side, list, list], Callable | None]


@dataclass(frozen=True)
class Row:
    """One judged batch: the plan's steps and interval, the judge's mean, the interval of
    log(predicted / measured), the noise floor, the hyperbola and trivial predictors."""

    batch: int
    test: bool  # False: the calibration point
    measured: float
    plan: tuple[float, float, float]
    log_ratio: tuple[float, float]
    floor: tuple[float, float, float]
    hyperbola: float
    inverse: float
    constant: float

    @property
    def covered(self) -> bool:
        return self.plan[1] <= self.measured <= self.plan[2]

    def error(self, predicted: float) -> float:
        return abs(math.log(predicted / self.measured))

    @property
    def claims(self) -> bool:
        """Whether tfscale's point differs from the hyperbola's by more than the floor."""
        return abs(math.log(self.plan[0] / self.hyperbola)) > floor_width(self.floor)

    @property
    def good(self) -> bool:
        """Closer than the hyperbola where it claims; else within the floor plus 10%."""
        if self.claims:
            return self.error(self.plan[0]) < self.error(self.hyperbola)
        return self.error(self.plan[0]) <= floor_width(self.floor) + FLOOR_SLACK


def bootstrap(side: Side, pricer: Pricer, draws: int) -> dict[int, tuple[float, float]]:
    """Per judged batch, the 95% interval of log(predicted / measured) over `draws` draws,
    each resampling the predictor's seeds (and pricing again from them) and the judge's."""
    rng = random.Random(0)
    logs: dict[int, list[float]] = {batch: [] for batch in side.judge}
    for _ in range(draws):
        steps = pricer(side, draw(side.base, rng), draw(side.pair, rng))
        for batch, trainings in side.judge.items():
            measured = mlperf([steps_of(t) for t in draw(trainings, rng)])
            predicted = steps(batch)[0] if steps else math.inf
            logs[batch].append(_log_ratio(predicted, measured))
    return {batch: quantiles(values) for batch, values in logs.items()}


def _log_ratio(predicted: float, measured: float) -> float:
    if math.isinf(predicted) and math.isinf(measured):
        return 0.0
    if measured == 0 or math.isnan(measured) or math.isinf(predicted):
        return math.inf
    return -math.inf if math.isinf(measured) else math.log(predicted / measured)


def rows_of(side: Side, pricer: Pricer = plan_pricer, draws: int = DRAWS) -> list[Row]:
    """The judged batches' rows, from the predictor's seeds as they are."""
    b = side.task["base_batch"]
    steps = pricer(side, side.base, side.pair)
    base = mlperf([steps_of(t) for t in side.base])
    pair = mlperf([steps_of(t) for t in side.pair])
    intervals = bootstrap(side, pricer, draws)
    rows = []
    for batch, trainings in sorted(side.judge.items()):
        measured = [steps_of(t) for t in trainings]
        rows.append(
            Row(
                batch, batch != b * PAIR, mlperf(measured),
                steps(batch) if steps else (math.inf,) * 3, intervals[batch],
                noise_floor(measured, draws), hyperbola(base, pair, b, batch), base * b / batch,
                base,
            )
        )  # fmt: skip
    return rows


def table(side: Side, rows: list[Row]) -> str:
    """The (task, optimizer, rule)'s table, in words."""
    t = side.task
    head = (
        f"{'batch':>6} {'measured':>9} {'plan (95%)':>20} {'cover':>5} {'pred/meas (95%)':>20} "
        f"{'floor (95%)':>18} {'hyperb':>6} {'1/B':>5} {'const':>5}  goal"
    )
    lines = [
        f"\n## {t['name']}, {t['optimizer']}, {side.rule}: base batch {t['base_batch']}, rate "
        f"{t['base_rate']:g}, target {t['target']:g}; predictor {len(side.base)} + "
        f"{len(side.pair)} seeds at {t['base_batch']} and {t['base_batch'] * PAIR}; judge "
        f"{max(map(len, side.judge.values()), default=0)} other seeds a batch; ratios are "
        "predicted / measured",
        head,
        "-" * len(head),
    ]
    for r in rows:
        lines.append(row_text(r))
    return "\n".join(lines)


def row_text(r: Row) -> str:
    point, low, high = r.plan
    lo, hi = (math.exp(v) if math.isfinite(v) else v for v in r.log_ratio)
    goal = "calibration, not a test"
    if r.test:
        goal = ("claims, " if r.claims else "") + ("met" if r.good else "missed")
    parts = [
        f"{r.batch:>6} {r.measured:>9,.0f} {point:>6,.0f} ({low:,.0f}-{high:,.0f})".ljust(37),
        f"{'yes' if r.covered else 'no':>5}",
        f"{point / r.measured:>5.2f} ({lo:.2f}-{hi:.2f})".ljust(20),
        f"{r.floor[0]:>5.2f} ({r.floor[1]:.2f}-{r.floor[2]:.2f})".ljust(18),
        f"{r.hyperbola / r.measured:>6.2f} {r.inverse / r.measured:>5.2f}",
        f"{r.constant / r.measured:>5.2f}  {goal}",
    ]
    return " ".join(parts)


def goals(rows: list[Row]) -> dict[str, tuple[int, int]]:
    """Each goal's (rows meeting it, rows it applies to), over the test rows."""
    tests = [r for r in rows if r.test]
    claims = [r for r in tests if r.claims]
    rest = [r for r in tests if not r.claims]
    return {
        "coverage": (sum(r.covered for r in tests), len(tests)),
        "beats the hyperbola where it claims to": (sum(r.good for r in claims), len(claims)),
        "within the noise floor plus 10% elsewhere": (sum(r.good for r in rest), len(rest)),
    }


def mean_errors(rows: list[Row]) -> str:
    """Beside the goals, which count rows: where tfscale's point claims (differs from the
    hyperbola's by more than the floor), the mean of |log(predicted / measured)| of each
    ('' where no row claims): how far each is off over those rows together."""
    claims = [r for r in rows if r.test and r.claims]
    if not claims:
        return ""
    ours = sum(r.error(r.plan[0]) for r in claims) / len(claims)
    theirs = sum(r.error(r.hyperbola) for r in claims) / len(claims)
    return (
        f"where it claims, the mean |log(predicted / measured)| over {len(claims)} rows: "
        f"tfscale {ours:.3f}, the hyperbola {theirs:.3f}"
    )


def verdicts(counts: dict[str, tuple[int, int]]) -> list[str]:
    """A line per goal, met or missed (coverage: at least 90%; the others: every row)."""
    lines = []
    for name, (met, n) in counts.items():
        if not n:
            lines.append(f"{name}: no test rows yet (train the judged batches): undecided")
            continue
        share = met / n
        ok = share >= 0.9 if name == "coverage" else met == n
        shown = f"{met}/{n}" + (f" ({share:.0%}; goal >= 90%)" if name == "coverage" else "")
        lines.append(f"{name}: {shown}: {'met' if ok else 'missed'}")
    return lines


def report(results: dict, pricer: Pricer = plan_pricer, draws: int = DRAWS) -> list[Row]:
    """Every (task, optimizer, rule)'s table, then the goals over all of their rows."""
    every = []
    for key, rule in results["runs"]:
        side = side_of(results, key, rule)
        missing = untrained(side, results["seeds"])
        if missing:
            print(f"\n## {key}, {rule}: not reported yet, {missing}")
            continue
        rows = rows_of(side, pricer, draws)
        print(table(side, rows))
        every += rows
    print("\n" + "\n".join([*verdicts(goals(every)), *filter(None, [mean_errors(every)])]))
    return every


def pairs_report(saved: dict, args: argparse.Namespace) -> tuple[int, int]:
    """The default's judge (`--pairs N`): N one-seed plans a (task, rule), each priced from
    one predictor seed's pair alone (a study's default: one seed a side), judged against
    the judge's seeds at the judged batches; the rows each plan's 95% interval covers, by
    task and rule and over all, with the share's one-sided 95% lower bound
    (Clopper-Pearson). The calibration point is no test (`goals`); more pairs than the
    results hold predictor seeds are refused (`predictor_seeds`). Returns (covered, rows)."""
    from scipy.stats import beta

    seeds = predictor_seeds(saved, args.pairs, args.predictor_from)["seeds"]["predictor"]
    counts: dict[tuple, list[int]] = {}
    for seed in seeds:
        one = argparse.Namespace(**{**vars(args), "seeds": 1, "predictor_from": seed})
        results = chosen_seeds(saved, one)
        for key, rule in results["runs"]:
            side = side_of(results, key, rule)
            if untrained(side, results["seeds"]):
                continue
            met, n = goals(rows_of(side, plan_pricer, 0))["coverage"]
            count = counts.setdefault((key, rule), [0, 0])
            count[0] += met
            count[1] += n
    for (key, rule), (met, n) in counts.items():
        print(f"{key}, {rule}: {met}/{n} rows covered")
    met, n = (sum(c[i] for c in counts.values()) for i in (0, 1))
    low = beta.ppf(0.05, met, n - met + 1) if met else 0.0
    print(
        f"one-seed plans from predictor seeds {seeds[0]}-{seeds[-1]}: coverage {met}/{n} "
        f"({met / n:.1%}; goal >= 90%), its one-sided 95% lower bound {low:.1%}: "
        f"{'met' if met / n >= 0.9 else 'missed'}"
    )
    return met, n


def untrained(side: Side, seeds: dict) -> str:
    """What a (task, rule) still lacks before its table can be made, in words ('' where
    nothing): a part of the judge reports what it has, and says what it has not."""
    wanted = {"predictor": len(seeds["predictor"]), "judge": len(seeds["judge"])}
    sides = {"the base": (side.base, "predictor"), "the pair": (side.pair, "predictor")}
    sides |= {f"batch {b}": (t, "judge") for b, t in sorted(side.judge.items())}
    short = [
        f"{name} {len(trainings)} of {wanted[who]}"
        for name, (trainings, who) in sides.items()
        if len(trainings) < wanted[who]
    ]
    return f"trained so far: {', '.join(short)}" if short else ""


def chosen_seeds(results: dict, args: argparse.Namespace) -> dict:
    """Saved results as `args` asks to report them: `--seeds` predictor seeds from
    `--predictor-from` (`predictor_seeds`), the judge's `--judge-seeds` from `--judge-from`
    (fresh seeds, trained after a change was chosen on the first ones) at the `--judged`
    batches."""
    results = predictor_seeds(results, args.seeds, args.predictor_from)
    seeds = {**results["seeds"], "judge": judge_seeds(args)}
    return {**results, "seeds": seeds, "judged": args.judged}


def judge_seeds(args: argparse.Namespace) -> list[int]:
    """The judge's seeds: `--judge-seeds` of them from `--judge-from`."""
    return list(range(args.judge_from, args.judge_from + args.judge_seeds))


def predictor_seeds(results: dict, count: int, first: int | None = None) -> dict:
    """`results` as `count` of its predictor seeds alone would give them, from `first` (its
    first by default): saved results may hold more (benchmarks/results/ keeps 10, to tell
    the model's error from the luck of a study's 5, and to judge again from the other 5);
    fewer there than `count` is refused, naming what they hold."""
    predictor = results["seeds"]["predictor"]
    start = predictor.index(first) if first in predictor else 0
    chosen = predictor[start : start + count]
    if first is not None and first not in predictor or len(chosen) < count:
        raise SystemExit(
            f"error: the results hold the predictor seeds {predictor[0]}-{predictor[-1]}, "
            f"not {count} from {predictor[start] if first is None else first}: pass "
            f"--seeds {len(predictor) - start} or fewer, or --predictor-from one of them"
        )
    return {**results, "seeds": {**results["seeds"], "predictor": chosen}}


def _scales(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--optimizers", default="adam,sgd")
    parser.add_argument("--rules", default="linear,sqrt")
    parser.add_argument("--seeds", type=int, default=5, help="the predictor's seeds")
    parser.add_argument(
        "--predictor-from",
        type=int,
        help=f"the predictor's first seed ({PREDICTOR_FROM} to train; saved results': theirs)",
    )
    parser.add_argument("--judge-seeds", type=int, default=10)
    parser.add_argument("--judge-from", type=int, default=1042, help="the judge's first seed")
    parser.add_argument(
        "--judged", type=_scales, default=list(JUDGED), help="batches over the base: 0.5,4,8"
    )
    parser.add_argument("--draws", type=int, default=DRAWS)
    parser.add_argument("--smoke", action="store_true", help="one judged batch (4B)")
    parser.add_argument("--results", type=Path, help="a results.json to report, training none")
    parser.add_argument(
        "--pairs", type=int, help="with --results: judge this many one-seed plans a task and rule"
    )
    parser.add_argument("--project", type=Path, help="go on with an earlier run's trainings")
    args = parser.parse_args()
    if args.results and args.pairs:
        pairs_report(json.loads(args.results.read_text()), args)
        return
    if args.results:
        results = chosen_seeds(json.loads(args.results.read_text()), args)
    else:
        project = args.project or Path(tempfile.mkdtemp(prefix="tfscale-judge-"))
        results = measure(args, project)
    report(results, draws=args.draws)


if __name__ == "__main__":
    main()
