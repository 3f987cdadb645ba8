"""`tfdist launch`: every task of a cluster on this machine, each with its TF_CONFIG."""

import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from tfdist.cluster.roles import runs_server, task_argv
from tfdist.cluster.spec import check_local_ports_free, check_resolvable, cluster_dict
from tfdist.cluster.tf_config import tf_config_json
from tfdist.errors import TfdistError
from tfdist.launch.task_process import TaskProcess, exit_code
from tfdist.strategies.capabilities import capabilities

_POLL_SECONDS = 0.05
_HANG_CHECK_SECONDS = 1.0


class Launcher:
    """Starts the tasks, restarts failed ones up to a budget, and stops them all at the end.

    The job succeeds when every task that runs the user's command exits 0; TF server
    tasks (parameter_server workers and ps) are then stopped. A task that fails with no
    restarts left stops the whole job. SIGINT and SIGTERM stop every task too.

    What a restart restarts is the strategy's `Capabilities.restart`. Synchronous
    strategies (multi_worker_mirrored) form one collective group that cannot take a
    newcomer, so the whole job is restarted (and resumes from `BackupAndRestore`'s last backup), as
    Kubeflow and TensorFlow's fault-tolerance guide do. Under parameter_server only the
    failed task is restarted: the coordinator keeps training on the other workers and
    uses a returning worker again.

    A task that neither prints a line nor uses CPU time for `hang_seconds` (e.g. blocked
    in a collective whose peer is gone) is reported by name, killed and handled as a
    failed task. Every task gets a private TMPDIR inside a directory that is removed when
    the job ends, so nothing is left behind, even by tasks that were killed.

    Args:
        config: a `Config`; without a cluster section, the command runs once, with no
            TF_CONFIG.
        command: the argv of the training command.
        max_restarts: how many times each task may be restarted after a failure.
        only_task: (job, index) to run just that task of a cluster whose ports are fixed.
        out, err: streams for the tasks' prefixed output and for the launcher's messages.
        grace_seconds: how long tasks get to exit after SIGTERM before SIGKILL.
        hang_seconds: a task without output or CPU use for this long is hung (0: never).

    Raises:
        LaunchError: no command, a negative option, a task not on this machine, or
            --task on a cluster given by counts.
        ClusterError: a host that does not resolve, or a local port already in use.
    """

    def __init__(self, config, command, *, max_restarts=0, only_task=None,
                 out=None, err=None, grace_seconds=10.0, hang_seconds=600.0):
        if not command:
            raise LaunchError("no command to launch; give it after --, e.g. "
                              "tfdist launch job.yaml -- python train.py")
        _check_options(max_restarts=max_restarts, grace_seconds=grace_seconds,
                       hang_seconds=hang_seconds)
        self.config, self.command, self.max_restarts = config, list(command), max_restarts
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.grace_seconds, self.hang_seconds = grace_seconds, hang_seconds
        self._lock = threading.Lock()
        self._signal = None
        strategy = config.strategy.name if config.strategy else None
        self.restart_whole_job = capabilities(strategy).restart == "job"
        self.restarts = 0  # job restarts (the per-task count is on each task)
        self.tmpdir = tempfile.mkdtemp(prefix="tfdist-launch-")
        try:
            self.tasks = self._make_tasks(only_task)
        except BaseException:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            raise

    def _make_tasks(self, only_task):
        strategy = self.config.strategy.name if self.config.strategy else None
        base_env = dict(os.environ, PYTHONUNBUFFERED="1")
        base_env.pop("TF_CONFIG", None)
        cluster = self.config.cluster
        if cluster is None:
            return [TaskProcess("main", self.command, self._private_tmp(base_env, "main"),
                                self.out, self._lock)]
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
        addresses = cluster_dict(cluster, pick_free_ports=only_task is None)
        tasks = []
        for job, index in selected:
            env = dict(self._private_tmp(base_env, f"{job}-{index}"),
                       TF_CONFIG=tf_config_json(addresses, job, index))
            argv = task_argv(strategy, job, self.command, python=sys.executable)
            tasks.append(TaskProcess(f"{job}:{index}", argv, env, self.out, self._lock,
                                     is_server=runs_server(strategy, job)))
        return tasks

    def _private_tmp(self, env, name):
        path = os.path.join(self.tmpdir, name)
        os.makedirs(path, exist_ok=True)
        return dict(env, TMPDIR=path, TEMP=path, TMP=path)

    def log(self, message):
        with self._lock:
            self.err.write(f"[tfdist] {message}\n")
            self.err.flush()

    def run(self):
        """Runs the job to the end. Returns the launcher's exit code."""
        handlers = self._install_signal_handlers()
        try:
            for task in self.tasks:
                self._start(task)
            return self._supervise()
        finally:
            self.stop_all()
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _start(self, task):
        try:
            task.start()
        except OSError as e:
            raise LaunchError(f"{task.name}: cannot run {task.argv[0]!r}: {e.strerror or e}") from None

    def _supervise(self):
        finished, next_hang_check = set(), time.monotonic() + _HANG_CHECK_SECONDS
        while True:
            if self._signal is not None:
                self.log(f"received {signal.Signals(self._signal).name}; stopping every task")
                return 128 + self._signal
            for task in self.tasks:
                code = task.poll()
                if code is None or task.name in finished:
                    continue
                if code == 0 and not task.is_server:
                    finished.add(task.name)
                    continue
                reason = ("made no progress (no output, no CPU time) for "
                          f"{self.hang_seconds:g}s; killed it" if task.hung else
                          f"exited with code {exit_code(code)}" if code else
                          "exited while the job was still running")
                task.wait_output()
                if not self._restart_after_failure(task, reason):
                    self.log(f"{task.name} {reason}; stopping the other tasks")
                    return exit_code(code) or 1
                if self.restart_whole_job:
                    finished.clear()
                break
            if all(t.name in finished for t in self.tasks if not t.is_server):
                return 0
            if self.hang_seconds and time.monotonic() >= next_hang_check:
                next_hang_check = time.monotonic() + _HANG_CHECK_SECONDS
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
            for each in self.tasks:
                self._start(each)
            return True
        if task.restarts >= self.max_restarts:
            return False
        task.restarts += 1
        self.log(f"{task.name} {reason}; restarting it ({task.restarts}/{self.max_restarts})")
        self._start(task)
        return True

    def _kill_hung_tasks(self, finished):
        for task in self.tasks:
            if (task.is_server or task.name in finished or task.poll() is not None
                    or task.seconds_without_progress() < self.hang_seconds):
                continue
            self.log(f"{task.name} is hung: no output and no CPU time for "
                     f"{self.hang_seconds:g}s (pid {task.pid})")
            task.hung = True
            task.signal_group(signal.SIGKILL)

    def stop_all(self):
        """SIGTERM to every task's process group, SIGKILL after the grace period."""
        for task in self.tasks:
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
            task.wait_output()

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum, frame):
            self._signal = signum

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}


def _check_options(**options):
    for key, value in options.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise LaunchError(f"{key} must be a number >= 0. Received: {key}={value!r}")
    if not isinstance(options["max_restarts"], int):
        raise LaunchError("max_restarts must be a whole number. "
                          f"Received: max_restarts={options['max_restarts']!r}")


def _check_all_local(cluster):
    for job, index in cluster.tasks():
        address = cluster.jobs()[job][index]
        if not address.is_local:
            raise LaunchError(
                f"{job}:{index} is at {address}, which is not this machine; to run every task "
                "here use localhost addresses or task counts, or start one task per host "
                "with --task TYPE:INDEX")


class LaunchError(TfdistError, RuntimeError):
    """A job that cannot start: a command that does not exist, a port in use..."""


def launch(config, command, **options):
    """Runs `command` in every task of `config`'s cluster; returns the exit code.

    See `Launcher` for the options.
    """
    return Launcher(config, command, **options).run()
