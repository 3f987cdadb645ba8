"""Where things are, for a test at any depth under tests/ (tests/ is on sys.path: the
`pythonpath` of pyproject.toml's [tool.pytest.ini_options]).

    ROOT   the checkout (configs/, examples/, benchmarks/, docs/, tfdist/)
    TESTS  tests/: the shared fixtures (conftest.py) and helper modules
    JOBS   tests/e2e/jobs/: the job programs the tests launch (run with cwd=JOBS; their
           shared modules, models.py, runs.py, zoo.py..., imported by in-process tests
           through the `jobs_path` fixture)
    DATA   tests/data/: fixtures kept as files (a backup an older tfdist wrote)
"""

import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
JOBS = TESTS / "e2e" / "jobs"
DATA = TESTS / "data"
