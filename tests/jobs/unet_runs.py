"""Several runs of the UNet example in one process per task, one after the other, each on
a new strategy, as a sweep or a notebook would run them.

    tfdist launch configs/X.yaml -- python unet_runs.py '["--config", "configs/A.yaml", ...]' ...

Each argument is a JSON list of train.py's flags. The example's own `main` runs each one
(a new multi_worker_mirrored per run is sound: tests/test_strategy_lifetimes.py); the
test saves a launch and every task's TensorFlow import per config.
"""

import json
import os
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "unet_segmentation")
sys.path.insert(0, os.path.abspath(EXAMPLE))

from absl import flags  # noqa: E402

import train  # noqa: E402


def main(runs):
    for argv in runs:
        flags.FLAGS.unparse_flags()
        flags.FLAGS([train.__file__, *argv])
        train.main([])


if __name__ == "__main__":
    main([json.loads(run) for run in sys.argv[1:]])
