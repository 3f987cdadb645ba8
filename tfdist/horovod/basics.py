"""Horovod's `init` and the ranks it gives (`horovod.common.basics`): `init()` reads this
process's TF_CONFIG (`tfdist.horovod.ranks`) and, in a job of several workers, joins
them in one collective group (`tfdist.horovod.collectives`); the other functions answer
from it, and, as Horovod's, refuse to answer before it."""

from tfdist.cluster.tf_config import read_tf_config
from tfdist.horovod.collectives import WorkerGroup
from tfdist.horovod.ranks import ranks_of
from tfdist.strategies.factory import get_strategy

_state = {"ranks": None, "group": None}


def init(comm=None, process_sets=None):
    """Reads this process's place in the job from its TF_CONFIG (`tfdist launch` sets
    it; none: a job of one). Horovod's MPI communicator and process sets are not
    supported: given, they are refused.

    Examples:
        >>> import tfdist.horovod.tensorflow as hvd
        >>> hvd.init()  # no TF_CONFIG here: a job of one
        >>> hvd.size(), hvd.rank(), hvd.local_rank()
        (1, 0, 0)
        >>> float(hvd.allreduce(tf.constant(3.0)))
        3.0
    """
    if comm is not None or process_sets is not None:
        raise ValueError("tfdist.horovod.init takes no MPI communicator or process sets: "
                         "every worker of the job is one group (TF_CONFIG). Received: "
                         f"comm={comm!r:.80}, process_sets={process_sets!r:.80}")
    ranks = ranks_of(read_tf_config())
    if ranks.size > 1 and _state["group"] is None:  # once per process: it starts a server
        _state["group"] = _join(ranks)
    _state["ranks"] = ranks


def _join(ranks):
    """The workers' collective group, on tfdist's MultiWorkerMirroredStrategy (its server
    and collective executor, from TF_CONFIG)."""
    return WorkerGroup(get_strategy("multi_worker_mirrored"), ranks.rank, ranks.size)


def group():
    """The workers' collective group (None in a job of one); after `init`."""
    _ranks()
    return _state["group"]


def shutdown():
    """Forgets the ranks (`init` reads them again; the workers' group stays: a process
    joins its job once)."""
    _state["ranks"] = None


def is_initialized():
    """Whether `init()` has run in this process, as Horovod's."""
    return _state["ranks"] is not None


def _ranks():
    if _state["ranks"] is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _state["ranks"]


def size():
    """The number of workers in the job."""
    return _ranks().size


def rank():
    """This worker's index among them (the chief's is 0)."""
    return _ranks().rank


def local_size():
    """The number of workers on this host."""
    return _ranks().local_size


def local_rank():
    """This worker's index among those on its host."""
    return _ranks().local_rank


def cross_size():
    """The number of hosts."""
    return _ranks().cross_size


def cross_rank():
    """This host's index among the hosts."""
    return _ranks().cross_rank
