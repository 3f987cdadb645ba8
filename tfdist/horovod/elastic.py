"""`hvd.elastic` (Horovod's elastic training: workers joining and leaving a running job)
is not here; every name of it refuses in one line and says what tfdist does instead: a
job that goes on with fewer workers and takes them back (`tfdist launch --min-workers K`),
every worker resuming from the last backup, saved at one agreed step
(`tfdist.keras.BackupAndRestore`, a callback for fit)."""

INSTEAD = ("tfdist.horovod has no hvd.elastic: run the script under `tfdist launch -n N "
           "--min-workers K` with tfdist.keras.BackupAndRestore(backup_dir) among fit's "
           "callbacks (a lost worker: the job goes on with the others from the last backup "
           "and takes it back at a step every worker saved); drop hvd.elastic.run and the "
           "State objects")

__all__ = ["CommitStateCallback", "KerasState", "ObjectState", "State", "TensorFlowKerasState",
           "TensorFlowState", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]


def _refused(name):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"hvd.elastic.{name}: {INSTEAD}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Refused: {INSTEAD}."
    return refuse


run = _refused("run")
State, ObjectState = _refused("State"), _refused("ObjectState")
TensorFlowState, TensorFlowKerasState = _refused("TensorFlowState"), _refused("TensorFlowKerasState")
KerasState = _refused("KerasState")
CommitStateCallback = _refused("CommitStateCallback")
UpdateBatchStateCallback = _refused("UpdateBatchStateCallback")
UpdateEpochStateCallback = _refused("UpdateEpochStateCallback")
