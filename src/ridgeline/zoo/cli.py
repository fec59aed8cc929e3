"""``ridgeline models``: build and list the local model zoo (thin commands over ``build_zoo``).

Mounted by the main app as ``app.add_typer(zoo_app, name="models")``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import JustifyMethod
from rich.table import Table

from ridgeline._cli_common import fail, out
from ridgeline.errors import RidgelineError
from ridgeline.zoo.build import build_zoo, default_zoo_dir
from ridgeline.zoo.families import FAMILIES
from ridgeline.zoo.manifest import Manifest, load_manifest

app = typer.Typer(
    help="A local zoo of ONNX models shaped like YOLOv5, EfficientNet, ArcFace, GIT and "
    "FastSpeech 2 (random weights, real FLOPs ratios; no downloads).",
    no_args_is_help=True,
)

OutOption = Annotated[
    Path | None,
    typer.Option("--out", help=f"zoo directory (default {default_zoo_dir()}, or $RIDGELINE_ZOO)"),
]


def zoo_table(manifest: Manifest, families: list[str] | None = None) -> Table:
    t = Table(title="model zoo", title_justify="left")
    columns: list[tuple[str, JustifyMethod]] = [
        ("variant", "left"),
        ("GFLOPs/item", "right"),
        ("params", "right"),
        ("file", "right"),
        ("published accuracy", "right"),
        ("metric", "left"),
    ]
    for name, justify in columns:
        t.add_column(name, justify=justify)
    for v in manifest.variants:
        if families and v.family not in families:
            continue
        acc = v.accuracy
        t.add_row(
            v.name,
            f"{v.gflops_per_item:.3f}",
            f"{v.params / 1e6:.2f} M",
            f"{v.size_bytes / 2**20:.1f} MiB",
            f"{acc.value:g}" if acc else "-",
            acc.metric if acc else "none published",
        )
    return t


@app.command()
def build(
    out_dir: OutOption = None,
    family: Annotated[
        list[str] | None,
        typer.Option("--family", help=f"a family to build, repeatable: {', '.join(FAMILIES)}"),
    ] = None,
    input_scale: Annotated[
        float | None,
        typer.Option(help="input size / native size for every family (default: per family)"),
    ] = None,
) -> None:
    """Build the zoo's ONNX models and its manifest.json (existing up-to-date files are kept)."""
    try:
        manifest = build_zoo(out_dir or default_zoo_dir(), family or None, input_scale=input_scale)
    except RidgelineError as exc:
        fail(exc)
    out.print(zoo_table(manifest, family))


@app.command("list")
def list_command(out_dir: OutOption = None) -> None:
    """Show the models of a built zoo."""
    try:
        manifest = load_manifest(out_dir or default_zoo_dir())
    except RidgelineError as exc:
        fail(exc)
    out.print(zoo_table(manifest))
