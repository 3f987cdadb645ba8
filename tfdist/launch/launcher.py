"""`tfdist launch`: every task of a cluster on this machine, each with its TF_CONFIG
(`Launcher`).

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
as usual and, at the end, output gets `DRAIN_SECONDS` to drain before it is dropped.
A stdout that is closed (``| head``) is reported once on stderr; the tasks go on,
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

import functools
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time

from tfdist.capabilities import capabilities
from tfdist.cluster.roles import runs_server, task_argv
from tfdist.cluster.spec import check_local_ports_free, check_resolvable, cluster_dict
from tfdist.cluster.tf_config import tf_config_json
from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.config.sections.elastic import ELASTIC_KEYS
from tfdist.launch import elastic, os_limits, reaper
from tfdist.launch.errors import LaunchError
from tfdist.launch.output import Sink
from tfdist.launch.resizing import DONE, Resizer, elastic_places
from tfdist.launch.summary import summary
from tfdist.launch.task_process import TaskProcess, exit_code

_POLL_SECONDS = 0.05
_HANG_CHECK_SECONDS = 1.0
MAX_GRACE_SECONDS = 3600.0  # an hour to stop: more would make Ctrl-C look ignored
MAX_HANG_SECONDS = 7 * 24 * 3600.0  # a week; 0 switches hang detection off
DRAIN_SECONDS = 2.0  # at the end, how long output may take to reach a slow reader
_STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


class _Stopped(BaseException):
    """A stop signal arrived while the launch was being set up."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


