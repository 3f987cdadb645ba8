"""Horovod's own TF2/Keras examples under `tfdist launch -n N`, their import changed to
`tfdist.horovod` (issue 57). Run by hand beside a Horovod checkout — its code is not in
tfdist, and CI has no copy of it:

    python benchmarks/horovod_examples.py --horovod /path/to/horovod [--workers 1 2 4]

Each example is copied with these edits, every one listed in the results:

- the import (`horovod.tensorflow[.keras]` -> `tfdist.horovod.tensorflow[.keras]`, and
  `import horovod` for the `horovod.run` branch a `tfdist launch` run does not take);
- what Keras 3 itself refuses, with or without Horovod: `compile(...,
  experimental_run_tf_function=False)` (no such argument) and `opt.variables()` (a list);
- what this machine cannot do: MNIST is not downloadable here (a synthetic MNIST of the
  same shapes and dtypes), and the step counts are cut to run in minutes on 2 CPU cores.

Each task runs its copy under a runner (RUNNER, not an edit): at exit it writes a SHA-256
of every Keras model's trainable weights in that process, so the workers' final weights
are compared (batch norm's moving statistics are each worker's own, in Horovod too).

Writes results/horovod_examples.{json,md}: per example and number of workers, the exit
code, the wall time, the first and last loss (or images/s) the chief printed, and whether
every worker ended with the same weights.
"""

import argparse
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
IMPORTS = [("import horovod.tensorflow.keras as hvd", "import tfdist.horovod.tensorflow.keras as hvd"),
           ("import horovod.keras as hvd", "import tfdist.horovod.keras as hvd"),
           ("import horovod.tensorflow as hvd", "import tfdist.horovod.tensorflow as hvd"),
           ("import horovod\n", "import tfdist.horovod as horovod\n")]
KERAS_3 = [(",\n                        experimental_run_tf_function=False)", ")"),
           (",\n              experimental_run_tf_function=False)", ")"),
           ("opt.variables()", "opt.variables")]
SYNTHETIC_MNIST = ("tf.keras.datasets.mnist.load_data(path='mnist-%d.npz' % hvd.rank())",
                   "_synthetic_mnist(hvd.rank())")
#: MNIST's shapes and dtypes, learnable: each digit class lights its own band of rows.
SYNTHETIC_MNIST_DEF = """
def _synthetic_mnist(seed, n=6000):
    import numpy as np
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    images = rng.integers(0, 96, (n, 28, 28))
    rows = np.arange(28)[None, :, None]
    band = (rows >= 2 * labels[:, None, None] + 4) & (rows < 2 * labels[:, None, None] + 8)
    return (np.where(band, images + 150, images).astype("uint8"), labels.astype("uint8")), None
"""
#: Horovod's Keras ImageNet ResNet-50 example is TensorFlow 1 and Keras 2 code: what no
#: TensorFlow 2 or Keras 3 runs, with or without Horovod (each edit listed).
TF1_SESSION = 'config = tf.ConfigProto()\nconfig.gpu_options.allow_growth = True\nconfig.gpu_options.visible_device_list = str(hvd.local_rank())\nK.set_session(tf.Session(config=config))\n'
IMAGENET_DIRECTORIES = '# Training data iterator.\ntrain_gen = image.ImageDataGenerator(\n    width_shift_range=0.33, height_shift_range=0.33, zoom_range=0.5, horizontal_flip=True,\n    preprocessing_function=keras.applications.resnet50.preprocess_input)\ntrain_iter = train_gen.flow_from_directory(args.train_dir,\n                                           batch_size=args.batch_size,\n                                           target_size=(224, 224))\n\n# Validation data iterator.\ntest_gen = image.ImageDataGenerator(\n    zoom_range=(0.875, 0.875), preprocessing_function=keras.applications.resnet50.preprocess_input)\ntest_iter = test_gen.flow_from_directory(args.val_dir,\n                                         batch_size=args.val_batch_size,\n                                         target_size=(224, 224))\n'
SYNTHETIC_IMAGENET = """# Small synthetic images (no ImageNet here): each class brightens its own rows.
class _SyntheticImages(keras.utils.PyDataset):
    def __init__(self, batch_size, batches, seed):
        super().__init__()
        self.batch_size, self.batches, self.seed = batch_size, batches, seed

    def __len__(self):
        return self.batches

    def __getitem__(self, index):
        import numpy as np
        rng = np.random.default_rng([self.seed, index % self.batches])
        labels = rng.integers(0, 10, self.batch_size)
        images = rng.normal(size=(self.batch_size, 32, 32, 3)).astype("float32")
        rows = np.arange(32)[None, :, None, None]
        images += 2.0 * ((rows // 3) == labels[:, None, None, None])
        return images, keras.utils.to_categorical(labels, 10)


train_iter = _SyntheticImages(args.batch_size, 16, hvd.rank())
test_iter = _SyntheticImages(args.val_batch_size, 4, 1000 + hvd.rank())
"""
TF1_KERAS2 = [(TF1_SESSION, ""), ("from keras.preprocessing import image\n", ""),
              (IMAGENET_DIRECTORIES, SYNTHETIC_IMAGENET),
              ("ResNet50(weights=None)", "ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)"),
              ("keras.optimizers.SGD(lr=", "keras.optimizers.SGD(learning_rate="),
              ("model.fit_generator(", "model.fit("), ("                    workers=4,\n", ""),
              ("model.evaluate_generator(test_iter, len(test_iter), workers=4)",
               "model.evaluate(test_iter, steps=len(test_iter), verbose=0)"),
              # Keras 3 (3.15) cannot train a model loaded from .h5 with SGD's momentum
              # ("Unknown variable ... the variables it was originally built with"), with
              # or without tfdist: the checkpoints resumed from are Keras 3's own format
              ("default='./checkpoint-{epoch}.h5'", "default='./checkpoint-{epoch}.keras'")]
