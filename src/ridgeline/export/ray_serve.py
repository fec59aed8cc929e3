"""A Plan as a Ray Serve application: ``serve_config.yaml``, its application module and
the model files, checked against Ray's own ``ServeDeploySchema``; and ``deploy``, the
same application on a local Ray (``ridgeline serve --engine ray``).

What the plan says becomes Serve's own settings, per task deployment:

==========================  ==============================================================
plan                        Serve
==========================  ==============================================================
``instances``               ``num_replicas``
``batch_size``,             ``user_config: {max_batch_size, batch_wait_timeout_s}``, read
``max_queue_delay_ms``      by ``@serve.batch`` in ``reconfigure`` (rows, not requests)
CPU segment                 ``ray_actor_options.num_cpus`` = its cores (intra-op threads:
                            ``threads``, default one per core)
MIG segment                 ``num_gpus`` = the slice's compute share of the GPU, and one
                            unit of the custom resource ``mig-<profile>``: Ray does not
                            enumerate MIG slices, so the nodes declare them
                            (``ray start --resources '{"mig-1g.18gb": 7}'``)
MPS share                   ``num_gpus`` and ``mig-<profile>`` times the share, and
                            ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in the replica's env
whole GPU                   ``num_gpus: 1``
==========================  ==============================================================

The model files come from ``serve.loading.task_backend``, as the runtime resolves them,
copied to ``models/TASK.onnx``; a Python backend has no file to ship and is refused.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from ridgeline._loopback import outside_loopback
from ridgeline.errors import ConfigError, PlanError
from ridgeline.pipeline.gpu import COMPUTE_SLICES, gpu_type
from ridgeline.pipeline.plan import Plan, TaskPlan
from ridgeline.pipeline.segments import CpuSegment, GpuSegment, MigSegment, MpsSegment
from ridgeline.policies import glue
from ridgeline.serve.backends import OnnxBackendConfig, SyntheticBackendConfig
from ridgeline.serve.loading import task_backend, zoo_dir
from ridgeline.v2.describe import tensor_metadata

CONFIG = "serve_config.yaml"
MODULE = "ridgeline_serve_app"
"""The application module's name beside the config (``import_path: MODULE:build``)."""
INGRESS_MAX_ONGOING = 1024
"""Pipeline requests the ingress holds at once: each mostly waits on its tasks' handles."""
QUEUE_ROUNDS = 4
"""Bound of a deployment's queue, in full rounds of its replicas' ongoing requests."""
_RAY = "the Ray Serve export needs Ray: pip install 'ridgeline[ray]'"

_HEADER = """\
# A ridgeline plan as a Ray Serve application (ridgeline export ray-serve).
# Per task deployment:
#   num_replicas          = the plan's instances
#   user_config           = its batch_size (rows) and max_queue_delay_ms, read by
#                           @serve.batch in reconfigure: edit them without a redeploy
#   max_ongoing_requests  = 2 x batch_size: a replica must hold batch_size requests at
#                           once for @serve.batch to fill a batch of one-row requests, and
#                           as many again to form the next batch while one runs
#   max_queued_requests   = {rounds} rounds of every replica's ongoing requests: beyond
#                           that a request would wait longer than the batches take, so the
#                           caller gets a 503 instead of an unbounded queue
#   ray_actor_options     = the segment: num_cpus = cores; a MIG slice as num_gpus = its
#                           compute share plus one unit of the custom resource
#                           mig-<profile> (start nodes with --resources); an MPS share as
#                           that share of both
# runtime_env.working_dir: where every node finds this directory (local://DIR on one
# machine or a shared filesystem; else zip it, upload it and give its URI).
# Then: serve deploy {config} (a running cluster) or serve run {config}.
"""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(_RAY) from None
    return ray


