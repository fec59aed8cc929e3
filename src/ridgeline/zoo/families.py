"""The model families, their variants, and how the zoo shrinks them to run on a CPU.

Each family is built at paper scale by its module (``_detector``, ``_classifier``, ...), then
shrunk by two factors that are the same for every variant of the family, so the FLOPs ratios
between variants stay close to the real ones:

- ``input_scale``: the input side (or, for ``tts``, the text length) as a fraction of the
  native one: YOLOv5 640 px -> 320, EfficientNet's 224..600 px -> 136..360 (x 0.6, to a
  multiple of 8), ArcFace 112 -> 56, GIT 224 -> 112, 128 phonemes -> 64.
- ``width_scale``: every layer's channel count (hidden width) as a fraction of the real one:
  1/5, and 1/10 for the captioner's transformers. Layer and block counts are the real ones,
  and so are the output sizes (80 COCO classes, 1000 ImageNet classes, 512-d embeddings,
  80 mel bins; the captioner's vocabulary is cut to 1,024).

The widths are cut to keep the files small (FP32 weights; parameters shrink with the square
of the width) and the inputs less so, to keep some compute: the smallest variant of each
family runs in about 1-10 ms per item on two CPU cores, the largest in about 40-120 ms, and
the whole zoo is about 130 MB. At ``input_scale=1, width_scale=1`` the builders reproduce
the published FLOPs and parameter counts (YOLOv5s 16.4 GFLOPs and 7.2 M parameters,
EfficientNet-B0 0.386 G multiply-adds, ArcFace R100 12.09 G multiply-adds).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import onnx

from ridgeline.errors import UnknownKindError
from ridgeline.zoo import _captioner, _classifier, _detector, _face, _tts
from ridgeline.zoo._graph import Graph

Builder = Callable[[Graph, str, float, float], int]


@dataclass(frozen=True)
class _Family:
    variants: tuple[str, ...]
    build: Builder
    input_scale: float
    width_scale: float
    task: str


_FAMILIES = {
    "detector": _Family(
        tuple(_detector.VARIANTS), _detector.build, 0.5, 0.2, "object detection (YOLOv5)"
    ),
    "classifier": _Family(
        tuple(_classifier.VARIANTS), _classifier.build, 0.6, 0.2, "classification (EfficientNet)"
    ),
    "face": _Family(tuple(_face.VARIANTS), _face.build, 0.5, 0.2, "face embedding (ArcFace)"),
    "captioner": _Family(
        tuple(_captioner.VARIANTS), _captioner.build, 0.5, 0.1, "image captioning (GIT)"
    ),
    "tts": _Family(tuple(_tts.VARIANTS), _tts.build, 0.5, 0.2, "text to mel (FastSpeech 2)"),
}

FAMILIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {name: f.variants for name, f in _FAMILIES.items()}
)
"""Family name to its variant names, smallest first."""


@dataclass(frozen=True)
class BuiltModel:
    """One variant as built: the ONNX model and its analytic cost per item."""

    family: str
    variant: str
    model: onnx.ModelProto
    flops: int
    params: int
    input_scale: float
    width_scale: float


def variants_of(family: str) -> tuple[str, ...]:
    """The variants of ``family``, smallest first; an unknown name lists the valid ones."""
    return _family(family).variants


def _family(name: str) -> _Family:
    if name not in _FAMILIES:
        raise UnknownKindError("model family", name, _FAMILIES)
    return _FAMILIES[name]


def _check(family: str, variant: str) -> _Family:
    f = _family(family)
    if variant not in f.variants:
        raise UnknownKindError(f"{family} variant", variant, f.variants)
    return f


def default_scales(family: str) -> tuple[float, float]:
    """``(input_scale, width_scale)`` the zoo builds ``family`` at."""
    f = _family(family)
    return f.input_scale, f.width_scale


def build_model(
    family: str,
    variant: str,
    *,
    input_scale: float | None = None,
    width_scale: float | None = None,
) -> BuiltModel:
    """Build ``variant`` of ``family`` with seeded weights (the family's scales by default).
    The weights depend only on the names and scales: two builds are identical."""
    f = _check(family, variant)
    scales = (
        input_scale if input_scale is not None else f.input_scale,
        width_scale if width_scale is not None else f.width_scale,
    )
    g = Graph(seed=zlib.crc32(f"{family}/{variant}".encode()))
    f.build(g, variant, *scales)
    doc = (
        f"ridgeline zoo: {variant}, {f.task}, random weights; input_scale={scales[0]:g}, "
        f"width_scale={scales[1]:g}; {g.flops} FLOPs (2 x MACs) per item"
    )
    model = g.model(variant.replace("-", "_"), doc)
    return BuiltModel(family, variant, model, g.flops, g.params, *scales)


def paper_flops(family: str, variant: str) -> tuple[int, int]:
    """``(FLOPs, parameters)`` per item of the full-size model at its native input size,
    counted without drawing its weights."""
    f = _check(family, variant)
    g = Graph(seed=0, materialize=False)
    f.build(g, variant, 1.0, 1.0)
    return g.flops, g.params
