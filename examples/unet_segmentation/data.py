"""Input pipelines of the UNet example: synthetic shapes, Oxford-IIIT Pet, or a folder.

Each source gives `(image float32 [s, s, 3] in [0, 1], mask int32 [s, s])` examples;
`dataset_fn` turns one into a function of a `tf.distribute.InputContext` that shards
the examples per input pipeline (each worker reads its own part, without overlap) and
batches them per replica — the form every tf.distribute strategy accepts.
"""

import glob
import os

import tensorflow as tf

import tfdist

import shapes

PET_CLASSES = ("pet", "background", "outline")


class DataError(ValueError):
    """The data the config points to is missing or inconsistent."""


def num_classes(train):
    return {"synthetic": len(shapes.CLASSES), "oxford_pet": len(PET_CLASSES)}.get(
        train.dataset, train.num_classes)


def examples(train, split, shard=(1, 0)):
    """The unbatched examples of `split` ("train" or "validation") for one shard."""
    if train.dataset == "synthetic":
        return shapes.shapes_dataset(train.seed, train.image_size, split,
                                     train.num_examples if split == "train" else 512, shard)
    if train.dataset == "oxford_pet":
        data = oxford_pet(train.data_dir, split).shard(*shard)
    else:
        data = folder(train.data_dir, train.num_classes, split).shard(*shard)
    return data.map(lambda image, mask: _resize(image, mask, train.image_size),
                    num_parallel_calls=tf.data.AUTOTUNE)


def dataset_fn(train, split):
    """fn(InputContext) -> per-replica batches of `split`, repeated, shuffled if training."""

    def fn(context):
        data = examples(train, split, (context.num_input_pipelines, context.input_pipeline_id))
        if split == "train":
            data = data.shuffle(1024, seed=train.seed + context.input_pipeline_id)
        batch = tfdist.strategies.replica_batch_size(context, train.batch_size)  # any split
        return data.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return fn


def _resize(image, mask, size):
    image = tf.image.resize(tf.image.convert_image_dtype(image, tf.float32), [size, size])
    mask = tf.image.resize(mask[..., None], [size, size], method="nearest")[..., 0]
    return image, tf.cast(mask, tf.int32)


def oxford_pet(data_dir, split):
    """Oxford-IIIT Pet from TensorFlow Datasets files already on disk (never downloads).

    Masks {1, 2, 3} become classes {0: pet, 1: background, 2: outline}.
    """
    expected = os.path.join(data_dir, "oxford_iiit_pet")
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError("dataset: oxford_pet reads TensorFlow Datasets files; install "
                        "tensorflow-datasets and prepare them under "
                        f"{expected}/<version>/ (tfds build oxford_iiit_pet)") from None
    versions = sorted(glob.glob(os.path.join(expected, "*", "dataset_info.json")))
    if not versions:
        raise DataError(f"Oxford-IIIT Pet not found: expected {expected}/<version>/"
                        "dataset_info.json and oxford_iiit_pet-{train,test}.tfrecord-* "
                        f"files under data_dir={data_dir!r}")
    data = tfds.load("oxford_iiit_pet", data_dir=data_dir, download=False,
                     split="train" if split == "train" else "test")
    return data.map(lambda e: (e["image"], tf.cast(e["segmentation_mask"][..., 0], tf.int32) - 1))


def folder(data_dir, classes, split):
    """`data_dir/images/NAME.(png|jpg)` with masks `data_dir/masks/NAME.png`.

    The last tenth of the sorted pairs (at least one) is the validation split. Every pair
    is checked once: a missing mask, an image and mask of different sizes, or a mask
    value outside [0, classes) is a `DataError` naming the file.
    """
    pairs = _pairs(data_dir)
    cut = len(pairs) - max(1, len(pairs) // 10)
    if cut < 1:
        raise DataError(f"{data_dir}: need at least 2 image/mask pairs (train and validation)")
    for image_path, mask_path in pairs:
        _check_pair(image_path, mask_path, classes)
    chosen = pairs[:cut] if split == "train" else pairs[cut:]
    images, masks = zip(*chosen)
    data = tf.data.Dataset.from_tensor_slices((list(images), list(masks)))
    return data.map(lambda i, m: (tf.io.decode_image(tf.io.read_file(i), 3, expand_animations=False),
                                  tf.io.decode_png(tf.io.read_file(m), 1)[..., 0]))


def _pairs(data_dir):
    images = sorted(p for ext in ("png", "jpg", "jpeg")
                    for p in glob.glob(os.path.join(data_dir, "images", f"*.{ext}")))
    if not images:
        raise DataError(f"no images found: expected {data_dir}/images/*.png or *.jpg")
    pairs, missing = [], []
    for image in images:
        mask = os.path.join(data_dir, "masks", os.path.splitext(os.path.basename(image))[0] + ".png")
        (pairs if os.path.exists(mask) else missing).append((image, mask))
    if missing:
        raise DataError(f"{len(missing)} image(s) have no mask, e.g. {missing[0][0]} needs "
                        f"{missing[0][1]}")
    return pairs


def _check_pair(image_path, mask_path, classes):
    image = tf.io.decode_image(tf.io.read_file(image_path), 3, expand_animations=False)
    mask = tf.io.decode_png(tf.io.read_file(mask_path), 1)
    if image.shape[:2] != mask.shape[:2]:
        raise DataError(f"{mask_path} is {mask.shape[1]}x{mask.shape[0]} but its image "
                        f"{image_path} is {image.shape[1]}x{image.shape[0]}")
    top = int(tf.reduce_max(mask))
    if top >= classes:
        raise DataError(f"{mask_path} has class {top}, but num_classes={classes} "
                        f"(mask values must be 0..{classes - 1})")