class Launcher:
    """Starts the tasks, restarts failed ones up to a budget, and stops them all at the end.

    The job succeeds when every task that runs the user's command exits 0; TF server
    tasks (parameter_server workers and ps) are then stopped. A task that fails with no
    restarts left stops the whole job. SIGINT, SIGTERM and SIGHUP stop every task too
    (exit 130, 143, 129), also while the launch is still being set up.

    What a restart restarts is the strategy's `Capabilities.restart`. Synchronous
    strategies (multi_worker_mirrored) form one collective group that cannot take a
    newcomer, so the whole job is restarted (and resumes from `BackupAndRestore`'s last backup), as
    Kubeflow and TensorFlow's fault-tolerance guide do. Under parameter_server only the
    failed task is restarted: the coordinator keeps training on the other workers and
    uses a returning worker again. With `min_workers` a multi_worker_mirrored job goes on
    with fewer workers when one is lost and takes its place back later, each by a restart
    at the new size (`tfdist.launch.elastic`).

    A task that neither prints a line nor uses CPU time for `hang_seconds` (e.g. blocked
    in a collective whose peer is gone) is reported by name, killed and handled as a
    failed task. A task that only waits for the launcher's stdout to take its output is
    not hung.

    Its output, what it leaves behind and what it does not promise: the module's
    docstring.

    Args:
        config: a `Config`; without a cluster section, the command runs once, with no
            TF_CONFIG.
        command: the argv of the training command.
        max_restarts: how many times each task may be restarted after a failure.
        only_task: (job, index) to run just that task of a cluster whose ports are fixed.
        out, err: streams for the tasks' prefixed output and for the launcher's messages.
        grace_seconds: how long tasks get to exit after SIGTERM before SIGKILL (finite,
            0 to `MAX_GRACE_SECONDS`).
        hang_seconds: a task without output or CPU use for this long is hung (0: never;
            at most `MAX_HANG_SECONDS`).
        min_workers: the fewest workers (chief included) a multi_worker_mirrored job goes
            on with when one is lost, instead of stopping (`tfdist.launch.elastic`);
            default: the config's ``elastic.min_workers``, else the job never resizes.
        rejoin_seconds: how long after its loss a worker's place is offered back (default:
            the config's ``elastic.rejoin_seconds``, else 60).
        discover: a command line that prints how many workers can run now
            (`elastic.Discovery`): a lost place is then taken back only once there is room
            for it (default: the config's ``elastic.discover``, else every place is there).

    Raises:
        LaunchError: no command, an option out of range, a task not on this machine,
            --task on a cluster given by counts, an open-files limit too low for the
            job, a task that cannot be started.
        ClusterError: a host that does not resolve, or a local port already in use.
    """

    def __init__(self, config, command, *, max_restarts=0, only_task=None,
                 out=None, err=None, grace_seconds=10.0, hang_seconds=600.0,
                 min_workers=None, rejoin_seconds=None, discover=None):
        if not command:
            raise LaunchError("no command to launch; give it after --, e.g. "
                              "tfdist launch job.yaml -- python train.py")
        _check_options(max_restarts=max_restarts, grace_seconds=grace_seconds,
                       hang_seconds=hang_seconds)
        given = config.elastic
        if min_workers is None and given is not None:
            min_workers = given.min_workers
        if rejoin_seconds is None:
            rejoin_seconds = given.rejoin_seconds if given is not None else 60.0
        if min_workers is not None:
            _check_options(min_workers=min_workers, rejoin_seconds=rejoin_seconds)
        places = elastic_places(config, min_workers, rejoin_seconds, only_task)
        if discover is None and config.elastic is not None:
            discover = config.elastic.discover
        elif discover is not None:
            discover = check_arguments("launch", ELASTIC_KEYS, discover=discover)["discover"]
        if discover is not None and places is None:
            raise LaunchError("--discover is for an elastic job: give --min-workers K too (or "
                              "an elastic: section in the config)")
        self._popen_pids = set()
        self.resizer = None if places is None else Resizer(self, places, None if (
            discover is None) else elastic.Discovery(discover, self.log,
                                                     register=self._popen_pids.add))
        self.config, self.command, self.max_restarts = config, list(command), max_restarts
        self.only_task = only_task
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.grace_seconds, self.hang_seconds = grace_seconds, hang_seconds
        self._signal = None
        self._setting_up = False
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
        started = time.monotonic()
        self._err_sink = Sink(self.err, "stderr")
        self._out_sink = Sink(self.out, "stdout", notice=self.log)
        handlers, subreaper, nofile, not_adopted, code = {}, None, None, set(), None
        self._setting_up = True
        try:
            handlers = self._install_signal_handlers()
            # refused before anything is changed (a killed launcher's leftovers included)
            selected = self._selected_tasks(self.only_task)
            nofile = self._ensure_open_files_limit()
            # our children from before the run are the host's (when used in-process)
            not_adopted = reaper.children() | {None}
            subreaper = reaper.enable_subreaper()
            self._clean_stale()
            self.tmpdir = os.path.join(tempfile.gettempdir(),
                                       reaper.dir_name(secrets.token_hex(6)))
            os.mkdir(self.tmpdir, 0o700)
            self.tasks = self._make_tasks(selected)
            self._setting_up = False
            self._check_signal()
            for task in self.tasks:
                self._start(task)
            code = self._supervise()
        except _Stopped as stopped:
            self._setting_up = False
            self._signal = stopped.signum
            code = self._stopped_by_signal()
        finally:
            self._setting_up = False
            self.stop_all()
            if self.resizer is not None:
                self.resizer.stop()
            if self.tmpdir is not None:
                reaper.sweep(self.tmpdir, adopted_besides=not_adopted | self._popen_pids)
                shutil.rmtree(self.tmpdir, ignore_errors=True)
            reaper.restore_subreaper(subreaper)
            if nofile is not None:
                os_limits.set_open_files(nofile)
            self._close_output(code, time.monotonic() - started)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        return code

    def _close_output(self, code, seconds):
        """Every task has exited: lets the output drain for at most DRAIN_SECONDS (a
        reader that does not read loses the rest), prints the summary of a job that ran
        (`code` not None), then stops the writers."""
        deadline = time.monotonic() + DRAIN_SECONDS
        restarts = self.restarts + sum(task.restarts for task in self.tasks)
        for task in self.tasks:
            task.wait_output(max(0.0, deadline - time.monotonic()))
        self._release_reports(keep=code != 0 or restarts > 0)
        self._out_sink.close(max(0.1, deadline - time.monotonic()))
        for task in self.tasks:  # a pump that was waiting for room reaches its end now
            task.wait_output(0.5)
        if code is not None and any(task.proc for task in self.tasks):
            self.log(summary(self.tasks, seconds=seconds, failed=self._failed,
                             signum=self._signal, restarts=restarts,
                             resizes=self.resizer.resizes if self.resizer else 0,
                             step_times=self._last_step_times()))
        self._err_sink.close(max(0.5, deadline - time.monotonic()))

    def _last_step_times(self):
        """The step-times line any task printed last (`TaskProcess.step_times`), or None."""
        said = [task.step_times for task in self.tasks if task.step_times is not None]
        return max(said, key=lambda said: said[0])[1] if said else None

    def _release_reports(self, keep):
        """Prints (`keep`: a task failed) or drops TF's peer-gone reports held so far
        (every task exited 0), saying in one line what was dropped."""
        for task in self.tasks:
            dropped = task.release_reports(keep)
            if dropped:
                self.log(f"{task.name}: not shown: TF's {dropped}-line report that a peer "
                         "had stopped (logged when workers finish at different times; "
                         "every task succeeded)")

    def _check_signal(self):
        if self._signal is not None:
            raise _Stopped(self._signal)

    def _stopped_by_signal(self):
        self.log(f"received {signal.Signals(self._signal).name}; stopping every task")
        return 128 + self._signal

    def _clean_stale(self):
        dirs, processes = reaper.clean_stale(tempfile.gettempdir())
        if dirs or processes:
            self.log(f"cleaned up after launchers that were killed: removed {dirs} stale "
                     f"director{'y' if dirs == 1 else 'ies'} and {processes} leftover "
                     f"process{'' if processes == 1 else 'es'}")

    def _ensure_open_files_limit(self):
        """Raises the open-files limit as far as the job's tasks need (`os_limits`)."""
        count = len(self.config.cluster.tasks()) if self.config.cluster else 1
        return os_limits.ensure_open_files(1 if self.only_task is not None else count)

    def _selected_tasks(self, only_task):
        """The (job, index) tasks to start, [] for a job without a cluster.

        Raises:
            LaunchError, ClusterError: a task not on this machine, ports not fixed for
                `only_task`, a host that does not resolve, a port in use.
        """
        cluster = self.config.cluster
        if cluster is None:
            return []
        selected = [only_task] if only_task else cluster.tasks()
        if only_task is None:
            _check_all_local(cluster)
        elif cluster.has_free_ports:
            job = next(j for j, a in cluster.jobs().items() if any(x.port is None for x in a))
            raise LaunchError(
                f"--task starts one host of a cluster with fixed addresses, but cluster.{job} "
                "is a task count, whose ports are only picked when tfdist launches every task "
                "itself; list \"host:port\" addresses for every task")
        check_resolvable(cluster)
        check_local_ports_free(cluster, selected)
        return selected

    def _make_tasks(self, selected):
        strategy = self.config.strategy.name if self.config.strategy else None
        base_env = dict(os.environ, PYTHONUNBUFFERED="1")
        base_env.pop("TF_CONFIG", None)
        base_env[reaper.ENV_TAG] = self.tmpdir
        cluster = self.config.cluster
        if cluster is None:
            return [TaskProcess("main", self.command, self._private_tmp(base_env, "main"),
                                self._out_sink)]
        if self.resizer is not None:
            cluster = elastic.resized(cluster, self.resizer.places.size())
            selected = cluster.tasks()
            base_env = elastic.task_env(base_env, self.resizer.places)
        addresses = cluster_dict(cluster, pick_free_ports=self.only_task is None)
        tasks = []
        for job, index in selected:
            env = dict(self._private_tmp(base_env, f"{job}-{index}"),
                       TF_CONFIG=tf_config_json(addresses, job, index))
            argv = task_argv(strategy, job, self.command, python=sys.executable)
            tasks.append(TaskProcess(f"{job}:{index}", argv, env, self._out_sink,
                                     is_server=runs_server(strategy, job)))
        return tasks

    def _private_tmp(self, env, name):
        path = os.path.join(self.tmpdir, name)
        os.makedirs(path, exist_ok=True)
        return dict(env, TMPDIR=path, TEMP=path, TMP=path)

    def log(self, message):
        """A message of the launcher on `err`; dropped (never waited for) if `err` does
        not keep up."""
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

    def _supervise(self):
        finished, next_hang_check = set(), time.monotonic() + _HANG_CHECK_SECONDS
        while True:
            if self._signal is not None:
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
                reason = ("made no progress (no output, no CPU time) for "
                          f"{self.hang_seconds:g}s; killed it" if task.hung else
                          f"exited with code {exit_code(code)}" if code else
                          "exited while the job was still running")
                task.wait_output()
                resized = self.resizer is not None and self.resizer.resize(task, code, reason)
                if resized == DONE:  # the others finished as it stopped: the job is done
                    finished.update(t.name for t in self.tasks if not t.is_server)
                    break
                if resized:
                    finished.clear()
                    break
                self._release_reports(keep=True)
                if not self._restart_after_failure(task, reason):
                    self.log(f"{task.name} {reason}; stopping the other tasks")
                    self._failed = task
                    return exit_code(code) or 1
                if self.restart_whole_job:
                    finished.clear()
                break
            if all(t.name in finished for t in self.tasks if not t.is_server):
                return 0
            if self.resizer is not None:
                self.resizer.take_back_when_due()
            if time.monotonic() >= next_hang_check:
                next_hang_check = time.monotonic() + _HANG_CHECK_SECONDS
                reaper.reap_adopted(self._popen_pids)
                if self.hang_seconds:
                    self._kill_hung_tasks(finished)
            time.sleep(_POLL_SECONDS)

    def _restart_after_failure(self, task, reason):
        """Restarts `task` (or the whole job) if the budget allows; False if not."""
        if self.restart_whole_job:
            if self.restarts >= self.max_restarts:
                return False
            self.restarts += 1
            self.log(f"{task.name} {reason}; restarting the whole job ({self.restarts}/"
                     f"{self.max_restarts}): its collectives need every worker")
            self.stop_all()
            reaper.sweep(self.tmpdir)  # what escaped the groups (setsid) goes too
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

    def _kill_hung_tasks(self, finished):
        hung = [task for task in self.tasks
                if not (task.is_server or task.name in finished or task.poll() is not None
                        or task.seconds_without_progress() < self.hang_seconds)]
        if self.resizer is not None and hung:  # its peers wait for it: they are not lost
            hung = [elastic.first_hung(hung)]
        for task in hung:
            self.log(f"{task.name} is hung: no output and no CPU time for "
                     f"{self.hang_seconds:g}s (pid {task.pid})")
            task.hung = True
            task.signal_group(signal.SIGKILL)

    @property
    def stopping(self):
        """Whether a stop signal reached the launcher (the job is being stopped)."""
        return self._signal is not None

    def kill_all(self):
        """SIGKILL to every task's group at once: blocked in a collective with a lost peer,
        they hold nothing the last backup does not."""
        for task in self.tasks:
            if task.poll() is None and task.proc is not None:
                task.stopped = True
            task.signal_group(signal.SIGKILL)
            if task.proc is not None:
                task.proc.wait()
                task.group_killed = True
        reaper.sweep(self.tmpdir)

    def restart_tasks(self, keep_reports):
        """Every task made again for the job's present size (`Resizer`) and started,
        after the old ones' output ended (TF's peer-gone reports kept if `keep_reports`)."""
        for task in self.tasks:
            task.wait_output()
        self._release_reports(keep=keep_reports)
        self.tasks = self._make_tasks(None)
        for task in self.tasks:
            self._start(task)

    def stop_all(self):
        """SIGTERM to every task's process group, SIGKILL after the grace period."""
        for task in self.tasks:
            if task.poll() is None and task.proc is not None:
                task.stopped = True
            task.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds
        while time.monotonic() < deadline and any(t.poll() is None for t in self.tasks if t.proc):
            time.sleep(_POLL_SECONDS)
        for task in self.tasks:
            if task.poll() is None and task.proc is not None:
                self.log(f"{task.name} did not stop within {self.grace_seconds:g}s; killing it")
            task.signal_group(signal.SIGKILL)
            if task.proc is not None:
                task.proc.wait()
                task.group_killed = True

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum, frame):
            if self._signal is None:
                self._signal = signum
            if self._setting_up:  # nothing runs yet: abandon the setup at once
                self._setting_up = False
                raise _Stopped(signum)

        handlers = {}
        for name in _STOP_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                handlers[sig] = signal.signal(sig, on_signal)
        return handlers


#: The launcher's options (``tfdist launch --max-restarts/--grace-seconds/--hang-seconds``),
#: checked by the config loader's checks.
OPTIONS = {
    "max_restarts": functools.partial(checks.integer, minimum=0, maximum=10**10 - 1),
    "grace_seconds": functools.partial(checks.number, minimum=0, maximum=MAX_GRACE_SECONDS),
    "hang_seconds": functools.partial(checks.number, minimum=0, maximum=MAX_HANG_SECONDS),
    **ELASTIC_KEYS,  # --min-workers, --rejoin-seconds: as the config's elastic: section
}


def _check_options(**options):
    check_arguments("launch", OPTIONS, **options)


def _check_all_local(cluster):
    for job, index in cluster.tasks():
        address = cluster.jobs()[job][index]
        if not address.is_local:
            raise LaunchError(
                f"{job}:{index} is at {address}, which is not this machine; to run every task "
                "here use localhost addresses or task counts, or start one task per host "
                "with --task TYPE:INDEX")


def launch(config, command, **options):
    """Runs `command` in every task of `config`'s cluster; returns the exit code.

    See `Launcher` for the options.
    """
    return Launcher(config, command, **options).run()
