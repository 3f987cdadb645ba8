"""The `tfdist` command line: argument parsing only; the work is in the packages."""

import argparse
import json
import os
import signal
import sys

import yaml

from tfdist.cluster.environment import CommandError, exec_task
from tfdist.cluster.manifest import DEFAULT_GRACE_SECONDS, MAX_GRACE_SECONDS, tfjob_manifest
from tfdist.cluster.trainjob import trainjob_manifests
from tfdist.cluster.sbatch import batch_script
from tfdist.cluster.slurm import describe_slurm
from tfdist.cluster.spec import cluster_dict, parse_task
from tfdist.cluster.tf_config import tf_config
from tfdist.config import config_from_dict, load_config
from tfdist.errors import TfdistError, one_line
from tfdist.launch import launch
from tfdist.limits import MAX_TASKS

USAGE_ERROR = 2
MAX_COUNT_DIGITS = 10  # --max-restarts: a whole number below 10**10
SBATCH_OPTIONS = ("nodes", "ntasks-per-node", "cpus-per-task", "time", "partition", "account",
                  "job-name", "output")  # passed to #SBATCH lines as given


class UsageError(TfdistError):
    """Bad input on the command line: reported in one line with exit code 2."""


def main(argv=None):
    """Entry point of the `tfdist` console script; returns the exit code.

    A `TfdistError` (bad input) is one printable line on stderr and exit code 2; any
    other exception is a bug in tfdist and keeps its traceback. A closed stdout (``|
    head -1``) ends the command quietly with 141, as SIGPIPE ends other tools; Ctrl-C
    outside `tfdist launch` (which handles it itself) exits 130 without a traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, command = _split_command(argv)
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}"
                     + _command_hint(args, command))
    try:
        code = args.run(args, command)
        if sys.stdout is not None:  # None: started with stdout closed (print drops it)
            sys.stdout.flush()  # here, where a reader that went away can still be handled
        return code
    except TfdistError as e:
        report(f"tfdist {args.command_name}: error: {e}")
        return USAGE_ERROR
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


def report(message):
    """Writes `message` to stderr as one printable line (control characters escaped)."""
    if sys.stderr is None:  # started with stderr closed: nothing to tell
        return
    try:
        print(one_line(message), file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):  # stderr's reader gone: nothing left to tell
        pass


def _stdout_closed():
    """The reader of stdout went away: drop what is still buffered, exit like SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the final flush at exit must not fail
    except (OSError, ValueError):
        pass
    return 128 + signal.SIGPIPE


def _split_command(argv):
    """Everything after the first '--' is the command to run, untouched."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _command_hint(args, command):
    """Where a subcommand that runs a command was given one without '--': how to write it."""
    if command or getattr(args, "command_name", None) not in ("launch", "manifest"):
        return ""
    return (f"; write the command after --, e.g. `tfdist {args.command_name} "
            + ("-n 2" if args.command_name == "launch" else "CONFIG --image IMAGE")
            + " -- python train.py`")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (the usage is in --help)."""

    def error(self, message):
        report(f"{self.prog}: error: {message} (see {self.prog} --help)")
        self.exit(USAGE_ERROR)


def _parser():
    parser = _Parser(
        prog="tfdist", description="Distributed TensorFlow/Keras training from one YAML file.")
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a config file (exit 2 with the reason)")
    p.add_argument("config")
    p.set_defaults(run=_validate)

    p = sub.add_parser("tf-config", help="print one task's TF_CONFIG JSON")
    p.add_argument("config")
    p.add_argument("--task", required=True, metavar="TYPE:INDEX")
    p.set_defaults(run=_tf_config)

    _add_launch(sub)
    _add_manifest(sub)

    p = sub.add_parser("exec", help="in a scheduled task (JobSet pod, SLURM step, Vertex AI "
                                    "replica): set its TF_CONFIG and run COMMAND",
                       usage="tfdist exec CONFIG -- COMMAND [ARGS...]")
    p.add_argument("config")
    p.set_defaults(run=_exec)

    _add_sbatch(sub)
    return parser


