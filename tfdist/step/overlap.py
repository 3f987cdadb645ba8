"""Work that runs beside the training steps (Streaming DiLoCo's overlapped exchanges).

Functions called inside `Background.dispatch()` go to an asynchronous eager executor of
their own: the call returns at once, the work runs in that executor's thread, and the
training steps — on the caller's usual, synchronous executor — go on beside it. The call
itself still happens in the caller's thread, in program order, which is what makes it
safe with collectives: tf.distribute gives each collective its instance key when the
function is *called* (per device, in call order), so a function called from a second
Python thread would draw keys in a different order on each device and worker.
`wait()` blocks until the work is done and raises what failed in it.

The executor is TensorFlow's (`tensorflow.python.eager.executor`, the one
`tf.experimental.async_scope` uses), scoped to the caller's thread and to the block;
`tests/unit/seam/test_keras_seams.py` fails if it moves.
"""

import contextlib

from tensorflow.python.eager import context, executor


class Background:
    """An asynchronous executor for work dispatched in program order (see module)."""

    def __init__(self):
        self._executor = executor.new_executor(enable_async=True)

    @contextlib.contextmanager
    def dispatch(self):
        """Ops and functions called in this block run in the background."""
        with context.executor_scope(self._executor):
            yield

    def wait(self):
        """Blocks until everything dispatched so far is done; raises what failed in it
        (the executor is then cleared for the next work)."""
        try:
            self._executor.wait()
        except Exception:
            self._executor.clear_error()
            raise
