"""The launcher's last line: how the job and each task ended, restarts, wall time, and
the slowest worker if a task reported step times (`tfdist.callbacks.StepTimes`).

For example ``job succeeded: 3 tasks (chief:0 0, worker:0 0, worker:1 0), 0 restarts,
41.2 s; step times (whole run, 120 steps): worker:1 slowest (+35% computing), the
others waited 22% of their step time`` or ``job failed, worker:1 first (exited with
code 3): 2 tasks (worker:0 stopped, worker:1 3), 0 restarts, 5.2 s``.
"""

import signal


def summary(tasks, *, restarts, seconds, failed=None, signum=None, step_times=None,
            resizes=0):
    """The summary of a finished launch.

    Args:
        tasks: the `TaskProcess`es, all exited.
        restarts: how many restarts (of a task or of the whole job) there were.
        seconds: the launch's wall time.
        failed: the task whose failure ended the job, if one did.
        signum: the signal that stopped the launcher, if one did.
        step_times: the last `tfdist.step_times_line.StepTimesLine` a task printed, if
            one did.
        resizes: how often an elastic job restarted at another size (`tasks` are those
            of its last size).
    """
    if signum is not None:
        head = f"job stopped by {signal_name(signum)}"
    elif failed is not None:
        head = f"job failed, {failed.name} first ({failure(failed)})"
    else:
        head = "job succeeded"
    ends = ", ".join(f"{task.name} {outcome(task)}" for task in tasks)
    resized = f", {_count(resizes, 'resize')}" if resizes else ""
    return (f"{head}: {_count(len(tasks), 'task')} ({ends}), {_count(restarts, 'restart')}"
            f"{resized}, {seconds:.1f} s" + ("" if step_times is None else f"; {straggler(step_times)}"))


def straggler(report):
    """The summary's clause on a `StepTimesLine`: which steps, the slowest worker, its
    lead and the others' wait (its per-worker figures stay in the task's log)."""
    steps = f"{'whole run' if report.whole_run else 'last report'}, {_count(report.steps, 'step')}"
    return (f"step times ({steps}): {report.slowest} slowest ({report.lead:+.0%} computing), "
            f"the others waited {report.share:.0%} of their step time")


def outcome(task):
    """How one task ended: its exit code, the signal that killed it, or "stopped" (by
    the launcher, at the end of the job or after another task failed)."""
    code = task.poll()
    if code is None:
        return "never started" if task.proc is None else "running"
    if task.stopped:
        return "stopped"
    return signal_name(-code) if code < 0 else str(code)


def failure(task):
    """Why `task` failed, in a few words."""
    code = task.poll()
    if task.hung:
        return "hung, killed"
    if code is not None and code < 0:
        return f"killed by {signal_name(-code)}"
    if code:
        return f"exited with code {code}"
    return "exited while the job was still running"


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _count(number, noun):
    return f"{number} {noun}{'' if number == 1 else 's'}"
