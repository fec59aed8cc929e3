"""The Open Inference Protocol v2's gRPC messages (Triton's ``service.proto``, as
tritonclient ships it), both ways: a ModelInferRequest (typed ``contents`` or
``raw_input_contents``) into tensors, and outputs into a ModelInferResponse
(``raw_output_contents``). Shared by every gRPC front end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tritonclient.grpc import service_pb2

from ridgeline.errors import InvalidRequest
from ridgeline.v2.spec import ModelSpec
from ridgeline.v2.tensors import Array, WireTensor, decode_inputs, to_raw

_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def decode_request(
    model: ModelSpec, request: Any, max_bytes: int
) -> tuple[int, list[Array], list[int]]:
    """(rows, input arrays in spec order, indices of the outputs asked for); a tensor
    that would decode to more than ``max_bytes`` is refused before it is decoded."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequest(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
            "send one per input, in order"
        )
    if raw:  # Triton refuses both as well: which one would the model see?
        typed = [t.name for t in request.inputs if t.HasField("contents")]
        if typed:
            raise InvalidRequest(
                f"inputs {typed} carry typed contents beside raw_input_contents; send "
                "each input one way: raw for all, or typed contents for all"
            )
    tensors = []
    for i, t in enumerate(request.inputs):
        field = _CONTENTS_FIELD.get(t.datatype)
        data = raw[i] if raw else (getattr(t.contents, field) if field else None)
        tensors.append(WireTensor(t.name, t.datatype, list(t.shape), data))
    rows, arrays = decode_inputs(model, tensors, max_bytes)
    index = {s.name: i for i, s in enumerate(model.outputs)}
    names = [o.name for o in request.outputs] or list(index)
    unknown = [n for n in names if n not in index]
    if unknown:
        raise InvalidRequest(
            f"unknown outputs {unknown}; model {model.name!r} has outputs {sorted(index)}"
        )
    return rows, arrays, [index[n] for n in names]


def encode_response(
    model: ModelSpec, request: Any, outputs: Sequence[Array], wanted: list[int], version: str
) -> Any:
    """The ModelInferResponse carrying the ``wanted`` outputs, raw."""
    response = service_pb2.ModelInferResponse(
        model_name=model.name, model_version=version, id=request.id
    )
    for i in wanted:
        spec, arr = model.outputs[i], outputs[i]
        response.outputs.add(name=spec.name, datatype=spec.datatype, shape=arr.shape)
        response.raw_output_contents.append(to_raw(arr))
    return response
