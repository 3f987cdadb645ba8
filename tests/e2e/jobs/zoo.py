"""The model families users bring, their data, and the three loops that train them.

Each family is a small model of the kind people train, with seeded data of 40 rows
(global batches of 16: the last one partial):

- ``transformer``: keras-io's "Text classification with Transformer" (token and position
  `Embedding`, `MultiHeadAttention`, `LayerNormalization`, `Dense` over the sequence);
- ``rnn``: an `Embedding`, a `GRU` over the sequence and an `LSTM`, with `class_weight`;
- ``conv``: `Conv2D`, `BatchNormalization`, `Dropout`;
- ``multi_io``: the functional API guide's ticket model (a title's tokens and tags in,
  a priority and a department out) with `loss_weights` and `sample_weight`;
- ``finetune``: keras-io's transfer-learning recipe — a frozen base and a new head, then
  the base unfrozen and the model compiled again (the trainable set changes);
- ``shared``: one layer applied to two inputs, and a head no loss reads (None gradients).

`train(family, loop, strategy, optimizer_fn)` trains one of them with ``fit`` (NumPy
arrays or a dataset), ``trainer`` (`tfdist.Trainer`) or ``own`` (TensorFlow's custom
training loop tutorial, compiled by `tfdist.function`) and returns the weights and the
losses. With `optimizer_fn` returning a plain Keras optimizer and no strategy, it is the
single-device reference the distributed runs are compared with.
"""

import keras
import numpy as np
import tensorflow as tf

import tfdist

ROWS, BATCH, EPOCHS = 40, 16, 2
VOCAB, LENGTH = 300, 10
FAMILIES = ("transformer", "rnn", "conv", "multi_io", "finetune", "shared")
#: Families whose layers compute per replica what one device computes on the whole batch
#: differently (BatchNormalization's statistics, Dropout's masks): compared with
#: TensorFlow's own strategy on as many replicas instead of with one device.
PER_REPLICA = ("conv",)
#: Families trained in two stages (compiled again between them).
STAGED = ("finetune",)


#: The exchanges other than the exact one, as a config's sections: compression (min_size 0:
#: these small models' tensors are compressed too) and local SGD / DiLoCo (the inner SGD has
#: momentum 0.9 already: DiLoCo's outer momentum is the paper's halved).
EXCHANGES = {
    "fp16": {"compression": {"name": "fp16", "min_size": 0}},
    "int8": {"compression": {"name": "int8", "min_size": 0}},
    "topk+ef": {"compression": {"name": "topk", "ratio": 0.1, "error_feedback": True,
                                "min_size": 0}},
    "powersgd+ef": {"compression": {"name": "powersgd", "rank": 2, "error_feedback": True,
                                    "min_size": 0}},
    "sign+ef": {"compression": {"name": "sign", "error_feedback": True, "min_size": 0}},
    "local_sgd": {"local_sgd": {"period": 2}},
    "diloco": {"local_sgd": {"period": 2, "outer": {"name": "nesterov", "learning_rate": 0.7,
                                                    "momentum": 0.5}}},
}


# --- the models -------------------------------------------------------------------------

class TokenAndPositionEmbedding(keras.layers.Layer):
    """keras-io's: a token embedding plus a learned position embedding."""

    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = keras.ops.shape(x)[-1]
        positions = self.pos_emb(keras.ops.arange(start=0, stop=maxlen, step=1))
        return self.token_emb(x) + positions


class TransformerBlock(keras.layers.Layer):
    """keras-io's encoder block."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([keras.layers.Dense(ff_dim, activation="relu"),
                                     keras.layers.Dense(embed_dim)])
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs, training=None):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.dropout2(self.ffn(out1), training=training)
        return self.layernorm2(out1 + ffn_output)


def transformer(dropout=0.0):
    inputs = keras.Input((LENGTH,), dtype="int32")
    x = TokenAndPositionEmbedding(LENGTH, VOCAB, 16)(inputs)
    x = TransformerBlock(16, 2, 16, rate=dropout)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dropout(dropout)(x)
    x = keras.layers.Dense(8, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))


def rnn():
    inputs = keras.Input((LENGTH,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, 8)(inputs)
    x = keras.layers.GRU(8, return_sequences=True)(x)
    x = keras.layers.LSTM(8)(x)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))


def conv(dropout=0.25):
    return keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.BatchNormalization(), keras.layers.Dropout(dropout),
        keras.layers.Flatten(), keras.layers.Dense(3)])


def multi_io():
    """The functional API guide's ticket model, smaller."""
    title = keras.Input((LENGTH,), dtype="int32", name="title")
    tags = keras.Input((4,), name="tags")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 8)(title))
    x = keras.layers.concatenate([x, tags])
    priority = keras.layers.Dense(1, name="priority")(x)
    department = keras.layers.Dense(3, name="department")(x)
    return keras.Model({"title": title, "tags": tags},
                       {"priority": priority, "department": department})