def _add_launch(sub):
    p = sub.add_parser("launch", help="run every task locally: tfdist launch CONFIG -- CMD ..., "
                                      "or N workers: tfdist launch -n N -- CMD ...",
                       usage="tfdist launch (CONFIG | -n N) [--max-restarts N] "
                             "[--min-workers K [--rejoin-seconds S] [--discover CMD]] "
                             "[--task TYPE:INDEX] [--preload MODULES] -- COMMAND [ARGS...]")
    p.add_argument("config", nargs="?")
    p.add_argument("-n", "--num-workers", type=_workers, metavar="N",
                   help="no config file: N local workers under multi_worker_mirrored (as "
                        "horovodrun -np N)")
    p.add_argument("--max-restarts", type=_non_negative, default=0, metavar="N",
                   help="restart after a failure up to N times (default 0: stop the job); "
                        "multi_worker_mirrored restarts every task, parameter_server the "
                        "failed one")
    p.add_argument("--task", metavar="TYPE:INDEX",
                   help="run only this task (one host of a cluster with fixed addresses)")
    p.add_argument("--grace-seconds", type=float, default=10.0,
                   help="time tasks get to exit after SIGTERM before SIGKILL")
    p.add_argument("--hang-seconds", type=float, default=600.0,
                   help="a task with no output and no CPU use for this long is reported "
                        "as hung and killed (default 600; 0: never)")
    p.add_argument("--min-workers", type=_workers, metavar="K",
                   help="multi_worker_mirrored: a lost worker does not stop the job, which "
                        "goes on from its last backup with at least K workers (default: the "
                        "config's elastic.min_workers; none: never resize)")
    p.add_argument("--rejoin-seconds", type=float, metavar="S",
                   help="with --min-workers: a lost worker's place is offered back after S "
                        "seconds (doubled each time it is lost again) and taken back at an "
                        "agreed step (default: elastic.rejoin_seconds, else 60)")
    p.add_argument("--discover", metavar="CMD",
                   help="with --min-workers: a command line that prints how many workers can "
                        "run now, run every 5 s while a place is lost; a place comes back "
                        "only when there is room for it (default: elastic.discover)")
    p.add_argument("--preload", metavar="MODULES",
                   help="fork every task from one process that imported these modules "
                        "(comma-separated, e.g. tensorflow,keras) instead of each importing "
                        "them (default: $TFDIST_PRELOAD; empty: off)")
    p.set_defaults(run=_launch)


def _add_manifest(sub):
    p = sub.add_parser("manifest", help="print a Kubeflow TFJob, or a Trainer v2 "
                                        "TrainingRuntime and TrainJob, for the cluster",
                       usage="tfdist manifest CONFIG --image IMAGE [--format tfjob|trainjob] "
                             "[--name NAME] [--namespace NS] [--max-restarts N] "
                             "-- COMMAND [ARGS...]")
    p.add_argument("config", help="the config file; for trainjob also its path inside the "
                                  "image, where each pod's `tfdist exec` reads it")
    p.add_argument("--image", required=True)
    p.add_argument("--format", choices=("tfjob", "trainjob"), default="tfjob",
                   help="tfjob: kubeflow.org/v1 TFJob (default); trainjob: Kubeflow Trainer "
                        "v2 TrainingRuntime + TrainJob on JobSet")
    p.add_argument("--name", help="TFJob/TrainJob name (default: from the config file name)")
    p.add_argument("--namespace", default="default")
    p.add_argument("--max-restarts", type=_non_negative, default=0, metavar="N",
                   help="tfjob: restartPolicy ExitCode with this backoff limit; trainjob: "
                        "JobSet failurePolicy.maxRestarts (default 0: no restarts but "
                        "preemptions)")
    p.add_argument("--grace-seconds", type=_grace_seconds, default=DEFAULT_GRACE_SECONDS,
                   metavar="N", help="each pod's terminationGracePeriodSeconds: time to "
                                     f"save after SIGTERM (default {DEFAULT_GRACE_SECONDS})")
    p.set_defaults(run=_manifest)


