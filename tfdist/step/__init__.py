"""One training step as the compiled graph sees it — no Keras privates, no loop, no YAML:
the hook contract and the pipeline that runs the hooks (`hooks`), the collectives
(`wire`, `buckets`, `gradients`, `overlap`; the shards of sharded training state,
`shards`), the transaction (`transaction`), preemption
as part of the step (`preemption`), the step clock (`step_clock`), the hooks' optional
abilities (`abilities`), per-replica state and its resize rules (`variables`, `resize`)
and tfdist's own graph code (`tracing`).
"""

from tfdist.versions import require_supported

require_supported()  # a TensorFlow or Keras tfdist cannot be right on stops here, in one line
