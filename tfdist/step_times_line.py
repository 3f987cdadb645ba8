"""The chief's step-times line: written by `tfdist.callbacks.StepTimes`, read back by
`tfdist launch`, which carries its figures in the job's summary. One format, one parse, in
pure Python (the launcher imports no TensorFlow), so the two cannot drift.

For example::

    tfdist step times (whole run) over 120 steps: worker:1 slowest, computing 0.123 s a
    step (+35% on the others' median 0.091 s); the others waited 22% of their step time
    for it; per worker (compute/exchange/wait s): chief:0 0.091/0.010/0.030, ...
"""

import dataclasses
import re

#: How every step-times line starts; the launcher looks for it in the tasks' output.
PREFIX = "tfdist step times"

_NUMBER = r"-?[0-9]{1,15}\.[0-9]{3}"
_NAME = r"[a-z_]{1,20}:[0-9]{1,9}"
_WORKER = rf"({_NAME}) ({_NUMBER})/({_NUMBER})/({_NUMBER})"
_PER_WORKER = "; per worker (compute/exchange/wait s): "
_LINE = re.compile(
    re.escape(PREFIX) + r"(?P<whole_run> \(whole run\))? over (?P<steps>[0-9]{1,15}) steps: "
    rf"(?P<slowest>{_NAME}) slowest, computing (?P<compute>{_NUMBER}) s a step "
    rf"\((?P<lead>[+-][0-9]{{1,15}})% on the others' median (?P<median>{_NUMBER}) s\); "
    r"the others waited (?P<share>[0-9]{1,15})% of their step time for it"
    rf"(?:{re.escape(_PER_WORKER)}(?P<workers>{_WORKER}(?:, {_WORKER})*))?", re.ASCII)
_WORKERS = re.compile(_WORKER, re.ASCII)


@dataclasses.dataclass(frozen=True)
class StepTimesLine:
    """One report of the chief's: the slowest worker and what it cost the others.

    Attributes:
        steps: how many steps the figures are the mean of.
        slowest: the slowest worker's task name, e.g. ``"worker:1"``.
        compute: its seconds computing a step.
        lead: how much longer than the others' median it computed (0.35: 35%).
        median: the other workers' median seconds computing a step.
        share: the share of the others' step time spent waiting for it (0.22: 22%).
        whole_run: the figures are the whole run's (the line at the end of training),
            not those of the steps since the previous line.
        workers: (name, compute, exchange, wait) seconds a step, for every worker.
    """

    steps: int
    slowest: str
    compute: float
    lead: float
    median: float
    share: float
    whole_run: bool = False
    workers: tuple = ()


def format_line(report):
    """The line of `report` (a `StepTimesLine`), as `StepTimes` logs it."""
    workers = ", ".join(f"{name} {c:.3f}/{e:.3f}/{w:.3f}" for name, c, e, w in report.workers)
    return (f"{PREFIX}{' (whole run)' if report.whole_run else ''} over {report.steps} "
            f"steps: {report.slowest} slowest, computing {report.compute:.3f} s a step "
            f"({report.lead:+.0%} on the others' median {report.median:.3f} s); the others "
            f"waited {report.share:.0%} of their step time for it"
            + (_PER_WORKER + workers if workers else ""))


def parse_line(text):
    """The `StepTimesLine` of the first step-times line in `text` (a line of a task's
    output: what precedes `PREFIX`, a logging format's, and what follows the figures is
    ignored), or None if there is none there or it is malformed; never raises."""
    start = text.find(PREFIX)
    found = _LINE.match(text, start) if start >= 0 else None
    if found is None:
        return None
    workers = tuple((name, float(c), float(e), float(w)) for name, c, e, w in
                    _WORKERS.findall(found["workers"] or ""))
    return StepTimesLine(
        steps=int(found["steps"]), slowest=found["slowest"], compute=float(found["compute"]),
        lead=int(found["lead"]) / 100, median=float(found["median"]),
        share=int(found["share"]) / 100, whole_run=bool(found["whole_run"]), workers=workers)