NO_TENSORBOARD = ("    callbacks.append(keras.callbacks.TensorBoard(args.log_dir))\n", "")
EXAMPLES = {
    "tensorflow2_keras_mnist.py": {
        "cuts": [("epochs=24", "epochs=3"), ("500 // hvd.size()", "48 // hvd.size()")],
        "args": []},
    "tensorflow2_mnist.py": {
        "cuts": [("10000 // hvd.size()", "120 // hvd.size()")], "args": []},
    "tensorflow2_keras_synthetic_benchmark.py": {
        "cuts": [], "args": ["--batch-size", "4", "--num-iters", "3",
                             "--num-batches-per-iter", "2", "--no-cuda"]},
    "tensorflow2_synthetic_benchmark.py": {
        "cuts": [], "args": ["--batch-size", "4", "--num-iters", "2", "--num-batches-per-iter",
                             "2", "--num-warmup-batches", "1", "--no-cuda"]},
    "keras_imagenet_resnet50.py": {
        "folder": "keras", "port": TF1_KERAS2, "cuts": [],
        "args": ["--epochs", "2", "--warmup-epochs", "1", "--batch-size", "8",
                 "--val-batch-size", "8"],
        # run again in the same directory: rank 0 resumes from the last epoch's checkpoint
        # with hvd.load_model, as the example's resume branch does
        "resume": ["--epochs", "3", "--warmup-epochs", "1", "--batch-size", "8",
                   "--val-batch-size", "8"]},
}
RESUMED = " (resumed)"  # a resumed run's example name ends so
#: Runs a script as its own __main__, then writes weights-<task index>.sha256: every Keras
#: model of the process (by name), its trainable weights in order (Horovod's averaged
#: gradients keep those alike; batch norm's moving statistics are each worker's own, in
#: Horovod as here).
RUNNER = """
import atexit, gc, hashlib, json, os, runpy, sys


def fingerprint():
    import keras
    import numpy as np

    digest = hashlib.sha256()
    models = sorted((o for o in gc.get_objects() if isinstance(o, keras.Model)),
                    key=lambda m: m.name)
    for model in models:
        for weight in model.trainable_weights:
            digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    with open(f"weights-{task}.sha256", "w") as f:
        f.write(f"{len(models)} {digest.hexdigest()}")


atexit.register(fingerprint)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
NUMBER = r"([0-9.]+(?:e[-+]?[0-9]+)?)"
#: Training losses (not Keras' "val_loss:" nor the example's closing "Test loss:") or
#: images per second, as the chief prints them.
NUMBERS = re.compile(rf"(?<![\w])(?<!Test )(?:[Ll]oss:\s*){NUMBER}|{NUMBER} img/sec per")


def briefly(text):
    """An edit's text as the results list it: its first line, and how many follow."""
    lines = text.strip().splitlines() or [""]
    return lines[0] + (f" ... ({len(lines)} lines)" if len(lines) > 2 else
                       "\n".join([""] + lines[1:]))


