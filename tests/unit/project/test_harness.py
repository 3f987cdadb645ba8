"""The test harness itself (tests/conftest.py): what it promises the other tests."""

import os
import subprocess
import sys

from conftest import CHILD_NICENESS


def test_a_process_a_test_starts_runs_nicer_than_the_test():
    """Every process a test starts runs CHILD_NICENESS above the test process (so an
    in-process test beside it keeps its time slices), with the argv it was given."""
    run = subprocess.run([sys.executable, "-c", "import os, sys; print(os.nice(0), sys.argv[1:])",
                          "one", "two"], capture_output=True, text=True, timeout=60)
    niceness, argv = run.stdout.split(" ", 1)
    assert int(niceness) == min(19, os.nice(0) + CHILD_NICENESS)
    assert argv.strip() == "['one', 'two']"
    shell = subprocess.run("cd / && python3 -c 'import os; print(os.nice(0))'",
                           shell=True, capture_output=True, text=True, timeout=60)
    assert int(shell.stdout.split()[-1]) == min(19, os.nice(0) + CHILD_NICENESS)
