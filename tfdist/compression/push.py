"""The gradient push to parameter servers, compressed: each gradient encoded on the
worker (`PushCodec`), decoded inside the variable's update on its server — the update
stage's `Pushed` updater (`tfdist.step.update`): the payload is what crosses."""

from tfdist.compression.buffers import pack, unpack
from tfdist.compression.compressors import Cast
from tfdist.step import gradients, wire
from tfdist.step.update import Wrapping


class Pushed(Wrapping):
    """The update stage under parameter servers with a compressed push: each gradient
    encoded on the worker (`PushCodec`), decoded inside the variable's update on its
    server, then `inner`'s update: the payload is what crosses."""

    def __init__(self, codec, inner):
        super().__init__(inner)
        self.codec = codec

    def encode(self, grad, variable):
        return self.codec.encode(grad)

    def payload_bytes(self, payload, variable):
        return sum(wire.sent_bytes(p) for p in payload)

    def apply(self, optimizer, payload, meta, variable, rate):
        self.inner.apply(optimizer, (self.codec.decode(payload, meta),), None, variable, rate)


class PushCodec:
    """Compresses one gradient pushed to a parameter server: `encode` runs on the worker,
    `decode` inside the variable's update on the server (the payload is what crosses)."""

    def __init__(self, compressor):
        self.compressor = compressor

    def encode(self, grad):
        """(payload tensors, layout) of `grad`; an `IndexedSlices` pushes its rows (in the
        cast's dtype for fp16 and bf16, as they are for int8), as TensorFlow pushes it."""
        if gradients.is_sparse(grad):
            dtype = (self.compressor.dtype if isinstance(self.compressor, Cast)
                     else grad.values.dtype)
            return (gradients.cast(grad, dtype),), None
        buffer, layout = pack([grad], self.compressor.align)
        return self.compressor.encode(buffer, layout, None), layout

    def decode(self, payload, layout):
        if layout is None:  # rows
            return payload[0]
        return unpack(self.compressor.decode(payload, layout, None), layout)[0]
