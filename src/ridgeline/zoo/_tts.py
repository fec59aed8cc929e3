"""FastSpeech-2-shaped text-to-speech acoustic model: phoneme ids in, mel frames out.

``tts-base`` has FastSpeech 2's published configuration (Ren et al., ICLR 2021, appendix:
256-wide, 4 encoder and 4 decoder feed-forward Transformer blocks, 2 heads, conv FFN of 1024
filters with kernels 9 and 1); ``tts-small`` and ``tts-large`` scale width and depth down and
up. The variance adaptor's predicted durations are replaced by a fixed ``FRAMES_PER_TOKEN``
so the output shape is static: ``mel`` ``[FRAMES_PER_TOKEN * tokens, 80]``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ridgeline.zoo._graph import Graph, T
from ridgeline.zoo._layers import add, attention, conv1d_ffn, layer_norm, linear, reshape


class _Shape(NamedTuple):
    width: int
    layers: int  # per side: encoder and decoder each
    heads: int
    filters: int


VARIANTS = {
    "tts-small": _Shape(width=128, layers=2, heads=2, filters=512),
    "tts-base": _Shape(width=256, layers=4, heads=2, filters=1024),
    "tts-large": _Shape(width=384, layers=6, heads=4, filters=1536),
}
NATIVE_TOKENS = 128
PHONEMES = 128
FRAMES_PER_TOKEN = 4
MELS = 80
KERNEL = 9


def _fft_block(g: Graph, x: T, heads: int, filters: int) -> T:
    """FastSpeech's feed-forward Transformer block (post-norm, conv FFN)."""
    x = layer_norm(g, add(g, x, attention(g, x, heads)))
    return layer_norm(g, add(g, x, conv1d_ffn(g, x, filters, KERNEL)))


def _positions(g: Graph, x: T) -> T:
    """Add the sinusoidal position table of the Transformer."""
    length, d = x.shape
    angle = np.arange(length)[:, None] / 10000 ** (np.arange(0, d, 2) / d)
    table = np.zeros((length, d), np.float32)
    table[:, 0::2], table[:, 1::2] = np.sin(angle), np.cos(angle)
    return g.op("Add", [x.name, g.const(table)], x.shape)


def build(g: Graph, name: str, input_scale: float, width_scale: float) -> int:
    """Add the variant to ``g``; return the number of input tokens it was built for."""
    shape = VARIANTS[name]
    tokens = max(8, round(NATIVE_TOKENS * input_scale))
    d = max(shape.heads, round(shape.width * width_scale / shape.heads) * shape.heads)
    filters = max(2, round(shape.filters * width_scale))

    ids = g.input("tokens", (tokens,), "INT64")
    x = g.op("Gather", [g.weight((PHONEMES, d), 1.0), ids.name], (tokens, d), axis=0)
    x = _positions(g, x)
    for _ in range(shape.layers):
        x = _fft_block(g, x, shape.heads, filters)
    frames = tokens * FRAMES_PER_TOKEN
    wide = g.op("Unsqueeze", [x.name, g.ints(2)], (tokens, 1, d))
    times = g.ints(1, 1, FRAMES_PER_TOKEN, 1)
    repeated = g.op("Expand", [wide.name, times], (tokens, FRAMES_PER_TOKEN, d))
    x = _positions(g, reshape(g, repeated, (frames, d)))
    for _ in range(shape.layers):
        x = _fft_block(g, x, shape.heads, filters)
    g.output(linear(g, x, MELS), "mel")
    return tokens
