"""Alternating rounds and their spreads, on synthetic timings: a slow spell falls on every
configuration alike, and a ratio taken round by round cancels it."""

from __future__ import annotations

import pytest
from helpers import scaled

from tfscale.tasks.measure.rounds import (
    RoundsEnded,
    Settling,
    Spread,
    alternate,
    block_steps,
    interval_95,
    least_rounds,
    log_t_interval,
    ratio,
    ratio_interval,
    t_975,
)


def test_calls_alternate_after_a_warm_up_round_that_is_dropped():
    order = []

    def call(name: str, value: float):
        return lambda: order.append(name) or value

    values = alternate({"a": call("a", 1.0), "b": call("b", 2.0)}, rounds=3)
    assert order == ["a", "b"] * 4  # one warm-up round, then three
    assert values == {"a": [1.0] * 3, "b": [2.0] * 3}


def test_a_slow_spell_moves_both_configurations_and_not_their_ratio():
    """The machine runs at 100%, 70% and 100% speed over three rounds: each figure
    spreads by 30%, the speedup taken round by round not at all."""
    speed = iter([1.0, 1.0, 1.0, 1.0, 0.7, 0.7, 1.0, 1.0])  # warm-up round first
    values = alternate({"one": lambda: 1000 * next(speed), "two": lambda: 1500 * next(speed)}, 3)
    assert Spread.of(values["one"]) == Spread(1000.0, 700.0, 1000.0)
    assert ratio(values["two"], values["one"]) == Spread(pytest.approx(1.5), 1.5, 1.5)


def test_a_ratio_is_of_the_medians_and_spreads_as_its_rounds():
    """1,500, 1,200 and 1,600 over 1,000, 800 and 1,000: 1,500 / 1,000 = 1.5 (what the
    figures beside it give), between the rounds' own 1.5, 1.5 and 1.6."""
    assert ratio([1500.0, 1200.0, 1600.0], [1000.0, 800.0, 1000.0]) == Spread(1.5, 1.5, 1.6)
    # the rounds' own ratios 3, 0.5, 0.5 and 3: their median 1.75, where the ratio of the
    # medians (2.5 / 2.5) would say 1.0
    assert ratio([3.0, 1.0, 2.0, 9.0], [1.0, 2.0, 4.0, 3.0]) == Spread(1.75, 0.5, 3.0)


def test_a_spread_reads_as_median_and_range_and_says_what_it_supports():
    spread = Spread.of([1.15, 1.27, 1.21, 1.19, 1.24])
    assert spread.text() == "1.21x (1.15-1.27)"
    assert Spread.of([1290.0, 1340.0, 1380.0]).text(" ex/s", 0) == "1,340 ex/s (1,290-1,380)"
    assert spread.above(1.1) and not spread.above(1.2)
    assert spread.below(1.3) and not spread.below(1.2)
    assert spread.holds(1.2) and not spread.holds(1.3)
    with pytest.raises(ValueError):
        Spread.of([])
    with pytest.raises(ValueError):
        alternate({"a": lambda: 1.0}, rounds=0)


def test_an_interval_needs_six_rounds_and_holds_the_ratio_of_the_medians():
    """Below 6 rounds no interval of a median reaches 95% (the lowest and highest of 5
    hold it 93.8% of the time); from 6 on, the interval is about the figure reported:
    1,500 over 1,000 is 1.5 whatever the draws."""
    assert least_rounds() == 6 and least_rounds(0.9) == 5
    assert ratio_interval([1.0] * 5, [1.0] * 5) is None
    run = [1500.0, 1480.0, 1530.0, 1510.0, 1490.0, 1520.0]
    interval = ratio_interval(run, [1000.0] * 6)
    assert interval.median == 1.505 and 1.48 <= interval.low < 1.505 < interval.high <= 1.53
    assert ratio_interval(run, [1000.0] * 6) == interval  # seeded: the same rounds, the same


def test_students_t_at_97_5_percent_is_the_tables_and_the_normals_past_30():
    """t(0.975) for 1, 4 and 30 degrees of freedom, as printed in any table (scipy's
    t.ppf(0.975, df): 12.7062, 2.7764, 2.0423), and 1.96 from 31 on."""
    assert (t_975(1), t_975(4), t_975(30), t_975(31)) == (12.706, 2.776, 2.042, 1.96)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_975(0)


