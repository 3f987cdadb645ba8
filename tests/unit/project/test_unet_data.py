"""The UNet example's data: deterministic, sharded without overlap, clear errors."""

import hashlib

import numpy as np
import pytest
import tensorflow as tf
from paths import ROOT

pytestmark = pytest.mark.usefixtures("unet_path")


def fingerprints(dataset):
    return [hashlib.sha1(np.asarray(image).tobytes() + np.asarray(mask).tobytes()).hexdigest()
            for image, mask in dataset]


def test_synthetic_data_is_deterministic_for_a_seed():
    import shapes

    first = fingerprints(shapes.shapes_dataset(7, 32, num_examples=16))
    again = fingerprints(shapes.shapes_dataset(7, 32, num_examples=16))
    other = fingerprints(shapes.shapes_dataset(8, 32, num_examples=16))
    assert first == again
    assert not set(first) & set(other)
    assert len(set(first)) == 16


def test_shards_cover_the_data_without_overlap():
    import shapes

    whole = fingerprints(shapes.shapes_dataset(1, 32, num_examples=24))
    shards = [fingerprints(shapes.shapes_dataset(1, 32, num_examples=24, shard=(3, i)))
              for i in range(3)]
    assert sum(len(s) for s in shards) == 24
    assert set().union(*map(set, shards)) == set(whole)
    for i in range(3):
        for j in range(i + 1, 3):
            assert not set(shards[i]) & set(shards[j])
    validation = fingerprints(shapes.shapes_dataset(1, 32, "validation", num_examples=24))
    assert not set(validation) & set(whole)


def test_examples_have_every_class_and_valid_ranges():
    import shapes

    images, masks = next(iter(shapes.shapes_dataset(3, 32, num_examples=64).batch(64)))
    assert images.shape == (64, 32, 32, 3) and masks.shape == (64, 32, 32)
    assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0
    counts = np.bincount(masks.numpy().ravel(), minlength=4)
    assert len(counts) == 4 and (counts > 0).all()
    assert counts[0] == counts.max()  # background is the majority class


def test_dataset_fn_batches_per_replica_and_shards_per_pipeline():
    import data
    from train_config import TrainConfig

    train = TrainConfig(image_size=16, batch_size=8, num_examples=32)
    fn = data.dataset_fn(train, "validation")
    contexts = [tf.distribute.InputContext(2, i, 4) for i in range(2)]
    batches = [next(iter(fn(c))) for c in contexts]
    assert all(b[0].shape == (2, 16, 16, 3) for b in batches)  # 8 global / 4 replicas
    assert not np.array_equal(batches[0][0].numpy(), batches[1][0].numpy())


