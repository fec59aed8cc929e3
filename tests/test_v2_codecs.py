"""The v2 request codecs (HTTP JSON and binary, gRPC): every element has one meaning,
every malformed field is an ``InvalidRequest`` naming it, a declared shape is bounded by
the body bound before anything is allocated, and for any bytes, JSON or protobuf a
client can send, nothing but ``InvalidRequest`` escapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from ridgeline.errors import InvalidRequest
from ridgeline.v2.grpc_codec import decode_request
from ridgeline.v2.http_codec import parse_infer
from ridgeline.v2.spec import DATATYPES, ONNX_TYPES, TensorSpec, from_onnx, triton_type
from ridgeline.v2.tensors import (
    LITTLE_ENDIAN,
    NUMPY_DTYPES,
    WireTensor,
    decode_inputs,
    to_elements,
    to_raw,
)

BOUND = 1 << 20
"""The body bound the codecs are given: 1 MiB."""


@dataclass(frozen=True)
class Model:
    """A ModelSpec: one or two inputs, outputs named after them."""

    inputs: tuple[TensorSpec, ...]
    name: str = "m"
    max_batch_size: int = 8

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(f"OUT{i}", s.datatype, s.shape) for i, s in enumerate(self.inputs))


NUMERIC = sorted(LITTLE_ENDIAN)
MODELS = [Model((TensorSpec("X", t, (-1, 2)),)) for t in [*NUMERIC, "BYTES"]]
MODELS.append(Model((TensorSpec("X", "FP32", (-1, 2)), TensorSpec("T", "BYTES", (-1,)))))
FP32 = MODELS[NUMERIC.index("FP32")]
TEXT = Model((TensorSpec("T", "BYTES", (-1, 1)),))


def body(*tensors: dict[str, Any], **extra: Any) -> bytes:
    return orjson.dumps({"inputs": list(tensors), **extra})


def x(data: Any, shape: list[int] | None = None, datatype: str = "FP32") -> dict[str, Any]:
    return {"name": "X", "datatype": datatype, "shape": shape or [1, 2], "data": data}


def decode_http(model: Model, raw: bytes, header_length: str | None = None) -> list[Any]:
    req = parse_infer(model, raw, header_length)
    return decode_inputs(model, req.inputs, BOUND)[1]


def refused(model: Model, raw: bytes) -> str:
    with pytest.raises(InvalidRequest) as caught:
        decode_http(model, raw)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- each element has one meaning ------------------------------------------------------


def test_an_integer_bytes_element_is_refused_not_allocated_as_that_many_zero_bytes() -> None:
    says = refused(TEXT, body({"name": "T", "datatype": "BYTES", "shape": [1, 1], "data": [10**9]}))
    assert says == "input 'T' data holds a number (1000000000); BYTES elements are strings"
    nested = {"name": "T", "datatype": "BYTES", "shape": [1, 1], "data": [[5, 6]]}
    assert "holds a number (5)" in refused(TEXT, body(nested))
    ragged = {"name": "T", "datatype": "BYTES", "shape": [2, 1], "data": [["a"], [[1]]]}
    assert "holds a list of 1 entry" in refused(TEXT, body(ragged))


def test_bytes_elements_are_strings_encoded_as_utf8() -> None:
    tensor = {"name": "T", "datatype": "BYTES", "shape": [2, 1], "data": ["d\u00e9", ""]}
    (got,) = decode_http(TEXT, body(tensor))
    assert got.tolist() == [["d\u00e9".encode()], [b""]]


def test_null_is_refused_not_read_as_nan() -> None:
    says = refused(FP32, body(x([None, 1.0])))
    assert says.startswith("input 'X' data holds null; FP32 elements are numbers")


@pytest.mark.parametrize(
    ("datatype", "data", "says"),
    [
        ("FP32", ["1.5", "2"], "data holds a string ('1.5'); FP32 elements are numbers"),
        ("FP32", [True, False], "data holds a boolean (true); FP32 elements are numbers"),
        ("INT32", [1.5, 2], "data holds a fractional number (1.5); INT32 elements are integers"),
        ("INT8", [1, 200], "data holds 200, outside INT8's range -128..127"),
        ("UINT16", [-1, 2], "data holds -1, outside UINT16's range 0..65535"),
        (
            "INT64",
            [-1, 2**64 - 1],
            "data holds 18446744073709551615, outside INT64's range",
        ),
        ("BOOL", [1, 0], "data holds a number (1); BOOL elements are booleans"),
        ("FP16", [1.0, 70000.0], "data holds 70000.0, beyond FP16's largest finite value"),
        ("FP32", [[1.0], 2.0], "is not a list of FP32 elements (nested lists must be even)"),
        ("FP32", [{"a": 1}, 2.0], "data holds an object of 1 entry; FP32 elements are numbers"),
    ],
)
def test_elements_the_datatype_cannot_hold_are_refused(datatype: str, data: Any, says: str) -> None:
    model = MODELS[NUMERIC.index(datatype)]
    assert says in refused(model, body(x(data, datatype=datatype)))


def test_numbers_within_range_decode_exactly_flat_or_nested() -> None:
    int8 = MODELS[NUMERIC.index("INT8")]
    (got,) = decode_http(int8, body(x([[-128], [127]], datatype="INT8")))
    assert (got.dtype, got.tolist()) == (np.dtype(np.int8), [[-128, 127]])
    (got,) = decode_http(FP32, body(x([1, 2.5])))  # integers are numbers too
    assert got.tolist() == [[1.0, 2.5]]


def test_a_declared_shape_over_the_body_bound_is_refused_before_decoding() -> None:
    says = refused(FP32, body(x([0.0], shape=[1, 10**9])))
    assert says == "input 'X' has shape [1, 1000000000]; the model expects [-1, 2]"
    wide = Model((TensorSpec("X", "FP32", (-1, -1)),))
    says = refused(wide, body(x([0.0], shape=[1, 10**9])))
    assert says == (
        "input 'X' declares shape [1, 1000000000]: 1000000000 FP32 elements, 4000000000 "
        f"bytes decoded, over the server's bound of {BOUND} bytes; send fewer rows per request"
    )
    text = Model((TensorSpec("T", "BYTES", (-1, -1)),))
    huge = {"name": "T", "datatype": "BYTES", "shape": [1, 2 * BOUND], "data": ["a"]}
    assert "over the server's bound" in refused(text, body(huge))


@given(st.sampled_from(MODELS[:-1]), st.integers(1, 8), st.data())
def test_json_and_binary_forms_decode_to_the_array_sent(model: Model, rows: int, data: Any) -> None:
    """The law the servers answer by: whatever a client encodes (to_elements for JSON,
    to_raw for the binary extension) decodes to the same array."""
    spec = model.inputs[0]
    if spec.datatype == "BYTES":
        flat = data.draw(st.lists(st.binary(max_size=4), min_size=2 * rows, max_size=2 * rows))
        arr = np.empty(2 * rows, dtype=np.object_)
        arr[:] = flat
        arr = arr.reshape(rows, 2)
        json_form = [b.hex() for b in flat]  # JSON BYTES are strings
    else:
        dtype = LITTLE_ENDIAN[spec.datatype]
        arr = np.frombuffer(
            data.draw(
                st.binary(min_size=2 * rows * dtype.itemsize, max_size=2 * rows * dtype.itemsize)
            ),
            dtype,
        )
        arr = arr.reshape(rows, 2)
        if dtype.kind == "f":
            arr = np.nan_to_num(arr, nan=0.0, posinf=1.0, neginf=-1.0)  # JSON has no NaN
        json_form = to_elements(arr)
    raw = to_raw(arr)
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": spec.datatype,
                    "shape": [rows, 2],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    (binary,) = decode_http(model, head + raw, str(len(head)))
    np.testing.assert_array_equal(binary, arr)
    tensor = x(json_form, shape=[rows, 2], datatype=spec.datatype)
    (from_json,) = decode_http(model, body(tensor))
    if spec.datatype == "BYTES":
        assert [bytes.fromhex(b.decode()) for b in from_json.reshape(-1)] == flat
    else:
        np.testing.assert_array_equal(from_json, arr)


# --- every malformed field is named ---------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (
            {"outputs": 5},
            '"outputs" must be a list of objects such as {"name": "OUT0"}, not a number (5)',
        ),
        ({"outputs": True}, "not a boolean (true)"),
        ({"outputs": "OUT0"}, "not a string ('OUT0')"),
        (
            {"outputs": [{"name": []}]},
            'output 0 must be an object with a "name" string, not a list of 0 entries',
        ),
        ({"outputs": [7]}, 'output 0 must be an object with a "name" string, not a number (7)'),
        (
            {"outputs": [{"parameters": 3}]},
            'output 0 must be an object with a "name" string, not null',
        ),
        (
            {"outputs": [{"name": "OUT0", "parameters": 3}]},
            "output 'OUT0' \"parameters\" must be an object, not a number (3)",
        ),
        (
            {"outputs": [{"name": "OUT0", "parameters": {"binary_data": "yes"}}]},
            "output 'OUT0' parameter binary_data must be true or false, not a string ('yes')",
        ),
        ({"outputs": [{"name": "nope"}]}, "unknown output 'nope'; model 'm' has outputs ['OUT0']"),
        ({"parameters": []}, 'request "parameters" must be an object, not a list of 0 entries'),
        (
            {"parameters": {"binary_data_output": 1}},
            "request parameter binary_data_output must be true or false, not a number (1)",
        ),
        ({"id": 5}, 'request "id" must be a string, not a number (5)'),
    ],
)
def test_a_malformed_request_field_is_named(extra: dict[str, Any], says: str) -> None:
    assert refused(FP32, body(x([1.0, 2.0]), **extra)).endswith(says)


@pytest.mark.parametrize(
    ("tensor", "says"),
    [
        (5, 'input 0 must be an object with a "name" string, not a number (5)'),
        ({"name": 5}, 'input 0 must be an object with a "name" string, not an object of 1 entry'),
        (
            {**x([1.0, 2.0]), "shape": "1,2"},
            "input 'X' needs a \"shape\", a list of integers, not a string ('1,2')",
        ),
        ({**x([1.0, 2.0]), "shape": [1, True]}, "input 'X' needs a \"shape\", a list of integers"),
        (
            {**x([1.0, 2.0]), "datatype": None},
            'input \'X\' needs a "datatype" string such as "FP32", not null',
        ),
        (
            {**x([1.0, 2.0]), "data": "12"},
            "input 'X' \"data\" must be a list of elements, not a string ('12')",
        ),
        (
            {**x([1.0, 2.0]), "parameters": 1},
            "input 'X' \"parameters\" must be an object, not a number (1)",
        ),
        (
            {**x([1.0, 2.0]), "parameters": {"binary_data_size": 0}},
            "input 'X' has both \"data\" and binary_data_size; send one of them",
        ),
        (
            {**x([1.0, 2.0]), "shape": [1, -2]},
            "input 'X' has shape [1, -2]; the model expects [-1, 2]",
        ),
        (
            {**x([1.0, 2.0]), "shape": [1] * 20},
            "has shape [1, 1, 1, 1, 1, 1, 1, 1, ... (20 dimensions)]",
        ),
    ],
)
def test_a_malformed_input_field_is_named(tensor: Any, says: str) -> None:
    assert says in refused(FP32, body(tensor))


def test_the_fast_paths_old_crashes_are_answered() -> None:
    """The requests that made the fake server's fast path close the connection."""
    for outputs in (5, True, [{"name": []}], [{"parameters": 3}]):
        refused(FP32, body(x([1.0, 2.0]), outputs=outputs))


