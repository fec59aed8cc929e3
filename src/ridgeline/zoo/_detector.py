"""YOLOv5 (v6.0+ layout): CSP backbone with C3 blocks and SPPF, PANet neck, 3-level head.

Scaled by YOLOv5's ``(depth_multiple, width_multiple)``: a C3 with ``n`` bottlenecks gets
``max(round(n * depth), 1)``, a layer of ``c`` channels gets ``c * width`` rounded up to a
multiple of 8 (the ``models/yolov5*.yaml`` files of ultralytics/yolov5). The head ends in the
usual decode and a top-K over ``objectness * best class score``, so the model answers
``detections`` ``[K, 6]`` per image: ``(x, y, w, h, score, class)``.
"""

from __future__ import annotations

import math

import numpy as np

from ridgeline.zoo._graph import Graph, T
from ridgeline.zoo._layers import RESIDUAL_GAIN, activation, add, concat, conv, reshape, transpose

VARIANTS = {  # name: (depth_multiple, width_multiple)
    "yolov5n": (0.33, 0.25),
    "yolov5s": (0.33, 0.50),
    "yolov5m": (0.67, 0.75),
    "yolov5l": (1.0, 1.0),
    "yolov5x": (1.33, 1.25),
}
NATIVE_SIZE = 640
CLASSES = 80
ANCHORS = 3
TOP_K = 32


def _c3(g: Graph, x: T, c_out: int, n: int, shortcut: bool = True) -> T:
    hidden = c_out // 2
    a = conv(g, x, hidden)
    for _ in range(n):
        inner = conv(g, conv(g, a, hidden), hidden, 3, gain=RESIDUAL_GAIN if shortcut else None)
        a = add(g, a, inner) if shortcut else inner
    return conv(g, concat(g, [a, conv(g, x, hidden)]), c_out)


def _sppf(g: Graph, x: T, c_out: int) -> T:
    y = conv(g, x, x.shape[0] // 2)
    pooled = [y]
    for _ in range(3):
        last = pooled[-1]
        pooled.append(g.op("MaxPool", [last.name], last.shape, kernel_shape=[5, 5], pads=[2] * 4))
    return conv(g, concat(g, pooled), c_out)


def _upsample(g: Graph, x: T) -> T:
    c, h, w = x.shape
    scales = g.const(np.array([1, 1, 2, 2], np.float32))
    return g.op("Resize", [x.name, "", scales], (c, 2 * h, 2 * w), mode="nearest")


def _decode(g: Graph, levels: list[T], size: int) -> T:
    """Per-level head outputs to the K best ``(x, y, w, h, score, class)`` rows."""
    rows = []
    for p in levels:
        _, h, w = p.shape
        split = reshape(g, p, (ANCHORS, CLASSES + 5, h * w))
        rows.append(reshape(g, transpose(g, split, (0, 2, 1)), (ANCHORS * h * w, CLASSES + 5)))
    raw = concat(g, rows)
    n = raw.shape[0]
    prob = activation(g, raw, "sigmoid")

    def cols(start: int, end: int) -> T:
        return g.op("Slice", [prob.name, g.ints(start), g.ints(end), g.ints(2)], (n, end - start))

    xywh = g.op("Mul", [cols(0, 4).name, g.const(np.array(size, np.float32))], (n, 4))
    classes = cols(5, 5 + CLASSES)
    best = g.op("ReduceMax", [classes.name], (n, 1), axes=[-1], keepdims=1)
    label = g.op("ArgMax", [classes.name], (n, 1), axis=-1, keepdims=1)
    score = g.op("Mul", [cols(4, 5).name, best.name], (n, 1))
    label_f = g.op("Cast", [label.name], (n, 1), to=1)
    table = concat(g, [xywh, score, label_f], axis=1)
    flat = reshape(g, score, (n,))
    _, top = g.node("TopK", [flat.name, g.ints(TOP_K)], 2, axis=-1)
    index = g.op("Unsqueeze", [top, g.ints(2)], (TOP_K, 1))
    wide = g.op("Expand", [index.name, g.ints(1, 1, 6)], (TOP_K, 6))
    return g.op("GatherElements", [table.name, wide.name], (TOP_K, 6), axis=1)


def build(g: Graph, name: str, input_scale: float, width_scale: float) -> int:
    """Add the variant to ``g``; return the input side it was built for."""
    depth, width = VARIANTS[name]
    size = max(32, round(NATIVE_SIZE * input_scale / 32) * 32)

    def ch(c: int) -> int:
        return max(2, round(math.ceil(c * width / 8) * 8 * width_scale))

    def n(k: int) -> int:
        return max(round(k * depth), 1)

    x = g.input("images", (3, size, size))
    x = conv(g, x, ch(64), 6, 2, pad=2)
    x = _c3(g, conv(g, x, ch(128), 3, 2), ch(128), n(3))
    p3 = _c3(g, conv(g, x, ch(256), 3, 2), ch(256), n(6))
    p4 = _c3(g, conv(g, p3, ch(512), 3, 2), ch(512), n(9))
    p5 = _sppf(g, _c3(g, conv(g, p4, ch(1024), 3, 2), ch(1024), n(3)), ch(1024))
    h10 = conv(g, p5, ch(512))
    h13 = _c3(g, concat(g, [_upsample(g, h10), p4]), ch(512), n(3), shortcut=False)
    h14 = conv(g, h13, ch(256))
    out3 = _c3(g, concat(g, [_upsample(g, h14), p3]), ch(256), n(3), shortcut=False)
    out4 = _c3(g, concat(g, [conv(g, out3, ch(256), 3, 2), h14]), ch(512), n(3), shortcut=False)
    out5 = _c3(g, concat(g, [conv(g, out4, ch(512), 3, 2), h10]), ch(1024), n(3), shortcut=False)
    heads = [conv(g, o, ANCHORS * (CLASSES + 5), act="none") for o in (out3, out4, out5)]
    g.output(_decode(g, heads, size), "detections")
    return size
