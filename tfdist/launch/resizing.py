"""The launcher's side of an elastic job (`tfdist.launch.elastic`): losing a place,
taking one back, and restarting the job at its new size — a collaborator of the
`tfdist.launch.launcher.Launcher`, which it reaches through the launcher's own methods
only: `tasks`, `log`, `stopping`, `grace_seconds`, `kill_all` and `restart_tasks`."""

import time

from tfdist.launch import elastic
from tfdist.launch.task_process import exit_code

_POLL_SECONDS = 0.05
#: `Resizer.resize`'s answer when the job is done: every member task counts as finished.
DONE = "done"


def elastic_places(config, min_workers, rejoin_seconds, only_task):
    """The `elastic.Places` of a job that resizes (`min_workers` not None), or None."""
    if min_workers is None:
        return None
    elastic.check_elastic(config, min_workers, only_task)
    return elastic.Places(elastic.members_of(config.cluster), min_workers, rejoin_seconds)


class Resizer:
    """What the launcher `job` does when `min_workers` is set: its `places`
    (`elastic.Places`), their `discovery` (`--discover`, or None) and the resize signal's
    round; `resizes` counts the restarts at a new size."""

    def __init__(self, job, places, discovery=None):
        self.job, self.places, self.discovery = job, places, discovery
        self._taking_back = None  # places to take back once the tasks stopped at one step
        self.resizes = 0

    def stop(self):
        """The job ends: the discovery's command goes with it."""
        if self.discovery is not None:
            self.discovery.stop()

    def _room(self, now):
        """How many lost places may come back now: all (None) without discovery, else as
        many as the last answer leaves room for (0 before a first answer)."""
        if self.discovery is None:
            return None
        count = self.discovery.poll(now)
        return 0 if count is None else count - self.places.size()

    def resize(self, task, code, reason):
        """An elastic job's answer to `task`'s exit: True if the job was restarted at a new
        size (a loss, or the agreed stop of a take-back), `DONE` if a task finished
        training meanwhile (`_finished_meanwhile`), False to handle it as any job."""
        if (self._taking_back and elastic.stop_code(code)) or code == elastic.PREEMPTED:
            return self._stopped_together(task, reason)
        if self._taking_back and code == 0:
            return False  # the job's end: as always
        self._taking_back = None
        self._settle()
        lost = elastic.lost_tasks(self.job.tasks, task)
        said = self._what_was_lost(task, reason, lost)
        self.job.kill_all()  # what is left holds nothing the last backup does not
        if self.discovery is not None:
            self.discovery.forget()
        if self.places.size() - len(lost) < self.places.min_workers:
            self.job.log(f"{task.name} {reason}; {self.places.size() - len(lost)} of "
                         f"{self.places.members} workers left, fewer than --min-workers "
                         f"{self.places.min_workers}")
            return False
        self._lose(lost, said)
        return self._restart_resized(taking_back=False)

    def _stopped_together(self, task, reason):
        """`task` stopped at the agreed step (a take-back, or a preemption): the job
        restarts with the places due, or is `DONE` if a task finished meanwhile."""
        if not self._taking_back:  # preempted from outside: all save at an agreed step
            self.job.log(f"{task.name} {reason} (preempted: every task saves at an agreed "
                         "step); restarting the job, not counted against --max-restarts")
        self._wait_for_stop()
        if self._finished_meanwhile(task):
            return DONE
        return self._restart_resized(taking_back=True)

    def _settle(self):
        """Waits a moment for the failures of the same moment (`elastic.SETTLE_SECONDS`)."""
        settle = time.monotonic() + elastic.SETTLE_SECONDS
        while time.monotonic() < settle and any(
                t.poll() is None for t in self.job.tasks if t.proc):
            time.sleep(_POLL_SECONDS)

    def _what_was_lost(self, task, reason, lost):
        """The log's account of the `lost` tasks (indices), `task` among them or not."""
        said = "; ".join(f"{self.job.tasks[i].name} " + (
            reason if self.job.tasks[i] is task else "was frozen (stopped)"
            if self.job.tasks[i].poll() is None else
            f"exited with code {exit_code(self.job.tasks[i].poll())}") for i in lost)
        if task not in [self.job.tasks[i] for i in lost]:
            said += f" ({task.name} {reason}: its collectives lost a peer)"
        return said

    def _lose(self, lost, said):
        """Loses the `lost` places (and takes back those due), and logs when they return."""
        now = time.monotonic()
        places = self.places.lose(lost, now)
        self.places.take_back(now, self._room(now))  # due meanwhile: back with this restart
        offered = min(self.places.back_in(place, now) for place in places)
        when = f"in {offered:.0f} s" + (", once --discover reports room for it"
                                         if self.discovery is not None else "")
        self.job.log(f"{said}; going on with {self.places.size()} of "
                     f"{self.places.members} workers (--min-workers {self.places.min_workers}) "
                     f"from the last backup; the lost place is offered back {when}")

    def take_back_when_due(self):
        """A lost place whose time has come: asks every task to stop at one agreed step."""
        now = time.monotonic()
        if self._taking_back or not self.places.due(now):
            return
        back = self.places.due(now, self._room(now))
        if not back or any(task.poll() is not None for task in self.job.tasks if not task.is_server):
            return  # no room yet; or one has exited (finished, failing): not the moment
        self._taking_back = len(back)  # the places to take back once every task stopped
        size = self.places.size() + len(back)
        self.job.log(f"a lost worker's place is back: asking every task to stop at an agreed "
                 f"step ({elastic.RESIZE_SIGNAL}) to go on with {size} of "
                 f"{self.places.members} workers")
        for task in self.job.tasks:
            if task.proc is not None and task.name.split(":")[0] in ("chief", "worker"):
                task.proc.send_signal(elastic.resize_signal())

    def _finished_meanwhile(self, stopped):
        """Whether a task exited 0 while the others stopped at the agreed step: it finished
        `fit`, so every step was trained (the last one a collective with all), and the
        backup the others would restart from is gone with its end. The job is done (a
        restart would train it again from step 0); `stopped` counts as finished."""
        done = [t.name for t in self.job.tasks if not t.is_server and t.poll() == 0]
        if not done:
            return False
        self.job.log(f"{', '.join(done)} finished training as the others stopped at the agreed "
                 f"step: the job is done ({stopped.name} stopped after its last step); no "
                 "place is taken back")
        self._taking_back = None
        return True

    def _wait_for_stop(self):
        """After one task answered the resize signal: the others get as long as saving
        may take (`grace_seconds`, at least a minute) to answer too, then are killed. A
        stop signal to the launcher ends the wait at once (it stops the job)."""
        deadline = time.monotonic() + max(self.job.grace_seconds, 60.0)
        while time.monotonic() < deadline and not self.job.stopping and any(
                t.poll() is None for t in self.job.tasks if t.proc):
            time.sleep(_POLL_SECONDS)
        if self.job.stopping:
            return
        late = [t.name for t in self.job.tasks if t.proc and t.poll() is None]
        if late:
            self.job.log(f"{', '.join(late)} did not stop at the agreed step; killing "
                     "(resuming from the last backup)")

    def _restart_resized(self, taking_back):
        """Kills what is left, takes back the places that are due (`taking_back`) and
        starts the job at its new size, from the last backup; after a stop signal to the
        launcher, starts nothing (the caller's loop then stops the job)."""
        self.job.kill_all()
        if self.job.stopping:
            self._taking_back = None
            return True
        asked, self._taking_back = self._taking_back, None
        if taking_back:  # or preempted: places due come back too
            now = time.monotonic()
            # as many as there was room for when the tasks were asked (or, after a
            # preemption, as there is now)
            self.places.take_back(now, asked if asked else self._room(now))
            self.job.log(f"every task stopped at the agreed step; going on with "
                     f"{self.places.size()} of {self.places.members} workers")
        self.resizes += 1
        self.job.restart_tasks(keep_reports=not taking_back)
        return True