# --- nothing but InvalidRequest escapes ----------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)
shapes = (
    st.sampled_from([[1, 2], [2, 2], [1, 1], [1], [0, 2], [9, 2], [1, 10**12]])
    | st.lists(st.integers(-(2**63), 2**64 - 1), max_size=3)
    | json_values
)
elements = st.lists(scalars, max_size=5) | st.lists(st.lists(scalars, max_size=2), max_size=3)
params = (
    st.fixed_dictionaries(
        {},
        optional={
            "binary_data_size": st.integers(-2, 16) | json_values,
            "binary_data": st.booleans() | json_values,
            "binary_data_output": st.booleans() | json_values,
        },
    )
    | json_values
)
tensors = (
    st.fixed_dictionaries(
        {"name": st.sampled_from(["X", "T", "Y"]) | json_values},
        optional={
            "datatype": st.sampled_from(sorted(DATATYPES)) | json_values,
            "shape": shapes,
            "data": elements | json_values,
            "parameters": params,
        },
    )
    | json_values
)
outputs = (
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "name": st.sampled_from(["OUT0", "OUT1"]) | json_values,
                "parameters": params,
            },
        )
        | json_values,
        max_size=3,
    )
    | json_values
)
documents = (
    st.fixed_dictionaries(
        {"inputs": st.lists(tensors, max_size=3) | json_values},
        optional={"outputs": outputs, "parameters": params, "id": json_values},
    )
    | json_values
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(MODELS),
    documents,
    st.binary(max_size=24),
    st.one_of(st.none(), st.text(max_size=4), st.just("")),
)
def test_any_json_request_decodes_or_is_an_invalid_request(
    model: Model, doc: Any, tail: bytes, header_length: str | None
) -> None:
    head = orjson.dumps(doc)
    if header_length == "":
        header_length = str(len(head))  # a well-formed binary request
    try:
        decode_http(model, head + tail if header_length is not None else head, header_length)
    except InvalidRequest as e:
        assert "\n" not in str(e)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(MODELS), st.binary(max_size=64), st.none() | st.text(max_size=6))