def finetune():
    """A base (as keras-io's `base_model`) and a new head; the base starts frozen."""
    base = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                             keras.layers.GlobalAveragePooling2D()], name="base")
    base.trainable = False
    inputs = keras.Input((8, 8, 1))
    x = base(inputs, training=False)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def shared():
    """One Dense applied to two inputs; the "unused" head is in no loss."""
    a, b = keras.Input((6,), name="a"), keras.Input((6,), name="b")
    layer = keras.layers.Dense(5, activation="tanh", name="shared")
    h = keras.layers.concatenate([layer(a), layer(b)])
    return keras.Model({"a": a, "b": b},
                       {"out": keras.layers.Dense(1, name="out")(h),
                        "unused": keras.layers.Dense(2, name="unused")(h)})


def build(family, seed=0, **options):
    keras.utils.set_random_seed(seed)
    return {"transformer": transformer, "rnn": rnn, "conv": conv, "multi_io": multi_io,
            "finetune": finetune, "shared": shared}[family](**options)


# --- data and losses --------------------------------------------------------------------

def data(family, rows=ROWS, seed=0):
    """(x, y, sample_weight or None) as NumPy, learnable, with repeated tokens."""
    rng = np.random.default_rng(seed)
    if family in ("transformer", "rnn"):
        x = rng.integers(0, VOCAB, (rows, LENGTH)).astype("int32")
        x[:, :3] = 7  # a token every row repeats: duplicate embedding rows in each batch
        y = (x[:, 3:].mean(axis=1) > VOCAB / 2).astype("int32")
        return x, y, None
    if family in ("conv", "finetune"):
        x = rng.normal(size=(rows, 8, 8, 1)).astype("float32")
        y = rng.integers(0, 3, rows).astype("int32")
        for i, c in enumerate(y):
            x[i, :, c * 2:c * 2 + 3, 0] += 1.5
        return x, y, None
    if family == "multi_io":
        title = rng.integers(0, VOCAB, (rows, LENGTH)).astype("int32")
        tags = rng.integers(0, 2, (rows, 4)).astype("float32")
        y = {"priority": tags.sum(axis=1, keepdims=True) / 4,
             "department": (title[:, 0] % 3).astype("int32")}
        weight = rng.uniform(0.5, 1.5, rows).astype("float32")
        return {"title": title, "tags": tags}, y, weight
    x = {"a": rng.normal(size=(rows, 6)).astype("float32"),
         "b": rng.normal(size=(rows, 6)).astype("float32")}
    return x, {"out": (x["a"][:, :1] - x["b"][:, 1:2]).astype("float32"),
               "unused": np.zeros((rows, 2), "float32")}, None


def dataset(family, rows=ROWS, seed=0):
    """`data` as a dataset of global batches, in order."""
    x, y, w = data(family, rows, seed)
    parts = (x, y) if w is None else (x, y, w)
    return tf.data.Dataset.from_tensor_slices(parts).batch(BATCH)


CLASS_WEIGHT = {0: 1.0, 1: 2.0}  # the rnn's (fit's class_weight; the other loops weigh alike)
LOSS_WEIGHTS = {"priority": 1.0, "department": 0.2}


def compile_arguments(family):
    """What `model.compile` gets besides the optimizer."""
    sparse = keras.losses.SparseCategoricalCrossentropy
    if family in ("transformer", "rnn"):
        return {"loss": sparse(), "metrics": ["accuracy"]}
    if family in ("conv", "finetune"):
        return {"loss": sparse(from_logits=True), "metrics": ["accuracy"]}
    if family == "multi_io":
        return {"loss": {"priority": keras.losses.MeanSquaredError(),
                         "department": sparse(from_logits=True)}, "loss_weights": LOSS_WEIGHTS}
    return {"loss": {"out": keras.losses.MeanSquaredError(), "unused": None}}


def per_example_loss(family):
    """fn(y, y_pred) -> per-example losses, as compile weighs them (loss_weights; the rnn's
    class weights), for the Trainer and your own loop."""
    crossentropy = keras.losses.sparse_categorical_crossentropy
    if family == "rnn":
        return lambda y, p: crossentropy(y, p) * tf.gather(
            tf.constant([CLASS_WEIGHT[0], CLASS_WEIGHT[1]]), tf.cast(y, tf.int32))
    if family == "transformer":
        return crossentropy
    if family in ("conv", "finetune"):
        return lambda y, p: crossentropy(y, p, from_logits=True)
    if family == "multi_io":
        return lambda y, p: (
            LOSS_WEIGHTS["priority"] * keras.losses.mean_squared_error(y["priority"],
                                                                      p["priority"])
            + LOSS_WEIGHTS["department"] * crossentropy(y["department"], p["department"],
                                                        from_logits=True))
    return lambda y, p: keras.losses.mean_squared_error(y["out"], p["out"])


