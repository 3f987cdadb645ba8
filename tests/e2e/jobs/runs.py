"""Several runs of a job in one process per task, one after the other, each on a new
strategy, as a sweep or a notebook would run them.

    tfdist launch job.yaml -- python runs.py JOB.py '["--flag", ...]' '["--flag", ...]' ...

JOB.py runs once per JSON list of flags, as its own `__main__` would: an absl program (the
examples: a module-level FLAGS) gets the flags parsed and `main([])`, another gets them in
`sys.argv` and `main()`. Keras' dtype policy is reset to float32 before each run. A new
multi_worker_mirrored per run is sound (tests/unit/strategies/test_strategy_lifetimes.py);
the tests save a launch and every task's TensorFlow import per run.
"""

import importlib.util
import json
import os
import sys


#: The line each task prints before a run (then the run's flags as JSON).
MARK = "tfdist-test-run"


def load(path):
    """JOB.py as a module named after it, its folder first on sys.path (its imports)."""
    path = os.path.abspath(path)
    sys.path.insert(0, os.path.dirname(path))
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(job, runs):
    import keras

    module = load(job)
    flags = getattr(module, "FLAGS", None)
    for argv in runs:
        print(MARK, json.dumps(argv), flush=True)  # where this run's output begins
        keras.mixed_precision.set_global_policy("float32")
        sys.argv = [job, *argv]
        if flags is not None:
            flags.unparse_flags()
            flags(sys.argv)
            module.main([])
        else:
            module.main()


if __name__ == "__main__":
    main(sys.argv[1], [json.loads(run) for run in sys.argv[2:]])
