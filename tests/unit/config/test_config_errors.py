"""Every kind of bad config is a ConfigError naming file, line, key and expectation."""

import pytest

import tfdist
from tfdist.config import ConfigError

# (id, YAML text, fragments the one-line message must contain)
CASES = [
    ("yaml-syntax", "cluster: [a, b\nstrategy: x\n", ["invalid YAML", "job.yaml:"]),
    ("empty-file", "", ["empty"]),
    ("only-comments", "# nothing here\n", ["empty"]),
    ("not-a-mapping", "- a\n- b\n", ["expected a mapping of sections"]),
    ("two-documents", "strategy: mirrored\n---\nstrategy: default\n", ["single document"]),
    ("duplicate-yaml-key", "strategy: mirrored\nstrategy: default\n",
     ["job.yaml:2:", "duplicate key 'strategy'", "line 1"]),
    ("misspelled-section", "stratgy: mirrored\n", ["did you mean 'strategy'"]),
    ("unknown-job-type", "cluster:\n  trainer: 2\n",
     ["job.yaml:2:", "cluster.trainer", "unknown key 'trainer'", "chief, worker, ps, evaluator"]),
    ("job-typo-suggests", "cluster: {wroker: 2}\n", ["did you mean 'worker'"]),
    ("master-job", "cluster:\n  master: ['a:1']\n  worker: ['b:1']\n",
     ["job.yaml:2:", "cluster.master", "use 'chief'"]),
    ("job-wrong-type", "cluster:\n  worker: localhost:2222\n",
     ["cluster.worker", 'a list of "host:port" strings or a task count']),
    ("address-not-string", "cluster:\n  worker: [2222]\n", ["cluster.worker[0]", '"host:port" string']),
    ("address-no-port", "cluster:\n  worker:\n    - localhost\n",
     ["job.yaml:3:", "cluster.worker[0]", 'expected "host:port"', "Received: 'localhost'"]),
    ("port-too-large", "cluster:\n  worker: ['a:2222', 'b:70000']\n",
     ["cluster.worker[1]", "outside 1-65535"]),
    ("port-zero", "cluster: {worker: ['a:0']}\n", ["outside 1-65535"]),
    ("port-not-number", "cluster: {worker: ['a:http']}\n", ["port 'http' is not a number"]),
    ("bad-host", "cluster: {worker: ['bad_host!:22']}\n", ["not a valid host name"]),
    ("bare-ipv6", "cluster: {worker: ['::1:22']}\n", ["brackets"]),
    ("duplicate-address", "cluster:\n  worker: ['localhost:2222', '127.0.0.1:2222']\n",
     ["cluster.worker[1]", "duplicate address", "worker:0"]),
    ("duplicate-across-jobs", "cluster: {chief: ['h:1'], worker: ['h:1']}\n",
     ["duplicate address", "chief:0"]),
    ("two-chiefs", "cluster:\n  chief: ['a:1', 'b:1']\n", ["at most one chief"]),
    ("chief-count-two", "cluster: {chief: 2, worker: 1}\n", ["cluster.chief", "between 0 and 1"]),
    ("two-evaluators", "cluster: {worker: 1, evaluator: ['a:1', 'b:1']}\n", ["at most one evaluator"]),
    ("negative-count", "cluster: {worker: -1}\n", ["cluster.worker", ">= 0", "Received: worker=-1"]),
    ("bool-count", "cluster: {worker: yes}\n", ["'yes' unquoted is read by YAML as True"]),
    ("no-tasks", "cluster: {worker: 0}\n", ["no tasks"]),
    ("ps-without-ps-strategy", "cluster: {worker: 2, ps: 1}\nstrategy: multi_worker_mirrored\n",
     ["cluster.ps", "parameter_server"]),
    ("ps-no-ps", "cluster: {chief: 1, worker: 2}\nstrategy: parameter_server\n",
     ["at least one ps"]),
    ("ps-no-worker", "cluster: {chief: 1, ps: 1}\nstrategy: parameter_server\n",
     ["at least one worker"]),
    ("ps-no-chief", "cluster: {worker: 2, ps: 1}\nstrategy: parameter_server\n",
     ["at least one chief", "coordinator"]),
    ("ps-no-cluster", "strategy: parameter_server\n", ["needs a cluster"]),
    ("single-machine-strategy-on-cluster", "cluster: {worker: 2}\nstrategy: mirrored\n",
     ["strategy.name", "one machine", "multi_worker_mirrored"]),
    ("unknown-strategy", "strategy: mirored\n",
     ["strategy.name", "did you mean 'mirrored'", "valid values are [mirrored,"]),
    ("strategy-without-name", "strategy: {communication: ring}\n", ["missing key 'name'"]),
    ("strategy-option-of-another", "strategy:\n  name: mirrored\n  communication: ring\n",
     ["job.yaml:3:", "strategy.communication", "unknown key", "cross_device_ops"]),
    ("yaml-off-as-bool", "strategy:\n  name: multi_worker_mirrored\n  communication: off\n",
     ["job.yaml:3:", "strategy.communication", "'off' unquoted is read by YAML as False"]),
    ("bad-communication", "strategy: {name: multi_worker_mirrored, communication: grpc}\n",
     ["valid values are [auto, ring, nccl]", "Received: communication='grpc'"]),
    ("logical-cpus-zero", "strategy: {name: mirrored, logical_cpus: 0}\n",
     ["between 1 and 1024"]),
    ("logical-cpus-huge", "strategy: {name: central_storage, logical_cpus: 100000}\n",
     ["between 1 and 1024", "Received: logical_cpus=100000"]),
    ("devices-not-list", "strategy: {name: mirrored, devices: /cpu:0}\n", ["a list of strings"]),
    ("unknown-compressor", "compression: {name: top-k}\n", ["did you mean 'topk'"]),
    ("ratio-zero", "compression:\n  name: topk\n  ratio: 0\n",
     ["job.yaml:3:", "compression.ratio", "> 0"]),
    ("ratio-above-one", "compression: {name: randomk, ratio: 1.5}\n", ["> 0 and <= 1"]),
    ("ratio-not-number", "compression: {name: topk, ratio: 1%}\n", ["a finite number"]),
    ("ratio-nan", "compression: {name: topk, ratio: .nan}\n", ["a finite number"]),
    ("ratio-wrong-compressor", "compression: {name: powersgd, ratio: 0.1}\n",
     ["compression.ratio", "applies only to [topk, randomk]"]),
    ("rank-zero", "compression: {name: powersgd, rank: 0}\n", ["compression.rank", ">= 1"]),
    ("levels-too-many", "compression: {name: qsgd, levels: 500}\n", ["between 1 and 127"]),
    ("start-step-negative", "compression: {name: fp16, start_step: -1}\n", [">= 0"]),
    ("min-size-float", "compression: {name: fp16, min_size: 1.5}\n", ["an integer"]),
    ("error-feedback-string", "compression: {name: sign, error_feedback: 'yes'}\n",
     ["true, false or 'ef21'"]),
    ("error-feedback-without-compressor", "compression: {name: none, error_feedback: true}\n",
     ["error feedback needs a compressor"]),
    ("compression-unknown-key", "compression: {name: topk, ration: 0.1}\n",
     ["did you mean 'ratio'"]),
    ("compression-under-central-storage", "strategy: central_storage\ncompression: fp16\n",
     ["compression.name", "nothing is exchanged"]),
    ("sign-under-ps", "cluster: {chief: 1, worker: 1, ps: 1}\nstrategy: parameter_server\n"
                      "compression: sign\n", ["only [none, fp16, bf16, int8]"]),
    ("control-character", "strategy: \x1f\n", ["invalid YAML", "special characters"]),
    ("local-sgd-period-zero", "local_sgd: {period: 0}\n", ["local_sgd.period", ">= 1"]),
    ("local-sgd-no-period", "local_sgd: {warmup_steps: 10}\n", ["missing key 'period'"]),
    ("local-sgd-negative-warmup", "local_sgd: {period: 4, warmup_steps: -3}\n", [">= 0"]),
    ("local-sgd-first-sync-past-int64", "local_sgd: {period: 9223372036854775807, "
     "warmup_steps: 1}\n", ["local_sgd.warmup_steps", "must be at most 0"]),
    ("local-sgd-warmup-past-int64", "local_sgd: {period: 4, warmup_steps: "
     "9223372036854775804}\n", ["local_sgd.warmup_steps", "at most 9223372036854775803"]),
    ("local-sgd-not-mapping", "local_sgd: 8\n", ["local_sgd", "a mapping"]),
    ("outer-unknown-name", "local_sgd: {period: 8, outer: nesterv}\n",
     ["local_sgd.outer.name", "did you mean 'nesterov'"]),
    ("outer-unknown-option", "local_sgd:\n  period: 8\n  outer: {name: sgd, momentun: 0.9}\n",
     ["job.yaml:3:", "local_sgd.outer.momentun", "did you mean 'momentum'"]),
    ("outer-clipnorm", "local_sgd: {period: 8, outer: {name: adam, clipnorm: 1}}\n",
     ["local_sgd.outer.clipnorm", "unknown key"]),
    ("outer-rate-string", "local_sgd: {period: 8, outer: {name: nesterov, learning_rate: fast}}\n",
     ["local_sgd.outer.learning_rate", "finite number"]),
    ("outer-no-name", "local_sgd: {period: 8, outer: {momentum: 0.9}}\n", ["missing key 'name'"]),
    ("fragments-above-period", "local_sgd: {period: 4, fragments: 5}\n",
     ["local_sgd.fragments", "between 1 and 4"]),
    ("overlap-a-whole-period", "local_sgd: {period: 4, overlap_steps: 4}\n",
     ["local_sgd.overlap_steps", "between 0 and 3"]),
    ("overlap-mix-above-one", "local_sgd: {period: 4, overlap_mix: 1.5}\n",
     ["local_sgd.overlap_mix", "between 0 and 1"]),
    ("local-sgd-compression-auto", "local_sgd: {period: 4, compression: auto}\n",
     ["local_sgd.compression.name", "int4"]),
    ("local-sgd-compression-twice", "compression: fp16\nlocal_sgd: {period: 4, compression: int4}\n",
     ["local_sgd.compression", "given twice"]),
    ("local-sgd-compression-unknown", "local_sgd: {period: 4, compression: {name: int3}}\n",
     ["local_sgd.compression.name", "int4"]),
    ("local-sgd-under-ps", "cluster: {chief: 1, worker: 1, ps: 1}\nstrategy: parameter_server\n"
                           "local_sgd: {period: 4}\n", ["local SGD needs replicas"]),
    ("non-string-key", "cluster: {1: ['a:1']}\n", ["keys must be strings"]),
    ("duplicate-key-by-value", "train:\n  1: a\n  0x1: b\n",
     ["job.yaml:3:", "train.0x1", "duplicate key '0x1'", "the same key as '1' on line 2"]),
    ("recursive-alias", "train: &t [*t]\n", ["job.yaml:1:", "train[0]", "inside its own anchor"]),
    ("alias-bomb", "a: &a [" + ", ".join(["x"] * 100) + "]\nb: &b [" + ", ".join(["*a"] * 100)
     + "]\nc: [" + ", ".join(["*b"] * 100) + "]\n",
     ["job.yaml:3:", "c[8]", "at most 100,000 values", "alias *b repeats 10,101 values"]),
    ("too-deep", "train: " + "[" * 70 + "]" * 70 + "\n", ["job.yaml:1:", "at most 64 nested"]),
    ("number-too-long", "compression: {name: topk, ratio: " + "1" * 400 + "}\n",
     ["job.yaml:1:", "compression.ratio", "at most 100 characters"]),
    ("beyond-int64", "compression: {name: fp16, start_step: 9223372036854775808}\n",
     ["compression.start_step", "64-bit integer"]),
    ("too-many-tasks", "cluster: {worker: 100000000}\n",
     ["cluster.worker", "at most 10,000 tasks", "Received: worker=100000000"]),
    ("escape-in-key", 'cluster: {"\\x1b[2Jworker": 1}\n', ["cluster.\\x1b[2Jworker",
                                                          "unknown key '\\x1b[2Jworker'"]),
]