def actor_options(task: TaskPlan) -> dict[str, Any]:
    """``ray_actor_options`` of one task's replicas, from its segment."""
    seg = task.segment
    if isinstance(seg, CpuSegment):
        return {"num_cpus": seg.cores}
    if isinstance(seg, GpuSegment):
        return {"num_gpus": 1}
    assert isinstance(seg, MigSegment | MpsSegment)
    share = seg.share if isinstance(seg, MpsSegment) else 1.0
    compute = gpu_type(seg.gpu).profile(seg.profile).compute / COMPUTE_SLICES
    # Ray keeps four decimals of a resource: rounded down, k replicas of 1/k still fit
    options: dict[str, Any] = {
        "num_gpus": math.floor(compute * share * 10_000) / 10_000,
        "resources": {f"mig-{seg.profile}": share},
    }
    if isinstance(seg, MpsSegment):
        percent = str(max(1, round(share * 100)))
        options["runtime_env"] = {"env_vars": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": percent}}
    return options


def deployments(plan: Plan) -> list[dict[str, Any]]:
    """Serve's ``deployments[]``: the ingress (named after the plan), then each task."""
    out: list[dict[str, Any]] = [
        {
            "name": plan.name,
            "num_replicas": 1,
            "max_ongoing_requests": INGRESS_MAX_ONGOING,
            "max_queued_requests": QUEUE_ROUNDS * INGRESS_MAX_ONGOING,
            # glue, like the runtime's front end: the plan's budget counts its tasks only
            "ray_actor_options": {"num_cpus": 0},
        }
    ]
    for name, task in plan.tasks.items():
        ongoing = 2 * task.batch_size
        out.append(
            {
                "name": name,
                "num_replicas": task.instances,
                "max_ongoing_requests": ongoing,
                "max_queued_requests": QUEUE_ROUNDS * ongoing * task.instances,
                "user_config": {
                    "max_batch_size": task.batch_size,
                    "batch_wait_timeout_s": task.max_queue_delay_ms / 1000.0,
                },
                "ray_actor_options": actor_options(task),
            }
        )
    return out


def _task_args(
    name: str, task: TaskPlan, plan_dir: Path, zoo: Path
) -> tuple[dict[str, Any], Path | None]:
    """What the application module needs of one task, and its model file (if any)."""
    backend = task_backend(name, task, plan_dir, zoo)
    shared = {"batch_size": task.batch_size, "max_queue_delay_ms": task.max_queue_delay_ms}
    if isinstance(backend, SyntheticBackendConfig):
        specs = {
            kind: [tensor_metadata(s) for s in specs]
            for kind, specs in (("inputs", backend.inputs), ("outputs", backend.outputs))
        }
        bad = [s["name"] for ss in specs.values() for s in ss if s["datatype"] == "BYTES"]
        if bad:
            raise PlanError(
                f"tasks.{name}.synthetic: tensors {bad} are BYTES, which the Ray Serve "
                "application does not carry; declare them numeric (FP32, INT64, ...)"
            )
        cost = {"base_ms": backend.base_ms, "per_item_ms": backend.per_item_ms}
        return {"kind": "synthetic", **cost, **specs, **shared}, None
    if not isinstance(backend, OnnxBackendConfig):
        raise PlanError(
            f"tasks.{name}.python: a Python backend class has no model file to ship to Ray "
            "Serve; give the task an ONNX artifact, a zoo variant or a synthetic model"
        )
    seg = task.segment
    threads = (seg.threads or seg.cores) if isinstance(seg, CpuSegment) else 1
    where = {"path": f"models/{name}.onnx", "device": backend.device, "threads": threads}
    return {"kind": "onnx", **where, **shared}, backend.path


def export_ray_serve(
    plan: Plan,
    out_dir: Path,
    *,
    plan_dir: Path = Path("."),
    zoo: Path | None = None,
    working_dir: str | None = None,
    host: str = "127.0.0.1",
) -> list[Path]:
    """Write ``serve_config.yaml``, ``ridgeline_serve_app.py`` and ``models/TASK.onnx``
    to ``out_dir``, validated by Ray's ``ServeDeploySchema``; the paths written.

    ``working_dir`` is where the cluster finds this directory: Serve's config takes
    only a remote URI (the directory zipped, ``s3://bucket/traffic.zip``) or
    ``local://`` for a directory every node already has; by default
    ``local://OUT_DIR``, right on one machine or a shared filesystem."""
    _ray()
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    if plan.name in plan.tasks:
        raise PlanError(
            f"task {plan.name!r} has the plan's own name, which the ingress deployment "
            "takes; rename the task or the plan"
        )
    tasks, files = {}, {}
    for name, task in plan.tasks.items():
        tasks[name], files[name] = _task_args(name, task, plan_dir, zoo or zoo_dir())
    args = {
        "name": plan.name,
        "slo_ms": plan.slo_ms,
        "tasks": tasks,
        "edges": [e.model_dump() for e in plan.edges],
    }
    config = {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": 8000},  # 0.0.0.0: reachable from others
        "applications": [
            {
                "name": plan.name,
                "route_prefix": "/",
                "import_path": f"{MODULE}:build",
                "runtime_env": {"working_dir": working_dir or f"local://{out_dir.resolve()}"},
                "args": args,
                "deployments": deployments(plan),
            }
        ],
    }
    try:
        ServeDeploySchema.model_validate(config)
    except ValidationError as e:  # a working_dir Ray cannot take, or a bug here
        said = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise ConfigError(
            f"Ray's ServeDeploySchema refused the exported config: {said}; give "
            "--working-dir a remote URI (s3://..., https://....zip) or local://DIR"
        ) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / CONFIG, out_dir / f"{MODULE}.py"]
    text = _HEADER.format(rounds=QUEUE_ROUNDS, config=CONFIG)
    written[0].write_text(text + yaml.safe_dump(config, sort_keys=False))
    shutil.copyfile(Path(__file__).with_name("_ray_app.py"), written[1])
    written.append(out_dir / f"{glue.COPIED_AS}.py")
    shutil.copyfile(glue.__file__, written[-1])
    for name, path in files.items():
        if path is not None:
            (out_dir / "models").mkdir(exist_ok=True)
            written.append(out_dir / "models" / f"{name}.onnx")
            shutil.copyfile(path, written[-1])
    return written


