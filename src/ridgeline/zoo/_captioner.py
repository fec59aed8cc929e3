"""GIT (Generative Image-to-text Transformer): a ViT image encoder and a 6-layer decoder.

Shaped like microsoft/GenerativeImage2Text's GIT_BASE (CLIP ViT-B/16) and GIT_LARGE (CLIP
ViT-L/14): patch embedding, pre-norm transformer blocks, a projection of the image tokens to
the decoder width, then a BERT-sized decoder over ``image tokens + caption positions`` under a
prefix-LM mask (the caption positions see every image token and the positions before them).
The caption's ``STEPS`` positions are decoded in one pass, as teacher-forced decoding does,
so one request costs one forward pass and the output is ``logits`` ``[STEPS, VOCAB]``.
"""

from __future__ import annotations

from typing import NamedTuple

from ridgeline.zoo._graph import Graph
from ridgeline.zoo._layers import (
    batched,
    concat,
    conv,
    layer_norm,
    linear,
    reshape,
    transformer_block,
    transpose,
)


class _Shape(NamedTuple):
    patch: int
    width: int
    layers: int
    heads: int


VARIANTS = {  # name: image encoder; both decode with a 6-layer, 768-wide, 12-head decoder
    "git-base-coco": _Shape(patch=16, width=768, layers=12, heads=12),
    "git-large-coco": _Shape(patch=14, width=1024, layers=24, heads=16),
}
NATIVE_SIZE = 224
DECODER = _Shape(patch=0, width=768, layers=6, heads=12)
STEPS = 20
VOCAB = 1024  # BERT's 30,522 word pieces cut to 1,024 so a batch of logits stays small


def build(g: Graph, name: str, input_scale: float, width_scale: float) -> int:
    """Add the variant to ``g``; return the input side it was built for."""
    enc = VARIANTS[name]
    grid = max(2, round(NATIVE_SIZE * input_scale / enc.patch))
    size, tokens = grid * enc.patch, grid * grid
    d_enc = max(enc.heads, round(enc.width * width_scale / enc.heads) * enc.heads)
    d_dec = max(DECODER.heads, round(DECODER.width * width_scale / DECODER.heads) * DECODER.heads)

    images = g.input("images", (3, size, size))
    patches = conv(g, images, d_enc, enc.patch, enc.patch, act="none", pad=0, gain=1.0)
    x = transpose(g, reshape(g, patches, (d_enc, tokens)), (1, 0))
    x = g.op("Add", [x.name, g.weight((tokens, d_enc), 0.02)], x.shape)
    x = layer_norm(g, x)
    for _ in range(enc.layers):
        x = transformer_block(g, x, enc.heads)
    visual = layer_norm(g, linear(g, layer_norm(g, x), d_dec))

    caption = batched(g, g.weight((STEPS, d_dec), 1.0), images, (STEPS, d_dec))
    seq = concat(g, [visual, caption])
    for _ in range(DECODER.layers):
        seq = transformer_block(g, seq, DECODER.heads, causal_after=tokens)
    steps = g.op(
        "Slice", [seq.name, g.ints(tokens), g.ints(tokens + STEPS), g.ints(1)], (STEPS, d_dec)
    )
    g.output(linear(g, layer_norm(g, steps), VOCAB), "logits")
    return size