def _add_sbatch(sub):
    p = sub.add_parser("sbatch", help="print a SLURM batch script for a cluster: slurm config",
                       usage="tfdist sbatch CONFIG [--ntasks N] [--nodes N] [--time T] "
                             "[--partition P] [...] -- COMMAND [ARGS...]")
    p.add_argument("config")
    p.add_argument("--ntasks", type=_non_negative, metavar="N",
                   help="SLURM tasks = TF tasks (default: chief + ps + evaluator + 1 worker)")
    for name in SBATCH_OPTIONS:
        p.add_argument(f"--{name}", metavar="VALUE", help=f"#SBATCH --{name}")
    p.add_argument("--grace-seconds", type=_grace_seconds, default=DEFAULT_GRACE_SECONDS,
                   metavar="N", help="SIGTERM this long before the time limit to save "
                                     f"(#SBATCH --signal=B:TERM@N; default {DEFAULT_GRACE_SECONDS})")
    p.set_defaults(run=_sbatch)


def _grace_seconds(text):
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_COUNT_DIGITS:
        raise argparse.ArgumentTypeError(f"expected a whole number of seconds from 1 to "
                                         f"{MAX_GRACE_SECONDS}. Received: {text!r}")
    seconds = int(text)
    if not 1 <= seconds <= MAX_GRACE_SECONDS:
        raise argparse.ArgumentTypeError(f"expected a whole number of seconds from 1 to "
                                         f"{MAX_GRACE_SECONDS}. Received: {text!r}")
    return seconds


def _non_negative(text):
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_COUNT_DIGITS:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 (at most "
                                         f"{MAX_COUNT_DIGITS} digits). Received: {text!r}")
    return int(text)


def _workers(text):
    """`-n`'s count: 1 to `MAX_TASKS` workers."""
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(MAX_TASKS))
            and 1 <= int(text) <= MAX_TASKS):
        raise argparse.ArgumentTypeError(
            f"expected a number of workers from 1 to {MAX_TASKS}. Received: {text!r}")
    return int(text)


def _validate(args, command):
    config = load_config(args.config)
    print(f"{one_line(args.config)}: OK ({describe(config)})")
    return 0


def describe(config):
    """A one-line summary of a config: strategy, tasks, compression, local SGD."""
    parts = [f"strategy {config.strategy.name}" if config.strategy else "no strategy section"]
    if config.cluster and config.cluster.scheduler == "slurm":
        parts.append(describe_slurm(config.cluster))
    elif config.cluster:
        parts.append("tasks " + ", ".join(f"{job}×{len(a)}" for job, a in config.cluster.jobs().items()))
    if config.compression:
        parts.append(f"compression {config.compression.name}")
    if config.local_sgd:
        local = config.local_sgd
        kind = f"DiLoCo (outer {local.outer['name']})" if local.outer else "local SGD"
        parts.append(f"{kind} every {local.period} steps" + (
            f", {local.fragments} fragments" if local.fragments > 1 else "") + (
            f", overlapped {local.overlap_steps} steps" if local.overlap_steps else "") + (
            f", {local.compression.name}" if local.compression else "") + (
            f", after {local.warmup_steps} synchronous steps" if local.warmup_steps else "") + (
            f" exchanging {local.warmup_compression.name}" if local.warmup_compression else ""))
    if config.elastic:
        parts.append(f"elastic: at least {config.elastic.min_workers} workers, a lost one "
                     f"offered back after {config.elastic.rejoin_seconds:g} s")
    return "; ".join(parts)


