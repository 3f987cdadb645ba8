"""`tfdist.strategies.barrier` on real worker processes: it waits for every worker, and it
never waits for ever (a worker that does not come is named after `timeout_seconds`)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

JOB = textwrap.dedent("""
    import time
    import tfdist
    strategy = tfdist.get_strategy("multi_worker_mirrored")
    _, index = tfdist.strategies.task_of()
    if index == 0:
        time.sleep(2)  # worker:1 waits for it at the first barrier
    start = time.monotonic()
    tfdist.strategies.barrier(strategy, timeout_seconds=60)
    print(f"first barrier after {time.monotonic() - start:.1f} s", flush=True)
    if index == 1:  # worker:0 never comes to the second one
        start = time.monotonic()
        try:
            tfdist.strategies.barrier(strategy, timeout_seconds=3)
        except TimeoutError as e:
            print(f"second barrier: {type(e).__name__} after {time.monotonic() - start:.1f} s: "
                  f"{e}", flush=True)
    else:
        time.sleep(8)
""")


@pytest.mark.multiprocess
def test_barrier_waits_for_every_worker_and_names_one_that_never_comes(write_config, tmp_path):
    config = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    (tmp_path / "job.py").write_text(JOB)
    run = subprocess.run([sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds",
                          "5", "--", sys.executable, str(tmp_path / "job.py")],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ))
    output = run.stdout + run.stderr
    waited = dict(re.findall(r"\[(worker:\d)\] first barrier after ([\d.]+) s", output))
    assert set(waited) == {"worker:0", "worker:1"}, output[-3000:]
    assert float(waited["worker:1"]) >= 1.5, "worker:1 went on before worker:0 came"
    found = re.search(r"\[worker:1\] second barrier: BarrierTimeoutError after ([\d.]+) s: "
                      r"(.*)", output)
    assert found, output[-3000:]
    assert 2.9 <= float(found.group(1)) < 10, found.group(1)
    line = found.group(2)
    assert line.startswith("worker:1 waited 3 s at a barrier for a worker that did not arrive")
    assert line.endswith("Received: timeout_seconds=3"), line
