"""`tfdist.horovod` under a hostile hand (issue 73, item 9): unlike collectives across ranks
are refused on every rank in one line naming both, never paired; allgather of empty
tensors works and of a scalar is refused, as Horovod's; root ranks are any integral number
of the job; process sets, absurd numbers and unknown dtypes are refused at the call."""

import json
import subprocess
import sys

import numpy as np
import pytest
from paths import JOBS
from tfdist.horovod.collectives import OUT_OF_STEP

JOB = JOBS / "horovod_hostile_job.py"
HEAD = "Mismatched Horovod collectives: every rank must call the same collectives"
#: case -> (what rank 0 called, what rank 1 called), as the message must name them
UNLIKE = {
    "broadcast_vs_allreduce": ("broadcast(float32[300,300], root_rank=0)",
                               "allreduce(float32[320,320], op=Average)"),
    "shape": ("allreduce(float32[3], op=Average)", "allreduce(float32[4], op=Average)"),
    "dtype": ("allreduce(float32[3], op=Average)", "allreduce(int32[3], op=Average)"),
    "name": ("allreduce(float32[3], op=Average, name='grad_a')",
             "allreduce(float32[3], op=Average, name='grad_b')"),
    "root": ("broadcast(float32[3], root_rank=0)", "broadcast(float32[3], root_rank=1)"),
    "gather_vs_reduce": ("allgather(float32[*,3])", "allreduce(float32[2,3], op=Average)"),
    "gather_trailing": ("allgather(float32[*,3])", "allgather(float32[*,4])"),
    "grouped_count": ("allreduce of a list of 2 tensors (5 elements",
                      "allreduce of a list of 1 tensors (3 elements"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Each rank's {case: outcome} from one run of the hostile job on 2 workers."""
    out = tmp_path_factory.mktemp("hostile")
    run = subprocess.run([sys.executable, "-m", "tfdist", "launch", "-n", "2", "--grace-seconds",
                          "5", "--", sys.executable, str(JOB), str(out)], capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", UNLIKE)
def test_unlike_collectives_are_refused_on_every_rank_naming_both(outcomes, case):
    mine, theirs = UNLIKE[case]
    for rank, got in enumerate(outcomes):
        outcome = got[case]
        assert outcome.get("error") == "MismatchError", (rank, outcome)
        message = outcome["message"]
        assert message.startswith(HEAD) and "\n" not in message, message
        assert f"Received: rank 0 called {mine}" in message, message
        assert f", rank 1 called {theirs}" in message, message


@pytest.mark.multiprocess
def test_unlike_traced_collectives_stop_the_step_naming_both(outcomes):
    """Inside a tf.function the same line is TensorFlow's assertion (its node lines
    around it)."""
    for got in outcomes:
        assert got["traced"]["error"] == "InvalidArgumentError"
        assert (f"{HEAD} in the same order, with the same shapes, dtypes, names and root "
                "ranks. Received: rank 0 called allreduce(float32[5,2], op=Average), rank 1 "
                "called allgather(float32[*,2])") in got["traced"]["message"]


@pytest.mark.multiprocess
def test_a_function_traced_while_the_keys_are_apart_is_refused_naming_the_cure(outcomes):
    """After unlike traced calls, a function traced before any eager collective would pair
    unlike keys: it is refused on every worker, in the same line."""
    for got in outcomes:
        assert got["traced_apart"]["error"] == "InvalidArgumentError", got["traced_apart"]
        assert OUT_OF_STEP in got["traced_apart"]["message"]


@pytest.mark.multiprocess
def test_after_refusals_the_collectives_stay_in_step_and_right(outcomes):
    """Eager refusals leave the workers' keys in step, and unlike traced ones are brought
    back in step by the next eager collective: later collectives (eager and traced) equal
    NumPy's."""
    expected = {
        "gather_empty_rows": np.arange(3.0).reshape(1, 3),  # rank 0: 0 rows, rank 1: one
        "gather_all_empty": [0, 3], "gather_no_columns": [4, 0], "reduce_empty": [0, 4],
        "root_numpy": [1, 11],  # rank 1's, broadcast from np.int64(1)
        "int8_sum": np.array([100 + 101, -3 - 2], np.int64).astype(np.int8),  # wraps
        "bool_gather": [True, True, False, True], "bfloat16_gather": [0.5, 1.5],
        "after": [3.0, 6.0], "eager_after_traced": [3.0, 6.0],
        "traced_after_eager": [3.0, 6.0],
    }
    for rank, got in enumerate(outcomes):
        for case, want in expected.items():
            assert "value" in got[case], (rank, case, got[case])
            np.testing.assert_array_equal(np.asarray(got[case]["value"]), np.asarray(want),
                                          err_msg=f"rank {rank}: {case}")


@pytest.mark.multiprocess
@pytest.mark.parametrize("case, says", [
    ("gather_scalar", "a scalar has none (Horovod refuses it too)"),
    ("root_huge", "root_rank must be a rank of this job, 0 to 1. Received: root_rank=1000"),
    ("process_set", "tfdist.horovod has no process sets")])
def test_bad_arguments_on_workers_are_refused_in_one_line(outcomes, case, says):
    for got in outcomes:
        assert got[case]["error"] == "ValueError" and says in got[case]["message"]
        assert "\n" not in got[case]["message"]


def _refused(call, says):
    with pytest.raises(ValueError, match=says) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message and "Received:" in message, message


@pytest.mark.parametrize("root", [np.int64(0), np.int32(0), np.uint8(0), 0])
def test_an_integral_root_rank_of_any_kind_is_taken(horovod, root):
    import tensorflow as tf

    horovod.init()
    from tfdist.horovod import ops

    assert ops.broadcast(tf.constant([2.0]), root).numpy().tolist() == [2.0]
    assert ops.check_root(root) == 0 and type(ops.check_root(root)) is int


@pytest.mark.parametrize("root", [10**20, -1, np.int64(1), 2**63, 1.0, np.float64(0), True, "0"])
def test_a_root_rank_outside_the_job_or_not_integral_is_refused(horovod, root):
    import tensorflow as tf

    horovod.init()
    from tfdist.horovod import ops

    _refused(lambda: ops.broadcast(tf.constant(1.0), root), "root_rank must be a rank")
    _refused(lambda: ops.broadcast_variables([tf.Variable(1.0)], root), "root_rank")


def test_the_broadcast_callback_refuses_its_root_when_built_not_at_fit(horovod):
    from tfdist.horovod import callbacks

    horovod.init()
    _refused(lambda: callbacks.BroadcastGlobalVariablesCallback(10**20), "0 to 0")
    horovod.shutdown()  # before init: the job's size is unknown, the type still checked
    _refused(lambda: callbacks.BroadcastGlobalVariablesCallback(-1), "0 or more")
    _refused(lambda: callbacks.BroadcastGlobalVariablesCallback(0.5), "0 or more")
    assert callbacks.BroadcastGlobalVariablesCallback(np.int64(3)).root_rank == 3


@pytest.mark.parametrize("factor, says", [
    (10**400, "finite"), (float("nan"), "finite"), (float("inf"), "finite"), ("2", "finite"),
    (True, "finite"), (1e39, "within float32's range"), (7e4, "within float16's range"),
    (0.5, "whole number within int32's range"), (2**40, "within int32's range")],
    ids=["10**400", "nan", "inf", "str", "bool", "1e39", "7e4-float16", "0.5-int", "2**40-int"])
def test_an_absurd_scale_factor_is_refused_at_the_call(horovod, factor, says):
    import tensorflow as tf

    horovod.init()
    from tfdist.horovod import ops

    dtype = tf.int32 if "int32" in says else tf.float16 if "float16" in says else tf.float32
    for key in ("prescale_factor", "postscale_factor"):
        _refused(lambda: ops.allreduce(tf.ones([2], dtype), **{key: factor}), key)


def test_a_scale_factor_the_dtype_holds_scales_as_numpy_does(horovod):
    import tensorflow as tf

    horovod.init()
    from tfdist.horovod import ops

    got = ops.allreduce(tf.constant([1.0, 2.0]), prescale_factor=10**20,
                        postscale_factor=np.float32(1e-20), op=ops.Sum)
    np.testing.assert_allclose(got.numpy(), np.float32([1.0, 2.0]) * 1e20 * np.float32(1e-20),
                               rtol=1e-6)
    assert ops.allreduce(tf.constant([3], tf.int32), prescale_factor=np.int64(2)).numpy() == [6]


@pytest.mark.parametrize("call, says", [
    ("allreduce", "allreduce takes tensors of float16"), ("allgather", "allgather takes"),
    ("broadcast", "broadcast takes")])
def test_a_dtype_no_collective_moves_is_refused_naming_it(horovod, call, says):
    import tensorflow as tf

    horovod.init()
    from tfdist.horovod import ops

    arguments = {"broadcast": (0,)}.get(call, ())
    for tensor in (tf.constant(["a"]), tf.constant([1j], tf.complex64)):
        _refused(lambda: getattr(ops, call)(tensor, *arguments), says)
    _refused(lambda: getattr(ops, call)(object(), *arguments), f"{call} takes a tensor")


def test_allgather_of_a_scalar_is_refused_and_of_no_rows_is_itself(horovod):
    import tensorflow as tf

    horovod.init()
    from tfdist.horovod import ops

    _refused(lambda: ops.allgather(tf.constant(1.0)), "a scalar has none")
    assert ops.allgather(tf.zeros([0, 3])).shape == (0, 3)


@pytest.mark.parametrize("name", [5, b"x", "n" * 1001])
def test_a_name_that_is_no_short_string_is_refused(horovod, name):
    import tensorflow as tf

    horovod.init()
    from tfdist.horovod import ops

    for call in (lambda: ops.allreduce(tf.ones([1]), name=name),
                 lambda: ops.allgather(tf.ones([1]), name=name),
                 lambda: ops.broadcast(tf.ones([1]), 0, name=name)):
        _refused(call, "name must be a string")


def test_process_sets_are_refused_in_one_line_and_the_global_one_is_taken(horovod):
    import tensorflow as tf

    import tfdist.horovod.tensorflow as hvd

    hvd.init()
    for call in (lambda: hvd.ProcessSet([0, 1]), lambda: hvd.add_process_set([0]),
                 lambda: hvd.remove_process_set(object())):
        _refused(call, "tfdist.horovod has no process sets")
    for call in (hvd.allreduce, hvd.allgather, lambda t, **k: hvd.broadcast(t, 0, **k),
                 lambda t, **k: hvd.grouped_allreduce([t], **k)):
        _refused(lambda: call(tf.ones([1]), process_set="ranks 0-1"), "no process sets")
        np.testing.assert_array_equal(
            np.asarray(call(tf.ones([1]), process_set=hvd.global_process_set)).ravel(), [1.0])
    assert hvd.global_process_set.ranks == [0] and hvd.global_process_set.size() == 1


@pytest.mark.parametrize("passes", [10**20, 2**31, 0, -1, 1.0, True, "2", np.float64(2)])
def test_an_absurd_backward_passes_per_step_is_refused_at_the_call(horovod, passes):
    import tfdist.horovod.tensorflow.keras as hvd

    hvd.init()
    _refused(lambda: hvd.DistributedOptimizer("sgd", backward_passes_per_step=passes),
             "backward_passes_per_step must be a whole number of batches, 1 to 2,147,483,647")


def test_a_numpy_backward_passes_per_step_is_taken(horovod):
    import tfdist.horovod.tensorflow.keras as hvd

    hvd.init()
    optimizer = hvd.DistributedOptimizer("sgd", backward_passes_per_step=np.int64(3))
    assert optimizer.gradient_accumulation_steps == 3


def test_a_signature_row_reads_back_as_the_call_it_describes():
    """The row a worker sends describes its call (what the message names), up to eight
    dimensions and beyond, names cut at 24 bytes, an allgather's rows as any."""
    import tensorflow as tf

    from tfdist.horovod import agreement

    def said(*args, **kwargs):
        return agreement.describe(agreement.signature(*args, **kwargs)).numpy().decode()

    assert said("allreduce", tf.ones([2, 3]), 1) == "allreduce(float32[2,3], op=Sum)"
    assert said("broadcast", tf.ones([], tf.int64), 7, name="é" + "x" * 30) == \
        f"broadcast(int64[], root_rank=7, name='??{'x' * 22}')"
    assert said("allgather", tf.ones([0, 2], tf.bfloat16), any_rows=True) == \
        "allgather(bfloat16[*,2])"
    assert said("allreduce", tf.ones([1] * 9), 0) == \
        "allreduce(float32[1,1,1,1,1,1,1,...], op=Average)"
    deep = [agreement.signature("allreduce", tf.ones([1] * 8 + [n])) for n in (2, 3)]
    assert not np.array_equal(deep[0].numpy(), deep[1].numpy())  # the 9th dim still counts
    rows = tf.stack([agreement.signature("allreduce", tf.ones([3])),
                     agreement.signature("allreduce", tf.ones([3])),
                     agreement.signature("allreduce", tf.ones([3], tf.float64))])
    differ, other = agreement.mismatch(rows)
    assert bool(differ) and int(other) == 2
    assert not bool(agreement.mismatch(rows[:2])[0])


@pytest.mark.parametrize("shape", [[0, 3], [2, 3, 4], [1] * 8 + [5, 6], [7]])
def test_a_row_of_known_shape_equals_the_row_traced_with_the_shape_unknown(shape):
    """An eager worker (its shape known) and a traced one (its shape not) send the same
    row for the same call, so they agree."""
    import tensorflow as tf

    from tfdist.horovod import agreement

    tensor = tf.ones(shape)
    for kind, options in (("allreduce", {"param": 1, "name": "g"}),
                          ("allgather", {"any_rows": True})):
        traced = tf.function(lambda t: agreement.signature(kind, t, **options),
                             input_signature=[tf.TensorSpec(None, tf.float32)])
        np.testing.assert_array_equal(agreement.signature(kind, tensor, **options).numpy(),
                                      traced(tensor).numpy(), err_msg=f"{kind} {shape}")