def _tf_config(args, command):
    config = load_config(args.config)
    if config.cluster is None:
        raise UsageError(f"{args.config} has no cluster: section, so there is no TF_CONFIG")
    cluster = cluster_dict(config.cluster)
    job, index = parse_task(args.task, cluster)
    print(json.dumps(tf_config(cluster, job, index), indent=2))
    return 0


def _launch(args, command):
    if args.config is not None and args.num_workers is not None and not command:
        raise UsageError(f"{args.config} would be a config file beside -n N, and no command "
                         "is given: write the command after --, e.g. `tfdist launch -n 2 -- "
                         f"python train.py`. Received: {args.config}")
    config = _launch_config(args.config, args.num_workers)
    only_task = None
    if args.task:
        if config.cluster is None:
            raise UsageError(f"--task needs a cluster: section in {args.config}")
        only_task = parse_task(args.task, {j: a for j, a in config.cluster.jobs().items()})
    _require_command(command, "launch")
    for flag in ("rejoin_seconds", "discover"):
        if getattr(args, flag) is not None and args.min_workers is None and config.elastic is None:
            raise UsageError(f"--{flag.replace('_', '-')} is for an elastic job: give "
                             "--min-workers K too (or an elastic: section in the config)")
    return launch(config, command, max_restarts=args.max_restarts, only_task=only_task,
                  grace_seconds=args.grace_seconds, hang_seconds=args.hang_seconds,
                  min_workers=args.min_workers, rejoin_seconds=args.rejoin_seconds,
                  discover=args.discover, preload=args.preload)


def _launch_config(path, workers):
    """The config file at `path`, or — `-n N` — N local workers under multi_worker_mirrored."""
    if (path is None) == (workers is None):
        given = "takes a config file or -n N, not both" if path is not None else \
            "needs a config file or -n N (N local workers)"
        raise UsageError(f"{given}: tfdist launch CONFIG -- COMMAND, or tfdist launch -n N -- "
                         "COMMAND")
    if path is not None:
        return load_config(path)
    return config_from_dict({"cluster": {"worker": workers}, "strategy": "multi_worker_mirrored"},
                            name=f"-n {workers}")


def _note_not_elastic(config, verb, orchestrator):
    """An elastic: section that `verb`'s output cannot express, said on stderr (the same
    config may also run under `tfdist launch`, which resizes)."""
    if config.elastic is not None:
        report(f"tfdist {verb}: note: {one_line(config.path or 'the config')}'s elastic: "
               f"section is not expressed here ({orchestrator} restarts the job at its "
               "declared size); only tfdist launch resizes. See docs/guides/elastic.md")


def _manifest(args, command):
    config = load_config(args.config)
    _require_command(command, "manifest")
    _note_not_elastic(config, "manifest", "Kubernetes")
    options = dict(image=args.image, command=command, name=args.name,
                   namespace=args.namespace, max_restarts=args.max_restarts,
                   grace_seconds=args.grace_seconds)
    if args.format == "trainjob":
        documents = trainjob_manifests(config, config_path=args.config, **options)
        print(yaml.safe_dump_all(documents, sort_keys=False), end="")
    else:
        print(yaml.safe_dump(tfjob_manifest(config, **options), sort_keys=False), end="")
    return 0


def _exec(args, command):
    config = load_config(args.config)
    _require_command(command, "exec")
    try:
        exec_task(config, command)  # replaces this process
    except CommandError as e:  # exit 127 (not found) or 126 (not executable), as a shell
        report(f"tfdist exec: error: {e}")
        return e.exit_code


def _sbatch(args, command):
    config = load_config(args.config)
    _require_command(command, "sbatch")
    options = [(name, getattr(args, name.replace("-", "_"))) for name in SBATCH_OPTIONS]
    print(batch_script(config, command, ntasks=args.ntasks, options=options,
                       grace_seconds=args.grace_seconds), end="")
    return 0


def _require_command(command, verb):
    if not command:
        raise UsageError(f"no command given; write it after --, e.g. "
                         f"tfdist {verb} job.yaml -- python train.py")
