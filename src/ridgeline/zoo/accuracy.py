"""Published accuracy and compute of the real models the zoo's variants are shaped like.

Kept as data with the source each figure was read from; nothing here is measured by
ridgeline (the zoo's weights are random, so its models have no accuracy of their own).
The figures describe the full-size models at their native input size, not the reduced ones.

- ``detector``: YOLOv5 v7.0, COCO val2017 mAP@0.5:0.95 at 640 px, and FLOPs at 640 px.
- ``classifier``: EfficientNet, ImageNet top-1 and FLOPs. The paper's "FLOPs" count
  multiply-adds, so they are half of the zoo's ``2 * MACs`` at the same scale.
- ``face``: ArcFace IResNet trained on WebFace42M (partial FC 0.3); MFR-ALL is the true
  accept rate at a false accept rate of 1e-6 on the ICCV2021-MFR all-race set. Its FLOPs
  column is also multiply-adds at 112 px.
- ``captioner``: GIT base and large fine-tuned on COCO, CIDEr on the Karpathy test split.
  No FLOPs are published with them: ``published_gflops`` is None.
- ``tts``: None. No text-to-speech family with several sizes and per-size quality figures
  (MOS or WER) could be read from a source precisely enough to cite, so none is given; the
  variants are FastSpeech-2-shaped, and FastSpeech 2 publishes one size only.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field


class Accuracy(BaseModel):
    """A published quality figure of a model, and where it was published."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float = Field(description="the figure as published, e.g. 37.4")
    metric: str = Field(min_length=1, description="what it measures, on which data set")
    source: str = Field(min_length=1, description="paper and table, or repository and file")


_YOLO = (
    "ultralytics/yolov5 README.md, 'Pretrained Checkpoints' table (release v7.0): "
    "mAPval 50-95 at size 640"
)
_YOLO_METRIC = "COCO val2017 mAP@0.5:0.95 (%), 640 px"
_EFFNET = (
    "Tan & Le, 'EfficientNet: Rethinking Model Scaling for Convolutional Neural Networks', "
    "ICML 2019, Table 2"
)
_EFFNET_METRIC = "ImageNet top-1 accuracy (%)"
_ARCFACE = (
    "deepinsight/insightface recognition/arcface_torch/README.md, 'ViT For Face Recognition' "
    "table, WF42M-PFC-0.3 rows"
)
_ARCFACE_METRIC = "ICCV2021-MFR-ALL TAR (%) at FAR 1e-6"
_GIT = (
    "microsoft/GenerativeImage2Text README.md, inference on COCO Karpathy test: "
    "'The CIDEr score should be 131.35 for GIT_BASE_COCO and 138.45 for GIT_LARGE_COCO'"
)
_GIT_METRIC = "COCO Karpathy test CIDEr"


def _table(metric: str, source: str, values: dict[str, float]) -> dict[str, Accuracy]:
    return {name: Accuracy(value=v, metric=metric, source=source) for name, v in values.items()}


ACCURACY: Mapping[str, Accuracy] = MappingProxyType(
    {
        **_table(
            _YOLO_METRIC,
            _YOLO,
            {"yolov5n": 28.0, "yolov5s": 37.4, "yolov5m": 45.4, "yolov5l": 49.0, "yolov5x": 50.7},
        ),
        **_table(
            _EFFNET_METRIC,
            _EFFNET,
            {
                "efficientnet-b0": 77.1,
                "efficientnet-b1": 79.1,
                "efficientnet-b2": 80.1,
                "efficientnet-b3": 81.6,
                "efficientnet-b4": 82.9,
                "efficientnet-b5": 83.6,
                "efficientnet-b6": 84.0,
                "efficientnet-b7": 84.3,
            },
        ),
        **_table(
            _ARCFACE_METRIC,
            _ARCFACE,
            {"arcface-r18": 79.13, "arcface-r50": 94.03, "arcface-r100": 96.69},
        ),
        **_table(_GIT_METRIC, _GIT, {"git-base-coco": 131.35, "git-large-coco": 138.45}),
    }
)
"""Variant name to its published accuracy; a variant without one is absent."""

PUBLISHED_GFLOPS: Mapping[str, float] = MappingProxyType(
    {
        # ultralytics/yolov5 README, v7.0 table, "FLOPs @640 (B)"
        "yolov5n": 4.5,
        "yolov5s": 16.5,
        "yolov5m": 49.0,
        "yolov5l": 109.1,
        "yolov5x": 205.7,
        # Tan & Le 2019, Table 2, "#FLOPs" (multiply-adds)
        "efficientnet-b0": 0.39,
        "efficientnet-b1": 0.70,
        "efficientnet-b2": 1.0,
        "efficientnet-b3": 1.8,
        "efficientnet-b4": 4.2,
        "efficientnet-b5": 9.9,
        "efficientnet-b6": 19.0,
        "efficientnet-b7": 37.0,
        # insightface arcface_torch README, "FLOPs" column of the table above (multiply-adds)
        "arcface-r18": 2.6,
        "arcface-r50": 6.3,
        "arcface-r100": 12.1,
    }
)
"""Variant name to the GFLOPs per item its source prints, at the native input size."""
