"""``ridgeline export``: a plan as files for the engines users already run (Ray Serve,
KServe, Triton). Each command is a few lines over ``ridgeline.export``; each validates what
it writes against the engine's own schema before it prints the paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ridgeline.cli._common import PlanArgument, ZooOption, emit, failing

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)  # plain help, as the top's
"""Mounted by ``ridgeline.cli``, which holds its help and imports this module when the
group is used."""

# --- ray-serve (ridgeline.export.ray_serve)


@app.command("ray-serve")
def ray_serve(
    plan: PlanArgument,
    out: Annotated[Path, typer.Option("--out", help="directory to write the application to")],
    zoo: ZooOption = None,
    working_dir: Annotated[
        str | None,
        typer.Option(
            help="where the cluster finds --out: a remote URI of it zipped (s3://..., "
            "https://....zip) or local://DIR (default: local://OUT, one machine or a "
            "shared filesystem)"
        ),
    ] = None,
    host: Annotated[
        str, typer.Option(help="address Serve's HTTP proxy binds on each node (0.0.0.0: all)")
    ] = "127.0.0.1",
) -> None:
    """Write a plan as a Ray Serve application: serve_config.yaml (a deployment per task
    with the plan's replicas, batching and resources; MIG slices as custom resources),
    the application module (v2 over HTTP) and the model files, checked by Ray's own
    ServeDeploySchema."""
    from ridgeline.export.ray_serve import CONFIG, export_ray_serve
    from ridgeline.pipeline.plan import load_plan

    with failing():
        written = export_ray_serve(
            load_plan(plan),
            _writable_dir(out),  # like the other exports: a file given as --out is named
            plan_dir=plan.parent,
            zoo=zoo,
            working_dir=working_dir,
            host=host,
        )
    emit("\n".join(str(p) for p in written))
    emit(
        f"run it: serve run {out / CONFIG} (or `serve deploy {CONFIG}` on a running "
        f"cluster); locally, ridgeline serve --engine ray {plan}"
    )


# --- kserve, triton (ridgeline.export.kserve, ridgeline.export.triton)


def _writable_dir(out: Path) -> Path:
    """``out``, created if need be; one that cannot be written is a ConfigError."""
    from ridgeline.errors import ConfigError

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory to write into")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"--out {out}: cannot create it ({e.strerror}); write elsewhere"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out} is not writable; give a directory you can write to")
    return out


@app.command("triton")
def triton(
    plan: PlanArgument,
    out: Annotated[Path, typer.Option("--out", help="directory to write the repository to")],
    zoo: ZooOption = None,
) -> None:
    """Write a plan as a Triton model repository: a config.pbtxt per task (the plan's
    batch size, queue delay, budget as queue timeout, instances) with its ONNX file or a
    Python model for a synthetic task, the graph as an ensemble with a glue model per
    edge; every config parsed back with Triton's own protobuf."""
    from ridgeline.export.triton import export_triton
    from ridgeline.pipeline.plan import load_plan

    with failing():
        loaded = load_plan(plan)
        written = export_triton(loaded, _writable_dir(out), plan_dir=plan.parent, zoo=zoo)
    emit("\n".join(str(p) for p in written))
    emit(f"serve it: tritonserver --model-repository {out} (the pipeline is model {loaded.name!r})")


@app.command("kserve")
def kserve(
    plan: PlanArgument,
    out: Annotated[Path, typer.Option("--out", help="directory to write the manifests to")],
    storage_uri: Annotated[
        str,
        typer.Option(
            help="where the Triton repository (`export triton`) is uploaded, e.g. s3://b/r"
        ),
    ],
    namespace: Annotated[str, typer.Option(help="namespace of the InferenceServices")] = "default",
) -> None:
    """Write a plan as KServe InferenceServices (Triton, v2 protocol; replicas = the
    plan's instances; MIG slices as nvidia.com/mig-<profile> resources) and the
    mig-parted ConfigMap of its MIG layout, checked with the Kubernetes client's models."""
    from ridgeline.export.kserve import export_kserve
    from ridgeline.pipeline.plan import load_plan

    with failing():
        loaded = load_plan(plan)
        written = export_kserve(
            loaded, _writable_dir(out), storage_uri=storage_uri, namespace=namespace
        )
    emit("\n".join(str(p) for p in written))
    emit(f"apply it: kubectl apply -f {out}/ (the label to give GPU nodes is in the files)")