# --- running it ------------------------------------------------------------------------


def application(out_dir: Path) -> tuple[str, Any]:
    """The exported application in ``out_dir`` as Serve would build it from the config
    (its deployments' options applied, model paths made absolute): (its name, the
    Serve ``Application``). Built from the package's own copy of the module, which
    local Ray workers import as ridgeline itself."""
    _ray()
    from ridgeline.export import _ray_app

    app = yaml.safe_load((out_dir / CONFIG).read_text())["applications"][0]
    args = app["args"]
    for task in args["tasks"].values():
        if task["kind"] == "onnx":
            task["path"] = str((out_dir / task["path"]).resolve())
    args["deployments"] = {
        d["name"]: {k: v for k, v in d.items() if k != "name"} for d in app["deployments"]
    }
    return app["name"], _ray_app.build(args)


def needs(plan_deployments: list[dict[str, Any]]) -> dict[str, float]:
    """The Ray resources the deployments' replicas ask for, all together."""
    total: dict[str, float] = {}
    for d in plan_deployments:
        opts = d.get("ray_actor_options", {})
        for key, res in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            total[res] = total.get(res, 0.0) + d["num_replicas"] * opts.get(key, 0)
        for res, amount in opts.get("resources", {}).items():
            total[res] = total.get(res, 0.0) + d["num_replicas"] * amount
    return {k: v for k, v in total.items() if v > 0}


def check_resources(asked: dict[str, float], have: dict[str, float]) -> None:
    """Refuse, before Serve waits for ever on replicas it cannot place, a plan asking
    for resources the Ray cluster lacks."""
    short = {k: (v, have.get(k, 0.0)) for k, v in asked.items() if v > have.get(k, 0.0) + 1e-9}
    if short:
        said = ", ".join(f"{k} {v:g} (the cluster has {h:g})" for k, (v, h) in short.items())
        raise ConfigError(
            f"the plan's replicas need {said}; start Ray with them (ray start --num-cpus N "
            "--num-gpus N --resources '{\"mig-1g.18gb\": 7}'), or plan for this cluster"
        )


def run_application(out_dir: Path, *, host: str = "127.0.0.1", port: int = 8000) -> str:
    """Serve the exported application in ``out_dir`` on the Ray this process is
    connected to, HTTP on ``host:port`` (0: a free port, found by binding one first:
    Serve's proxy cannot report a port it chose); blocks until every replica is up.
    Returns the pipeline's v2 URL."""
    ray = _ray()
    from ray import serve

    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    doc = yaml.safe_load((out_dir / CONFIG).read_text())["applications"][0]
    check_resources(needs(doc["deployments"]), ray.cluster_resources())
    name, app = application(out_dir)
    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(app, name=name, route_prefix="/")
    except RuntimeError as e:  # Serve's "Deploying application ... failed: ..."
        raise ConfigError(f"Ray Serve could not deploy plan {name!r}: {e}") from None
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v2/models/{name}"


