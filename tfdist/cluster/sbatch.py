"""`tfdist sbatch`: the SLURM batch script that runs a ``cluster: slurm`` config.

The script asks for the tasks (`#SBATCH` lines) and starts them with one srun step, each
task running ``tfdist exec CONFIG -- COMMAND``, which derives its TF_CONFIG from SLURM's
environment (`tfdist.cluster.slurm`).

Preemption: the script asks SLURM for SIGTERM `grace_seconds` before the end
(``--signal=B:TERM@N``) and to be requeued (``--requeue``; ``--open-mode=append``
keeps the output of the run before). The signal — also SLURM's
preemption, ``scancel --signal=TERM --batch``, ``scontrol requeue`` — reaches the batch shell,
which has SLURM pass it to every task of the step (``scancel --signal=TERM JOBID``: a
SIGTERM to srun would kill them outright): they save at one agreed step
(`tfdist.callbacks.BackupAndRestore`) and exit with 143, and the script requeues the job
and waits for SLURM to end it; the job resumes from that backup when SLURM starts it again.
"""

import os
import re
import shlex
import sys

from tfdist.cluster.errors import ClusterError
from tfdist.cluster.manifest import (DEFAULT_GRACE_SECONDS, PREEMPTED_EXIT_CODE,
                                     check_grace_seconds)
from tfdist.cluster.slurm import task_counts
from tfdist.errors import one_line

_VALUE = re.compile(r"[!-~]+")  # visible ASCII: a value cannot end its #SBATCH line

# srun options: block distribution is what the TF_CONFIG assumes (also SLURM's default);
# one failed task ends the step instead of leaving the others waiting for it; output
# lines start with the task's SLURM_PROCID ("0: ...").
SRUN_OPTIONS = ("--distribution=block", "--kill-on-bad-exit=1", "--label")
REQUEUE_WAIT_SECONDS = 120  # after `scontrol requeue`, for SLURM to end the batch script


def batch_script(config, command, *, ntasks=None, options=(), tfdist=None,
                 grace_seconds=DEFAULT_GRACE_SECONDS):
    """The text of a batch script for `sbatch`.

    Args:
        config: a `Config` with ``cluster: slurm``.
        command: the training command every task runs (argv list).
        ntasks: SLURM tasks (TF tasks); default the fewest the config fits
            (chief + ps + evaluator + one worker).
        options: more ``(name, value)`` sbatch options, e.g. ``("nodes", "2")``; a value of
            None leaves the option out.
        tfdist: argv that runs tfdist on the nodes; default this Python's ``-m tfdist``.
        grace_seconds: SIGTERM this long before the time limit, time to save.

    Raises:
        ClusterError: not a slurm config, too few tasks, or a value that is not one
            visible-ASCII word.
    """
    ntasks = _checked_ntasks(config, ntasks)
    check_grace_seconds(grace_seconds)
    lines = _directives(config, ntasks, options, grace_seconds)
    srun_line = _srun_line(config, command, tfdist)
    return "\n".join(lines + ["set -uo pipefail", *_PREEMPTIBLE(srun_line)]) + "\n"


def _checked_ntasks(config, ntasks):
    """The script's task count: `ntasks`, by default the fewest the slurm config fits."""
    slurm = config.cluster
    if getattr(slurm, "scheduler", None) != "slurm":
        raise ClusterError(f"tfdist sbatch needs a config with `cluster: {{slurm: {{...}}}}`; "
                           f"{config.path or 'the config'} lists its tasks, so run it with "
                           "`tfdist launch` (or list the hosts and use --task on each)")
    ntasks = slurm.minimum_tasks if ntasks is None else ntasks
    if ntasks < slurm.minimum_tasks:
        raise ClusterError(f"--ntasks must be at least {slurm.minimum_tasks} for this config "
                           f"(chief {slurm.chief}, ps {slurm.ps}, evaluator {slurm.evaluator} "
                           f"and one worker). Received: --ntasks={ntasks}")
    return ntasks


def _directives(config, ntasks, options, grace_seconds):
    """The script's head: the shebang, a comment on the layout and the #SBATCH lines."""
    name = one_line(config.path or "a config").encode("ascii", "backslashreplace").decode()
    size = [f"#SBATCH --ntasks={ntasks}"] if config.elastic is None else \
        _elastic_size(config, ntasks, options)
    lines = ["#!/bin/bash", f"# Written by tfdist sbatch for {name}: "
             f"{'up to ' if config.elastic else ''}{ntasks} TF task(s), "
             f"{_layout(config.cluster, ntasks)}.",
             *size, f"#SBATCH --signal=B:TERM@{grace_seconds}",
             "#SBATCH --requeue", "#SBATCH --open-mode=append"]  # a requeued run's log after
    # the preempted one's, not over it
    lines += [f"#SBATCH --{name}={_checked(name, value)}" for name, value in options
              if value is not None]
    return lines