# --- the loops --------------------------------------------------------------------------

def sgd():
    """SGD with momentum: linear in the gradient, so every exact exchange ends where one
    device does."""
    return keras.optimizers.SGD(0.05, momentum=0.9)


def train(family, loop, strategy=None, optimizer_fn=sgd, wrap=None, epochs=EPOCHS,
          numpy=True, callbacks=(), seed=0, model_options=None):
    """Trains `family` with `loop` under `strategy` (None: the default, one device) ->
    (final weights, the loss of each epoch, the model).

    Args:
        optimizer_fn: makes a fresh optimizer (per stage).
        wrap: optimizer -> the optimizer trained with (e.g. a tfdist DistributedOptimizer);
            None: as it is.
        numpy: fit reads NumPy arrays (else a dataset).
        callbacks: more callbacks for fit and the Trainer.
    """
    strategy = strategy or tf.distribute.get_strategy()
    wrap = wrap or (lambda optimizer: optimizer)
    with strategy.scope():
        model = build(family, seed, **(model_options or {}))
    losses = []
    for stage in range(2 if family in STAGED else 1):
        if stage == 1:  # keras-io: unfreeze the base, compile again with a lower rate
            model.get_layer("base").trainable = True
        with strategy.scope():
            optimizer = wrap(optimizer_fn() if stage == 0 else _lower_rate(optimizer_fn()))
        run = {"fit": _fit, "trainer": _trainer, "own": _own}[loop]
        losses += run(family, model, optimizer, strategy, epochs, numpy, list(callbacks))
    return [w.numpy() for w in model.weights], losses, model


def _lower_rate(optimizer):
    config = optimizer.get_config()
    return type(optimizer).from_config({**config, "learning_rate": config["learning_rate"] / 5})


def _fit(family, model, optimizer, strategy, epochs, numpy, callbacks):
    with strategy.scope():
        model.compile(optimizer, **compile_arguments(family))
    extra = {"class_weight": CLASS_WEIGHT} if family == "rnn" else {}
    if tfdist.core.pipeline_of(optimizer) is not None:
        callbacks = [tfdist.callbacks.TrainingHooks(), *callbacks]
    if numpy:
        x, y, w = data(family)
        history = model.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=epochs,
                            shuffle=False, verbose=0, callbacks=callbacks, **extra)
    else:
        history = model.fit(dataset(family), epochs=epochs, verbose=0, callbacks=callbacks,
                            **extra)
    return history.history["loss"]


def _trainer(family, model, optimizer, strategy, epochs, numpy, callbacks):
    trainer = tfdist.Trainer(model, optimizer, per_example_loss(family), strategy=strategy)
    history = trainer.fit(dataset(family), epochs=epochs, verbose=0, callbacks=callbacks)
    return history.history["loss"]


def _own(family, model, optimizer, strategy, epochs, numpy, callbacks):
    """TensorFlow's "Custom training with tf.distribute.Strategy" loop: per-example
    losses, `tf.nn.compute_average_loss` over the global batch, `strategy.run`, and
    `strategy.reduce` of the losses; compiled by `tfdist.function`."""
    loss_fn = per_example_loss(family)
    with strategy.scope():
        optimizer.build(model.trainable_variables)

    def train_step(inputs):
        x, y, w = keras.utils.unpack_x_y_sample_weight(inputs)
        with tf.GradientTape() as tape:
            predictions = model(x, training=True)
            loss = tf.nn.compute_average_loss(loss_fn(y, predictions), sample_weight=w,
                                              global_batch_size=BATCH)
            loss += tf.nn.scale_regularization_loss(model.losses) if model.losses else 0.0
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    def distributed_train_step(inputs):
        per_replica_losses = strategy.run(train_step, args=(inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    routed = tfdist.core.pipeline_of(optimizer) is not None
    step = (tfdist.function(distributed_train_step, model=model, optimizer=optimizer)
            if routed else tf.function(distributed_train_step))  # the one-device reference
    losses = []
    for _ in range(epochs):
        total, batches = 0.0, 0
        for inputs in strategy.experimental_distribute_dataset(dataset(family)):
            total, batches = total + float(step(inputs)), batches + 1
        losses.append(total / batches)
    if routed:
        step.before_read()
    return losses