EXPOSED_OK = "RIDGELINE_RAY_EXPOSED"
"""Set to 1 to accept a local Ray whose services listen beyond loopback."""


AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""Ray's authentication settings; where the user set any, a local Ray keeps them."""


@contextlib.contextmanager
def private_ray_auth() -> Iterator[None]:
    """Around a local Ray this process starts: token authentication with a fresh random
    token of its own, in the environment its processes inherit, unless the user set one
    of ``AUTH_VARIABLES``. Ray 2.60 turns token mode on for every new local cluster and
    reads, or else writes, the token in ``~/.ray/auth_token``: a token another Ray left
    there became this one's, and one this Ray wrote switched the user's next `ray start`
    to token mode. With its own token, the home folder is neither read nor written and
    another user of the machine cannot reach the cluster's loopback ports without it."""
    if any(v in os.environ for v in AUTH_VARIABLES):
        yield
        return
    # the token only: a new local cluster then turns token mode on itself, and refreshes
    # the settings an imported ``ray`` read (RAY_AUTH_MODE set here was not seen by them);
    # one token a process, as Ray's driver keeps the first it read for its later clusters
    os.environ["RAY_AUTH_TOKEN"] = _process_token()
    try:
        yield
    finally:
        for v in AUTH_VARIABLES[:2]:
            os.environ.pop(v, None)


@functools.cache
def _process_token() -> str:
    return secrets.token_hex(32)


def refuse_exposed_ray(ray: Any) -> None:
    """A Ray this process started that listens beyond loopback is shut down and refused
    (a ``ConfigError`` naming what listened where), unless ``EXPOSED_OK`` is 1. Ray 2.60
    binds its GCS, raylet and agents to every interface, or the machine's address, even
    when told ``_node_ip_address="127.0.0.1"``, and Ray's services run code for whoever
    reaches them: what ridgeline starts on its own listens on loopback only."""
    exposed = outside_loopback()
    if not exposed or os.environ.get(EXPOSED_OK) == "1":
        return
    ray.shutdown()
    shown = "; ".join(map(str, exposed[:4])) + (" …" if len(exposed) > 4 else "")
    raise ConfigError(
        f"the local Ray this started listens beyond loopback ({shown}): refused, and shut "
        "down. Serve on a Ray cluster you started on a network you trust (`ray start "
        f"--head`, then RAY_ADDRESS=auto), or set {EXPOSED_OK}=1 to accept these listeners"
    )


def deploy(
    source: Path | Plan,
    *,
    plan_dir: Path = Path("."),
    zoo: Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    announce: Callable[[str], None] = print,
) -> None:
    """Serve a plan (or a directory ``export_ray_serve`` wrote) on Ray Serve until SIGINT
    or SIGTERM: on the Ray this process is connected to, or else on a local one it starts
    with as many CPUs as the plan asks (or the host has, if more; logical CPUs, so a
    plan wider than the host shares its cores, as the runtime's does); then shut Serve
    (and a Ray it started) down."""
    ray = _ray()
    from ray import serve as ray_serve

    serve: Any = ray_serve  # its shutdown is untyped
    with tempfile.TemporaryDirectory(prefix="ridgeline-ray-") as tmp:
        if isinstance(source, Plan):
            export_ray_serve(source, Path(tmp), plan_dir=plan_dir, zoo=zoo)
            source = Path(tmp)
        if not (source / CONFIG).is_file():
            raise ConfigError(
                f"{source} has no {CONFIG}; give a plan, or a directory `ridgeline export "
                "ray-serve` wrote"
            )
        started = not ray.is_initialized()
        with private_ray_auth() if started else contextlib.nullcontext():
            if started:
                doc = yaml.safe_load((source / CONFIG).read_text())["applications"][0]
                cpus = math.ceil(needs(doc["deployments"]).get("CPU", 0.0))
                ray.init(
                    num_cpus=max(cpus, os.cpu_count() or 1),
                    include_dashboard=False,
                    log_to_driver=False,
                    _node_ip_address="127.0.0.1",
                )
                refuse_exposed_ray(ray)
            done = threading.Event()  # after ray.init, which installs handlers of its own
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: done.set())
            try:
                url = run_application(source, host=host, port=port)
                announce(f"serving plan on Ray Serve: v2 HTTP {url} (Ctrl-C stops)")
                done.wait()
            finally:
                serve.shutdown()
                if started:
                    ray.shutdown()