def test_any_bytes_decode_or_are_an_invalid_request(
    model: Model, raw: bytes, header_length: str | None
) -> None:
    try:
        decode_http(model, raw, header_length)
    except InvalidRequest as e:
        assert "\n" not in str(e)


def test_deeply_nested_json_is_an_invalid_request() -> None:
    deep = b"[" * 2000 + b"]" * 2000
    for raw in (
        deep,
        b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": %s}]}'
        % (b"[" * 1000 + b"]" * 1000),
    ):
        with pytest.raises(InvalidRequest):
            decode_http(FP32, raw)


# --- gRPC -------------------------------------------------------------------------------

_FIELDS = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=4),
}


@st.composite
def infer_requests(draw: Any) -> Any:
    r = service_pb2.ModelInferRequest(model_name="m", id=draw(st.text(max_size=3)))
    for _ in range(draw(st.integers(0, 3))):
        t = r.inputs.add(
            name=draw(st.sampled_from(["X", "T", "Y", ""])),
            datatype=draw(st.sampled_from([*sorted(DATATYPES), "", "fp32"])),
        )
        t.shape.extend(
            draw(
                st.sampled_from([[1, 2], [2, 2], [1], [1, 1], [1, 10**12], [-1, 2]])
                | st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)
            )
        )
        field = draw(st.sampled_from([None, *_FIELDS]))
        if field is not None:
            getattr(t.contents, field).extend(draw(st.lists(_FIELDS[field], max_size=5)))
    if draw(st.booleans()):
        r.raw_input_contents.extend(draw(st.lists(st.binary(max_size=20), max_size=3)))
    for name in draw(st.lists(st.sampled_from(["OUT0", "OUT1", "x", ""]), max_size=2)):
        r.outputs.add(name=name)
    return r


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(MODELS), infer_requests())
def test_any_grpc_request_decodes_or_is_an_invalid_request(model: Model, request: Any) -> None:
    try:
        decode_request(model, request, BOUND)
    except InvalidRequest as e:
        assert "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(MODELS), st.binary(max_size=80))
