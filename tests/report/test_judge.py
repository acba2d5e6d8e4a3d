"""The judge of `tfscale plan`'s steps (`benchmarks/rule_predictions.py`), on results built
by hand: steps that follow McCandlish's hyperbola S(b) = 100 (1 + 64/b) exactly (300 at
32, 200 at 64, 500 at 16, 150 at 128, 125 at 256), and a stand-in for the plan whose
points and intervals are set here, so that every figure the report gives is worked by
hand. No training."""

from __future__ import annotations

import json
import math
import sys

import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import rule_predictions as judge  # noqa: E402

pytestmark = pytest.mark.unit

KEY = "toy-adam"


def _training(batch: int, seed: int, steps: int | None, gain: float) -> dict:
    reached = {"reached": steps is not None, "steps": steps}
    return {"task": KEY, "batch": batch, "seed": seed, "rate": 0.001 * gain, "to_target": reached}


def _results() -> dict:
    """sqrt's rates (the pair's gain, 1.414, holds at 4x and 8x: the plan's cap); the judge's
    seeds at 128 spread 140-170, elsewhere on the hyperbola."""
    root2 = math.sqrt(2)
    trainings = [_training(32, s, 300, 1.0) for s in (1, 2, 3)]
    trainings += [_training(64, s, 200, root2) for s in (1, 2, 3)]
    judged = {16: ([500] * 4, math.sqrt(0.5)), 64: ([200] * 4, root2)}
    judged |= {128: ([140, 150, 160, 170], root2), 256: ([125] * 4, root2)}
    for batch, (steps, gain) in judged.items():
        seeds = zip((11, 12, 13, 14), steps, strict=True)
        trainings += [_training(batch, s, n, gain) for s, n in seeds]
    task = {"name": "toy", "optimizer": "adam", "base_batch": 32, "base_rate": 0.001}
    return {
        "tasks": {KEY: task | {"target": 0.7}},
        "seeds": {"predictor": [1, 2, 3], "judge": [11, 12, 13, 14]},
        "judged": [0.5, 2, 4, 8],
        "runs": [[KEY, "sqrt"]],
        "trainings": trainings,
    }


# the plan's stand-in: its points on the hyperbola; its intervals +-10%, except at 256
# (50-90% of its point: it misses the judge's 125) and at 64 (missing too: the calibration
# point, which no goal counts)
INTERVALS = {16: (0.9, 1.1), 64: (0.05, 0.1), 128: (0.9, 1.1), 256: (0.5, 0.9)}


def _plan(side, base, pair):
    def steps(batch):
        point = 100 * (1 + 64 / batch)
        low, high = INTERVALS[batch]
        return point, point * low, point * high

    return steps


def _rows() -> list:
    side = judge.side_of(_results(), KEY, "sqrt")
    return judge.rows_of(side, _plan, draws=50)


def test_the_judge_finds_each_batchs_trainings_at_the_rate_the_plan_prices():
    side = judge.side_of(_results(), KEY, "sqrt")
    assert [len(side.base), len(side.pair)] == [3, 3]
    assert {b: len(t) for b, t in side.judge.items()} == {16: 4, 64: 4, 128: 4, 256: 4}


def test_the_hyperbola_through_the_pair_alone_gives_the_hyperbola_back():
    # 300 at 32 over 200 at 64: m = 1.5, B_noise = 0.5 / (1/32 - 1.5/64) = 64;
    # S(b) = 300 (1 + 64/b) / (1 + 64/32) = 100 (1 + 64/b)
    rows = {r.batch: r for r in _rows()}
    assert {b: round(r.hyperbola, 9) for b, r in rows.items()} == {
        16: 500,
        64: 200,
        128: 150,
        256: 125,
    }
    assert rows[128].inverse == 75  # 300 x 32 / 128
    assert rows[128].constant == 300


def test_the_hyperbola_of_a_pair_that_scaled_perfectly_falls_as_one_over_the_batch():
    assert judge.hyperbola(300, 150, 32, 256) == 300 * 32 / 256  # B_noise infinite
    assert judge.hyperbola(300, 300, 32, 256) == 300  # B_noise 0


def test_the_noise_floor_is_the_judges_halves_against_each_other():
    # halves 140, 150 and 160, 170: each of 2 seeds keeps both, means 145 and 165
    floor, low, high = judge.noise_floor([140, 150, 160, 170], draws=200)
    assert floor == pytest.approx(145 / 165)
    # a draw's half means lie in 140-150 and 160-170: the ratio within 140/170-150/160
    assert 140 / 170 <= low <= floor <= high <= 150 / 160


def test_the_judges_mean_is_mlperfs_and_its_seeds_on_the_hyperbola_agree_exactly():
    rows = {r.batch: r for r in _rows()}
    assert rows[128].measured == 155  # 140 and 170 dropped
    assert rows[16].floor == (1.0, 1.0, 1.0)
    assert rows[16].log_ratio == (0.0, 0.0)  # 500 predicted on every draw, 500 measured


