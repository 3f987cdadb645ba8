"""A TF server task that ends when the chief is done: ``python -m
tfdist.cluster.server_watch -- SERVER_ARGV...``.

Under parameter_server, workers and ps host a `tf.distribute.Server`, which never exits
by itself; `tfdist launch` stops them once the chief succeeds, but an srun step lasts
until every task has exited. So under SLURM `tfdist exec` runs each server task through
this watcher: it runs the server as a child and checks the chief's address (the
coordinator listens there while it trains); once the chief has been seen and then stays
unreachable for `GONE_CHECKS` checks in a row, the server is stopped and the task exits
0. The chief's own exit code is still the step's: a failed chief fails the step (and
`srun --kill-on-bad-exit=1` stops the others at once).
"""

import signal
import socket
import subprocess
import sys
import time

from tfdist.cluster.address import parse_address
from tfdist.cluster.tf_config import read_tf_config

CHECK_SECONDS = 2.0
GONE_CHECKS = 3
STOP_SECONDS = 10.0


def chief_reachable(address, timeout=CHECK_SECONDS):
    """True when a TCP connection to the chief's "host:port" succeeds."""
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout):
            return True
    except OSError:
        return False


def serve(argv, chief, check_seconds=CHECK_SECONDS, gone_checks=GONE_CHECKS):
    """Runs `argv` until it exits (its code) or `chief` has come and gone (0)."""
    child = subprocess.Popen(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_stop(child), sys.exit(128 + signal.SIGTERM)))
    seen, missing = False, 0
    while child.poll() is None:
        up = chief_reachable(chief)
        seen = seen or up
        missing = 0 if up else missing + 1
        if seen and missing >= gone_checks:
            _stop(child)
            return 0
        time.sleep(check_seconds)
    return child.returncode


def _stop(child):
    child.terminate()
    try:
        child.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or not argv[argv.index("--") + 1:]:
        sys.exit("usage: python -m tfdist.cluster.server_watch -- SERVER_COMMAND...")
    tf_config = read_tf_config() or {}
    chiefs = tf_config.get("cluster", {}).get("chief")
    if not chiefs:
        sys.exit("tfdist server_watch: TF_CONFIG has no chief to watch")
    sys.exit(serve(argv[argv.index("--") + 1:], parse_address(chiefs[0])))


if __name__ == "__main__":
    main()
