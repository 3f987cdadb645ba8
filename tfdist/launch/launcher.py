"""`tfdist launch`: every task of a cluster on this machine, each with its TF_CONFIG."""

import os
import signal
import sys
import threading
import time

from tfdist.cluster.roles import runs_server, task_argv
from tfdist.cluster.spec import check_local_ports_free, cluster_dict
from tfdist.cluster.tf_config import tf_config_json
from tfdist.launch.task_process import TaskProcess, exit_code

_POLL_SECONDS = 0.05


class Launcher:
    """Starts the tasks, restarts failed ones up to a budget, and stops them all at the end.

    The job succeeds when every task that runs the user's command exits 0; TF server
    tasks (parameter_server workers and ps) are then stopped. A task that fails with no
    restarts left stops the whole job. SIGINT and SIGTERM stop every task too.

    Args:
        config: a `Config`; without a cluster section, the command runs once, with no
            TF_CONFIG.
        command: the argv of the training command.
        max_restarts: how many times each task may be restarted after a failure.
        only_task: (job, index) to run just that task of a cluster whose ports are fixed.
        out, err: streams for the tasks' prefixed output and for the launcher's messages.
        grace_seconds: how long tasks get to exit after SIGTERM before SIGKILL.
    """

    def __init__(self, config, command, *, max_restarts=0, only_task=None,
                 out=None, err=None, grace_seconds=10.0):
        if not command:
            raise ValueError("no command to launch; give it after --, e.g. "
                             "tfdist launch job.yaml -- python train.py")
        self.config, self.command, self.max_restarts = config, list(command), max_restarts
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.grace_seconds = grace_seconds
        self._lock = threading.Lock()
        self._signal = None
        self.tasks = self._make_tasks(only_task)

    def _make_tasks(self, only_task):
        strategy = self.config.strategy.name if self.config.strategy else None
        base_env = dict(os.environ, PYTHONUNBUFFERED="1")
        base_env.pop("TF_CONFIG", None)
        cluster = self.config.cluster
        if cluster is None:
            return [TaskProcess("main", self.command, base_env, self.out, self._lock)]
        selected = [only_task] if only_task else cluster.tasks()
        if only_task is None:
            _check_all_local(cluster)
        elif cluster.has_free_ports:
            job = next(j for j, a in cluster.jobs().items() if any(x.port is None for x in a))
            raise LaunchError(
                f"--task starts one host of a cluster with fixed addresses, but cluster.{job} "
                "is a task count, whose ports are only picked when tfdist launches every task "
                "itself; list \"host:port\" addresses for every task")
        check_local_ports_free(cluster, selected)
        addresses = cluster_dict(cluster, pick_free_ports=only_task is None)
        tasks = []
        for job, index in selected:
            env = dict(base_env, TF_CONFIG=tf_config_json(addresses, job, index))
            argv = task_argv(strategy, job, self.command, python=sys.executable)
            tasks.append(TaskProcess(f"{job}:{index}", argv, env, self.out, self._lock,
                                     is_server=runs_server(strategy, job)))
        return tasks

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
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _start(self, task):
        try:
            task.start()
        except OSError as e:
            raise LaunchError(f"{task.name}: cannot run {task.argv[0]!r}: {e.strerror or e}") from None

    def _supervise(self):
        finished = set()
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
                reason = (f"exited with code {exit_code(code)}" if code else
                          "exited while the job was still running")
                if task.restarts < self.max_restarts:
                    task.restarts += 1
                    task.wait_output()
                    self.log(f"{task.name} {reason}; restarting it "
                             f"({task.restarts}/{self.max_restarts})")
                    self._start(task)
                    continue
                task.wait_output()
                self.log(f"{task.name} {reason}; stopping the other tasks")
                return exit_code(code) or 1
            if all(t.name in finished for t in self.tasks if not t.is_server):
                return 0
            time.sleep(_POLL_SECONDS)

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


def _check_all_local(cluster):
    for job, index in cluster.tasks():
        address = cluster.jobs()[job][index]
        if not address.is_local:
            raise LaunchError(
                f"{job}:{index} is at {address}, which is not this machine; to run every task "
                "here use localhost addresses or task counts, or start one task per host "
                "with --task TYPE:INDEX")


class LaunchError(RuntimeError):
    """A job that cannot start: a command that does not exist, a port in use..."""


def launch(config, command, **options):
    """Runs `command` in every task of `config`'s cluster; returns the exit code.

    See `Launcher` for the options.
    """
    return Launcher(config, command, **options).run()