def write_png(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    tf.io.write_file(str(path), tf.io.encode_png(np.asarray(array, np.uint8)))


def make_folder(root, n=3, image_size=(12, 10), mask_size=None, top_class=1):
    for i in range(n):
        write_png(root / "images" / f"{i}.png", np.full((*image_size, 3), 40 * i))
        mask = np.zeros((*(mask_size or image_size), 1))
        mask[0, 0] = top_class
        write_png(root / "masks" / f"{i}.png", mask)


def folder_train(root, classes=2):
    from train_config import TrainConfig

    return TrainConfig(dataset="folder", data_dir=str(root), num_classes=classes, image_size=8)


def test_folder_dataset_loads_resized_pairs(tmp_path):
    import data

    make_folder(tmp_path, n=4)
    train = list(data.examples(folder_train(tmp_path), "train"))
    validation = list(data.examples(folder_train(tmp_path), "validation"))
    assert len(train) == 3 and len(validation) == 1
    image, mask = train[0]
    assert image.shape == (8, 8, 3) and mask.shape == (8, 8) and mask.dtype == tf.int32
    assert set(np.unique(mask.numpy())) <= {0, 1}


@pytest.mark.parametrize("setup,message", [
    (lambda root: make_folder(root, mask_size=(6, 6)), "is 6x6 but its image"),
    (lambda root: make_folder(root, top_class=5), "has class 5, but num_classes=2"),
    (lambda root: (make_folder(root), (root / "masks" / "1.png").unlink()), "have no mask"),
    (lambda root: None, "no images found"),
])
def test_folder_dataset_errors_name_the_file(tmp_path, setup, message):
    import data

    setup(tmp_path)
    with pytest.raises(data.DataError, match=message):
        data.examples(folder_train(tmp_path), "train")


def test_missing_oxford_pet_names_what_is_missing(tmp_path):
    import data

    with pytest.raises(data.DataError) as raised:
        data.oxford_pet(str(tmp_path), "train")
    assert str(tmp_path / "oxford_iiit_pet") in str(raised.value)


def test_train_section_errors_are_located(write_config):
    import tfdist
    from train_config import train_config

    config = tfdist.load_config(write_config("strategy: mirrored\ntrain:\n  loop: fitt\n"))
    with pytest.raises(tfdist.ConfigError, match=r"job.yaml:3: train.loop: did you mean 'fit'"):
        train_config(config)
    config = tfdist.load_config(write_config("train: {image_sise: 32}\n"))
    with pytest.raises(tfdist.ConfigError, match="did you mean 'image_size'"):
        train_config(config)
    config = tfdist.load_config(write_config("train: {image_size: 36}\n"))
    with pytest.raises(tfdist.ConfigError, match="divisible by 2\\*\\*depth=8"):
        train_config(config)
    assert train_config(config, {"image_size": 40}).image_size == 40


@pytest.mark.parametrize("value,fragment", [
    ("5", "train.backup_dir: expected a non-empty string"),
    ("''", "train.backup_dir: expected a non-empty string"),
    ('"a\\0b"', "a path cannot hold a NUL character"),
    ("x" * 5000, "a path is at most 4,096 bytes (MAX_PATH_BYTES). Received: 5,000 bytes"),
    ("[a]", "train.backup_dir: expected a non-empty string"),
])
def test_a_bad_backup_dir_is_refused_in_one_line(write_config, value, fragment):
    """train.backup_dir (and --backup_dir, checked the same): a path, or a located error."""
    import tfdist
    from train_config import train_config

    config = tfdist.load_config(write_config(f"train:\n  backup_dir: {value}\n"))
    with pytest.raises(tfdist.ConfigError) as raised:
        train_config(config)
    message = str(raised.value)
    assert fragment in message and message.startswith(f"{config.path}:2:"), message
    assert "\n" not in message and len(message) < 400, message
    with pytest.raises(tfdist.ConfigError, match="a path cannot hold a NUL"):
        train_config(tfdist.load_config(write_config("strategy: default\n")),
                     {"backup_dir": "a\0b"})  # the flag: located at the train section


def test_without_matplotlib_the_example_writes_all_but_the_curves_and_says_so_first(
        tmp_path, monkeypatch):
    """The `plots` extra is not in `pip install .`: the example says so in one line before
    training (train.py prints report.NO_PLOTS on the chief) and writes the other outputs."""
    import importlib.util

    import keras

    path = ROOT / "examples" / "unet_segmentation" / "report.py"
    spec = importlib.util.spec_from_file_location("unet_report_under_test", path)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    assert report.can_plot()  # the test extra brings it
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find(name, *a))
    assert not report.can_plot()
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 1)])
    images = np.zeros((2, 8, 8, 3), "float32")
    masks = np.zeros((2, 8, 8), "int32")
    history = {"loss": [1.0, 0.5], "pixel_accuracy": [0.5, 0.6], "mean_iou": [0.2, 0.3]}
    paths = report.write_all(str(tmp_path), model, [images, masks], history, {})
    assert sorted(paths) == ["metrics.json", "predictions.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "predictions.png"]
    assert "pip install 'tfdist[plots]'" in report.NO_PLOTS and "\n" not in report.NO_PLOTS
    source = (path.parent / "train.py").read_text()
    assert source.index("report.NO_PLOTS") < source.index("model.fit(")  # before training
