"""Streaming DiLoCo's fragments (Douillard et al. 2025, arXiv 2501.18512): the model split
into F parts of similar size, each synchronised once every `period` steps, at staggered
steps — so the bytes of one synchronisation are spread over the period. Pure Python."""


def split(sizes, count):
    """Consecutive groups of indices into `sizes` (elements per variable), `count` of
    them (fewer if there are fewer variables), each close to an equal share of the total."""
    count = max(1, min(int(count), len(sizes)))
    total, groups, current, done = sum(sizes), [], [], 0
    for i, size in enumerate(sizes):
        current.append(i)
        done += size
        left_vars, left_groups = len(sizes) - i - 1, count - len(groups) - 1
        if left_groups and (done >= total * (len(groups) + 1) / count
                            or left_vars == left_groups):
            groups.append(current)
            current = []
    return groups + [current] if current else groups


def offset(fragment, count, period):
    """The local step (counted from the end of the warm-up, modulo `period`) at which
    fragment `fragment` of `count` synchronises: evenly staggered, the last at 0."""
    return (fragment + 1) * period // count % period


def due(local_step, count, period):
    """The fragments that start a synchronisation after local step `local_step`."""
    return [f for f in range(count) if local_step % period == offset(f, count, period)]
