"""tfdist.Trainer against plain tf.distribute in alternating blocks of steps in the same
2 worker processes (overhead.py), and the figures drawn from such pairs (the ratio and its
interval, the paired difference in ms): what the report, pass_through.py and
step_times_cost.py share.
"""

import json
import math
import pathlib
import statistics
import sys

from .methods import ONE_CORE, job_config
from .netns import ROOT, run_in_namespace

RESULTS = ROOT / "benchmarks" / "results"


def measure_overhead(pairs, block, workdir, *flags):
    """tfdist.Trainer against plain tf.distribute in alternating blocks of `block` steps,
    in the same 2 worker processes (overhead.py); returns its metrics."""
    workdir = pathlib.Path(workdir)
    config, out = workdir / "overhead.yaml", workdir / "out-overhead"
    config.write_text(job_config("none", 2))
    command = [*ONE_CORE, sys.executable, ROOT / "benchmarks" / "overhead.py",
               "--output_dir", out, "--pairs", pairs, "--block", block, *flags]
    return run_in_namespace(config, command, out, workdir)[1]


def overhead(results):
    """(tfdist's / plain's step time: the geometric mean over alternating block pairs, its
    95% confidence interval (low, high), the number of pairs), or (None, None, 0)."""
    blocks = (results.get("overhead") or {}).get("block_median_seconds")
    if not blocks:
        return None, None, 0
    logs = [math.log(t / p) for t, p in zip(blocks["tfdist"], blocks["plain tf.distribute"])]
    mean, n = statistics.mean(logs), len(logs)
    if n < 2:
        return math.exp(mean), None, n
    half = t_quantile(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half)), n


#: pass_through.py's newest measurement of today's Trainer (`--name pass_through_current`),
#: the ladder, and the same day's with only plain, plain_fresh and the Trainer (one fit, and
#: a fit per block) in more pairs (`--name pass_through_many_pairs`). Measurements of other
#: days are not pooled with them: the step's length moves with the machine's speed (0.33 s
#: when stop 41 measured, 0.073 s on 11-28, 0.049 s on 11-29), and tfdist's share with it.
CURRENT_PASS_THROUGH = "pass_through_current.json"
CURRENT_PASS_THROUGH_PAIRS = "pass_through_many_pairs.json"


def saved_overhead():
    """The pass-through of today's Trainer in the most pairs (`CURRENT_PASS_THROUGH_PAIRS`,
    if its Trainer's step has the graph ops of `CURRENT_PASS_THROUGH`'s: the same code;
    else `CURRENT_PASS_THROUGH`), else the longest measurement with tfdist's default
    exchange (`overhead_issue16.json`), or None."""
    found = [json.loads((RESULTS / name).read_text())
             for name in (CURRENT_PASS_THROUGH_PAIRS, CURRENT_PASS_THROUGH)
             if (RESULTS / name).exists()]
    if len(found) == 2 and found[0]["graph_ops"]["tfdist"] != found[1]["graph_ops"]["tfdist"]:
        found.pop(0)  # measured on other code than the ladder: stale
    if found:
        return found[0]
    older = RESULTS / "overhead_issue16.json"
    return json.loads(older.read_text())["one_buffer"] if older.exists() else None


def fresh_overhead(results):
    """`overhead` with a new input iterator each block on both sides: `Trainer.fit` called
    per block (the `trainer_fresh` rung; before 2026-11-29 the `tfdist` one was that) against
    plain's loop starting a new iterator each block (`plain_fresh`), or (None, None, 0)."""
    blocks = (results.get("overhead") or {}).get("block_median_seconds", {})
    if "plain_fresh" not in blocks:
        return None, None, 0
    return overhead({"overhead": {"block_median_seconds": {
        "tfdist": blocks.get("trainer_fresh", blocks["tfdist"]),
        "plain tf.distribute": blocks["plain_fresh"]}}})


#: overhead.py's name of a rung's figures where it is not the rung's own (`plain`, `trainer`).
NAMES = {"plain": "plain tf.distribute", "trainer": "tfdist"}


def difference(after, before):
    """Mean of paired differences (ms) and its 95% half-width (Student's t)."""
    pairs = [1000 * (a - b) for a, b in zip(after, before)]
    n = len(pairs)
    half = t_quantile(0.975, n - 1) * statistics.stdev(pairs) / math.sqrt(n)
    return statistics.mean(pairs), half


def t_quantile(p, df):
    """Student's t quantile: from the table at 0.975 for df <= 5, else the Cornish-Fisher
    expansion of the normal's (within 1% for df > 5)."""
    if p == 0.975 and df <= 5:
        return (12.706, 4.303, 3.182, 2.776, 2.571)[df - 1]
    z = statistics.NormalDist().inv_cdf(p)
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
