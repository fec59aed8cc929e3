"""Layers over a ``Graph``: each adds its nodes and weights and counts its own FLOPs.

Weights are drawn so that activations stay of order one through deep stacks with no batch
norm: each output unit's weights sum to zero and have L2 norm ``gain``, the gain that keeps
the second moment of the following activation at one, and the last layer of a residual
branch is drawn small (``RESIDUAL_GAIN``) so the residual stream grows slowly. Batch norms
are taken as folded into the preceding convolution's weights and bias, as an exported
inference model has them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import numpy as np

from ridgeline.zoo._graph import Graph, T

Act = Literal["silu", "relu", "prelu", "gelu", "sigmoid", "none"]

# 1 / sqrt(E[act(x)^2]) for x ~ N(0, 1): the gain that keeps the next layer's input at unit scale
_GAIN = {"silu": 1.68, "relu": 1.41, "prelu": 1.37, "gelu": 1.6, "sigmoid": 1.0, "none": 1.0}
RESIDUAL_GAIN = 0.3


def _prelu(g: Graph, x: T) -> T:
    return g.op("PRelu", [x.name, g.fill((x.shape[0], 1, 1), 0.25)], x.shape)


def _silu(g: Graph, x: T) -> T:
    return g.op("Mul", [x.name, g.op("Sigmoid", [x.name], x.shape).name], x.shape)


def _gelu(g: Graph, x: T) -> T:
    """Exact GELU, ``0.5 * x * (1 + erf(x / sqrt 2))``, the pattern onnxruntime fuses."""

    def scalar(v: float) -> str:
        return g.const(np.array(v, np.float32))

    erf = g.op("Erf", [g.op("Mul", [x.name, scalar(1 / math.sqrt(2))], x.shape).name], x.shape)
    one = g.op("Add", [erf.name, scalar(1.0)], x.shape)
    half = g.op("Mul", [x.name, scalar(0.5)], x.shape)
    return g.op("Mul", [half.name, one.name], x.shape)


_ACTIVATIONS: dict[Act, Callable[[Graph, T], T]] = {
    "silu": _silu,
    "relu": lambda g, x: g.op("Relu", [x.name], x.shape),
    "prelu": _prelu,
    "gelu": _gelu,
    "sigmoid": lambda g, x: g.op("Sigmoid", [x.name], x.shape),
    "none": lambda g, x: x,
}


def activation(g: Graph, x: T, act: Act) -> T:
    return _ACTIVATIONS[act](g, x)


def conv(
    g: Graph,
    x: T,
    c_out: int,
    k: int = 1,
    stride: int = 1,
    *,
    groups: int = 1,
    act: Act = "silu",
    pad: int | None = None,
    gain: float | None = None,
) -> T:
    """A 2-D (or, for a ``(C, L)`` input, 1-D) convolution with its bias, then ``act``."""
    c_in, *space = x.shape
    p = k // 2 if pad is None else pad
    out_space = tuple((s + 2 * p - k) // stride + 1 for s in space)
    fan_in = c_in // groups * k ** len(space)
    w_shape = (c_out, c_in // groups, *(k,) * len(space))
    w = g.unit_weight(
        w_shape, gain if gain is not None else _GAIN[act], (1, *range(2, len(w_shape)))
    )
    b = g.weight((c_out,), 0.02)
    g.flops += 2 * fan_in * c_out * math.prod(out_space)
    y = g.op(
        "Conv",
        [x.name, w, b],
        (c_out, *out_space),
        kernel_shape=[k] * len(space),
        strides=[stride] * len(space),
        pads=[p] * (2 * len(space)),
        group=groups,
    )
    return activation(g, y, act)


def linear(g: Graph, x: T, d_out: int, *, act: Act = "none", gain: float | None = None) -> T:
    """``x @ W + b`` over the last axis, then ``act``."""
    d_in = x.shape[-1]
    w = g.unit_weight((d_in, d_out), gain if gain is not None else _GAIN[act], (0,))
    b = g.weight((d_out,), 0.02)
    g.flops += 2 * math.prod(x.shape) * d_out
    shape = (*x.shape[:-1], d_out)
    y = g.op("MatMul", [x.name, w], shape)
    return activation(g, g.op("Add", [y.name, b], shape), act)


def add(g: Graph, a: T, b: T) -> T:
    return g.op("Add", [a.name, b.name], a.shape)


def concat(g: Graph, parts: list[T], axis: int = 0) -> T:
    """Join on a per-item axis (0 is the first axis after the batch)."""
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    return g.op("Concat", [p.name for p in parts], tuple(shape), axis=axis + 1)


def reshape(g: Graph, x: T, shape: tuple[int, ...]) -> T:
    return g.op("Reshape", [x.name, g.ints(-1, *shape)], shape)


def transpose(g: Graph, x: T, perm: tuple[int, ...]) -> T:
    """Permute the per-item axes; the batch axis stays first."""
    shape = tuple(x.shape[i] for i in perm)
    return g.op("Transpose", [x.name], shape, perm=[0, *(i + 1 for i in perm)])


def global_pool(g: Graph, x: T) -> T:
    return g.op("GlobalAveragePool", [x.name], (x.shape[0], 1, 1))


def flatten(g: Graph, x: T) -> T:
    return g.op("Flatten", [x.name], (math.prod(x.shape),), axis=1)


def layer_norm(g: Graph, x: T) -> T:
    d = x.shape[-1]
    scale, bias = g.fill((d,), 1.0), g.fill((d,), 0.0)
    return g.op("LayerNormalization", [x.name, scale, bias], x.shape, axis=-1, epsilon=1e-5)


def attention(g: Graph, x: T, heads: int, *, causal_after: int | None = None) -> T:
    """Multi-head self-attention over ``x`` of shape ``(L, d)``.

    With ``causal_after=n``, positions from ``n`` on see only the positions before them
    (and all of the first ``n``): the prefix-LM mask of an image-to-text decoder.
    """
    length, d = x.shape
    dh = d // heads

    def split(t: T) -> T:  # (L, d) -> (heads, L, dh)
        return transpose(g, reshape(g, t, (length, heads, dh)), (1, 0, 2))

    q, k, v = (split(linear(g, x, d)) for _ in range(3))
    kt = transpose(g, k, (0, 2, 1))
    scores = g.op("MatMul", [q.name, kt.name], (heads, length, length))
    scaled = g.op("Mul", [scores.name, g.const(np.array(dh**-0.5, np.float32))], scores.shape)
    if causal_after is not None:
        mask = np.zeros((length, length), np.float32)
        mask[np.triu_indices(length, 1)] = -1e4
        mask[:, :causal_after] = 0.0
        scaled = g.op("Add", [scaled.name, g.const(mask)], scores.shape)
    weights = g.op("Softmax", [scaled.name], scores.shape, axis=-1)
    mixed = g.op("MatMul", [weights.name, v.name], (heads, length, dh))
    g.flops += 2 * 2 * heads * length * length * dh
    merged = reshape(g, transpose(g, mixed, (1, 0, 2)), (length, d))
    return linear(g, merged, d, gain=RESIDUAL_GAIN)


def transformer_block(
    g: Graph, x: T, heads: int, mlp_ratio: int = 4, *, causal_after: int | None = None
) -> T:
    """Pre-norm block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""
    x = add(g, x, attention(g, layer_norm(g, x), heads, causal_after=causal_after))
    hidden = linear(g, layer_norm(g, x), x.shape[-1] * mlp_ratio, act="gelu")
    return add(g, x, linear(g, hidden, x.shape[-1], gain=RESIDUAL_GAIN))


def batched(g: Graph, param: str, like: T, shape: tuple[int, ...]) -> T:
    """A per-item parameter of ``shape`` repeated over the batch of ``like``."""
    dims = g.op("Shape", [like.name], (), start=0, end=1)
    target = g.op("Concat", [dims.name, g.ints(*shape)], (), axis=0)
    return g.op("Expand", [param, target.name], shape)


def conv1d_ffn(g: Graph, x: T, hidden: int, k: int) -> T:
    """FastSpeech's position-wise FFN over ``(L, d)``: conv1d(k) + ReLU, then conv1d(1)."""
    channels_first = transpose(g, x, (1, 0))
    h = conv(g, channels_first, hidden, k, act="relu")
    y = conv(g, h, x.shape[-1], 1, act="none", gain=RESIDUAL_GAIN)
    return transpose(g, y, (1, 0))
