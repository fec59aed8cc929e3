"""A plan exported to Ray Serve (``ridgeline.export.ray_serve``): the config Ray's own
schema accepts, carrying the plan's replicas, batching and resources; the application
deployed on a local Ray, answering v2 through the task graph, and measured by ridgeline.

The deployed tests use the session's ``ray_local`` cluster (two CPUs: the synthetic plan's
two one-core tasks; the ingress asks none). Serve's HTTP proxy runs in an actor of its
own, so the measurement's load does not share this process's event loop with it."""

from __future__ import annotations

import ast
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from ridgeline.cli import app as cli
from ridgeline.errors import PlanError
from ridgeline.export.ray_serve import CONFIG, MODULE, export_ray_serve, run_application
from ridgeline.pipeline.plan import Plan, PythonModel, load_plan

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "plans" / "traffic-cpu.yaml"


def _synthetic(cols: int) -> dict[str, Any]:
    return {
        "base_ms": 2.0,
        "per_item_ms": 0.5,
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, cols]}],
        "outputs": [{"name": "Y", "datatype": "FP32", "shape": [-1, cols]}],
    }


def synthetic_plan(**segments: Any) -> Plan:
    """``a`` (4 columns, batches of 4) feeding ``b`` (8 columns, batches of 8) 2.5 rows
    per row; ``segments`` overrides a task's segment."""
    cpu = {"kind": "cpu", "cores": 1}
    task = {"variant": "fake", "max_queue_delay_ms": 2, "latency_budget_ms": 200}
    return Plan.model_validate(
        {
            "name": "pipe",
            "slo_ms": 500,
            "tasks": {
                "a": {
                    **task,
                    "synthetic": _synthetic(4),
                    "batch_size": 4,
                    "segment": segments.get("a", cpu),
                },
                "b": {
                    **task,
                    "synthetic": _synthetic(8),
                    "batch_size": 8,
                    "instances": 1,
                    "segment": segments.get("b", cpu),
                },
            },
            "edges": [{"source": "a", "target": "b", "factor": 2.5}],
        }
    )


def config_of(out: Path) -> dict[str, Any]:
    """The exported config, read back and checked by Ray's own schema."""
    from ray.serve.schema import ServeDeploySchema

    doc = yaml.safe_load((out / CONFIG).read_text())
    ServeDeploySchema.model_validate(doc)
    app: dict[str, Any] = doc["applications"][0]
    return app


def by_name(app: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in app["deployments"]}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ridgeline.zoo import build_zoo

    out = tmp_path_factory.mktemp("zoo")
    build_zoo(out, ["detector", "classifier", "face"])
    return out


def test_the_example_plan_exports_a_config_ray_accepts_with_its_models(
    tmp_path: Path, zoo: Path
) -> None:
    written = export_ray_serve(load_plan(EXAMPLE), tmp_path, plan_dir=EXAMPLE.parent, zoo=zoo)
    names = sorted(str(p.relative_to(tmp_path)) for p in written)
    assert names == sorted(
        [
            CONFIG,
            f"{MODULE}.py",
            "ridgeline_glue.py",
            "models/detect.onnx",
            "models/car.onnx",
            "models/face.onnx",
        ]
    )
    assert (tmp_path / "models" / "detect.onnx").read_bytes() == (
        zoo / "detector" / "yolov5n.onnx"
    ).read_bytes()
    # Serve's proxy binds loopback unless the user asks for more (--host)
    assert yaml.safe_load((tmp_path / CONFIG).read_text())["http_options"]["host"] == "127.0.0.1"
    app = config_of(tmp_path)
    assert app["import_path"] == f"{MODULE}:build" and app["route_prefix"] == "/"
    assert app["runtime_env"] == {"working_dir": f"local://{tmp_path.resolve()}"}
    d = by_name(app)
    assert list(d) == ["traffic", "detect", "car", "face"]
    assert d["detect"]["user_config"] == {"max_batch_size": 4, "batch_wait_timeout_s": 0.01}
    assert d["car"]["user_config"] == {"max_batch_size": 16, "batch_wait_timeout_s": 0.01}
    assert [d[t]["num_replicas"] for t in ("detect", "car", "face")] == [1, 1, 1]
    assert [d[t]["max_ongoing_requests"] for t in ("detect", "car", "face")] == [8, 32, 32]
    assert [d[t]["max_queued_requests"] for t in ("detect", "car", "face")] == [32, 128, 128]
    assert d["face"]["ray_actor_options"] == {"num_cpus": 1}
    assert d["traffic"]["ray_actor_options"] == {"num_cpus": 0}
    assert app["args"]["tasks"]["detect"] == {
        "kind": "onnx",
        "path": "models/detect.onnx",
        "device": "cpu",
        "threads": 1,
        "batch_size": 4,
        "max_queue_delay_ms": 10.0,
    }
    assert [(e["source"], e["target"], e["factor"]) for e in app["args"]["edges"]] == [
        ("detect", "car", 2.0),
        ("detect", "face", 1.0),
    ]

    # the application runs on a cluster without ridgeline: of ridgeline it needs only the
    # glue shipped beside it (the package's copy is the fallback), and the glue only NumPy
    def imported(name: str) -> set[str]:
        tree = ast.parse((tmp_path / name).read_text())
        return {
            (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.Import | ast.ImportFrom)
            for a in n.names
        }

    app_needs = {m for m in imported(f"{MODULE}.py") if m.startswith("ridgeline")}
    assert app_needs == {"ridgeline_glue", "ridgeline.policies.glue"}
    assert imported("ridgeline_glue.py") <= {
        "__future__",
        "math",
        "collections.abc",
        "typing",
        "numpy",
    }