def test_a_few_rounds_give_a_t_interval_on_their_logs_not_their_range():
    """Three rounds at 1.2 e^-0.1, 1.2 and 1.2 e^0.1: their logs' mean is log 1.2 and
    their sd 0.1, so the 95% t-interval (t at 2 degrees of freedom 4.303) is
    1.2 e^(+-4.303 x 0.1 / sqrt 3) = 1.2 e^(+-0.24843) = 0.9360-1.5384, where the range,
    1.0858-1.3262, holds the median only 75% of the time (1 - 2/2^3). Two rounds: t 12.706
    on the half-difference of their logs; one round, no interval."""
    import math

    three = [1.2 * math.exp(-0.1), 1.2, 1.2 * math.exp(0.1)]
    spread, kind = interval_95(three, "rounds")
    ends = (spread.median, spread.low, spread.high)
    assert ends == pytest.approx((1.2, 0.9360, 1.5384), abs=1e-4)
    assert kind == "a 95% t-interval on the logs of 3 rounds, too few for the median's"
    # logs 0 and 0.2: mean 0.1, sd 0.2 / sqrt 2, over sqrt 2: 0.1; x 12.706: e^(0.1 +- 1.2706)
    two = log_t_interval([1.0, math.exp(0.2)])
    assert (two.low, two.high) == pytest.approx((math.exp(-1.1706), math.exp(1.3706)))
    assert interval_95([1.2], "rounds") is None and log_t_interval([1.2]) is None
    # from 6 rounds, the order statistics' interval: the lowest and highest of 6 (96.9%)
    six = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    over_six = (Spread(1.25, 1.0, 1.5), "the median's 95% interval over 6 rounds")
    assert interval_95(six, "rounds") == over_six


def test_the_speedups_interval_narrows_with_rounds_where_the_range_only_widens():
    """Rounds at 1.2-1.3x and one at 0.8x (another process took the machine for a block):
    the range of the rounds crosses 1, the 95% interval does not; and twice the rounds
    from the same machine give a narrower interval, where the range cannot narrow."""
    ratios = [1.20, 1.25, 1.22, 1.30, 1.24, 0.80, 1.26, 1.23, 1.21, 1.28, 1.27, 1.225]
    base = [1000.0] * len(ratios)
    run = [1000.0 * r for r in ratios]
    assert ratio(run, base).low == 0.8
    interval = ratio_interval(run, base)
    assert interval.above(1.0) and interval.median == pytest.approx(1.235)
    assert (interval.low, interval.high) == (1.21, 1.27)  # ranks 3 and 10 of the 12 sorted
    assert interval.high - interval.low < 0.1
    doubled = ratio_interval(run * 2, base * 2)
    assert doubled.high - doubled.low < interval.high - interval.low
    assert ratio(run * 2, base * 2) == ratio(run, base)  # the range: no narrower


def test_a_slow_spell_shared_by_both_sides_of_a_round_leaves_the_interval_narrow():
    """The machine's speed moves 30% from round to round, both configurations alike: each
    throughput spreads, their ratio does not, and the paired draws keep it that way."""
    speed = [1.0, 0.7, 0.9, 1.0, 0.75, 0.85, 0.95, 0.8]
    interval = ratio_interval([1500.0 * v for v in speed], [1000.0 * v for v in speed])
    assert interval == Spread(pytest.approx(1.5), pytest.approx(1.5), pytest.approx(1.5))


def test_rounds_stop_once_the_interval_is_as_narrow_as_aimed():
    """Rounds within 1.19-1.21: settled at the sixth, the first round an interval exists;
    before it, always go on."""
    rule = Settling(aim=0.03, cap=25)
    speedups = [1.20, 1.21, 1.19, 1.20, 1.21, 1.19, 1.40]
    assert [rule.check(speedups[: n + 1]) for n in range(5)] == [None] * 5
    verdict = rule.check(speedups[:6])
    assert verdict is not None and (verdict.rounds, verdict.ended_by) == (6, "precision")
    assert verdict.half_width <= 0.01 / 1.20 + 1e-9
    assert verdict.low >= 1.19 and verdict.high <= 1.21 and verdict.median == 1.20
    assert verdict.text("the speedup") == (
        f"until the speedup was known to +-{verdict.half_width:.1%} (95% confidence)"
    )
    # the same on a ratio: 6 rounds of two configurations 1.2x apart, round by round
    base = [1000.0, 900.0, 1100.0, 950.0, 1050.0, 1000.0]
    assert rule.check([1.2 * b for b in base], base).ended_by == "precision"