def test_coverage_counts_the_tests_and_never_the_calibration_point():
    rows = _rows()
    assert [(r.batch, r.test, r.covered) for r in rows] == [
        (16, True, True),  # 450-550 holds 500
        (64, False, False),  # 10-20 misses 200, but 64 is the pair's own batch
        (128, True, True),  # 135-165 holds 155
        (256, True, False),  # 62.5-112.5 misses 125
    ]
    counts = judge.goals(rows)
    assert counts["coverage"] == (2, 3)
    assert judge.verdicts(counts)[0] == "coverage: 2/3 (67%; goal >= 90%): missed"


def test_the_calibration_row_says_it_is_not_a_test():
    side = judge.side_of(_results(), KEY, "sqrt")
    lines = judge.table(side, _rows()).splitlines()
    (row,) = [line for line in lines if line.split()[:1] == ["64"]]
    assert row.endswith("calibration, not a test")


def test_a_point_on_the_hyperbola_claims_nothing_and_is_judged_by_the_floor():
    rows = _rows()
    assert not any(r.claims for r in rows)
    counts = judge.goals(rows)
    assert counts["beats the hyperbola where it claims to"] == (0, 0)
    # each within its floor plus 10%: at 128, |log(150/155)| = 0.033 < log 1.1
    assert counts["within the noise floor plus 10% elsewhere"] == (3, 3)


def test_a_point_away_from_the_hyperbola_claims_and_must_beat_it():
    # tfscale 100 and the hyperbola 150, against a floor of 0.95-1.05: |log(100/150)| =
    # 0.41 > |log 0.95| = 0.051, a claim; measured 100: tfscale's error 0, the hyperbola's
    # 0.41
    row = judge.Row(256, True, 100, (100, 90, 110), (0.0, 0.0), (1.0, 0.95, 1.05), 150, 40, 300)
    assert row.claims and row.good
    wrong = judge.Row(256, True, 150, (100, 90, 110), (0.0, 0.0), (1.0, 0.95, 1.05), 150, 40, 300)
    assert wrong.claims and not wrong.good
    counts = judge.goals([row, wrong])
    assert judge.verdicts(counts)[1] == "beats the hyperbola where it claims to: 1/2: missed"
    # measured 100 and 120: tfscale's errors 0 and |log(100/120)| = 0.182, the
    # hyperbola's |log(150/100)| = 0.405 and |log(150/120)| = 0.223
    near = judge.Row(256, True, 120, (100, 90, 110), (0.0, 0.0), (1.0, 0.95, 1.05), 150, 40, 300)
    assert judge.mean_errors([row, near]) == (
        "where it claims, the mean |log(predicted / measured)| over 2 rows: "
        "tfscale 0.091, the hyperbola 0.314"
    )
    assert judge.mean_errors(_rows()) == ""  # no row claims


def test_a_goal_with_no_test_rows_is_undecided_not_missed():
    """A part run that trained only the calibration point has no test row: its goals say
    so, where a share of 0/0 printed 'nan%: missed'."""
    assert judge.verdicts({"coverage": (0, 0)}) == [
        "coverage: no test rows yet (train the judged batches): undecided"
    ]
    assert judge.verdicts({"coverage": (9, 10)}) == ["coverage: 9/10 (90%; goal >= 90%): met"]


def test_a_part_resumed_from_the_kept_results_trains_only_what_they_lack():
    """A part run from a copy of the committed results.json: each (batch, seed, rate) the
    judge wants is found there when its rate is computed as the judge computes it, so the
    part trains none of them again; a seed the file lacks is still wanted."""
    task = judge.TASKS["synthetic"]
    seeds = {"predictor": [42, 43], "judge": [1042]}
    wanted = judge.wanted(task, "sqrt", seeds, (0.5, 2, 4, 8))
    kept = [{"task": task.key, "batch": b, "seed": s, "rate": r} for b, s, r in wanted]
    have = judge.recorded(json.loads(json.dumps(kept)))  # as read back from the file
    assert all((task.key, *key) in have for key in wanted)
    more = judge.wanted(task, "sqrt", {**seeds, "judge": [1042, 1043]}, (0.5, 2, 4, 8))
    assert [k for k in more if (task.key, *k) not in have] == [
        (16, 1043, task.base_rate * judge.rule_gain("sqrt", 0.5)),
        (64, 1043, task.base_rate * judge.rule_gain("sqrt", 2)),
        (128, 1043, task.base_rate * judge.rule_gain("sqrt", 4)),
        (256, 1043, task.base_rate * judge.rule_gain("sqrt", 8)),
    ]


