"""UNet (Ronneberger et al. 2015), as in the TensorFlow image segmentation tutorial."""

import keras


def conv_block(x, filters):
    for _ in range(2):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization(momentum=0.9)(x)
        x = keras.layers.ReLU()(x)
    return x


def unet(image_size, num_classes, base_filters=16, depth=3, dropout=0.0):
    """Encoder of conv blocks with BatchNormalization, decoder of transposed convolutions
    with skip connections; returns per-pixel logits [batch, size, size, num_classes].

    Args:
        image_size: input height and width; divisible by 2**depth.
        num_classes: segmentation classes (including background).
        base_filters: filters of the first block, doubled at each level.
        depth: number of down-sampling levels.
        dropout: dropout rate at the bottleneck (0 for none).
    """
    if image_size % (2 ** depth):
        raise ValueError(f"image_size must be divisible by 2**depth={2 ** depth}. "
                         f"Received: image_size={image_size}")
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x, skips = inputs, []
    for level in range(depth):
        x = conv_block(x, base_filters * 2 ** level)
        skips.append(x)
        x = keras.layers.MaxPooling2D()(x)
    x = conv_block(x, base_filters * 2 ** depth)
    if dropout:
        x = keras.layers.Dropout(dropout)(x)
    for level in reversed(range(depth)):
        filters = base_filters * 2 ** level
        x = keras.layers.Conv2DTranspose(filters, 3, strides=2, padding="same")(x)
        x = conv_block(keras.layers.Concatenate()([x, skips[level]]), filters)
    outputs = keras.layers.Conv2D(num_classes, 1, name="logits", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="unet")
