"""A launch's last output, once every task has exited: what the tasks printed drains (for
at most `DRAIN_SECONDS`: a reader that does not read loses the rest), TF's peer-gone
reports are printed or dropped (`tfdist.launch.shutdown_reports`), and one line sums the
job up (`tfdist.launch.summary`)."""

import time

from tfdist.launch.summary import summary as summary_line

DRAIN_SECONDS = 2.0  # at the end, how long output may take to reach a slow reader


def close_output(tasks, out_sink, err_sink, log, *, ran, keep_reports, summary, seconds):
    """Drains the tasks' output into `out_sink`, releases their reports (`keep_reports`:
    printed), logs the summary of a job that `ran` (`summary`: `summary_line`'s keywords)
    and closes both sinks."""
    deadline = time.monotonic() + DRAIN_SECONDS
    for task in tasks:
        task.wait_output(max(0.0, deadline - time.monotonic()))
    release_reports(tasks, keep_reports, log)
    out_sink.close(max(0.1, deadline - time.monotonic()))
    for task in tasks:  # a pump that was waiting for room reaches its end now
        task.wait_output(0.5)
    if ran and any(task.proc for task in tasks):
        log(summary_line(tasks, seconds=seconds, step_times=last_step_times(tasks), **summary))
    err_sink.close(max(0.5, deadline - time.monotonic()))


def release_reports(tasks, keep, log):
    """Prints (`keep`: a task failed) or drops TF's peer-gone reports held so far (every
    task exited 0), saying in one line what was dropped."""
    for task in tasks:
        dropped = task.release_reports(keep)
        if dropped:
            log(f"{task.name}: not shown: TF's {dropped}-line report that a peer had stopped "
                "(logged when workers finish at different times; every task succeeded)")


def last_step_times(tasks):
    """The step-times line any task printed last (`TaskProcess.step_times`), or None."""
    said = [task.step_times for task in tasks if task.step_times is not None]
    return max(said, key=lambda said: said[0])[1] if said else None
