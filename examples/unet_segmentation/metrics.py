"""Segmentation metrics: pixel accuracy and mean IoU, exact across replicas and workers.

Both are Keras streaming metrics whose state is a sum (correct pixels; a confusion
matrix), so tf.distribute adds them up across replicas and workers, and tfdist.Trainer
can update them with atomic increments under ParameterServerStrategy.
"""

import keras


def segmentation_metrics(num_classes):
    """[pixel_accuracy, mean_iou] for logits [..., num_classes] and integer masks."""
    return [
        keras.metrics.SparseCategoricalAccuracy(name="pixel_accuracy"),
        keras.metrics.MeanIoU(num_classes, name="mean_iou", sparse_y_true=True,
                              sparse_y_pred=False),
    ]
