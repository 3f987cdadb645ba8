"""What every example reads the same way: the `train:` keys they share (so every config in
configs/ runs each example), their checks (tfdist's own, so a bad value is a located
`ConfigError`), and the command-line flags that override them."""

import functools
import sys

from tfdist.config import ConfigError, checks
from tfdist.config.yaml_source import Source

LOOPS = ("fit", "ctl")
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
positive = functools.partial(checks.integer, minimum=1)
#: The `train:` keys every example takes, and their checks.
TRAIN_CHECKS = {
    "batch_size": positive,
    "epochs": positive,
    "steps_per_epoch": positive,
    "validation_steps": positive,
    "learning_rate": functools.partial(checks.number, minimum=0, open_minimum=True),
    "seed": functools.partial(checks.integer, minimum=0),
    "loop": functools.partial(checks.string, choices=LOOPS),
    "policy": functools.partial(checks.string, choices=POLICIES),
    "backup_dir": checks.path,
}
#: Flags that override a key of tfdist's own sections, by the optimizer's keyword.
TFDIST_OVERRIDES = {"start_step": "compression.start_step",
                    "warmup_steps": "local_sgd.warmup_steps", "period": "local_sgd.period"}


def define_flags(flags, config_help, output_dir):
    """Defines --config, --output_dir and an override flag for each shared `train:` key
    and each of `TFDIST_OVERRIDES` (None: the config's value)."""
    flags.DEFINE_string("config", None, config_help, required=True)
    flags.DEFINE_string("output_dir", output_dir, "where the chief writes its outputs")
    for name in ("epochs", "steps_per_epoch", "validation_steps", "seed"):
        flags.DEFINE_integer(name, None, f"override train.{name}")
    flags.DEFINE_integer("batch_size", None, "override train.batch_size (global)")
    flags.DEFINE_float("learning_rate", None, "override train.learning_rate")
    flags.DEFINE_enum("loop", None, list(LOOPS), "override train.loop")
    flags.DEFINE_enum("policy", None, list(POLICIES), "override train.policy (Keras dtype policy)")
    flags.DEFINE_string("backup_dir", None, "override train.backup_dir: back up every epoch "
                        "there; a SIGTERM saves after the next step, a relaunch resumes there. "
                        "tfdist writes and removes only its own entries there (checkpoint-*, "
                        "latest, run.json, .lock); a finished run removes its backups")
    for name, key in TFDIST_OVERRIDES.items():
        flags.DEFINE_integer(name, None, f"override {key}")


def flag_values(flags_values, names):
    """{name: the flag's value} of `names` (None where the flag was not given)."""
    return {name: getattr(flags_values, name) for name in names}


def source_of(config):
    """Where the config's sections came from (for located errors)."""
    return config.source or Source(config.path or "<config>", {}, {})


def checked_section(source, name, section, checks_, overrides=None, ignored=()):
    """The keys of section `name` that `checks_` knows, each checked (refusing any other
    key but `ignored`), updated with the non-None `overrides` (checked as the flags they
    came from: ``command line --epochs: train.epochs: ...``)."""
    checks.mapping(source, (name,), section, (*checks_, *ignored))
    values = {k: checks_[k](source, (name, k), v) for k, v in section.items() if k in checks_}
    for key, value in (overrides or {}).items():
        if value is not None and key in checks_:
            flag = Source(f"command line --{key}", {}, {})
            values[key] = checks_[key](flag, (name, key), value)
    return values


def require_tensorflow_backend():
    """Exits 2 with one line if `KERAS_BACKEND` names a backend other than TensorFlow (call
    it before importing Keras, whose import would fail in a traceback of its own)."""
    from tfdist.versions import backend_problem

    problem = backend_problem()
    if problem:
        print(f"{sys.argv[0]}: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)


def parse_flags(argv):
    """absl's flag parsing, a bad flag (`--loop bogus`, `--epochs abc`, an unknown one)
    ending in one line and exit code 2 as a bad config value does."""
    from absl import flags

    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        print(f"{argv[0] if argv else sys.argv[0]}: {' '.join(str(error).split())[:500]}",
              file=sys.stderr, flush=True)
        sys.exit(2)


def run(app, main):
    """`app.run(main)`, a bad config value or flag ending in one line (file, line, key),
    exit code 2, instead of a traceback; so does a backup directory this run cannot take
    (another run's backups, or another run writing there now)."""
    from tfdist.checkpoint import CheckpointError

    def checked(argv):
        try:
            return main(argv)
        except (ConfigError, CheckpointError) as error:
            print(f"{sys.argv[0]}: {error}", file=sys.stderr, flush=True)
            sys.exit(2)

    app.run(checked, flags_parser=parse_flags)