@pytest.mark.parametrize("text,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_is_a_located_config_error(write_config, text, fragments):
    path = write_config(text)
    with pytest.raises(ConfigError) as raised:
        tfdist.load_config(path)
    message = str(raised.value)
    assert message.startswith(path), message
    assert message.isprintable(), message  # one line, no escape sequences
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_config_error_is_a_value_error_with_location(write_config):
    path = write_config("cluster:\n  worker: ['a:1']\n  ps: ['b:99999']\n")
    with pytest.raises(ValueError) as raised:
        tfdist.load_config(path)
    error = raised.value
    assert isinstance(error, ConfigError)
    assert (error.file, error.line, error.key) == (path, 3, "cluster.ps[0]")


def test_python_tags_are_refused_not_executed(write_config, tmp_path):
    marker = tmp_path / "pwned"
    path = write_config(f"train: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="python/object"):
        tfdist.load_config(path)
    assert not marker.exists()


def test_a_path_that_is_not_a_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"expected a path to a YAML file. Received: path=1"):
        tfdist.load_config(1)
    with pytest.raises(ConfigError, match="got a directory"):
        tfdist.load_config(tmp_path)


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        tfdist.load_config(tmp_path / "missing.yaml")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        tfdist.load_config(binary)


@pytest.mark.parametrize("parameter", ["ratio", "rank", "levels"])
def test_a_hyperparameter_range_is_declared_once_for_config_and_constructor(parameter):
    """The config loader and the compressor's constructor refuse the same values, from one
    declaration (tfdist/config/hyperparameters.py)."""
    from tfdist.compression.factory import build
    from tfdist.config.hyperparameters import HYPERPARAMETERS

    declared = HYPERPARAMETERS[parameter]
    name = declared.compressors[0]
    outside = declared.maximum + 1 if declared.maximum is not None else declared.minimum - 1
    for good in (declared.default, declared.minimum + 1):
        assert declared.valid(good)
        build(name, **{parameter: good})  # accepted by both
    with pytest.raises(tfdist.ConfigError, match=parameter) as from_config:
        tfdist.config.config_from_dict({"compression": {"name": name, parameter: outside}})
    compressor = type(build(name).compressor)
    with pytest.raises(tfdist.ConfigError) as from_argument:
        compressor(**{parameter: outside})
    assert from_argument.value.reason == from_config.value.reason  # the same check
    assert str(from_argument.value).startswith(f"{compressor.__name__}(): {parameter}: ")
