"""`tfdist launch`: every task of a cluster on this machine, each with its TF_CONFIG
(`Launcher`).

The job succeeds when every task that runs the user's command exits 0; TF server tasks
(parameter_server workers and ps) are then stopped. A task that fails with no restarts
left stops the whole job. SIGINT, SIGTERM and SIGHUP stop every task too (exit 130, 143,
129), also while the launch is still being set up (`tfdist.launch.stop_signals`).

What a restart restarts is the strategy's `Capabilities.restart`. Synchronous strategies
(multi_worker_mirrored) form one collective group that cannot take a newcomer, so the
whole job is restarted (and resumes from `BackupAndRestore`'s last backup), as Kubeflow
and TensorFlow's fault-tolerance guide do. Under parameter_server only the failed task is
restarted: the coordinator keeps training on the other workers and uses a returning
worker again. With `min_workers` a multi_worker_mirrored job goes on with fewer workers
when one is lost and takes its place back later, each by a restart at the new size
(`tfdist.launch.resizing`, `tfdist.launch.elastic`).

A task that neither prints a line nor uses CPU time for `hang_seconds` (e.g. blocked in
a collective whose peer is gone) is reported by name, killed and handled as a failed
task. A task that only waits for the launcher's stdout to take its output is not hung.

Output: the tasks' bytes reach `out` prefixed by task, each line at most 64 KiB
(longer ones are cut into prefixed pieces), through a bounded queue and a writer
thread per destination (`tfdist.launch.output`). Progress bars that redraw with
``\\r`` become periodic lines; terminal control is an allow-list (colours on a
terminal, nothing else): cursor/erase sequences and titles are dropped, every other
control sequence or control character is shown escaped, and the prefix is never
overwritten (`tfdist.launch.rendering`).
TF's reports that a peer has gone (logged when one worker finishes before another,
"The tasks have crashed") are printed if a task failed (restarted or not), else
replaced by a one-line note (`tfdist.launch.shutdown_reports`). At the end, one line
on `err` sums the job up: how each task ended, restarts, wall time and, if a task
printed `tfdist.callbacks.StepTimes`' line, the last one's slowest worker and the
others' wait (`tfdist.launch.summary`). A stdout that does not read (a paused pager)
holds up the tasks' output, never the supervisor: signals and failures are handled
as usual and, at the end, output gets `closing.DRAIN_SECONDS` to drain before it is
dropped. A stdout that is closed (``| head``) is reported once on stderr; the tasks go on,
their output discarded.

What is left behind — promised: when `run` returns (success, failure, a signal, a
setup error), no process started by the launch is left: each task's process group is
signalled (also when only its leader exited, and before a restart), and a sweep
kills every process whose environment carries the launch's tag
``TFDIST_LAUNCH_DIR`` and every orphan adopted by the launcher, which is a child
subreaper during the run (grandchildren that called ``setsid`` included; see
`tfdist.launch.reaper` for why not a cgroup). Tasks also die with the launcher
(``PR_SET_PDEATHSIG``). Every task gets a private TMPDIR inside the launch's directory
``$TMPDIR/tfdist-launch-PID-START-RANDOM``, removed at the end.

Not promised: a SIGKILLed launcher cleans nothing; its grandchildren and directory
survive it. The next launch (same user, same TMPDIR for directories) removes the
directories of dead launchers and kills the processes still tagged with one, and says
so in one line. Found through ``/proc``: Linux only; a process that runs as another
user, or that cleared its environment and also left the tree before the launcher
adopted it, cannot be found. Used in-process (`launch`), a child that the host
process itself starts from another thread during the run is taken for an adopted
orphan and killed.
"""

import os
import secrets
import shutil
import signal
import sys
import tempfile
import time

from tfdist.capabilities import capabilities
from tfdist.launch import elastic, os_limits, reaper
from tfdist.launch.closing import close_output, release_reports
from tfdist.launch.errors import LaunchError
from tfdist.launch.output import Sink
from tfdist.launch.options import check_options, elastic_options, preload_modules
from tfdist.launch.preload import Preloader
from tfdist.launch.resizing import DONE, Resizer
from tfdist.launch.stop_signals import StopSignals, Stopped
from tfdist.launch.task_process import exit_code
from tfdist.launch.task_set import kill_hung, make_tasks, selected_tasks, stop_tasks

