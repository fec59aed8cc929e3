"""EfficientNet-B0..B7: MBConv blocks with squeeze-and-excitation, compound-scaled.

The B0 stages and the ``(width, depth, resolution)`` coefficients are those of Tan & Le,
"EfficientNet: Rethinking Model Scaling for CNNs" (ICML 2019), Table 1 and the reference
implementation (``round_filters`` to a multiple of 8, ``ceil(depth * repeats)``).
"""

from __future__ import annotations

import math

from ridgeline.zoo._graph import Graph, T
from ridgeline.zoo._layers import (
    RESIDUAL_GAIN,
    add,
    conv,
    flatten,
    global_pool,
    linear,
)

VARIANTS = {  # name: (width, depth, resolution)
    "efficientnet-b0": (1.0, 1.0, 224),
    "efficientnet-b1": (1.0, 1.1, 240),
    "efficientnet-b2": (1.1, 1.2, 260),
    "efficientnet-b3": (1.2, 1.4, 300),
    "efficientnet-b4": (1.4, 1.8, 380),
    "efficientnet-b5": (1.6, 2.2, 456),
    "efficientnet-b6": (1.8, 2.6, 528),
    "efficientnet-b7": (2.0, 3.1, 600),
}
# B0 stages: (expand ratio, kernel, stride, input filters, output filters, repeats)
STAGES = (
    (1, 3, 1, 32, 16, 1),
    (6, 3, 2, 16, 24, 2),
    (6, 5, 2, 24, 40, 2),
    (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3),
    (6, 5, 2, 112, 192, 4),
    (6, 3, 1, 192, 320, 1),
)
CLASSES = 1000


def _round_filters(filters: int, width: float) -> int:
    f = filters * width
    rounded = max(8, int(f + 4) // 8 * 8)
    return rounded + 8 if rounded < 0.9 * f else rounded


def _mbconv(g: Graph, x: T, c_out: int, expand: int, k: int, stride: int, se: int) -> T:
    c_in = x.shape[0]
    h = conv(g, x, c_in * expand) if expand != 1 else x
    channels = h.shape[0]
    h = conv(g, h, channels, k, stride, groups=channels)
    squeeze = conv(g, global_pool(g, h), se)
    gate = conv(g, squeeze, channels, act="sigmoid")
    h = g.op("Mul", [h.name, gate.name], h.shape)
    residual = stride == 1 and c_in == c_out
    out = conv(g, h, c_out, act="none", gain=RESIDUAL_GAIN if residual else None)
    return add(g, x, out) if residual else out


def build(g: Graph, name: str, input_scale: float, width_scale: float) -> int:
    """Add the variant to ``g``; return the input side it was built for."""
    width, depth, native = VARIANTS[name]
    size = max(32, int(native * input_scale / 8 + 0.5) * 8)

    def ch(filters: int) -> int:
        return max(2, round(_round_filters(filters, width) * width_scale))

    x = g.input("images", (3, size, size))
    x = conv(g, x, ch(32), 3, 2)
    for expand, k, stride, f_in, f_out, repeats in STAGES:
        for i in range(math.ceil(depth * repeats)):
            se = max(1, int(ch(f_in if i == 0 else f_out) * 0.25))
            x = _mbconv(g, x, ch(f_out), expand, k, stride if i == 0 else 1, se)
    x = conv(g, x, ch(1280))
    g.output(linear(g, flatten(g, global_pool(g, x)), CLASSES), "logits")
    return size
