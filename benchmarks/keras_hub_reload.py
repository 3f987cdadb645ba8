"""KerasHub's `GPT2CausalLM` saved and reloaded under tfdist (issue 73, item 5).

`GPT2CausalLM` overrides `compile`, so `keras.models.load_model` does not compile it from
the file: the exchange and the optimizer's state would be dropped. This check trains one
(a tiny backbone, random weights: no preset can be downloaded here) under `mirrored` on 2
logical CPUs with `DistributedOptimizer(Adam, "fp16")`, saves it, loads it back with
`tfdist.keras.load_model` and with `keras.models.load_model`, trains each for one more
epoch, and records the bytes per step (`CommStats`) and the optimizer's step at load.

keras-hub is not a tfdist dependency: `pip install keras-hub regex tokenizers` first.

    python benchmarks/keras_hub_reload.py

writes `benchmarks/results/keras_hub_reload.{json,md}`.
"""

import json
import os
import pathlib
import sys
import tempfile

import numpy as np

RESULTS = pathlib.Path(__file__).parent / "results"
BATCH, ROWS, LENGTH, VOCABULARY = 16, 64, 16, 64


def data():
    tokens = np.random.default_rng(0).integers(0, VOCABULARY, size=(ROWS, LENGTH + 1))
    tokens = tokens.astype("int32")
    return {"token_ids": tokens[:, :-1], "padding_mask": np.ones((ROWS, LENGTH), bool)}, \
        tokens[:, 1:]


def trained(model):
    """(bytes per step, the optimizer's step before) after one epoch of `fit`."""
    import tfdist

    before = int(model.optimizer.iterations.numpy())
    history = model.fit(*data(), batch_size=BATCH, epochs=1, verbose=0,
                        callbacks=[tfdist.callbacks.CommStats()])
    payload = history.history.get("comm_payload_bytes")
    return (None if payload is None else float(payload[-1])), before


def main():
    try:
        import keras_hub
    except ImportError as error:
        sys.exit(f"keras_hub_reload: needs keras-hub ({error}); pip install keras-hub regex "
                 "tokenizers")
    import keras

    import tfdist

    strategy = tfdist.get_strategy("mirrored", logical_cpus=2)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=32,
            intermediate_dim=64, max_sequence_length=LENGTH)
        model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        model.compile(optimizer=tfdist.keras.DistributedOptimizer(
            keras.optimizers.Adam(1e-3), "fp16"),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rows = [("trained", *trained(model))]
    path = os.path.join(tempfile.mkdtemp(), "gpt2.keras")
    model.save(path)
    for name, load in (("tfdist.keras.load_model", tfdist.keras.load_model),
                       ("keras.models.load_model", keras.models.load_model)):
        with strategy.scope():
            rows.append((name, *trained(load(path))))
    result = {"keras_hub": keras_hub.__version__, "keras": keras.__version__,
              "rows": [{"model": m, "bytes_per_step": b, "optimizer_step_at_start": s}
                       for m, b, s in rows]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "keras_hub_reload.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# KerasHub GPT2CausalLM reloaded (keras-hub {result['keras_hub']}, Keras "
             f"{result['keras']}, 2 logical CPUs, fp16 exchange)", "",
             "| model | bytes per step (CommStats) | optimizer step at start |",
             "| --- | --- | --- |"]
    lines += [f"| {m} | {'-' if b is None else f'{b:.0f}'} | {s} |" for m, b, s in rows]
    lines += ["", "`model.save` says in one line that `keras.models.load_model` will not compile "
              "this model (its own `compile`) and to load it with `tfdist.keras.load_model` "
              "under the strategy's scope; `-`: no exchange left to count."]
    (RESULTS / "keras_hub_reload.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
