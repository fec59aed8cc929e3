"""The Open Inference Protocol v2's HTTP body, both ways: an infer request (JSON tensors,
or Triton's binary tensor extension: the JSON header of ``Inference-Header-Content-Length``
bytes, then each input with a ``binary_data_size`` parameter, in order) into tensors, and
outputs into an answer (binary when asked: ``binary_data_output`` for all, ``binary_data``
per output). Independent of the server library; errors are ``{"error": "..."}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ridgeline.errors import InvalidRequest
from ridgeline.v2.spec import ModelSpec
from ridgeline.v2.tensors import WireTensor, to_elements, to_raw

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


def error_answer(message: str, status: int) -> Answer:
    return Answer(status, orjson.dumps({"error": message}))


def parse_infer(model: ModelSpec, body: bytes, header_length: str | None) -> InferRequest:
    head, tail = body, memoryview(b"")
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            n = -1
        if not 0 < n <= len(body):
            raise InvalidRequest(
                f"{HEADER_LENGTH} is {header_length!r}; it must be the JSON header's length "
                f"in bytes, 1..{len(body)}"
            )
        head, tail = body[:n], memoryview(body)[n:]
    try:
        doc = orjson.loads(head)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"request header is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise InvalidRequest('request must be a JSON object with an "inputs" list')
    inputs, offset = [], 0
    for t in doc["inputs"]:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise InvalidRequest('each input must be an object with a "name"')
        name, shape = t["name"], t.get("shape")
        if not isinstance(shape, list) or not all(type(d) is int for d in shape):
            raise InvalidRequest(f"input {name!r} needs a shape, a list of integers")
        size = _params(t).get("binary_data_size")
        data: Any = t.get("data")
        if size is not None:
            if type(size) is not int or size < 0 or offset + size > len(tail):
                raise InvalidRequest(
                    f"input {name!r} declares binary_data_size {size!r} but only "
                    f"{len(tail) - offset} bytes of binary data are left"
                )
            data, offset = tail[offset : offset + size], offset + size
        elif data is not None and not isinstance(data, list):
            raise InvalidRequest(f'input {name!r} "data" must be a list of elements')
        inputs.append(WireTensor(name, str(t.get("datatype")), shape, data))
    if offset != len(tail):
        raise InvalidRequest(
            f"request carries {len(tail)} bytes of binary data but its inputs declare {offset}"
        )
    binary_all = bool(_params(doc).get("binary_data_output", False))
    index = {s.name: i for i, s in enumerate(model.outputs)}
    wanted: list[tuple[int, bool]] = []
    for o in doc.get("outputs") or [{"name": s.name} for s in model.outputs]:
        name = o.get("name") if isinstance(o, dict) else None
        if name not in index:
            raise InvalidRequest(
                f"unknown output {name!r}; model {model.name!r} has outputs {sorted(index)}"
            )
        binary = _params(o).get("binary_data", binary_all)
        wanted.append((index[name], bool(binary)))
    rid = doc.get("id")
    return InferRequest(str(rid) if rid is not None else None, inputs, wanted)


def _params(obj: dict[str, Any]) -> dict[str, Any]:
    params = obj.get("parameters")
    return params if isinstance(params, dict) else {}


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
