"""The only code that touches Keras' optimizer internals: the routed optimizer class that
runs a step through the pipeline (`optimizer`, `routed`), dynamic loss scaling in the
transactional step (`loss_scale`), every tfdist optimizer a model owns (`owned`), Keras'
gradient accumulation under replicas (`accumulation`), one model on every replica
(`replica_state`), 1-bit Adam's frozen variance (`frozen_variance`) and the checks of the
Keras behaviour the seam relies on (`seam_check`). tests/unit/seam/test_keras_seams.py holds its
canary tests.
"""