def test_rounds_go_on_while_the_interval_is_wide_and_stop_at_the_cap_saying_so():
    """Rounds spread 1.0-1.4: the interval stays wider than +-3%, so the rounds go on to
    the cap, which ends them with the precision reached beside the one aimed at."""
    spread = [1.0, 1.4, 1.1, 1.3, 1.2, 1.05, 1.35, 1.15, 1.25, 1.2]
    rule = Settling(aim=0.03, cap=10)
    assert all(rule.check(spread[: n + 1]) is None for n in range(9))
    verdict = rule.check(spread)
    assert (verdict.rounds, verdict.ended_by) == (10, "cap") and verdict.half_width > 0.03
    assert verdict.text("the speedup").startswith("the most allowed: the speedup known to +-")
    assert verdict.text("the speedup").endswith("aimed at +-3%")


def test_a_cap_below_what_the_interval_needs_says_there_was_none():
    verdict = Settling(aim=0.03, cap=3).check([1.2, 1.2, 1.2])
    assert (verdict.rounds, verdict.ended_by, verdict.half_width) == (3, "cap", None)
    assert "too few for the speedup's interval (it needs 6 rounds)" in verdict.text("the speedup")
    # aim 0: a fixed count, however narrow the interval
    fixed = Settling(aim=0.0, cap=8)
    assert fixed.check([1.2] * 7) is None
    assert fixed.check([1.2] * 8).text() == (
        "a fixed count: the figure known to +-0.0% (95% confidence)"
    )
    assert RoundsEnded(**fixed.check([1.2] * 8).to_dict()) == fixed.check([1.2] * 8)


def test_alternate_stops_after_the_round_its_rule_settles():
    """`settled` is asked after each timed round, never after the warm-up."""
    seen = []

    def settled(values):
        seen.append(len(values["a"]))
        return len(values["a"]) == 4

    values = alternate({"a": lambda: 1.0, "b": lambda: 2.0}, rounds=10, settled=settled)
    assert seen == [1, 2, 3, 4] and values == {"a": [1.0] * 4, "b": [2.0] * 4}


@pytest.mark.integration  # a process of its own beside this one
@pytest.mark.serial  # alone on the machine: the other tests' load is not the spinner's
def test_a_busy_process_beside_a_measurement_is_seen():
    """A second process spinning on a core while this one measures: the watch reports
    other processes' CPU, and the page says so; a quiet stretch says nothing."""
    import subprocess
    import sys
    import time

    from tfscale.tasks.core.machine_load import LoadWatch

    # it spins from the line it prints until it is killed: the whole watch, however long
    # its start took (a sleep guessed at it, and a fixed spin, could miss the watch)
    spin = "print('spinning', flush=True)\nwhile True: pass\n"
    busy = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline() == "spinning\n", busy.poll()
        with LoadWatch() as watch:
            time.sleep(1.5)  # this process idles: the busy core is another's
    finally:
        busy.kill()
        busy.wait(timeout=scaled(60))
    seen = watch.result
    assert seen.known and seen.other_cores > 0.5, seen
    assert seen.material and "other processes kept" in seen.text()


def test_interference_below_the_thresholds_is_not_material():
    from tfscale.tasks.core.machine_load import Interference

    quiet = Interference(other_cores=0.1, steal_share=0.01, cores=2, seconds=10, known=True)
    assert not quiet.material and quiet.text() == ""
    stolen = Interference(other_cores=0.0, steal_share=0.2, cores=2, seconds=10, known=True)
    assert "the hypervisor took 20% of the CPU time" in stolen.text()
    assert not Interference(other_cores=5.0).material  # unknown: no claim either way


@pytest.mark.parametrize(
    ("seconds_per_step", "most", "steps"),
    [
        (0.005, 100, 100),  # the default digits CNN: 0.5 s in 100 steps, the cap holds
        (0.02, 100, 50),  # 50 steps make the block's second
        (0.26, 100, 10),  # a CNN at batch 256: never fewer than 10 steps (2.6 s)
        (0.26, 3, 3),  # a cap below the floor: the cap
        (0.0, 100, 100),  # no time measured: the cap
    ],
)
def test_a_block_lasts_about_a_second_between_its_floor_and_its_cap(seconds_per_step, most, steps):
    assert block_steps(seconds_per_step, most, target_s=1.0) == steps


