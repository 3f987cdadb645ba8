"""Horovod's process sets (`hvd.ProcessSet`, `hvd.add_process_set`, ...: collectives over
a subset of the ranks) are not here: every collective runs over every worker of the job.
`hvd.global_process_set` (all of them) is taken wherever Horovod takes a process set;
any other refuses in one line, as Adasum and `hvd.elastic` do."""

from tfdist.errors import shown
from tfdist.horovod import basics

INSTEAD = ("tfdist.horovod has no process sets: every collective runs over all the job's "
           "workers (hvd.global_process_set); run a subset's work as its own job, or use "
           "tfdist's strategies (islands of local SGD) for groups of workers")

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]


class _GlobalProcessSet:
    """Every worker of the job: Horovod's `global_process_set` (id 0)."""

    process_set_id = 0

    @property
    def ranks(self):
        return list(range(basics.size()))

    def size(self):
        return basics.size()

    def rank(self):
        return basics.rank()

    def included(self):
        return True

    def __repr__(self):
        return "hvd.global_process_set"


global_process_set = _GlobalProcessSet()


def _refused(name):
    def refuse(*args, **kwargs):
        received = ", ".join([shown(a) for a in args] +
                             [f"{k}={shown(v)}" for k, v in kwargs.items()])
        raise ValueError(f"hvd.{name}: {INSTEAD}. Received: {name}({received})")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Refused: {INSTEAD}."
    return refuse


ProcessSet = _refused("ProcessSet")
add_process_set = _refused("add_process_set")
remove_process_set = _refused("remove_process_set")
