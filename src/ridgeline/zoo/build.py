"""Build the zoo into a directory: ``<out>/<family>/<variant>.onnx`` and ``<out>/manifest.json``.

Idempotent: a variant whose manifest entry was written by the same builder format at the
same scales, and whose file still has the recorded digest, is kept as it is; anything else
is rebuilt. Families not asked for keep their entries, so a zoo can be built a family at a
time. Files are written whole and then renamed into place.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import onnx

from ridgeline.errors import ConfigError
from ridgeline.zoo.accuracy import ACCURACY, PUBLISHED_GFLOPS
from ridgeline.zoo.families import FAMILIES, build_model, default_scales, variants_of
from ridgeline.zoo.manifest import (
    FORMAT,
    Manifest,
    ZooVariant,
    load_manifest,
    tensor_specs,
    write_manifest,
)


def default_zoo_dir() -> Path:
    """``$RIDGELINE_ZOO``, else ``~/.cache/ridgeline/zoo``."""
    env = os.environ.get("RIDGELINE_ZOO")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ridgeline" / "zoo"


def build_zoo(
    out_dir: Path,
    families: Sequence[str] | None = None,
    *,
    input_scale: float | None = None,
) -> Manifest:
    """Build ``families`` (all by default) into ``out_dir`` and return its manifest.

    ``input_scale`` overrides every family's default input reduction (1.0 builds the native
    input sizes: heavier, for a GPU); channel widths keep the family's reduction.
    """
    if isinstance(families, str):
        families = [families]
    names = list(dict.fromkeys(FAMILIES if families is None else families))
    for name in names:
        variants_of(name)  # an unknown family fails before anything is written
    if input_scale is not None and not input_scale > 0:
        raise ConfigError(f"input_scale must be > 0, got {input_scale}; 1.0 is the native size")
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the zoo directory {out_dir}: {exc}") from exc
    previous = _previous(out_dir)
    entries: dict[str, ZooVariant] = {}
    for family in names:
        default_input, width = default_scales(family)
        scales = (input_scale if input_scale is not None else default_input, width)
        for variant in FAMILIES[family]:
            old = previous.get(variant)
            if old is not None and _up_to_date(old, out_dir, scales):
                entries[variant] = _with_published(old)
            else:
                entries[variant] = _build_one(out_dir, family, variant, scales)
    kept = {
        name: v
        for name, v in previous.items()
        if v.family not in names and (out_dir / v.path).is_file()
    }
    order = [v for family in FAMILIES for v in FAMILIES[family]]
    merged = {**kept, **entries}
    manifest = Manifest(variants=tuple(merged[n] for n in order if n in merged))
    write_manifest(out_dir, manifest)
    return manifest


def _previous(out_dir: Path) -> dict[str, ZooVariant]:
    """The entries of an existing manifest of this format; none if it is absent or stale."""
    try:
        manifest = load_manifest(out_dir)
    except ConfigError:
        return {}
    return {v.name: v for v in manifest.variants} if manifest.format == FORMAT else {}


def _up_to_date(entry: ZooVariant, out_dir: Path, scales: tuple[float, float]) -> bool:
    path = out_dir / entry.path
    return (
        (entry.input_scale, entry.width_scale) == scales
        and path.is_file()
        and path.stat().st_size == entry.size_bytes
        and _sha256(path) == entry.sha256
    )


def _with_published(entry: ZooVariant) -> ZooVariant:
    """Refresh the published figures, which may have been corrected since the build."""
    return entry.model_copy(
        update={
            "published_gflops": PUBLISHED_GFLOPS.get(entry.name),
            "accuracy": ACCURACY.get(entry.name),
        }
    )


def _build_one(out_dir: Path, family: str, variant: str, scales: tuple[float, float]) -> ZooVariant:
    built = build_model(family, variant, input_scale=scales[0], width_scale=scales[1])
    rel = f"{family}/{variant}.onnx"
    path = out_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".onnx.tmp")
    onnx.save_model(built.model, tmp)
    os.replace(tmp, path)
    return ZooVariant(
        family=family,
        name=variant,
        path=rel,
        inputs=tensor_specs(list(built.model.graph.input)),
        outputs=tensor_specs(list(built.model.graph.output)),
        flops_per_item=built.flops,
        params=built.params,
        published_gflops=PUBLISHED_GFLOPS.get(variant),
        accuracy=ACCURACY.get(variant),
        input_scale=built.input_scale,
        width_scale=built.width_scale,
        size_bytes=path.stat().st_size,
        sha256=_sha256(path),
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"