def test_any_grpc_message_bytes_decode_or_are_an_invalid_request(model: Model, raw: bytes) -> None:
    try:
        request = service_pb2.ModelInferRequest.FromString(raw)
    except DecodeError:  # refused before any codec of ours sees it (see test_v2_servers)
        return
    try:
        decode_request(model, request, BOUND)
    except InvalidRequest as e:
        assert "\n" not in str(e)


def test_grpc_elements_and_shapes_are_held_to_the_same_rules() -> None:
    def grpc_refusal(model: Model, build: Any) -> str:
        r = service_pb2.ModelInferRequest(model_name="m")
        build(r.inputs.add(name=model.inputs[0].name, datatype=model.inputs[0].datatype))
        with pytest.raises(InvalidRequest) as caught:
            decode_request(model, r, BOUND)
        return str(caught.value)

    int8 = MODELS[NUMERIC.index("INT8")]

    def big_ints(t: Any) -> None:
        t.shape.extend([1, 2])
        t.contents.int_contents.extend([1, 1000])

    assert "holds 1000, outside INT8's range" in grpc_refusal(int8, big_ints)
    wide = Model((TensorSpec("X", "FP32", (-1, -1)),))

    def huge(t: Any) -> None:
        t.shape.extend([1, 10**9])
        t.contents.fp32_contents.append(0.0)

    assert "1000000000 FP32 elements" in grpc_refusal(wide, huge)


