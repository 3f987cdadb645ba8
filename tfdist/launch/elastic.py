"""An elastic local job: a lost worker does not stop it, and its place is taken back later.

A multi_worker_mirrored job forms one collective group of a fixed size, which cannot take
a newcomer nor lose a member (TensorFlow aborts its collectives and must be restarted
with the same cluster). So a resize is a restart with a new `TF_CONFIG`, from the last
backup, which `tfdist.callbacks.BackupAndRestore` (or `tfdist.ModelBackup`) restores onto
the new number of replicas (`tfdist.step.resize`):

- **A loss** (a worker that exits with anything but 0 or 143, is killed, or hangs): the
  survivors hold nothing a backup does not (blocked in a collective with it, or failing
  as TensorFlow aborts the group's collectives: `lost_tasks` tells them apart), so after
  `SETTLE_SECONDS` they are killed and the job restarts with the places left, if at least
  `min_workers`, else it stops as any job would; the steps since the last backup are
  trained again (what a SIGKILL costs any job: choose `save_freq` by it). A bug that
  fails every worker loses one place at each size until fewer than `min_workers` are left.
- **A place back**: `rejoin_seconds` after a loss (doubled each time the same place is
  lost again, up to `MAX_REJOIN_SECONDS`, so a machine that keeps failing costs less
  and less), the launcher asks every task to stop at one agreed step with `RESIZE_SIGNAL`
  (tfdist's preemption watch: every worker saves after the same step and exits 143, so
  nothing trained is lost) and restarts the job with the place back. A task not training
  when it arrives (building, restoring, after `fit`) takes note and goes on: the request
  is honoured at the first step, or the job ends as it would have.

- **A preemption** (a SIGTERM to a task: every worker saves after one agreed step and
  exits 143) restarts the job at once, with any place that is due, and is not counted
  against ``--max-restarts`` (nothing was lost; JobSet's ``RestartJobSetAndIgnoreMaxRestarts``
  does the same).

The global batch is what the training script batches its dataset by: under
multi_worker_mirrored TensorFlow splits each batch over the workers there are, so the same
script keeps the global batch, its learning rate and the examples of every step across a
resize (each worker computes a larger share). A script that batches per worker (`batch *
num_replicas_in_sync`) changes its global batch instead and must scale its learning rate
itself.
"""

import functools
import os
import signal

from tfdist.config.sections.elastic import MAX_REJOIN_SECONDS, min_workers_problem
from tfdist.launch.errors import LaunchError
from tfdist.launch.task_process import child_setup
from tfdist import resize_signal as resize_signal_contract

RESIZE_SIGNAL = resize_signal_contract.NAME  # why not SIGTERM: tfdist.resize_signal
PREEMPTED = 143  # tfdist.step.preemption.EXIT_CODE, without importing TensorFlow
#: After a first failure, how long the others get to fail too (those of the same moment are
#: lost together; a survivor blocked in a collective with a lost peer does not exit).
SETTLE_SECONDS = 1.0


class Places:
    """The member places of an elastic job (chief and workers) and the ones lost.

    Args:
        members: the cluster's chief and worker tasks: the most the job runs with.
        min_workers: the fewest it goes on with.
        rejoin_seconds: how long after its loss a place is offered back.
    """

    def __init__(self, members, min_workers, rejoin_seconds):
        self.members, self.min_workers, self.rejoin_seconds = members, min_workers, rejoin_seconds
        self._back_at = {}  # place -> time.monotonic() when it is offered back
        self._losses = [0] * members

    def active(self):
        """The places running now, in order: task i of the current cluster is active()[i]."""
        return [place for place in range(self.members) if place not in self._back_at]

    def size(self):
        return self.members - len(self._back_at)

    def lose(self, indices, now):
        """Marks the current cluster's members `indices` lost; returns their places."""
        active = self.active()
        places = [active[i] for i in indices]
        for place in places:
            self._losses[place] += 1
            delay = self.rejoin_seconds * 2 ** (self._losses[place] - 1)
            self._back_at[place] = now + min(delay, MAX_REJOIN_SECONDS)
        return places

    def back_in(self, place, now):
        """Seconds until a lost `place` is offered back."""
        return max(0.0, self._back_at[place] - now)

    def due(self, now, room=None):
        """The lost places whose time to be offered back has come (at most `room`)."""
        due = sorted(place for place, at in self._back_at.items() if at <= now)
        return due if room is None else due[:max(0, room)]

    def take_back(self, now, room=None):
        """Makes the due places active again (at most `room`); returns how many."""
        due = self.due(now, room)
        for place in due:
            del self._back_at[place]
        return len(due)


