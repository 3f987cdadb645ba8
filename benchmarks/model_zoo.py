"""The model zoo's table: each family users bring x each loop x each exchange, measured.

Trains every family of tests/e2e/jobs/zoo.py (a text transformer, a GRU/LSTM text model, a
convolutional net with BatchNormalization and Dropout, a multi-input multi-output model, a
frozen base fine-tuned after a recompile, a shared layer with an unused head) on 2 logical
CPUs through tfdist:

- with the exact exchange (``none``) and SGD with momentum, in `fit` on NumPy arrays, `fit`
  on a dataset, `tfdist.Trainer` and your own loop: the largest difference of any weight on
  any replica from one device's run (TensorFlow's own MirroredStrategy's for the family whose
  layers compute per replica, trainable weights);
- with every other exchange in `fit`: the loss after 4 epochs against the first epoch's,
  and whether every replica holds the same weights.

    python benchmarks/model_zoo.py [--from-results]

Writes benchmarks/results/model_zoo.json and .md (the table docs/concepts/models.md shows).
"""

import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e" / "jobs"))
RESULTS = ROOT / "benchmarks" / "results"

LOOPS = ("fit", "fit_dataset", "trainer", "own")


def replica_values(model):
    from tfdist.step.variables import underlying

    strategy = model.distribute_strategy
    return [[t.numpy() for t in strategy.experimental_local_results(underlying(w))]
            for w in model.weights]


def exact_cell(zoo, family, loop, strategy, mirrored, references):
    import numpy as np
    import tfdist

    base = {"fit_dataset": "fit", "trainer": "fit"}.get(loop, loop)
    key = (family, base)
    if key not in references:
        references[key] = zoo.train(family, base, mirrored if family in zoo.PER_REPLICA
                                    else None)[0]
    _, losses, model = zoo.train(
        family, loop.replace("_dataset", ""), strategy, numpy=loop != "fit_dataset",
        wrap=lambda o: tfdist.keras.DistributedOptimizer(o, "none"))
    gap = max(float(np.max(np.abs(value - expected)))
              for w, values, expected in zip(model.weights, replica_values(model),
                                             references[key])
              if w.trainable or family not in zoo.PER_REPLICA for value in values)
    return {"max_weight_difference": gap, "losses": losses}


def exchange_cell(zoo, family, exchange, strategy):
    import numpy as np
    import tfdist
    from tfdist.config.load import config_from_dict

    config = config_from_dict({"cluster": {"worker": 1}, "strategy": "mirrored",
                               **zoo.EXCHANGES[exchange]})
    _, losses, model = zoo.train(
        family, "fit", strategy, epochs=4, callbacks=[tfdist.callbacks.CommStats()],
        wrap=lambda o: tfdist.keras.optimizer_from_config(o, config))
    identical = all(np.array_equal(v, values[0]) for values in replica_values(model)
                    for v in values)
    logs = model.history.history
    return {"losses": losses, "identical": identical,
            "payload_bytes": logs["comm_payload_bytes"][-1],
            "ratio_vs_tensorflow": logs["compression_ratio_vs_tensorflow"][-1]}


def markdown(results):
    families = list(results["exact"])
    names = list(next(iter(results["exchanges"].values())))
    lines = ["Exact exchange (`none`), SGD with momentum, 2 replicas: the largest difference "
             "of any weight on any replica from one device (`conv`: from TensorFlow's own "
             "MirroredStrategy, trainable weights; its BatchNormalization statistics are "
             "the replicas' mean in tfdist, replica 0's in TensorFlow).", "",
             "| family | " + " | ".join(LOOPS) + " |", "|---|" + "---|" * len(LOOPS)]
    for family in families:
        cells = [f"{results['exact'][family][loop]['max_weight_difference']:.1e}"
                 for loop in LOOPS]
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    cells = [c for family in results["exchanges"].values() for c in family.values()]
    apart = sum(not c["identical"] for c in cells)
    lines += ["", "Other exchanges, `fit`, 4 epochs, 2 replicas: last epoch's loss / first "
              f"epoch's (below 1: it learns); ✗ where replicas end apart ({apart} of "
              f"{len(cells)}).", "",
              "| family | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for family in families:
        cells = []
        for exchange in names:
            cell = results["exchanges"][family][exchange]
            cells.append(f"{cell['losses'][-1] / cell['losses'][0]:.2f}"
                         + ("" if cell["identical"] else " ✗"))
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    lines += ["", f"Measured on {results['date']} in {results['seconds']:.0f} s "
              "(benchmarks/model_zoo.py)."]
    return "\n".join(lines) + "\n"


def main():
    if sys.argv[1:] == ["--from-results"]:  # the table again, from the last run's results
        results = json.loads((RESULTS / "model_zoo.json").read_text())
        (RESULTS / "model_zoo.md").write_text(markdown(results))
        return
    import tensorflow as tf

    import tfdist

    tfdist.strategies.ensure_logical_cpus(2)
    import zoo

    began = time.time()
    strategy = tfdist.get_strategy("mirrored")
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    references, results = {}, {"exact": {}, "exchanges": {}}
    for family in zoo.FAMILIES:
        results["exact"][family] = {loop: exact_cell(zoo, family, loop, strategy, mirrored,
                                                     references) for loop in LOOPS}
        results["exchanges"][family] = {e: exchange_cell(zoo, family, e, strategy)
                                        for e in zoo.EXCHANGES}
        print(family, "done", flush=True)
    results["seconds"] = time.time() - began
    results["date"] = time.strftime("%Y-%m-%d")
    (RESULTS / "model_zoo.json").write_text(json.dumps(results, indent=2))
    (RESULTS / "model_zoo.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