def test_mig_slices_and_mps_shares_become_gpu_fractions_and_custom_resources(
    tmp_path: Path,
) -> None:
    mig = {"kind": "mig", "gpu": "H200-141GB", "profile": "1g.18gb"}
    mps = {"kind": "mps", "gpu": "H200-141GB", "profile": "1g.18gb", "share": 0.5}
    plan = synthetic_plan(a=mig, b=mps)
    plan = plan.model_copy(
        update={"tasks": {**plan.tasks, "a": plan.tasks["a"].model_copy(update={"instances": 3})}}
    )
    export_ray_serve(plan, tmp_path, working_dir="s3://bucket/pipe.zip")
    app = config_of(tmp_path)
    assert app["runtime_env"] == {"working_dir": "s3://bucket/pipe.zip"}
    d = by_name(app)
    assert d["a"]["num_replicas"] == 3
    assert d["a"]["max_queued_requests"] == 4 * 8 * 3
    # one compute slice of seven, rounded down to Ray's four decimals: seven fit a GPU
    assert d["a"]["ray_actor_options"] == {"num_gpus": 0.1428, "resources": {"mig-1g.18gb": 1.0}}
    assert d["b"]["ray_actor_options"] == {
        "num_gpus": 0.0714,
        "resources": {"mig-1g.18gb": 0.5},
        "runtime_env": {"env_vars": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}},
    }


def test_a_python_backend_and_a_local_working_dir_are_refused_with_the_fix(
    tmp_path: Path,
) -> None:
    plan = synthetic_plan()
    python = plan.tasks["b"].model_copy(
        update={"synthetic": None, "python": PythonModel(target="pkg.mod:Model")}
    )
    with pytest.raises(PlanError, match=r"tasks\.b\.python: .*ONNX artifact"):
        export_ray_serve(plan.model_copy(update={"tasks": {**plan.tasks, "b": python}}), tmp_path)
    from ridgeline.errors import ConfigError

    with pytest.raises(ConfigError, match=r"ServeDeploySchema refused.*--working-dir"):
        export_ray_serve(plan, tmp_path, working_dir="some/dir")


def test_the_cli_exports_and_refuses_what_the_ray_engine_cannot_do(tmp_path: Path) -> None:
    plan = tmp_path / "pipe.yaml"
    plan.write_text(yaml.safe_dump(synthetic_plan().model_dump(mode="json", exclude_none=True)))
    runner = CliRunner(env={"COLUMNS": "200"})
    done = runner.invoke(cli, ["export", "ray-serve", str(plan), "--out", str(tmp_path / "o")])
    assert done.exit_code == 0, done.output
    assert f"serve run {tmp_path / 'o' / CONFIG}" in done.output
    refused = runner.invoke(cli, ["serve", "--engine", "ray", str(plan), "--reconfigure"])
    assert refused.exit_code == 2
    assert "error: --engine ray does not support --reconfigure" in refused.output


# --- deployed on a local Ray ----------------------------------------------------------


@pytest.fixture(scope="module")
def deployed(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from ray import serve

    out = tmp_path_factory.mktemp("ray-app")
    export_ray_serve(synthetic_plan(), out)
    try:
        yield run_application(out, host="127.0.0.1", port=0)
    finally:
        serve.shutdown()


def _call(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def _one_row(values: list[float]) -> dict[str, Any]:
    return {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": values}]}


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_deployed_plan_answers_v2_through_the_graph(deployed: str) -> None:
    meta = _call(deployed)
    assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "b.Y", "datatype": "FP32", "shape": [-1, 8]}]
    # 2.5 rows of b per row of a: 2 and 3, the half carried from one request to the next
    rows = []
    for _ in range(2):
        answer = _call(f"{deployed}/infer", {"id": "r1", **_one_row([0, 1, 2, 3])})
        assert answer["id"] == "r1"
        (out,) = answer["outputs"]
        assert out["name"] == "b.Y"
        rows.append(out["shape"][0])
        # a doubles [0 1 2 3]; b's input is that tiled to 8 columns; b doubles it
        expected = np.tile([0.0, 4.0, 8.0, 12.0], 2 * out["shape"][0])
        assert out["data"] == expected.tolist()
    assert sorted(rows) == [2, 3]
    task = _call(deployed.replace("/pipe", "/a") + "/infer", _one_row([1, 2, 3, 4]))
    assert task["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_ridgeline_measures_the_deployed_plan_without_errors(deployed: str) -> None:
    from ridgeline.loadgen.schedule import from_arrival
    from ridgeline.loadgen.step import StepConfig, measure_step
    from ridgeline.workload.arrivals import parse_arrival

    schedule = from_arrival(parse_arrival("poisson", 20.0), 2.0)
    step = await measure_step(deployed, schedule, StepConfig())
    s = step.summary
    assert s.sent == len(schedule.times) and s.ok == s.sent
    assert s.errors == 0 and s.timeouts == 0 and s.valid, s