_POLL_SECONDS = 0.05
_HANG_CHECK_SECONDS = 1.0


class Launcher:
    """Starts the tasks, restarts failed ones up to a budget, and stops them all at the end
    (how: the module's docstring).

    Args:
        config: a `Config`; without a cluster section, the command runs once, with no
            TF_CONFIG.
        command: the argv of the training command.
        max_restarts: how many times each task may be restarted after a failure.
        only_task: (job, index) to run just that task of a cluster whose ports are fixed.
        out, err: streams for the tasks' prefixed output and for the launcher's messages.
        grace_seconds: how long tasks get to exit after SIGTERM before SIGKILL (finite,
            0 to `options.MAX_GRACE_SECONDS`).
        hang_seconds: a task without output or CPU use for this long is hung (0: never;
            at most `options.MAX_HANG_SECONDS`).
        min_workers: the fewest workers (chief included) a multi_worker_mirrored job goes
            on with when one is lost, instead of stopping (`tfdist.launch.elastic`);
            default: the config's ``elastic.min_workers``, else the job never resizes.
        rejoin_seconds: how long after its loss a worker's place is offered back (default:
            the config's ``elastic.rejoin_seconds``, else 60).
        discover: a command line that prints how many workers can run now
            (`elastic.Discovery`): a lost place is then taken back only once there is room
            for it (default: the config's ``elastic.discover``, else every place is there).
        preload: module names (a comma-separated string or a sequence) the tasks are
            forked from one process having imported (`tfdist.launch.preload`); default:
            the environment variable ``TFDIST_PRELOAD``, else none.

    Raises:
        LaunchError: no command, an option out of range, a task not on this machine,
            --task on a cluster given by counts, an open-files limit too low for the
            job, a task that cannot be started.
        ClusterError: a host that does not resolve, or a local port already in use.
    """

    def __init__(self, config, command, *, max_restarts=0, only_task=None,
                 out=None, err=None, grace_seconds=10.0, hang_seconds=600.0,
                 min_workers=None, rejoin_seconds=None, discover=None, preload=None):
        if not command:
            raise LaunchError("no command to launch; give it after --, e.g. "
                              "tfdist launch job.yaml -- python train.py")
        check_options(max_restarts=max_restarts, grace_seconds=grace_seconds,
                       hang_seconds=hang_seconds)
        places, discover = elastic_options(config, only_task, min_workers, rejoin_seconds, discover)
        self.preload = preload_modules(preload)
        self.preloader = None
        self._popen_pids = set()
        self.resizer = None if places is None else Resizer(self, places, None if (
            discover is None) else elastic.Discovery(discover, self.log,
                                                     register=self._popen_pids.add))
        self.config, self.command, self.max_restarts = config, list(command), max_restarts
        self.only_task = only_task
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.grace_seconds, self.hang_seconds = grace_seconds, hang_seconds
        self.signals = StopSignals()
        strategy = config.strategy.name if config.strategy else None
        self.restart_whole_job = capabilities(strategy).restart == "job"
        self.restarts = 0  # job restarts (the per-task count is on each task)
        self._failed = None  # the task whose failure ended the job
        self.tmpdir = None
        self.tasks = []
        self._err_sink = self._out_sink = None

    # --- the run ------------------------------------------------------------------------

    def run(self):
        """Sets up and runs the job to the end. Returns the launcher's exit code.

        Raises:
            LaunchError, ClusterError: the job cannot start (nothing is left behind).
        """
        started, code, kept = time.monotonic(), None, {}
        self._err_sink = Sink(self.err, "stderr")
        self._out_sink = Sink(self.out, "stdout", notice=self.log)
        try:
            self._set_up(kept)
            for task in self.tasks:
                self._start(task)
            code = self._supervise()
        except Stopped as stopped:
            self.signals.signum = stopped.signum
            code = self._stopped_by_signal()
        finally:
            self.signals.setting_up = False
            self.stop_all()
            if self.preloader is not None:
                self.preloader.close()
            if self.resizer is not None:
                self.resizer.stop()
            _undo(self.tmpdir, kept, self._popen_pids)
            self._close_output(code, time.monotonic() - started)
            self.signals.restore()
        return code

    def _set_up(self, kept):
        """Everything before the first task starts, what `run` must undo noted in `kept`:
        the signal handlers, the tasks checked (refused before anything is changed, a
        killed launcher's leftovers included), the open-files limit, the subreaper, a
        killed launcher's leftovers cleaned, the launch's directory and its tasks made."""
        self.signals.setting_up = True
        self.signals.install()
        selected = selected_tasks(self.config, self.only_task)
        count = len(self.config.cluster.tasks()) if self.config.cluster else 1
        kept["nofile"] = os_limits.ensure_open_files(1 if self.only_task is not None else count)
        # our children from before the run are the host's (when used in-process)
        kept["not_adopted"] = reaper.children() | {None}
        kept["subreaper"] = reaper.enable_subreaper()
        _clean_stale(self.log)
        self.tmpdir = os.path.join(tempfile.gettempdir(), reaper.dir_name(secrets.token_hex(6)))
        os.mkdir(self.tmpdir, 0o700)
        if self.preload:
            self.preloader = Preloader(self.preload, self.tmpdir)
        self.tasks = self._make_tasks(selected)
        self.signals.setting_up = False
        self.signals.check()

    def _close_output(self, code, seconds):
        """Every task has exited: the output drained, the job's summary (`code` not None:
        it ran) and the writers stopped (`tfdist.launch.closing`)."""
        restarts = self.restarts + sum(task.restarts for task in self.tasks)
        close_output(self.tasks, self._out_sink, self._err_sink, self.log, ran=code is not None,
                     seconds=seconds, keep_reports=code != 0 or restarts > 0, summary=dict(
                         failed=self._failed, signum=self.signals.signum, restarts=restarts,
                         resizes=self.resizer.resizes if self.resizer else 0))

    def _stopped_by_signal(self):
        signum = self.signals.signum
        self.log(f"received {signal.Signals(signum).name}; stopping every task")
        return 128 + signum

    def _make_tasks(self, selected):
        return make_tasks(self.config, self.command, self.tmpdir, self._out_sink, selected,
                          places=self.resizer.places if self.resizer else None,
                          only_task=self.only_task, preloader=self.preloader)

    def log(self, message):
        """A message of the launcher on `err`; dropped if `err` does not keep up."""
        sink = self._err_sink
        if sink is None:
            return
        sink.put_text(f"[tfdist] {message}\n")

    def _start(self, task):
        try:
            task.start()
        except OSError as e:
            raise LaunchError(os_limits.start_failure(task, e)) from None
        self._popen_pids.add(task.pid)
        if self.preloader is not None and self.preloader.proc is not None:
            self._popen_pids.add(self.preloader.proc.pid)

    def _supervise(self):
        finished, next_hang_check = set(), time.monotonic() + _HANG_CHECK_SECONDS
        while True:
            if self.signals.signum is not None:
                return self._stopped_by_signal()
            for task in self.tasks:
                code = task.poll()
                if code is None:
                    continue
                task.kill_group_after_exit()
                if task.name in finished:
                    continue
                if code == 0 and not task.is_server:
                    finished.add(task.name)
                    continue
                ended = self._after_failure(task, code, finished)
                if ended is not None:
                    return ended
                break
            if all(t.name in finished for t in self.tasks if not t.is_server):
                return 0
            if self.resizer is not None:
                self.resizer.take_back_when_due()
            if time.monotonic() >= next_hang_check:
                next_hang_check = time.monotonic() + _HANG_CHECK_SECONDS
                reaper.reap_adopted(self._popen_pids)
                if self.hang_seconds:
                    kill_hung(self.tasks, finished, self.hang_seconds, self.log,
                              first_only=self.resizer is not None)
            time.sleep(_POLL_SECONDS)

    def _after_failure(self, task, code, finished):
        """`task` failed (or a server exited): the job resized or restarted (`finished`
        updated; None), or ended, with no restart left: its exit code."""
        reason = ("made no progress (no output, no CPU time) for "
                  f"{self.hang_seconds:g}s; killed it" if task.hung else
                  f"exited with code {exit_code(code)}" if code else
                  "exited while the job was still running")
        task.wait_output()
        resized = self.resizer is not None and self.resizer.resize(task, code, reason)
        if resized == DONE:  # the others finished as it stopped: the job is done
            finished.update(t.name for t in self.tasks if not t.is_server)
            return None
        if resized:
            finished.clear()
            return None
        release_reports(self.tasks, True, self.log)
        if not self._restart_after_failure(task, reason):
            self.log(f"{task.name} {reason}; stopping the other tasks")
            self._failed = task
            return exit_code(code) or 1
        if self.restart_whole_job:
            finished.clear()
        return None

    def _restart_after_failure(self, task, reason):
        """Restarts `task` (or the whole job) if the budget allows; False if not."""
        if self.restart_whole_job:
            if self.restarts >= self.max_restarts:
                return False
            self.restarts += 1
            self.log(f"{task.name} {reason}; restarting the whole job ({self.restarts}/"
                     f"{self.max_restarts}): its collectives need every worker")
            self.stop_all()
            _sweep(self.tmpdir, self.preloader)  # what escaped the groups (setsid) goes too
            for each in self.tasks:
                self._start(each)
            return True
        if task.restarts >= self.max_restarts:
            return False
        task.restarts += 1
        self.log(f"{task.name} {reason}; restarting it ({task.restarts}/{self.max_restarts})")
        task.kill_group_after_exit()  # the old attempt's children must not linger
        self._start(task)
        return True

    @property
    def stopping(self):
        """Whether a stop signal reached the launcher (the job is being stopped)."""
        return self.signals.signum is not None

    def kill_all(self):
        """SIGKILL to every task's group at once: blocked in a collective with a lost peer,
        they hold nothing the last backup does not."""
        stop_tasks(self.tasks, 0.0, self.log, signal.SIGKILL)
        _sweep(self.tmpdir, self.preloader)

    def restart_tasks(self, keep_reports):
        """Every task made again for the job's present size (`Resizer`) and started,
        after the old ones' output ended (TF's peer-gone reports kept if `keep_reports`)."""
        for task in self.tasks:
            task.wait_output()
        release_reports(self.tasks, keep_reports, self.log)
        self.tasks = self._make_tasks(None)
        for task in self.tasks:
            self._start(task)

    def stop_all(self):
        """SIGTERM to every task's process group, SIGKILL after the grace period."""
        stop_tasks(self.tasks, self.grace_seconds, self.log)


