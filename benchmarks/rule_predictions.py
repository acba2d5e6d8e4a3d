"""Benchmark: the predicted steps to a target, judged on seeds the predictor never saw.

On the synthetic task of known difficulty (`benchmarks/time_to_accuracy.py`), for each
learning-rate rule (`linear`, `sqrt`) it trains, on one device, each with its own seeds:
- the predictor, as a study has it: 5 seeds at global batch 32 (the base rate 0.001) and
  5 at 64 with the rule's rate (a study's baseline and its 2 replicas' run);
- the judge: 5 other seeds at global batches 16, 32, 64, 128 and 256, the rate scaled
  from 32's by the rule.
Every training evaluates the held-out split every 0.1 epoch (a crossing known to about
2% of the examples to it) and stops at the target. From the predictor alone it predicts
the steps at each batch as `tfscale plan` does (`tasks.measure.noise_trajectory.rule_steps`:
each batch-32 seed's steps along its own noise scale, at the rate the rule gives the
batch, with the base rate's headroom calibrated from the predictor's MLPerf means at 32
and 64; then the MLPerf mean over the seeds) and prints them beside the judge's MLPerf
mean (its seeds' range), their ratio, and the two trivial predictors: steps falling as
1/B (perfect scaling) and steps constant.

    uv run python benchmarks/rule_predictions.py [--seeds 5] [--rules linear,sqrt]
        [--results FILE]   # print from a saved run's results, training nothing
        [--project DIR]    # go on with an earlier run's project, its trainings kept

Targets: predicted/measured within 0.83-1.2 at every batch for each rule reported, and
closer to 1 than both trivial predictors at 128 and 256.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASE, PAIR = 32, 64  # the predictor's batches: the baseline's, its 2 replicas'
JUDGED = (16, 32, 64, 128, 256)
BASE_RATE = 0.001
KEPT = ("to_target", "gradient_noise", "global_batch", "grad_accum_steps", "steps_per_epoch")


def gain(rule: str, batch: int) -> float:
    return batch / BASE if rule == "linear" else math.sqrt(batch / BASE)


def train(project: Path, params: dict, batch: int, seed: int, rate: float) -> dict:
    """One training to the target on one device; the parts of its metrics.json kept."""
    from benchmarks.time_to_accuracy import train_to_target

    metrics = train_to_target(
        project, params, f"{batch}-{seed}-{rate:g}", batch_size_per_replica=batch, seed=seed,
        learning_rate=rate,
    )  # fmt: skip
    kept = {k: v for k, v in metrics.items() if k in KEPT}
    return {"batch": batch, "seed": seed, "rate": rate, **kept}


def measure(seeds: int, rules: list[str], project: Path | None = None) -> dict:
    """Every training the table needs, each once (batch 32 is every rule's), in `project`
    (default: a new temporary one; an earlier one's finished trainings are kept)."""
    from benchmarks.time_to_accuracy import TASKS, merged

    project = project or Path(tempfile.mkdtemp(prefix="tfscale-judge-"))
    params = merged(yaml.safe_load((ROOT / "params.yaml").read_text()), TASKS["synthetic"])
    params["prepare"]["data_dir"] = str(project / "data")
    params["track"]["store_dir"] = str(project / "mlflow")
    params["train"]["epochs"] = 40
    params["evaluate"]["every_epochs"] = 0.1
    prepared = project / "params.yaml"
    prepared.write_text(yaml.safe_dump(params))
    tfscale = str(Path(sys.executable).parent / "tfscale")
    if not (project / "data").exists():
        subprocess.run([tfscale, "--params", str(prepared), "prepare"], cwd=project, check=True)
    predictor_seeds = list(range(42, 42 + seeds))
    judge_seeds = list(range(1042, 1042 + seeds))
    done: dict[tuple[int, int, float], dict] = {}
    wanted = [(BASE, s, BASE_RATE) for s in predictor_seeds]
    for rule in rules:
        wanted += [(PAIR, s, BASE_RATE * gain(rule, PAIR)) for s in predictor_seeds]
        wanted += [(b, s, BASE_RATE * gain(rule, b)) for b in JUDGED for s in judge_seeds]
    for i, key in enumerate(dict.fromkeys(wanted), 1):
        done[key] = train(project, params, *key)
        reached = done[key]["to_target"]
        print(
            f"[{i}/{len(set(wanted))}] batch {key[0]}, seed {key[1]}, rate {key[2]:g}: "
            + (f"{reached['steps']:,} steps" if reached.get("reached") else "missed"),
            flush=True,
        )
    results = {
        "seeds": {"predictor": predictor_seeds, "judge": judge_seeds},
        "rules": rules,
        "trainings": list(done.values()),
    }
    out = project / "results.json"
    out.write_text(json.dumps(results))
    print(f"results: {out}")
    return results


def mlperf(values: list[float | None]) -> tuple[float | None, float, float]:
    """The mean without the fastest and slowest (of 3 or more), and the kept range."""
    from tasks.train.to_target import over_seeds

    over = over_seeds(values)
    return over.mean, over.low, over.high


def predictor(
    results: dict, rule: str
) -> tuple[list, list[int], tuple[float | None, float], float]:
    """The predictor's seeds at 32 (each one's trajectory and steps), the headroom and noise
    factor their MLPerf means at 32 and 64 imply for `rule` (`calibrated`, as `tfscale
    plan` calibrates), and their noise scale (the mean of the seeds' headlines)."""
    from tasks.measure.noise_trajectory import split_examples, trajectory
    from tasks.train.noise_estimates import calibrated, planned_gain

    seeds, trainings = results["seeds"]["predictor"], results["trainings"]
    base = [t for t in trainings if t["batch"] == BASE and t["seed"] in seeds]
    base = [t for t in base if t["to_target"].get("reached")]
    paths = [trajectory(t["gradient_noise"], examples=split_examples(t)) for t in base]
    steps = [int(t["to_target"]["steps"]) for t in base]
    phi = sum(p.headline("raw", s)[1] for p, s in zip(paths, steps, strict=True)) / len(paths)
    pair_rate = BASE_RATE * gain(rule, PAIR)
    pair = [
        t["to_target"].get("steps")
        for t in trainings
        if t["batch"] == PAIR
        and t["seed"] in seeds
        and math.isclose(t["rate"], pair_rate, rel_tol=1e-5)
    ]
    base_mean, pair_mean = mlperf(steps)[0], mlperf(pair)[0]
    calibration: tuple[float | None, float] = (None, 1.0)
    if base_mean and pair_mean:
        rule_gain = planned_gain(rule, PAIR / BASE, phi, BASE)
        calibration = calibrated(phi, BASE, PAIR, lambda _: rule_gain, base_mean / pair_mean)
    return paths, steps, calibration, phi


def report(results: dict) -> bool:
    from tasks.measure.noise_trajectory import rule_steps

    trainings, judge = results["trainings"], results["seeds"]["judge"]
    met = True
    for rule in results["rules"]:
        paths, steps, (headroom, factor), phi = predictor(results, rule)
        base_steps = mlperf(steps)[0]
        shown = "none" if headroom is None else f"{headroom:.2f}, noise factor {factor:.2f}"
        print(
            f"\n## {rule}: predictor {len(steps)} seeds at {BASE} ({base_steps:,.0f} steps, "
            f"MLPerf mean; noise scale {phi:,.0f}), headroom from the pair at {PAIR}: {shown}; "
            f"judged on {len(judge)} other seeds"
        )
        head = (
            f"{'batch':>6} {'rate':>7} {'measured steps':>22} {'predicted':>10} {'ratio':>6} "
            f"{'1/B ratio':>9} {'constant':>9}"
        )
        print(head + "\n" + "-" * len(head))
        for batch in JUDGED:
            rate = BASE_RATE * gain(rule, batch)
            measured, low, high = mlperf(
                [
                    t["to_target"]["steps"] if t["to_target"].get("reached") else None
                    for t in trainings
                    if t["batch"] == batch
                    and t["seed"] in judge
                    and math.isclose(t["rate"], rate, rel_tol=1e-5)
                ]
            )
            each = [
                rule_steps(path, n, BASE, batch, rule, headroom, factor).steps
                for path, n in zip(paths, steps, strict=True)
            ]
            finite = [p for p in each if p is not None and math.isfinite(p)]
            predicted = mlperf(finite)[0] if len(finite) == len(each) else math.inf
            said = "never" if not math.isfinite(predicted) else f"{predicted:,.0f}"
            if measured is None:
                print(f"{batch:>6} {rate:>7.2g} {'missed by a seed':>22} {said:>10}")
                met = met and not math.isfinite(predicted)
                continue
            ratio = predicted / measured
            inverse = base_steps * BASE / batch / measured
            constant = base_steps / measured
            print(
                f"{batch:>6} {rate:>7.2g} {measured:>10,.0f} ({low:,.0f}-{high:,.0f}) "
                f"{said:>10} {ratio:>6.2f} {inverse:>9.2f} {constant:>9.2f}"
            )
            ok = 0.83 <= ratio <= 1.2
            if batch >= 128:
                ok = ok and abs(math.log(ratio)) < min(
                    abs(math.log(inverse)), abs(math.log(constant))
                )
            met = met and ok
    print(
        "\npredicted/measured within 0.83-1.2 at every batch, and closer than both trivial "
        f"predictors at 128 and 256: {'met' if met else 'missed'}"
    )
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rules", default="linear,sqrt")
    parser.add_argument("--results", type=Path, help="a results.json to report, training none")
    parser.add_argument("--project", type=Path, help="go on with an earlier run's trainings")
    args = parser.parse_args()
    if args.results:
        results = json.loads(args.results.read_text())
    else:
        results = measure(args.seeds, args.rules.split(","), args.project)
    report(results)


if __name__ == "__main__":
    main()