def edited(source, cuts, port=()):
    """The example's text with the edits, and the list of those that applied."""
    applied = []
    tensorboard = [] if importlib.util.find_spec("tensorboard") else [NO_TENSORBOARD]
    for kind, pairs in (("import", IMPORTS), ("TensorFlow 1 / Keras 2 to TF 2 / Keras 3", port),
                        ("Keras 3", KERAS_3), ("offline data", [SYNTHETIC_MNIST]),
                        ("TensorBoard is not installed here", tensorboard),
                        ("fewer steps", cuts)):
        for old, new in pairs:
            if old in source:
                source = source.replace(old, new)
                applied.append(f"{kind}: {briefly(old)!r} -> {briefly(new)!r}")
    if SYNTHETIC_MNIST[1] in source:
        source = source.replace("import tensorflow as tf\n",
                                "import tensorflow as tf\n" + SYNTHETIC_MNIST_DEF, 1)
    return source, applied


def run(script, workers, args):
    runner = script.parent / "runner.py"
    runner.write_text(RUNNER)
    for old in script.parent.glob("weights-*.sha256"):
        old.unlink()
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tfdist", "launch", "-n", str(workers), "--",
                           sys.executable, str(runner), str(script), *args],
                          capture_output=True, text=True, timeout=3600, cwd=script.parent)
    seconds = time.monotonic() - began
    prints = {p.read_text() for p in script.parent.glob("weights-*.sha256")}
    alike = (len(list(script.parent.glob("weights-*.sha256"))) == workers and len(prints) == 1
             and not next(iter(prints)).startswith("0 "))
    chief = [line for line in done.stdout.splitlines() if line.startswith("[worker:0]")]
    values = [float(a or b) for line in chief for a, b in NUMBERS.findall(line)]
    return {"workers": workers, "exit": done.returncode, "seconds": round(seconds, 1),
            "first": values[0] if values else None, "last": values[-1] if values else None,
            "weights_alike": alike,
            "tail": (done.stderr if done.returncode else "\n".join(chief))[-1500:]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horovod", required=True, type=pathlib.Path,
                        help="a Horovod checkout (its examples/)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--only", nargs="*", help="example file names")
    args = parser.parse_args()
    saved = HERE / "results" / "horovod_examples.json"
    results = [r for r in (json.loads(saved.read_text()) if saved.exists() else [])
               if base(r["example"]) in EXAMPLES]  # earlier runs, replaced as these run
    with tempfile.TemporaryDirectory() as scratch:
        for name, spec in EXAMPLES.items():
            if args.only and name not in args.only:
                continue
            folder = args.horovod / "examples" / spec.get("folder", "tensorflow2")
            source, applied = edited((folder / name).read_text(), spec["cuts"],
                                     spec.get("port", ()))
            for workers in args.workers:  # each in a directory of its own (checkpoints)
                script = pathlib.Path(scratch) / f"{workers}-{name[:-3]}" / name
                script.parent.mkdir()
                script.write_text(source)
                runs = [(name, spec["args"])] + (
                    [(name + RESUMED, spec["resume"])] if "resume" in spec else [])
                for label, flags in runs:
                    result = {"example": label, "edits": applied, **run(script, workers, flags)}
                    print(f"{label} on {workers}: exit {result['exit']} in "
                          f"{result['seconds']} s, {result['first']} -> {result['last']}, "
                          f"weights alike: {result['weights_alike']}", flush=True)
                    results = [r for r in results
                               if (r["example"], r["workers"]) != (label, workers)] + [result]
                    write(results)


def base(example):
    """The example file a result's name is of."""
    return example[:-len(RESUMED)] if example.endswith(RESUMED) else example


def write(results):
    """results/horovod_examples.{json,md}, after every run (a long sweep keeps what ran)."""
    order = list(EXAMPLES)
    results = sorted(results, key=lambda r: (order.index(base(r["example"])), r["workers"],
                                             r["example"]))
    (HERE / "results" / "horovod_examples.json").write_text(json.dumps(results, indent=1))
    lines = ["# Horovod's examples under tfdist launch -n (benchmarks/horovod_examples.py)", "",
             "| example | workers | exit | seconds | first -> last (loss, or img/s) "
             "| every worker's weights alike |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['example']} | {r['workers']} | {r['exit']} | {r['seconds']} | "
              f"{r['first']} -> {r['last']} | "
              f"{ {True: 'yes', False: 'no'}.get(r.get('weights_alike'), 'not checked')} |"
              for r in results]
    lines += ["", "Edits per example:", ""]
    for name in dict.fromkeys(base(r["example"]) for r in results):
        edits = next(r["edits"] for r in results if base(r["example"]) == name)
        lines += [f"- {name}: " + "; ".join(f"`{e}`" for e in edits)]
    (HERE / "results" / "horovod_examples.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
