"""A local model zoo: ONNX models shaped like the variants of real model families.

Built with ``onnx.helper`` (no downloads, seeded random weights) at reduced input size and
width so that they run on a CPU, with FLOPs that grow across each family as the real ones
do, and the real models' published accuracy kept beside them as data with its source::

    from ridgeline.zoo import build_zoo

    manifest = build_zoo(Path("zoo"), ["detector"])
    v = manifest.variant("yolov5s")
    print(v.path, v.gflops_per_item, v.accuracy)
"""

from ridgeline.zoo.accuracy import ACCURACY, PUBLISHED_GFLOPS, Accuracy
from ridgeline.zoo.build import build_zoo, default_zoo_dir
from ridgeline.zoo.families import (
    FAMILIES,
    BuiltModel,
    build_model,
    default_scales,
    paper_flops,
    variants_of,
)
from ridgeline.zoo.manifest import Manifest, ZooVariant, load_manifest

__all__ = [
    "ACCURACY",
    "FAMILIES",
    "PUBLISHED_GFLOPS",
    "Accuracy",
    "BuiltModel",
    "Manifest",
    "ZooVariant",
    "build_model",
    "build_zoo",
    "default_scales",
    "default_zoo_dir",
    "load_manifest",
    "paper_flops",
    "variants_of",
]
