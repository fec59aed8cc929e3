"""Open Inference Protocol v2 over gRPC (Triton, KServe), with ``grpc.aio``.

Uses tritonclient's service definitions. ``connect`` opens a small pool of keep-alive
channels (each its own TCP connection, so HTTP/2 streams spread over them), checks
``ServerReady`` on each within a deadline and reads the model's metadata. Each
distinct ``items`` gets one ``ModelInferRequest``, serialized once: the hot path hands
the prepared bytes to the channel and does not parse the answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ridgeline.errors import ConfigError, TargetUnreachableError
from ridgeline.targets._http import not_connected
from ridgeline.targets.base import OK, Reply
from ridgeline.targets.tensors import raw_bytes
from ridgeline.v2.security import grpc_root_certificates
from ridgeline.v2.spec import TensorSpec
from ridgeline.workload.payloads import RequestShape

_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_STREAMS_PER_CHANNEL = 100
_CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.use_local_subchannel_pool", 1),  # one connection per channel, not one shared
)


class V2GrpcTarget:
    """``V2GrpcTarget("127.0.0.1:8001", "resnet")`` calls ModelInfer for model ``resnet``."""

    def __init__(
        self,
        address: str,
        model: str,
        *,
        version: str | None = None,
        inputs: Sequence[TensorSpec] | None = None,
        headers: Mapping[str, str] | None = None,
        tls: bool = False,
        ca_file: Path | None = None,
        max_channels: int = 4,
        connect_timeout: float = 10.0,
    ) -> None:
        if max_channels < 1:
            raise ConfigError(f"max_channels is {max_channels}; it must be at least 1")
        self._address = address
        self._model = model
        self._version = version or ""
        self._metadata = tuple((k.lower(), v) for k, v in (headers or {}).items()) or None
        self._tls = tls
        self._roots = grpc_root_certificates(ca_file) if tls else None
        self._max_channels = max_channels
        self._connect_timeout = connect_timeout
        self.inputs: tuple[TensorSpec, ...] | None = tuple(inputs) if inputs else None
        """The model's inputs: given, or learnt from its metadata at connect."""
        self._requests: dict[int, bytes] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._calls: Iterator[Any] | None = None

    @property
    def url(self) -> str:
        return f"{'grpcs' if self._tls else 'grpc'}://{self._address}/{self._model}"

    async def connect(self, max_outstanding: int) -> None:
        if max_outstanding < 1:
            raise ConfigError(f"max_outstanding is {max_outstanding}; it must be at least 1")
        await self.close()
        count = min(self._max_channels, -(-max_outstanding // _STREAMS_PER_CHANNEL))
        self._channels = [self._open_channel() for _ in range(count)]
        try:
            stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in self._channels]
            for stub in stubs:
                await self._check_ready(stub)
            if self.inputs is None:
                self.inputs = await self._model_inputs(stubs[0])
        except BaseException:
            await self.close()
            raise
        calls = [c.unary_unary(_MODEL_INFER) for c in self._channels]  # bytes in, bytes out
        self._calls = itertools.cycle(calls)

    async def send(self, shape: RequestShape) -> Reply:
        request = self._requests.get(shape.items)
        if request is None:
            request = self._encode(shape.items)
        calls = self._calls
        if calls is None:
            raise not_connected(self)
        try:
            await next(calls)(request, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            return failed_reply(exc)
        return OK

    async def close(self) -> None:
        channels, self._channels, self._calls = self._channels, [], None
        for channel in channels:
            await channel.close()

    def _open_channel(self) -> grpc.aio.Channel:
        if self._tls:
            credentials = grpc.ssl_channel_credentials(root_certificates=self._roots)
            return grpc.aio.secure_channel(self._address, credentials, options=_CHANNEL_OPTIONS)
        return grpc.aio.insecure_channel(self._address, options=_CHANNEL_OPTIONS)

    async def _check_ready(self, stub: Any) -> None:
        try:
            answer = await stub.ServerReady(
                service_pb2.ServerReadyRequest(),
                timeout=self._connect_timeout,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as exc:
            raise TargetUnreachableError(
                f"v2 gRPC server at {self.url} did not answer ServerReady "
                f"({exc.code().name}: {exc.details()}); check that the server is running, "
                "that host and port are right and that the port is the gRPC one"
            ) from exc
        if not answer.ready:
            raise TargetUnreachableError(
                f"v2 gRPC server at {self.url} answered ServerReady: not ready; "
                "wait for its models to load, or check its logs"
            )

    async def _model_inputs(self, stub: Any) -> tuple[TensorSpec, ...]:
        request = service_pb2.ModelMetadataRequest(name=self._model, version=self._version)
        try:
            answer = await stub.ModelMetadata(
                request, timeout=self._connect_timeout, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            raise TargetUnreachableError(
                f"model metadata for {self.url} is unavailable ({exc.code().name}: "
                f"{exc.details()}); check the model name and version"
            ) from exc
        return tuple(TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in answer.inputs)

    def _encode(self, items: int) -> bytes:
        if self.inputs is None:
            raise not_connected(self)
        request = service_pb2.ModelInferRequest(model_name=self._model, model_version=self._version)
        for spec in self.inputs:
            tensor = request.inputs.add(name=spec.name, datatype=spec.datatype)
            tensor.shape.extend(spec.concrete_shape(items))
            request.raw_input_contents.append(raw_bytes(spec, items))
        encoded: bytes = request.SerializeToString()
        self._requests[items] = encoded
        return encoded


def failed_reply(exc: grpc.aio.AioRpcError) -> Reply:
    """The reply for a failed call; UNAVAILABLE with details starting "dropped" is a drop."""
    code = exc.code()
    details = exc.details() or ""
    dropped = code == grpc.StatusCode.UNAVAILABLE and details.startswith("dropped")
    return Reply(ok=False, dropped=dropped, error=f"gRPC {code.name}: {details}")
