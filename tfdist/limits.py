"""The limits a config file must stay within, so that hostile input fails fast and small.

A tfdist config is a few hundred bytes; every limit below is orders of magnitude above
real use, and each is checked before the work it bounds is done. Beyond a limit the
loader raises a `ConfigError` naming the file, the line, the key and the limit.

MAX_FILE_BYTES = 1 MiB (1,048,576 bytes)
    The largest config file read. At most this many bytes plus one are ever read, so
    ``/dev/zero``-like input or a huge file costs one MiB, not minutes and gigabytes.
MAX_VALUES = 100,000
    The most values (scalars, lists and mappings) in the document *after* expanding
    every alias. An alias stands for the whole node it names, so nested aliases grow
    exponentially ("billion laughs": 600 bytes that expand to 10^9 values); each alias
    is charged the size of its anchor as it is read, and the document is refused at the
    first alias that goes over, before anything is built from it.
MAX_DEPTH = 64
    The deepest nesting of lists and mappings, also counted through aliases. PyYAML
    builds nodes recursively (about 500 levels overflow the Python stack); tfdist's
    sections nest three levels.
MAX_NUMBER_CHARS = 100
    The longest number written in the file (digits, sign, ``_``, ``0x``...). Converting
    a longer one costs up to quadratic time (sexagesimal ``1:2:3...``), Python refuses
    integers of more than 4,300 digits, and no tfdist key takes more than 19 digits.
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
    The range of every integer tfdist uses (steps, periods, sizes end in ``tf.int64``).
MAX_TASKS = 10,000
    The most tasks in a cluster, summed over its jobs, whether given as counts or as
    address lists: ``worker: 100000000`` would otherwise build 10^8 addresses.
MAX_PATH_BYTES = 4,096
    The longest path a config gives (Linux's PATH_MAX, in UTF-8 bytes).
MAX_LOGICAL_CPUS = 1,024
    The most logical CPU devices a strategy splits this machine's CPU into
    (``strategy: {logical_cpus: N}``): 512 take TensorFlow 4 s and 650 MB here; 100,000
    would hang for minutes and end in MemoryError.

Recursive structures (an alias inside its own anchor, ``a: &a [*a]``) are refused
whatever their size: they have no finite expansion.
"""

MAX_FILE_BYTES = 1024 * 1024
MAX_VALUES = 100_000
MAX_DEPTH = 64
MAX_NUMBER_CHARS = 100
INT64_MIN = -2**63
INT64_MAX = 2**63 - 1
MAX_TASKS = 10_000
MAX_PATH_BYTES = 4096
MAX_LOGICAL_CPUS = 1024
#: Islands of one job (local SGD's `islands`): one collective group each; 64 group keys per
#: plan x up to 781 plans fit a strategy's key range.
MAX_ISLANDS = 64


def islands_problem(islands, workers, unit="workers"):
    """Why `islands` (a count or lists of indices) cannot group `workers` training tasks
    (chief and workers), or None: the one check `validate`, `tfdist exec` (against the
    scheduler's counted tasks) and the job's start share. `unit` "replicas": the
    replicas of one machine, which its islands group instead."""
    counted, indices, has = (
        ("a number of workers (chief and workers)", "worker index", "the cluster has")
        if unit == "workers" else
        ("a number of replicas", "replica index", "the strategy's devices give"))
    if isinstance(islands, int) and workers % islands:
        return (f"{islands} equal islands need {counted} divisible by {islands}; "
                f"{has} {workers}")
    if isinstance(islands, (tuple, list)) and sum(map(len, islands)) != workers:
        return (f"islands must list every {indices} 0..{workers - 1}"
                + (" (chief first, then the workers)" if unit == "workers" else "")
                + f" exactly once; they list {sum(map(len, islands))}")
    return None
