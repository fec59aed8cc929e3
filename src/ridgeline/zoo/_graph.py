"""A tiny graph builder over ``onnx.helper`` that counts FLOPs and parameters as it goes.

Every tensor carries its static shape without the batch dimension, so each layer knows its
own cost: a convolution or a matrix product adds ``2 * MACs`` per item to ``Graph.flops``;
element-wise work (activations, adds, softmax, pooling) is not counted, as in the published
figures. With ``materialize=False`` no weights are drawn: the graph only counts, which is
how the paper-scale FLOPs of a variant are computed without allocating its weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ridgeline.v2.spec import ONNX_TYPES

OPSET = 17
IR_VERSION = 8  # onnxruntime >= 1.14 and Triton's ONNX backend both read it
BATCH = "batch"


def _onnx_type(datatype: str) -> int:
    """The ONNX element type of a v2 datatype (``v2.spec.ONNX_TYPES``)."""
    return int(TensorProto.DataType.Value(ONNX_TYPES[datatype]))


@dataclass(frozen=True)
class T:
    """A tensor of the graph being built: its name and per-item shape (no batch dim)."""

    name: str
    shape: tuple[int, ...]


@dataclass
class Graph:
    """Nodes, weights and running totals of one model; ``seed`` makes the weights repeatable."""

    seed: int
    materialize: bool = True
    flops: int = 0
    params: int = 0
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    weights: list[onnx.TensorProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    outputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    _count: int = 0
    _rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def input(self, name: str, shape: tuple[int, ...], datatype: str = "FP32") -> T:
        dims: list[int | str] = [BATCH, *shape]
        self.inputs.append(helper.make_tensor_value_info(name, _onnx_type(datatype), dims))
        return T(name, shape)

    def output(self, x: T, name: str, datatype: str = "FP32") -> T:
        self.nodes.append(helper.make_node("Identity", [x.name], [name]))
        dims: list[int | str] = [BATCH, *x.shape]
        self.outputs.append(helper.make_tensor_value_info(name, _onnx_type(datatype), dims))
        return T(name, x.shape)

    def weight(self, shape: tuple[int, ...], std: float) -> str:
        """A parameter of seeded normal draws with standard deviation ``std`` (a bias)."""
        self.params += math.prod(shape)
        if not self.materialize:
            return self.fresh("w")
        return self.const(self._rng.standard_normal(shape, np.float32) * np.float32(std))

    def unit_weight(self, shape: tuple[int, ...], gain: float, fan_axes: tuple[int, ...]) -> str:
        """Seeded normal draws, centred and rescaled so each output unit's weights over
        ``fan_axes`` sum to zero and have L2 norm ``gain``: a unit then drops its input's
        mean and scales the rest by exactly ``gain``, so deep stacks neither blow up nor
        fade out."""
        self.params += math.prod(shape)
        if not self.materialize:
            return self.fresh("w")
        values = self._rng.standard_normal(shape, np.float32)
        if math.prod(shape[a] for a in fan_axes) > 2:
            values -= values.mean(axis=fan_axes, keepdims=True)
        norms = np.sqrt(np.square(values).sum(axis=fan_axes, keepdims=True))
        return self.const(values * (np.float32(gain) / norms))

    def fill(self, shape: tuple[int, ...], value: float) -> str:
        """A constant-valued parameter (a norm's scale, a slope): counted, not drawn."""
        self.params += math.prod(shape)
        if not self.materialize:
            return self.fresh("w")
        return self.const(np.full(shape, value, np.float32))

    def const(self, array: np.ndarray) -> str:
        """A constant that is not a parameter (shapes, axes, masks)."""
        name = self.fresh("c")
        self.weights.append(numpy_helper.from_array(array, name))
        return name

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, np.int64))

    def op(self, op_type: str, inputs: list[str], shape: tuple[int, ...], **attrs: Any) -> T:
        (out,) = self.node(op_type, inputs, 1, **attrs)
        return T(out, shape)

    def node(self, op_type: str, inputs: list[str], outputs: int, **attrs: Any) -> list[str]:
        """A node with several outputs (TopK); returns their names."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, **attrs))
        return names

    def model(self, name: str, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name, self.inputs, self.outputs, initializer=self.weights
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            producer_name="ridgeline.zoo",
            doc_string=doc,
        )
        onnx.checker.check_model(model)
        return model
