"""ArcFace IResNet-18/50/100 (insightface ``arcface_torch``): a face embedding and attributes.

The backbone is ``backbones/iresnet.py`` of deepinsight/insightface: a 3x3 stem at full
resolution, four stages of ``IBasicBlock`` (3x3, PReLU, 3x3 with the stride) of 64..512
channels, and a fully connected layer from the last feature map to a 512-d embedding. A
linear head from the embedding to 40 attribute logits (the CelebA attribute set) is added so
one model answers both, as a face-analysis pipeline stage does; it is 0.1% of the FLOPs.
"""

from __future__ import annotations

from ridgeline.zoo._graph import Graph, T
from ridgeline.zoo._layers import RESIDUAL_GAIN, add, conv, flatten, linear

VARIANTS = {  # name: blocks per stage
    "arcface-r18": (2, 2, 2, 2),
    "arcface-r50": (3, 4, 14, 3),
    "arcface-r100": (3, 13, 30, 3),
}
NATIVE_SIZE = 112
EMBEDDING = 512
ATTRIBUTES = 40


def _block(g: Graph, x: T, planes: int, stride: int) -> T:
    h = conv(g, x, planes, 3, act="prelu")
    h = conv(g, h, planes, 3, stride, act="none", gain=RESIDUAL_GAIN)
    needs_projection = stride != 1 or x.shape[0] != planes
    shortcut = conv(g, x, planes, 1, stride, act="none") if needs_projection else x
    return add(g, shortcut, h)


def build(g: Graph, name: str, input_scale: float, width_scale: float) -> int:
    """Add the variant to ``g``; return the input side it was built for."""
    size = max(16, int(NATIVE_SIZE * input_scale / 8 + 0.5) * 8)
    x = g.input("images", (3, size, size))
    x = conv(g, x, max(2, round(64 * width_scale)), 3, act="prelu")
    for planes, blocks in zip((64, 128, 256, 512), VARIANTS[name], strict=True):
        for i in range(blocks):
            x = _block(g, x, max(2, round(planes * width_scale)), 2 if i == 0 else 1)
    embedding = g.output(linear(g, flatten(g, x), EMBEDDING), "embedding")
    g.output(linear(g, embedding, ATTRIBUTES), "attributes")
    return size