def _clean_stale(log):
    """What killed launchers left behind removed (`reaper.clean_stale`), said in a line."""
    dirs, processes = reaper.clean_stale(tempfile.gettempdir())
    if dirs or processes:
        log(f"cleaned up after launchers that were killed: removed {dirs} stale "
            f"director{'y' if dirs == 1 else 'ies'} and {processes} leftover "
            f"process{'' if processes == 1 else 'es'}")


def _undo(tmpdir, kept, started):
    """What `Launcher._set_up` changed undone: the launch's processes (but those
    ``kept["not_adopted"]``, the host's) swept, its directory removed, the subreaper and
    the open-files limit restored."""
    if tmpdir is not None:
        reaper.sweep(tmpdir, adopted_besides=kept.get("not_adopted", set()) | started)
        shutil.rmtree(tmpdir, ignore_errors=True)
    reaper.restore_subreaper(kept.get("subreaper"))
    if kept.get("nofile") is not None:
        os_limits.set_open_files(kept["nofile"])


def _sweep(tmpdir, preloader):
    """Every process of the launch in `tmpdir` killed but the preloading one (the next
    tasks are forked from it)."""
    server = preloader.proc if preloader is not None else None
    reaper.sweep(tmpdir, keep={server.pid} if server is not None else ())


def launch(config, command, **options):
    """Runs `command` in every task of `config`'s cluster; returns the exit code.

    See `Launcher` for the options.
    """
    return Launcher(config, command, **options).run()
