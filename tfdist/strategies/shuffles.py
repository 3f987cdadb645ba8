"""The shuffles of a tf.data pipeline that got no seed (their order differs every run and
on every worker)."""


def unseeded_shuffles(dataset):
    """The shuffle datasets of `dataset`'s pipeline that got no seed at all (TensorFlow
    draws theirs at random each run, so no backup can say which batches come next, and
    no two workers read the same order).
    Walks tf.data's own links (`_inputs()`, a shuffle's `_seed` and `_seed2`: a seam of
    TensorFlow's, watched by tests/unit/step/test_input_position.py), never the graph (a pipeline
    over a large array would be copied); a pipeline it cannot walk is not judged."""
    found = []
    for node in pipeline_nodes(dataset):
        try:
            seeds = [getattr(node, name, None) for name in ("_seed", "_seed2")]
            if type(node).__name__ == "_ShuffleDataset" and all(
                    seed is not None and int(seed) == 0 for seed in seeds):
                found.append(node)
        except Exception:  # a symbolic seed: not judged
            continue
    return found


def pipeline_nodes(dataset):
    """Every dataset of `dataset`'s pipeline reachable through tf.data's `_inputs()`
    (a dataset of one's own that cannot say its inputs ends the walk there)."""
    nodes, pending, seen = [], [dataset], set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        try:
            pending.extend(node._inputs())
        except Exception:
            continue
    return nodes
