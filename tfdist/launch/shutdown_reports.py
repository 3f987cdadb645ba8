"""TensorFlow's reports that a peer has gone, which a normal end of a job also prints.

Workers of a MultiWorkerMirroredStrategy job do not leave at the same moment. When one
exits first (its script is done), the task hosting the coordination service misses its
heartbeats about 10 s later and logs, although nothing went wrong (TF 2.21, reproduced
with two workers, one of which finishes its script 25 s after the other)::

    E0000 ... base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort
        UNAVAILABLE: Error reported from /job:worker/task:1: The following tasks are
        unhealthy (stopped sending heartbeats):
    /job:worker/replica:0/task:1
    The tasks have crashed. Check the task logs for an earlier error, ...

and a task that outlives the coordination service's host logs ``StartAbort UNAVAILABLE:
Failed to send RPC to coordination service. Either the leader task was
preempted/died/restarted unexpectedly ...`` with two lines of gRPC detail.

`ShutdownReports` holds such a report back instead of printing it; the launcher prints
what was held when a task failed, restarted or not (the report may then explain the
failure), and drops it, saying so in one line, when every task exited 0. Any other line
passes at once.
"""

import re
import threading

_HEAD = re.compile(
    rb"BaseCollectiveExecutor::StartAbort UNAVAILABLE: (?:Error reported from \S+: The "
    rb"following tasks are unhealthy \(stopped sending heartbeats\):|Failed to send RPC to "
    rb"coordination service\. )")
_CONTINUATION = re.compile(
    rb"/job:[\w-]+/replica:\d+/task:\d+\s*\Z|The tasks have crashed\. |Additional GRPC "
    rb"error information from remote target |:UNKNOWN:Error received from peer ")


class ShutdownReports:
    """Separates TF's peer-gone reports from a task's other lines (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held = []
        self._in_report = False

    def filter(self, lines):
        """The lines to print now; the lines of a report are held."""
        passed = []
        with self._lock:
            for line in lines:
                if _HEAD.search(line) or (self._in_report and _CONTINUATION.match(line)):
                    self._in_report = True
                    self._held.append(line)
                else:
                    self._in_report = False
                    passed.append(line)
        return passed

    def take(self):
        """The lines held so far (and holds none from now)."""
        with self._lock:
            held, self._held = self._held, []
            return held