def test_a_part_reports_what_it_has_and_says_what_it_lacks(capsys):
    """A second rule whose predictor never trained, and the first's batch 256 with one
    seed of four: neither is reported, each says what it lacks; no error."""
    results = _results()
    results["runs"].append([KEY, "linear"])
    results["trainings"] = [t for t in results["trainings"] if t["batch"] != 256 or t["seed"] == 11]
    assert judge.report(results, _plan, draws=20) == []
    out = capsys.readouterr().out
    assert "toy-adam, sqrt: not reported yet, trained so far: batch 256 1 of 4" in out
    assert "toy-adam, linear: not reported yet, trained so far: the base 3 of 3" not in out
    assert "the pair 0 of 3" in out


def test_saved_results_are_reported_at_the_predictor_seeds_asked():
    """Saved results with 3 predictor seeds reported at 2: the pair's MLPerf mean (hence the
    hyperbola) is the first two seeds' mean, 300 steps with seed 2 at 400; with all three it
    is their middle one, 200; from seed 2, seeds 2 and 3; more seeds than the results hold
    from there, or a first seed they do not hold, are refused."""
    results = _results()
    results["trainings"] = [
        t | {"to_target": {"reached": True, "steps": 400}}
        if (t["batch"], t["seed"]) == (64, 2) else t
        for t in results["trainings"]
    ]  # fmt: skip
    two = judge.predictor_seeds(results, 2)
    assert two["seeds"] == {"predictor": [1, 2], "judge": [11, 12, 13, 14]}
    assert results["seeds"]["predictor"] == [1, 2, 3]  # the saved results as they were
    pair = judge.side_of(two, KEY, "sqrt").pair
    assert [t["seed"] for t in pair] == [1, 2]
    assert judge.mlperf([judge.steps_of(t) for t in pair]) == 300
    every = judge.side_of(results, KEY, "sqrt").pair
    assert judge.mlperf([judge.steps_of(t) for t in every]) == 200  # of 3: the middle one
    with pytest.raises(SystemExit, match="seeds 1-3, not 4 from 1: pass --seeds 3 or fewer"):
        judge.predictor_seeds(results, 4)
    later = judge.predictor_seeds(results, 2, first=2)  # `--predictor-from 2 --seeds 2`
    assert later["seeds"]["predictor"] == [2, 3]
    pair = judge.side_of(later, KEY, "sqrt").pair
    assert judge.mlperf([judge.steps_of(t) for t in pair]) == 300  # (400 + 200)/2
    with pytest.raises(SystemExit, match="not 2 from 3: pass --seeds 1 or fewer"):
        judge.predictor_seeds(results, 2, first=3)
    with pytest.raises(SystemExit, match="not 2 from 7: .* or --predictor-from one of them"):
        judge.predictor_seeds(results, 2, first=7)


def test_fresh_judge_seeds_are_reported_alone_at_the_batches_asked():
    """`--judge-from 13 --judge-seeds 2 --judged 0.5,4`: the judge's seeds 13 and 14 only,
    at 16 and 128 (128's seeds 13 and 14 needed 160 and 170: their mean 165, not the four's
    MLPerf mean 155), and no calibration row."""
    import argparse

    args = argparse.Namespace(
        seeds=3, predictor_from=None, judge_from=13, judge_seeds=2, judged=[0.5, 4.0]
    )
    chosen = judge.chosen_seeds(_results(), args)
    assert chosen["seeds"] == {"predictor": [1, 2, 3], "judge": [13, 14]}
    rows = judge.rows_of(judge.side_of(chosen, KEY, "sqrt"), _plan, draws=20)
    assert [(r.batch, r.measured) for r in rows] == [(16, 500), (128, 165)]
    assert all(r.test for r in rows)


def test_the_default_is_judged_as_one_seed_plans_from_each_predictor_seed(capsys):
    """`--pairs 10` on the saved results: each of the predictor seeds 42-51 alone prices a
    one-seed plan (a study's default), judged on the judge's seeds 1042-1051 at 0.5x, 4x and
    8x the base batch: 3 rows x 6 (task, rule) x 10 = 180. On 2026-12-04 (the rate held at
    the cap by the pair's own hyperbola too, and one seed's spread the judge's pooled 37%)
    161 of 180 rows were covered; at the 13% and the hyperbola's 1/B before, 139 (77%)."""
    import argparse

    saved = json.loads((ROOT / "benchmarks" / "results" / "rule_predictions.json").read_text())
    args = argparse.Namespace(
        pairs=10, predictor_from=None, judge_seeds=10, judge_from=1042, judged=[0.5, 4, 8]
    )
    assert judge.pairs_report(saved, args) == (161, 180)
    out = capsys.readouterr().out
    assert "predictor seeds 42-51: coverage 161/180 (89.4%; goal >= 90%)" in out
    assert "its one-sided 95% lower bound 84.9%" in out
