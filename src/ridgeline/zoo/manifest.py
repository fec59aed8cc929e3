"""The zoo's manifest: what each built model takes and gives, costs, and is published to score.

``<zoo>/manifest.json`` lists every variant built into the directory, with its file's path
relative to the manifest, its tensors as the Open Inference Protocol (KServe v2) names them
(``FP32``, ``INT64``; ``-1`` for the batch dimension), its analytic cost per item, and the
published figures of the real model it is shaped like.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ridgeline.errors import ConfigError, UnknownKindError
from ridgeline.v2.spec import TensorSpec, from_onnx
from ridgeline.zoo.accuracy import Accuracy

FORMAT = 1  # bump when a builder changes what it writes: older files are then rebuilt
MANIFEST_NAME = "manifest.json"
MAX_BATCH_SIZE = 32


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ZooVariant(_Frozen):
    """One built model of the zoo."""

    family: str
    name: str = Field(description="the public name of the real model, e.g. yolov5s")
    path: str = Field(description="the .onnx file, relative to the manifest")
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = Field(default=MAX_BATCH_SIZE, gt=0)
    flops_per_item: int = Field(gt=0, description="2 x multiply-accumulates per item, counted")
    params: int = Field(gt=0)
    published_gflops: float | None = Field(
        description="GFLOPs per item of the real model at its native input, as its source prints"
    )
    accuracy: Accuracy | None = Field(description="the real model's published figure")
    input_scale: float = Field(gt=0, description="input side (or length) / the native one")
    width_scale: float = Field(gt=0, description="channel counts / the real ones")
    size_bytes: int = Field(gt=0)
    sha256: str

    @property
    def gflops_per_item(self) -> float:
        return self.flops_per_item / 1e9


class Manifest(_Frozen):
    """Every variant built into one zoo directory."""

    format: int = FORMAT
    variants: tuple[ZooVariant, ...] = ()

    def variant(self, name: str) -> ZooVariant:
        """The variant called ``name``; an unknown one lists those in the manifest."""
        for v in self.variants:
            if v.name == name:
                return v
        raise UnknownKindError("zoo variant", name, [v.name for v in self.variants])

    def family(self, name: str) -> tuple[ZooVariant, ...]:
        return tuple(v for v in self.variants if v.family == name)


def tensor_specs(values: list[onnx.ValueInfoProto]) -> tuple[TensorSpec, ...]:
    """The v2 view of a graph's inputs or outputs: symbolic dimensions become -1 (the zoo's
    and ``export.triton``'s); a type v2 cannot carry is a ConfigError."""
    specs = []
    for v in values:
        dims = v.type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
        kind = onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)
        datatype = from_onnx(kind)
        if datatype is None:
            raise ConfigError(
                f"tensor {v.name!r} is {kind}, which the Open Inference Protocol v2 cannot "
                "carry; export the model with numeric or string tensors"
            )
        specs.append(TensorSpec(name=v.name, datatype=datatype, shape=shape))
    return tuple(specs)


def load_manifest(out_dir: Path) -> Manifest:
    """Read ``<out_dir>/manifest.json``; a missing or malformed one says how to rebuild it."""
    path = Path(out_dir) / MANIFEST_NAME
    fix = f"build the zoo with `ridgeline models build --out {out_dir}`"
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise ConfigError(f"no model zoo manifest at {path}; {fix}") from None
    except (OSError, ValidationError) as exc:
        raise ConfigError(f"the zoo manifest {path} cannot be read ({exc}); {fix}") from exc


def write_manifest(out_dir: Path, manifest: Manifest) -> Path:
    """Write the manifest atomically (a reader never sees half of it)."""
    path = Path(out_dir) / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)
    return path
