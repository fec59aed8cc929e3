"""MLServer's peer: a custom runtime (``mlserver.MLModel``) running the shared onnxruntime
session. Served by ``mlserver start DIR`` with adaptive batching on (``max_batch_size``,
``max_batch_time`` in model-settings.json); MLServer merges the requests of a batch along
their first dimension before ``predict`` and splits the answer after it.
"""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from session import open_session, run


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        uri = self.settings.parameters.uri if self.settings.parameters else None
        if not uri:
            raise ValueError("model-settings.json names no parameters.uri (the ONNX file)")
        self._session = open_session(uri)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        images = NumpyCodec.decode_input(payload.inputs[0])
        logits = run(self._session, images)
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output("logits", logits)],
        )
