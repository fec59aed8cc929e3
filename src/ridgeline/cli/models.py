"""``ridgeline models``: build and list the local model zoo (thin commands over ``build_zoo``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ridgeline.cli._common import failing, out
from ridgeline.zoo.build import default_zoo_dir
from ridgeline.zoo.families import FAMILIES

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)  # plain help, as the top's
"""Mounted by ``ridgeline.cli``, which holds its help and imports this module when the
group is used."""

OutOption = Annotated[
    Path | None,
    typer.Option("--out", help=f"zoo directory (default {default_zoo_dir()}, or $RIDGELINE_ZOO)"),
]


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
    from ridgeline.report.terminal import zoo_table
    from ridgeline.zoo.build import build_zoo

    with failing():
        manifest = build_zoo(out_dir or default_zoo_dir(), family or None, input_scale=input_scale)
    out.print(zoo_table(manifest, family))


@app.command("list")
def list_command(out_dir: OutOption = None) -> None:
    """Show the models of a built zoo."""
    from ridgeline.report.terminal import zoo_table
    from ridgeline.zoo.manifest import load_manifest

    with failing():
        manifest = load_manifest(out_dir or default_zoo_dir())
    out.print(zoo_table(manifest))
