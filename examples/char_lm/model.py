"""A small decoder-only transformer over bytes (Radford et al. 2018, "Improving Language
Understanding by Generative Pre-Training"; pre-norm blocks as in GPT-2), in Keras 3."""

import keras
from keras import layers

VOCABULARY = 256  # bytes


class Block(layers.Layer):
    """Pre-norm causal self-attention and a 4x MLP, each with a residual connection."""

    def __init__(self, width, heads, dropout, **kwargs):
        super().__init__(**kwargs)
        self.norm1, self.norm2 = layers.LayerNormalization(), layers.LayerNormalization()
        self.attention = layers.MultiHeadAttention(heads, width // heads, dropout=dropout)
        self.mlp = keras.Sequential([layers.Dense(4 * width, activation="gelu"),
                                     layers.Dense(width), layers.Dropout(dropout)])

    def call(self, x, training=None):
        h = self.norm1(x)
        x = x + self.attention(h, h, use_causal_mask=True, training=training)
        return x + self.mlp(self.norm2(x), training=training)


class Positions(layers.Layer):
    """Adds a learned embedding of each position."""

    def build(self, input_shape):
        self.table = self.add_weight(shape=tuple(input_shape[1:]), initializer="zeros",
                                     name="positions")

    def call(self, x):
        return x + keras.ops.cast(self.table, x.dtype)


def decoder(sequence_length, width=64, depth=2, heads=2, dropout=0.0):
    """bytes [batch, sequence_length] -> next-byte logits [batch, sequence_length, 256]
    (float32 logits under a mixed policy)."""
    tokens = keras.Input((sequence_length,), dtype="int32")
    x = Positions()(layers.Embedding(VOCABULARY, width)(tokens))
    for i in range(depth):
        x = Block(width, heads, dropout, name=f"block_{i}")(x)
    x = layers.LayerNormalization()(x)
    logits = layers.Dense(VOCABULARY, dtype="float32", name="logits")(x)
    return keras.Model(tokens, logits, name="char_lm")
