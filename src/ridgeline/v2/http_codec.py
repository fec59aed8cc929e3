"""The Open Inference Protocol v2's HTTP body, both ways: an infer request (JSON tensors,
or Triton's binary tensor extension: the JSON header of ``Inference-Header-Content-Length``
bytes, then each input with a ``binary_data_size`` parameter, in order) into tensors, and
outputs into an answer (binary when asked: ``binary_data_output`` for all, ``binary_data``
per output). Independent of the server library; errors are ``{"error": "..."}``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from ridgeline.errors import InvalidRequest
from ridgeline.v2.spec import ModelSpec
from ridgeline.v2.tensors import (
    Array,
    WireTensor,
    decode_inputs,
    describe_value,
    to_elements,
    to_raw,
)

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True, slots=True)
class InferRequest:
    id: str | None
    inputs: list[WireTensor]
    outputs: list[tuple[int, bool]]
    """(index into model.outputs, send binary) for each output to return."""


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP answer to an infer request, independent of the server library."""

    status: int
    body: bytes
    header_length: int | None = None
    """``Inference-Header-Content-Length`` when the body carries binary outputs."""

    @property
    def content_type(self) -> str:
        return "application/json" if self.header_length is None else "application/octet-stream"


@dataclass(frozen=True, slots=True)
class Decoded:
    """An infer request's body, decoded: what to answer (``request``, its inputs' wire
    form dropped) and the input arrays, in the model's order, of ``rows`` rows."""

    request: InferRequest
    rows: int
    arrays: list[Array]


Body = bytes | memoryview


class BodyDecoder(Protocol):
    """Decodes an infer request's body for a model (``decode_body``, or a pool of
    processes doing it off the event loop); raises ``InvalidRequest`` for a bad body."""

    def __call__(
        self, model: ModelSpec, body: bytes, header_length: str | None, max_bytes: int
    ) -> Awaitable[Decoded]: ...


def decode_body(model: ModelSpec, body: Body, header_length: str | None, max_bytes: int) -> Decoded:
    """``parse_infer`` then ``decode_inputs``: the body as arrays, every field checked."""
    req = parse_infer(model, body, header_length)
    rows, arrays = decode_inputs(model, req.inputs, max_bytes)
    return Decoded(replace(req, inputs=[]), rows, arrays)


async def decode_inline(
    model: ModelSpec, body: bytes, header_length: str | None, max_bytes: int
) -> Decoded:
    """``decode_body`` on the event loop: a ``BodyDecoder`` for small bodies and tests."""
    return decode_body(model, body, header_length, max_bytes)


def error_answer(message: str, status: int) -> Answer:
    return Answer(status, orjson.dumps({"error": message}))


def parse_infer(model: ModelSpec, body: Body, header_length: str | None) -> InferRequest:
    """The request in ``body``, every field checked for its type (``InvalidRequest``
    naming the field otherwise); the tensors' contents are checked by ``decode_inputs``."""
    head, tail = body, memoryview(b"")
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            n = -1
        if not 0 < n <= len(body):
            raise InvalidRequest(
                f"{HEADER_LENGTH} is {describe_value(header_length)}; it must be the JSON header's "
                f"length in bytes, 1..{len(body)}"
            )
        head, tail = body[:n], memoryview(body)[n:]
    try:
        doc = orjson.loads(head)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"request header is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise InvalidRequest('request must be a JSON object with an "inputs" list')
    inputs, offset = [], 0
    for k, t in enumerate(doc["inputs"]):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise InvalidRequest(
                f'input {k} must be an object with a "name" string, not {describe_value(t)}'
            )
        name, shape, datatype = t["name"], t.get("shape"), t.get("datatype")
        if not isinstance(shape, list) or not all(type(d) is int for d in shape):
            raise InvalidRequest(
                f'input {name!r} needs a "shape", a list of integers, not {describe_value(shape)}'
            )
        if not isinstance(datatype, str):
            raise InvalidRequest(
                f'input {name!r} needs a "datatype" string such as "FP32", '
                f"not {describe_value(datatype)}"
            )
        size = _params(t, f"input {name!r}").get("binary_data_size")
        data: Any = t.get("data")
        if size is not None:
            if data is not None:
                raise InvalidRequest(
                    f'input {name!r} has both "data" and binary_data_size; send one of them'
                )
            if type(size) is not int or size < 0 or offset + size > len(tail):
                shown = size if type(size) is int else describe_value(size)
                raise InvalidRequest(
                    f"input {name!r} declares binary_data_size {shown} but only "
                    f"{len(tail) - offset} bytes of binary data are left"
                )
            data, offset = tail[offset : offset + size], offset + size
        elif data is not None and not isinstance(data, list):
            raise InvalidRequest(
                f'input {name!r} "data" must be a list of elements, not {describe_value(data)}'
            )
        inputs.append(WireTensor(name, datatype, shape, data))
    if offset != len(tail):
        raise InvalidRequest(
            f"request carries {len(tail)} bytes of binary data but its inputs declare {offset}"
        )
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise InvalidRequest(f'request "id" must be a string, not {describe_value(rid)}')
    wanted = _outputs(model, doc)
    return InferRequest(rid, inputs, wanted)


def _outputs(model: ModelSpec, doc: dict[str, Any]) -> list[tuple[int, bool]]:
    """(index into model.outputs, binary) for each output asked for (all when none are)."""
    binary_all = _flag(_params(doc, "request"), "binary_data_output", False, "request")
    index = {s.name: i for i, s in enumerate(model.outputs)}
    asked = doc.get("outputs")
    if asked is None:
        return [(i, binary_all) for i in range(len(model.outputs))]
    if not isinstance(asked, list):
        raise InvalidRequest(
            f'"outputs" must be a list of objects such as {{"name": "{model.outputs[0].name}"}}, '
            f"not {describe_value(asked)}"
        )
    wanted: list[tuple[int, bool]] = []
    for k, o in enumerate(asked or [{"name": s.name} for s in model.outputs]):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            got = describe_value(o.get("name") if isinstance(o, dict) else o)
            raise InvalidRequest(f'output {k} must be an object with a "name" string, not {got}')
        name = o["name"]
        if name not in index:
            raise InvalidRequest(
                f"unknown output {name!r}; model {model.name!r} has outputs {sorted(index)}"
            )
        where = f"output {name!r}"
        wanted.append((index[name], _flag(_params(o, where), "binary_data", binary_all, where)))
    return wanted


def _params(obj: dict[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidRequest(
            f'{where} "parameters" must be an object, not {describe_value(params)}'
        )
    return params


def _flag(params: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = params.get(key, default)
    if type(value) is not bool:
        raise InvalidRequest(
            f"{where} parameter {key} must be true or false, not {describe_value(value)}"
        )
    return value


def infer_answer(
    model: ModelSpec, req: InferRequest, arrays: list[Any], version: str = "1"
) -> Answer:
    outputs, blobs = [], []
    for i, binary in req.outputs:
        spec, arr = model.outputs[i], arrays[i]
        entry: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype}
        entry["shape"] = list(arr.shape)
        if binary:
            raw = to_raw(arr)
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = to_elements(arr)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": model.name, "model_version": version}
    if req.id is not None:
        doc["id"] = req.id
    doc["outputs"] = outputs
    head = orjson.dumps(doc)
    if not blobs:
        return Answer(200, head)
    return Answer(200, b"".join([head, *blobs]), header_length=len(head))
