"""Heterogeneous islands' pace (tfdist.local_sgd.pace), against brute-force counting:
which calls an island trains, the counts measured times give, and each island's weight."""

import math

import pytest

from tfdist.local_sgd import pace
from tfdist.local_sgd.pace import IslandPace


def brute_trained(counts_by_period, period, island, start, end):
    """Calls start..end-1 that island `island` trains, one call at a time (a call before
    0 counts as the first period's)."""
    total = 0
    for call in range(start, end):
        index = max(call, 0) // period
        count = counts_by_period(index)[island]
        total += pace.trains(call % period, count, period)
    return total


@pytest.mark.parametrize("period", [1, 3, 8, 32])
def test_an_island_trains_its_count_in_every_period_evenly_spread(period):
    for count in range(1, period + 1):
        calls = [c for c in range(period) if pace.trains(c, count, period)]
        assert len(calls) == count
        assert calls[-1] == period - 1  # the last call before a synchronisation trains
        gaps = [b - a for a, b in zip([-1] + calls, calls)]
        assert max(gaps) - min(gaps) <= 1  # evenly spread
        for start in range(period + 1):
            for end in range(start, period + 1):
                assert pace.trained_between(count, period, start, end) == sum(
                    pace.trains(c, count, period) for c in range(start, end))


def test_measured_times_give_the_counts_that_fit_in_the_fastest_islands_period():
    # twice as slow, skipping free: half the calls
    assert pace.counts_within(32, [0.03, 0.06], [0.0, 0.0]) == [32, 16]
    # a skipped call costs 5 ms: n * 0.06 + (32 - n) * 0.005 <= 32 * 0.03
    n = pace.counts_within(32, [0.03, 0.06], [0.0, 0.005])[1]
    assert n * 0.06 + (32 - n) * 0.005 <= 32 * 0.03 < (n + 1) * 0.06 + (31 - n) * 0.005
    assert pace.counts_within(32, [0.06, 0.03, 0.03], [0, 0, 0]) == [16, 32, 32]
    assert pace.counts_within(8, [0.01, 10.0], [0, 0]) == [8, 1]  # never none
    assert pace.counts_within(8, [0.01, 0.02], [0, 0.05]) == [8, 8]  # skipping costs more
    assert pace.counts_within(8, [0.02, 0.02], [0, 0]) == [8, 8]


def measured(period=4, replicas=(2, 2), own=1):
    return IslandPace("auto", period, list(replicas), own)


def test_a_decision_takes_effect_at_the_period_it_was_made_for_and_weighs_by_samples():
    p = measured(period=4, replicas=(2, 1), own=1)
    assert p.counts(0) == [4, 4] and not p.begin_period(1)  # nothing agreed yet
    p.take_agreed([0.01, 0.0, 0.02, 0.0])
    assert p.begin_period(2) and p.counts(2) == [4, 2] and p.counts(1) == [4, 4]
    assert p.history == [[0, [4, 4]], [2, [4, 2]]]
    by_period = {0: [4, 4], 1: [4, 4], 2: [4, 2]}

    def counts_of(index):
        return by_period[max(k for k in by_period if k <= index)]

    for start, end in [(6, 10), (8, 12), (4, 8), (-4, 0), (9, 11)]:
        counts = [brute_trained(counts_of, 4, i, start, end) for i in range(2)]
        assert [p.trained(i, start, end) for i in range(2)] == counts
        # island 1 (1 replica of 3) weighed by its samples against island 0's 2 replicas
        assert p.scale(start, end) == pytest.approx(3 * counts[1] / (2 * counts[0] + counts[1]))
    assert [p.trains_next(c) for c in range(8, 12)] == [False, True, False, True]


def test_configured_counts_weigh_as_the_islands_counts_say():
    p = IslandPace([32, 16], 32, [2, 2], own=1)
    assert p.scale(-32, 0) == pytest.approx(4 * 16 / (2 * 32 + 2 * 16))
    assert p.scale(40, 72) == p.scale(-32, 0)  # any 32 consecutive calls
    assert not p.begin_period(5) and p.timing() == [0.0] * 4  # nothing is measured


def test_an_island_times_its_trained_and_skipped_calls_but_not_the_first(monkeypatch):
    clock = iter([0.0, 9.0,  # the first call traces: not timed
                  10.0, 10.1, 10.2, 10.25, 11.0, 11.3])
    monkeypatch.setattr(pace.time, "perf_counter", lambda: next(clock))
    p = measured(own=1)
    p.resume()
    p.call_ended(1)
    for local, skip in [(2, False), (3, True), (4, False)]:
        p.resume()
        if skip:
            p.skipping()
        p.call_ended(local)
    assert p.timing() == pytest.approx([0, 0, (0.1 + 0.3) / 2, 0.05])


@pytest.mark.parametrize("state", [
    None, [], {}, {"schedule": [[0, [4, 4]]]},
    {"schedule": [], "agreed": None},
    {"schedule": [[0, [4, 5]]], "agreed": None},          # more than the period
    {"schedule": [[0, [4, 0]]], "agreed": None},          # none
    {"schedule": [[0, [4]]], "agreed": None},             # another count of islands
    {"schedule": [[0, [4, True]]], "agreed": None},
    {"schedule": [[-1, [4, 4]]], "agreed": None},
    {"schedule": [[0, [4, 4]], [1, [4, 4]], [2, [4, 4]]], "agreed": None},
    {"schedule": [[0, [4, 4]]], "agreed": [[0.1, math.nan], [0, 0]]},
    {"schedule": [[0, [4, 4]]], "agreed": [[0.1, -1], [0, 0]]},
    {"schedule": [[0, [4, 4]]], "agreed": [[0.1, 0.2]]},
    {"schedule": [[0, [4, 4]]], "agreed": None, "more": 1}])
def test_a_backups_pace_that_does_not_fit_is_refused(state):
    assert not measured().valid(state)


def test_a_backups_pace_resumes_the_same_schedule():
    p = measured()
    p.take_agreed([0.01, 0.0, 0.03, 0.001])
    p.begin_period(1)
    p.begin_period(2)
    state = p.state()
    assert measured().valid(state)
    q = measured()
    q.restore(state)
    assert q.state() == state and q.counts(2) == p.counts(2) and q.agreed == p.agreed
    assert [q.trains_next(c) for c in range(12)] == [p.trains_next(c) for c in range(12)]