def test_wire_tensors_with_a_model_of_an_undecodable_datatype_are_invalid_requests() -> None:
    bf16 = Model((TensorSpec("X", "BF16", (-1, 2)),))
    with pytest.raises(InvalidRequest, match="BF16, which this server cannot decode"):
        decode_inputs(bf16, [WireTensor("X", "BF16", [1, 2], b"\0" * 4)], BOUND)


def test_the_datatype_table_names_real_onnx_types_and_reads_both_spellings_back() -> None:
    import onnx
    from tritonclient.grpc import model_config_pb2

    for datatype, onnx_name in ONNX_TYPES.items():
        onnx.TensorProto.DataType.Value(onnx_name)  # a real ONNX element type
        model_config_pb2.DataType.Value(triton_type(datatype))  # and a real Triton one
        assert from_onnx(onnx_name) == from_onnx(f"tensor({onnx_name.lower()})") == datatype
    assert set(NUMPY_DTYPES) == DATATYPES - {"BF16"}  # numpy has no bfloat16
    assert triton_type("BYTES") == "TYPE_STRING"
    assert [from_onnx(t) for t in ("COMPLEX64", "seq(tensor(float))", "FLOAT8E4M3FN")] == [
        None,
        None,
        None,
    ]


def test_a_grpc_request_with_both_raw_and_typed_contents_is_refused() -> None:
    """Issue 33, fault 18: raw contents were used and typed ones beside them ignored in
    silence; Triton refuses the mix, and so does this codec. Raw alone still decodes."""
    fp32 = MODELS[NUMERIC.index("FP32")]
    r = service_pb2.ModelInferRequest(model_name="m")
    t = r.inputs.add(name="X", datatype="FP32")
    t.shape.extend([1, 2])
    r.raw_input_contents.append(np.array([[1.0, 2.0]], dtype=np.float32).tobytes())
    rows, arrays, _ = decode_request(fp32, r, BOUND)
    assert rows == 1 and arrays[0].tolist() == [[1.0, 2.0]]
    t.contents.fp32_contents.extend([3.0, 4.0])
    with pytest.raises(InvalidRequest, match=r"inputs \['X'\] carry typed contents beside raw"):
        decode_request(fp32, r, BOUND)
