"""Open Inference Protocol v2 over gRPC (Triton's ``GRPCInferenceService``), on grpc.aio.

The service definitions are the ones tritonclient ships, so ``tritonclient.grpc`` talks
to this server as to Triton. Implemented: ServerLive, ServerReady, ModelReady,
ServerMetadata, ModelMetadata, ModelConfig, ModelStatistics, RepositoryIndex and
ModelInfer (typed ``contents`` or ``raw_input_contents`` in; ``raw_output_contents``
out). Errors are status codes: INVALID_ARGUMENT (bad request), NOT_FOUND (unknown
model), UNAVAILABLE (queue full), INTERNAL (injected error), UNAUTHENTICATED (token).
"""

from __future__ import annotations

import time
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from ridgeline.errors import InvalidRequest
from ridgeline.fakeserver import _describe
from ridgeline.fakeserver.engine import BatchingEngine, Status
from ridgeline.synthetic.model import LatencyModel
from ridgeline.synthetic.outputs import compute_outputs
from ridgeline.v2.grpc_codec import decode_request, encode_response


class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, model: LatencyModel, engine: BatchingEngine, max_bytes: int) -> None:
        self.model, self.engine, self.stats = model, engine, engine.stats
        self.max_bytes = max_bytes

    async def _check_model(self, name: str, version: str, context: Any) -> None:
        if name == self.model.name and version in ("", _describe.VERSION):
            return
        self.stats.finish("not_found")
        await context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"unknown model {name!r} version {version or _describe.VERSION}; this server "
            f"serves {self.model.name!r} version {_describe.VERSION}",
        )

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        ready = request.name == self.model.name and request.version in ("", _describe.VERSION)
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return json_format.ParseDict(
            _describe.server_metadata(), service_pb2.ServerMetadataResponse()
        )

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        await self._check_model(request.name, request.version, context)
        return json_format.ParseDict(
            _describe.model_metadata(self.model), service_pb2.ModelMetadataResponse()
        )

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        await self._check_model(request.name, request.version, context)
        config = json_format.ParseDict(
            _describe.model_config(self.model), model_config_pb2.ModelConfig()
        )
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        if request.name:
            await self._check_model(request.name, request.version, context)
        doc = _describe.model_statistics(self.model, self.stats)
        return json_format.ParseDict(doc, service_pb2.ModelStatisticsResponse())

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        doc = {"models": _describe.repository_index(self.model)}
        return json_format.ParseDict(doc, service_pb2.RepositoryIndexResponse())

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        began = time.perf_counter()
        await self._check_model(request.model_name, request.model_version, context)
        try:
            rows, arrays, wanted = decode_request(self.model, request, self.max_bytes)
        except InvalidRequest as e:
            self.stats.finish("invalid")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        outcome = await self.engine.submit(rows)
        if outcome.status is not Status.OK:
            self.stats.finish(outcome.status.value, time.perf_counter() - began)
            rejected = outcome.status is Status.REJECTED
            code = grpc.StatusCode.UNAVAILABLE if rejected else grpc.StatusCode.INTERNAL
            await context.abort(code, outcome.detail)
        outputs = compute_outputs(self.model, rows, arrays)
        response = encode_response(self.model, request, outputs, wanted, _describe.VERSION)
        self.stats.finish("ok", time.perf_counter() - began)
        return response
