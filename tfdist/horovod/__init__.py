"""Horovod's API on TensorFlow's own collectives, for Horovod scripts on TensorFlow 2.16+
and Keras 3: the modules mirror Horovod's paths, so a script's import gains one prefix
(`import horovod.tensorflow.keras as hvd` -> `import tfdist.horovod.tensorflow.keras as
hvd`). One process per worker, as horovodrun runs it (`tfdist launch -n N -- python
train.py`). So far: the ranks (`init`, `size`, `rank`, `local_rank`, ...) and the tensor
collectives (`allreduce`, `allgather`, `broadcast`, `broadcast_variables`)."""
