"""The step-times line (issue 58): `tfdist.step_times_line` formats what
`tfdist.callbacks.StepTimes` logs and parses what `tfdist launch` reads back for its
summary; round trips, `StepTimes`' own line, and forged lines that parse to nothing."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfdist.step_times_line import PREFIX, StepTimesLine, format_line, parse_line

WORKERS = (("chief:0", 0.091, 0.01, 0.03), ("worker:0", 0.09, 0.011, 0.031),
           ("worker:1", 0.123, 0.012, 0.0))
REPORT = StepTimesLine(steps=120, slowest="worker:1", compute=0.123, lead=0.35, median=0.091,
                       share=0.22, whole_run=True, workers=WORKERS)
LINE = ("tfdist step times (whole run) over 120 steps: worker:1 slowest, computing 0.123 s a "
        "step (+35% on the others' median 0.091 s); the others waited 22% of their step time "
        "for it; per worker (compute/exchange/wait s): chief:0 0.091/0.010/0.030, worker:0 "
        "0.090/0.011/0.031, worker:1 0.123/0.012/0.000")


def test_the_line_reads_as_before_and_parses_back():
    assert format_line(REPORT) == LINE
    assert parse_line(LINE) == REPORT
    assert parse_line("INFO:tfdist:" + LINE + " (trailing)") == REPORT  # a logging format's
    interval = StepTimesLine(steps=4, slowest="chief:0", compute=1.5, lead=0.0, median=1.5,
                             share=0.0)
    assert format_line(interval) == (
        "tfdist step times over 4 steps: chief:0 slowest, computing 1.500 s a step (+0% on "
        "the others' median 1.500 s); the others waited 0% of their step time for it")
    assert parse_line(format_line(interval)) == interval


seconds = st.integers(0, 10**6).map(lambda n: n / 1000)
names = st.from_regex(r"[a-z_]{1,20}:[0-9]{1,9}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(st.builds(StepTimesLine, steps=st.integers(0, 10**12), slowest=names, compute=seconds,
                 lead=st.integers(-100, 10**4).map(lambda n: n / 100), median=seconds,
                 share=st.integers(0, 100).map(lambda n: n / 100), whole_run=st.booleans(),
                 workers=st.lists(st.tuples(names, seconds, seconds, seconds), max_size=5)
                 .map(tuple)))
def test_any_report_at_the_printed_precision_round_trips(report):
    assert parse_line(format_line(report)) == report


@pytest.mark.parametrize("forged", [
    PREFIX,
    LINE.replace("worker:1 slowest", "\\x1b]52;c;AAAA\\x07 slowest"),  # as the launcher shows it
    LINE.replace("worker:1 slowest", "worker:1; rm -rf / slowest"),
    LINE.replace("over 120 steps", "over \u0661\u0662 steps"),  # Arabic-Indic digits
    LINE.replace("computing 0.123", "computing nan"),
    LINE.replace("+35%", "+" + "9" * 40 + "%"),
    LINE[:LINE.index("; the others")],
    "tfdist step times (whole run) over 120 steps: " + "x" * (64 << 10),
    (PREFIX + " ") * 3000,
], ids=["prefix", "escapes", "name", "unicode-digits", "nan", "huge", "cut", "long", "repeated"])
def test_a_forged_or_malformed_line_parses_to_nothing(forged):
    assert parse_line(forged) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300))
def test_parsing_never_raises_and_takes_only_plain_names(before, after):
    found = parse_line(before + PREFIX + after)
    assert found is None or re.fullmatch(r"[a-z_]{1,20}:[0-9]{1,9}", found.slowest)


def test_step_times_logs_the_line_the_launcher_parses(capsys):
    """`StepTimes._say` on the chief, from two totals of a fake clock: its line parses to
    `straggler`'s figures at the printed precision."""
    from tfdist.keras.callbacks.step_times import StepTimes, per_step, straggler

    start = {"steps": 0, "compute": [0.0] * 3, "exchange": [0.0] * 3, "wait": [0.0] * 3}
    end = {"steps": 10, "compute": [0.9, 1.2, 0.95], "exchange": [0.1] * 3,
           "wait": [0.4, 0.0, 0.35]}
    callback = StepTimes(every_steps=None)
    callback._clock = type("Clock", (), {"totals": lambda self: end})()
    callback._names, callback._hosts = ["chief:0", "worker:0", "worker:1"], ["localhost"] * 3
    callback._chief, callback._report = True, start
    callback._say(final=True)
    report = parse_line(capsys.readouterr().out)
    slow, lead, share = straggler(per_step(start, end))
    assert (report.slowest, report.steps, report.whole_run) == ("worker:0", 10, True)
    assert (slow, report.lead, report.share) == (1, round(lead, 2), round(share, 2))
    assert report.workers[1] == ("worker:0", 0.12, 0.01, 0.0)