def test_a_block_of_half_a_second_takes_half_the_steps():
    assert block_steps(0.02, 100, target_s=0.5) == 25
    assert block_steps(0.02, 100, target_s=2.0) == 100  # the cap


def test_a_block_warms_up_then_times_the_steps_its_warm_up_sized():
    """The probes' blocks (`tasks.measure.probes._sized`): the warm-up call traces, times a few
    steps, and runs one block of the number that makes about a second, which every later
    call times."""
    from tfscale.tasks.measure.probes import _sized

    calls = []

    def timed(n: int) -> float:  # 64 examples a step at 20 ms: 3,200 examples/s
        calls.append(n)
        return 3200.0

    block = _sized(timed, most=100, examples=64)
    block()
    assert calls == [10, 10, 50]  # tracing, the timed sizing steps, then a whole block
    assert [block(), block()] == [3200.0, 3200.0]
    assert calls[3:] == [50, 50]


@pytest.mark.parametrize(
    ("scaling", "baseline"),
    [("weak", "one_device_replica_batch"), ("strong", "one_device_global_batch")],
)
def test_a_round_times_the_speedup_next_to_its_baseline_and_the_input_last(scaling, baseline):
    """The probes' order (`tasks.measure.probes._paired`): each ratio the speedup is read from is
    of two blocks timed back to back, whatever order the calls were built in."""
    from tfscale.tasks.measure.probes import _paired

    names = [
        "end_to_end",
        "compute",
        "input",
        "one_device_replica_batch",
        "one_device_replica_batch_compute",
        "one_device_global_batch",
        "one_device_global_batch_compute",
    ]
    order = list(_paired(dict.fromkeys(names), scaling))
    assert sorted(order) == sorted(names)
    assert order[:4] == ["end_to_end", baseline, "compute", baseline + "_compute"]
    assert order[-1] == "input"
    # one device alone: the run's own three blocks, the input still last
    assert list(_paired(dict.fromkeys(["end_to_end", "compute", "input"]), scaling)) == [
        "end_to_end",
        "compute",
        "input",
    ]


def test_each_logical_cpu_device_gets_its_share_of_the_cores():
    """The session split the CPU into 2 logical devices (conftest): TensorFlow's one
    intra-op pool has half the cores this process may use, so one replica's small ops do
    not wait for threads the other holds, and one device is one such share."""
    import os

    import tensorflow as tf

    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert tf.config.threading.get_intra_op_parallelism_threads() == share
    assert len(tf.config.list_logical_devices("CPU")) == 2


def test_the_rounds_watch_the_speedup_or_with_one_device_the_inputs_share():
    """Both watched figures are ratios of two blocks of the same round, so a slow spell
    cancels: the speedup over the baseline of the scaling, else end to end over compute."""
    from tfscale.tasks.measure.probes import watched_figure, watched_name

    rounds = {"end_to_end": [2.0, 4.0], "compute": [4.0, 8.0]}
    assert watched_figure(rounds, "weak") == ([2.0, 4.0], [4.0, 8.0])
    assert watched_name(rounds, "weak") == "the input's share"
    several = {**rounds, "one_device_replica_batch": [1.0, 2.0], "one_device_global_batch": [3.0]}
    assert watched_figure(several, "weak") == ([2.0, 4.0], [1.0, 2.0])
    assert watched_figure(several, "strong")[1] == [3.0]
    assert watched_name(several, "weak") == "the speedup"


def test_the_measuring_rounds_say_what_they_time_and_how_far_they_are(caplog):
    """Off a terminal (a log, a Prefect run's page): a line as they start, saying what is
    timed and until when, then one every 5 rounds with the rounds done against the most
    allowed and how well the figure is known; nothing after the last round."""
    import logging

    from tfscale.tasks.core.progress import RoundsProgress

    with caplog.at_level(logging.INFO, logger="tfscale"):
        with RoundsProgress("the run and one device", "the speedup", cap=12, aim=0.03) as progress:
            for done, width in enumerate([None] * 5 + [0.12, 0.09, 0.08, 0.07, 0.061], 1):
                progress.round(done, width)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "measuring   the run and one device, alternating, until the speedup is known to +-3% "
        "(at most 12\n            rounds)",  # wrapped within 100 columns, under its text
        "measuring   round 5 of at most 12: too few rounds yet for the speedup's interval",
        "measuring   round 10 of at most 12: the speedup known to +-6.1%",
    ]