def lost_tasks(tasks, first):
    """The indices in `tasks` of the ones lost when `first` failed: those killed by a signal
    or hung in the same moment (`SETTLE_SECONDS`), else `first` alone. A task that exited
    with an error of its own meanwhile is a survivor: TensorFlow aborts the collectives of
    a group that lost a peer, which then fail in every task (their place is not lost).
    A bug that fails them all is `first` alone each time. A frozen task (`is_frozen`) is lost
    too: its peers' errors are its doing."""
    killed = [i for i, task in enumerate(tasks) if not task.stopped and (
        task.poll() is None and is_frozen(task)  # SIGSTOPped: its peers fail, not it
        or task.poll() is not None and (task.poll() < 0 or task.hung))]
    return killed or [tasks.index(first)]


def is_frozen(task):
    """Whether the task's process is stopped (SIGSTOP, a debugger): alive, but no step of
    it will come."""
    try:
        with open(f"/proc/{task.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError, TypeError):
        return False


def first_hung(tasks):
    """Of tasks that all made no progress (one frozen or stuck, the others waiting for it
    in a collective), the one to kill as lost: a frozen one first, else the one quiet the
    longest."""
    return max(tasks, key=lambda task: (is_frozen(task), task.seconds_without_progress()))


def check_elastic(config, min_workers, only_task):
    """The launcher's checks of an elastic job (the config's are in
    `tfdist.config.together`; these also hold for --min-workers given on the command line).

    Raises:
        LaunchError: not multi_worker_mirrored, one task only, a cluster given by
            addresses, or more workers required than it has.
    """
    strategy = config.strategy.name if config.strategy else None
    cluster = config.cluster
    if strategy != "multi_worker_mirrored" or cluster is None or cluster.scheduler:
        raise LaunchError("--min-workers resizes the collective group of a local "
                          "multi_worker_mirrored cluster (parameter_server already goes on "
                          "without a lost worker: --max-restarts). Received: strategy="
                          f"{strategy}" + ("" if cluster is None or not cluster.scheduler
                                           else f", cluster: {cluster.scheduler}"))
    if only_task is not None:
        raise LaunchError("--min-workers resizes a job whose every task this launcher runs; "
                          "--task runs one host of a fixed cluster")
    if any(address.port is not None for job in ("chief", "worker")
           for address in cluster.jobs().get(job, ())):
        raise LaunchError("--min-workers needs the chief and workers given by counts (e.g. "
                          "cluster: {worker: 4}): the launcher picks the ports of each size "
                          "it runs at")
    problem = min_workers_problem(min_workers, members_of(cluster))
    if problem:
        raise LaunchError(f"--{problem.replace('_', '-')}")


def members_of(cluster):
    return cluster.num_training_tasks


def resized(cluster, size):
    """`cluster` with `size` members (`ClusterConfig.resized`)."""
    return cluster.resized(size)


def resize_signal():
    return resize_signal_contract.number()


def stop_code(code):
    """Whether an exit code is a task's answer to the resize signal: 143 (it saved at the
    agreed step) or killed by the signal itself (a command that does not catch it)."""
    return code in (PREEMPTED, -resize_signal(), 128 + resize_signal())


def task_env(env, places):
    """A task's environment in an elastic job: it names the resize signal, and the places
    of `places` (`Places`) the tasks of this size hold."""
    return dict(env, **{resize_signal_contract.ENV: RESIZE_SIGNAL,
                        resize_signal_contract.PLACES_ENV: resize_signal_contract.places_text(
                            places.active(), places.members)})


DISCOVER_SECONDS = 5.0  # how often the discovery command is run
DISCOVER_TIMEOUT = 10.0  # a run that takes longer is killed and counts as no answer
DISCOVER_BYTES = 4096  # what is read of its output; more is a wrong answer
DISCOVER_FRESH = 2 * DISCOVER_SECONDS  # an older answer is not taken for "now"


class Discovery:
    """How many workers can run now, as a command says (``--discover``; Horovod's
    ``--host-discovery-script``, but a count: every task of a local job is on this machine).

    The command prints one whole number; it is run every `DISCOVER_SECONDS`, never two at a
    time, without blocking the launcher. An answer it cannot use — the command not found, a
    non-zero exit, no whole number, more than `DISCOVER_BYTES`, no answer within
    `DISCOVER_TIMEOUT` — is said in one line (once until the next good answer) and leaves
    the last good one. An answer older than `DISCOVER_FRESH`, or from before the last loss
    (`forget`), is none: no place is taken back on it.

    Args:
        argv: the command.
        log: the launcher's one-line messages.
        register: called with the pid of each run (the launcher's own children).
    """

    def __init__(self, argv, log, register=lambda pid: None):
        self.argv, self.log, self.register = list(argv), log, register
        self.count = None
        self._answered = None  # when `count` was answered (time.monotonic())
        self._proc = self._started = None
        self._output, self._next, self._said = b"", 0.0, None

    def forget(self):
        """After a loss: what was said before is no answer for what follows."""
        self.count = self._answered = None
        self._next = 0.0

    def poll(self, now):
        """Starts a run when one is due, takes in a finished one; returns the answer, or
        None if there is no fresh one."""
        if self._proc is not None:
            self._read()
            if self._proc.poll() is not None:
                self._finish()
            elif now - self._started > DISCOVER_TIMEOUT or len(self._output) > DISCOVER_BYTES:
                self._kill(f"gave no answer within {DISCOVER_TIMEOUT:g} s" if
                           len(self._output) <= DISCOVER_BYTES else
                           f"printed more than {DISCOVER_BYTES} bytes")
        elif now >= self._next:
            self._start(now)
        fresh = self._answered is not None and now - self._answered <= DISCOVER_FRESH
        return self.count if fresh else None

    def _start(self, now):
        import subprocess

        self._next, self._started, self._output = now + DISCOVER_SECONDS, now, b""
        try:
            # dies with the launcher, even SIGKILLed (PR_SET_PDEATHSIG), as the tasks do
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          preexec_fn=functools.partial(child_setup,
                                                                       os.getpid()))
        except OSError as e:
            self._refuse(f"could not be run ({e.strerror or e})")
            return
        self.register(self._proc.pid)
        os.set_blocking(self._proc.stdout.fileno(), False)

    def _read(self):
        try:
            while len(self._output) <= DISCOVER_BYTES:
                chunk = self._proc.stdout.read(DISCOVER_BYTES + 1)
                if not chunk:
                    return
                self._output += chunk
        except (BlockingIOError, ValueError):
            return

    def _finish(self):
        code, text = self._proc.returncode, self._output
        self._close()
        if code:
            return self._refuse(f"exited with code {code}")
        words = text.decode("ascii", "replace").split()
        if len(words) != 1 or not (words[0].isascii() and words[0].isdigit()) \
                or len(words[0]) > 9:
            return self._refuse("printed no whole number of workers. Received: "
                                f"{text[:80]!r}")
        self.count, self._said = int(words[0]), None
        self._answered = self._started

    def _kill(self, why):
        _kill_group(self._proc)
        self._close()
        self._refuse(why)

    def _close(self):
        self._proc.stdout.close()
        self._proc = None

    def _refuse(self, why):
        if why != self._said:
            self.log(f"--discover {' '.join(self.argv)[:200]}: {why}; keeping the last "
                     f"answer ({'none yet' if self.count is None else self.count})")
        self._said = why

    def stop(self):
        if self._proc is not None:
            _kill_group(self._proc)
            self._close()


def _kill_group(proc):
    """SIGKILL to a discovery run's process group (its own: `child_setup`), then reaps it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.wait()