def _srun_line(config, command, tfdist):
    """The srun command that starts every task, as one line of bash words."""
    config_path = os.path.abspath(config.path) if config.path else "CONFIG"
    tfdist = list(tfdist or (sys.executable, "-m", "tfdist"))
    srun = ["srun", *SRUN_OPTIONS, *tfdist, "exec", config_path, "--", *command]
    nul = next((word for word in srun if "\0" in word), None)
    if nul is not None:  # no command line can carry one
        raise ClusterError(f"a command argument cannot hold a NUL character. Received: {nul!r}")
    return " ".join(shell_word(word) for word in srun)


def shell_word(text):
    """`text` as one bash word on one line of printable ASCII: single-quoted (`shlex`),
    or ANSI-C quoted (``$'...'``, every other byte as ``\\xHH``) when it holds a newline, a
    control character, non-ASCII text or bytes that are not UTF-8 (a command line's
    ``surrogateescape``) — so that no value can start a line of the script, and bash
    hands the task exactly the bytes it was given."""
    if text.isascii() and text.isprintable():
        return shlex.quote(text)
    data = text.encode("utf-8", "surrogateescape")
    return "$'" + "".join(chr(b) if 0x20 <= b < 0x7f and chr(b) not in "\\'" else f"\\x{b:02x}"
                          for b in data) + "'"


def _PREEMPTIBLE(srun):  # noqa: N802 (the script's body)
    """srun in the background, SIGTERM passed on to its tasks, a preempted step requeued."""
    return [
        "# SIGTERM (preemption, the time limit's --signal, scancel --signal=TERM --batch) goes",
        "# on to every task of the step, through SLURM: srun itself would kill the tasks",
        f"# outright. Tasks that saved at the agreed step exit with {PREEMPTED_EXIT_CODE}.",
        "# The trap comes first: a SIGTERM between the two would end this script outright.",
        'trap \'scancel --signal=TERM "$SLURM_JOB_ID"\' TERM',
        f"{srun} &",
        "step=$!",
        "status=0",
        'wait "$step" || status=$?',
        'while kill -0 "$step" 2>/dev/null; do status=0; wait "$step" || status=$?; done',
        f'if [ "$status" -eq {PREEMPTED_EXIT_CODE} ]; then',
        '  echo "tfdist: preempted; requeueing job $SLURM_JOB_ID" >&2',
        "  # SLURM ends this script once the requeue is under way; exiting first would race",
        "  # it (the job could end FAILED instead of pending again).",
        "  trap - TERM",
        f'  scontrol requeue "$SLURM_JOB_ID" && sleep {REQUEUE_WAIT_SECONDS}',
        "fi",
        'exit "$status"']


def _elastic_size(config, ntasks, options):
    """The #SBATCH lines of an ``elastic:`` job: a range of nodes, one TF task each
    (``--nodes=MIN-MAX``: SLURM starts it with as many as it can give, at least MIN). A lost
    node fails the job, which SLURM requeues (``--requeue``; its NODE_FAIL), and the job
    resumes from its backup on the nodes it then gets — a resize at each start, not while
    it runs."""
    taken = sorted(name for name, value in options
                   if value is not None and name in ("nodes", "ntasks-per-node"))
    if taken:
        raise ClusterError(f"with an elastic: section tfdist sbatch chooses --nodes (a range, "
                           f"one task each) itself; leave out --{', --'.join(taken)}")
    slurm = config.cluster
    least = slurm.ps + slurm.evaluator + config.elastic.min_workers  # min_workers: chief too
    if not slurm.minimum_tasks <= least <= ntasks:
        members = ntasks - slurm.ps - slurm.evaluator
        raise ClusterError(f"elastic.min_workers must be between {1 + slurm.chief} and the "
                           f"{members} chief and worker tasks of --ntasks={ntasks}. Received: "
                           f"min_workers={config.elastic.min_workers}")
    return [f"# elastic: {least} to {ntasks} nodes, one TF task each; a lost node requeues "
            "the job, which resumes from its backup on the nodes it gets",
            f"#SBATCH --nodes={least}-{ntasks}", "#SBATCH --ntasks-per-node=1"]


def _layout(slurm, ntasks):
    counts = task_counts(slurm, ntasks)
    return ", ".join(f"{job} x{n}" for job, n in counts.items() if n) + f", ports {slurm.port}+"


def _checked(name, value):
    text = str(value)
    if not _VALUE.fullmatch(text):
        raise ClusterError(f"--{name} takes one word of visible characters (no spaces or "
                           f"newlines, which would end the #SBATCH line). Received: {text!r}")
    return text
