"""``ridgeline export triton``: a plan as a Triton model repository, read back with Triton's
own ``ModelConfig`` protobuf, and (where a ``tritonserver`` is at hand) loaded and asked."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from _cli import ridgeline
from ridgeline.errors import PlanError
from ridgeline.export._triton_model import synthetic_outputs
from ridgeline.export.triton import export_triton, parse_config
from ridgeline.pipeline.plan import Plan, load_plan
from ridgeline.policies.glue import adapt, fan_out

EXAMPLE = Path(__file__).parents[1] / "examples" / "plans" / "traffic-cpu.yaml"
REPO_ROOT = Path(__file__).parents[1]
PYTRITON = ".triton-venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver"


def synthetic_plan(**segments: dict[str, object]) -> Plan:
    """Two synthetic tasks, ``detect`` fanning out 1.5 rows per row to ``classify``."""
    seg = {"detect": {"kind": "cpu", "cores": 1}, "classify": {"kind": "cpu"}, **segments}
    tensors = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [-1, 8]}]}
    tensors["outputs"] = [{"name": "OUT", "datatype": "FP32", "shape": [-1, 8]}]
    return Plan.model_validate(
        {
            "name": "syn",
            "slo_ms": 400,
            "tasks": {
                "detect": {
                    "variant": "a",
                    "synthetic": {"base_ms": 2, "per_item_ms": 1, **tensors},
                    "segment": seg["detect"],
                    "batch_size": 4,
                    "max_queue_delay_ms": 2.5,
                    "preferred_batch_sizes": [2, 4],
                    "instances": 2,
                    "latency_budget_ms": 200,
                },
                "classify": {
                    "variant": "b",
                    "synthetic": {"base_ms": 1, "per_item_ms": 0.5, **tensors},
                    "segment": seg["classify"],
                    "batch_size": 8,
                    "max_queue_delay_ms": 1,
                    "instances": 3,
                    "latency_budget_ms": 150,
                },
            },
            "edges": [{"source": "detect", "target": "classify", "factor": 1.5}],
        }
    )


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ridgeline.zoo import build_zoo

    out = tmp_path_factory.mktemp("zoo")
    build_zoo(out, ["detector", "classifier", "face"])
    return out


def configs(repo: Path) -> dict[str, object]:
    return {p.parent.name: parse_config(p) for p in repo.glob("*/config.pbtxt")}


def test_the_example_plan_becomes_a_repository_with_its_batching_and_budgets(
    zoo: Path, tmp_path: Path
) -> None:
    from tritonclient.grpc import model_config_pb2 as pb

    written = export_triton(load_plan(EXAMPLE), tmp_path, plan_dir=EXAMPLE.parent, zoo=zoo)
    assert (tmp_path / "detect" / "1" / "model.onnx").read_bytes() == (
        zoo / "detector" / "yolov5n.onnx"
    ).read_bytes()
    assert tmp_path / "car" / "1" / "model.onnx" in written
    got: dict[str, pb.ModelConfig] = configs(tmp_path)  # type: ignore[assignment]
    assert set(got) == {"detect", "car", "face", "detect_to_car", "detect_to_face", "traffic"}
    detect = got["detect"]
    assert detect.platform == "onnxruntime_onnx" and detect.max_batch_size == 4
    assert [(g.count, g.kind) for g in detect.instance_group] == [
        (1, pb.ModelInstanceGroup.KIND_CPU)
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in detect.input] == [
        ("images", pb.TYPE_FP32, [3, 320, 320])
    ]
    batching = detect.dynamic_batching
    assert list(batching.preferred_batch_size) == [4]
    assert batching.max_queue_delay_microseconds == 10_000
    policy = batching.default_queue_policy
    assert policy.timeout_action == pb.ModelQueuePolicy.REJECT and policy.allow_timeout_override
    assert policy.default_timeout_microseconds == 200_000  # detect's 200 ms budget
    assert policy.max_queue_size == 16  # 4 rounds of a batch of 4 on one instance
    assert got["car"].dynamic_batching.default_queue_policy.default_timeout_microseconds == 150_000
    assert got["car"].parameters["intra_op_thread_count"].string_value == "1"

    ensemble = got["traffic"]
    assert ensemble.platform == "ensemble"
    # one row fans out to 2 car rows and 1 face row: 4 rows fit every batch (car's 16)
    assert ensemble.max_batch_size == 4
    steps = [s.model_name for s in ensemble.ensemble_scheduling.step]
    assert sorted(steps) == sorted(set(got) - {"traffic"})
    assert [t.name for t in ensemble.output] == ["car.logits", "face.embedding", "face.attributes"]
    glue = got["detect_to_car"]
    assert glue.backend == "python" and glue.parameters["factor"].string_value == "2.0"
    assert [list(t.dims) for t in glue.output] == [[-1, 3, 136, 136]]  # car's input


def test_gpu_segments_map_to_one_process_per_mig_device(tmp_path: Path) -> None:
    from tritonclient.grpc import model_config_pb2 as pb

    mig = {"kind": "mps", "gpu": "A100-80GB", "profile": "1g.10gb", "share": 0.5}
    plan = synthetic_plan(detect={"kind": "gpu", "gpu": "A100-80GB"}, classify=mig)
    plan = plan.model_copy(
        update={
            "tasks": {
                **plan.tasks,
                "detect": plan.tasks["detect"].model_copy(update={"gpus": (0, 2)}),
            }
        }
    )
    export_triton(plan, tmp_path)
    got: dict[str, pb.ModelConfig] = configs(tmp_path)  # type: ignore[assignment]
    gpu = pb.ModelInstanceGroup.KIND_GPU
    # a whole GPU per instance, on the GPUs the layout chose
    assert [(g.count, g.kind, list(g.gpus)) for g in got["detect"].instance_group] == [
        (1, gpu, [0]),
        (1, gpu, [2]),
    ]
    # an MPS share: one instance in each of the plan's 3 tritonserver processes
    assert [(g.count, g.kind, list(g.gpus)) for g in got["classify"].instance_group] == [
        (1, gpu, [0])
    ]
    assert "one tritonserver per MIG device" in (tmp_path / "classify" / "config.pbtxt").read_text()
    assert got["classify"].dynamic_batching.default_queue_policy.max_queue_size == 4 * 8
    synthetic = got["detect"]
    assert synthetic.backend == "python" and synthetic.max_batch_size == 4
    assert synthetic.parameters["base_ms"].string_value == "2.0"
    assert list(synthetic.dynamic_batching.preferred_batch_size) == [2, 4]
    assert synthetic.dynamic_batching.max_queue_delay_microseconds == 2500
    assert got["syn"].max_batch_size == 4  # 4 rows -> 6 classify rows, within its 8
    assert (tmp_path / "detect" / "1" / "model.py").read_text().count(
        "class TritonPythonModel"
    ) == 1


def test_the_glue_fans_out_rows_carrying_the_fraction() -> None:
    carried, sent = 0.0, []
    for rows in (1, 1, 3, 1):
        n, carried = fan_out(carried, rows, 1.5, at_least=1)
        sent.append(n)
    assert sent == [1, 2, 4, 2] and carried == 0.0
    # an ensemble runs every step: a factor below 1 still sends one row
    assert fan_out(0.0, 1, 0.4, at_least=1) == (1, 0.0)
    assert fan_out(0.0, 1, 0.4) == (0, 0.4)  # the runtime sends none, and carries it
    parent = [np.arange(12, dtype=np.float32).reshape(2, 6)]
    images, ids = adapt(parent, 4, [(np.float32, (2, 2)), (np.int64, (4,))])
    assert images.shape == (4, 2, 2) and images.reshape(-1).tolist() == [*range(12), *range(4)]
    assert ids.dtype == np.int64 and set(ids.reshape(-1).tolist()) == {0, 1}
    (out,) = synthetic_outputs([np.ones((2, 8), np.float32)], [("OUT", np.float32, (8,))])
    assert out.shape == (2, 8) and out.sum() == 32.0


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"python": {"target": "pkg.mod:Model"}, "synthetic": None}, "tasks.classify.python"),
        ({"batch_size": 1}, "tasks.classify.batch_size: one pipeline row fans out to 2"),
    ],
)
def test_a_plan_triton_cannot_take_is_refused_naming_the_field(
    tmp_path: Path, change: dict[str, object], says: str
) -> None:
    doc = synthetic_plan().model_dump()
    doc["tasks"]["classify"] |= change
    bad = Plan.model_validate(doc)
    with pytest.raises(PlanError, match=says.replace(".", r"\.")):
        export_triton(bad, tmp_path)
    assert not list(tmp_path.iterdir())  # refused before anything is written


def test_the_cli_writes_the_repository_and_refuses_bad_inputs(zoo: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    res = ridgeline("export", "triton", str(EXAMPLE), "--out", str(out), "--zoo", str(zoo))
    assert res.returncode == 0, res.stderr
    assert str(out / "traffic" / "config.pbtxt") in res.stdout.splitlines()
    missing = ridgeline("export", "triton", str(tmp_path / "nope.yaml"), "--out", str(out))
    assert missing.returncode == 2 and missing.stderr.startswith("error:")
    python = synthetic_plan().model_dump(mode="json")
    python["tasks"]["classify"] |= {"python": {"target": "pkg.mod:Model"}, "synthetic": None}
    (tmp_path / "py.yaml").write_text(yaml.safe_dump(python))
    refused = ridgeline("export", "triton", str(tmp_path / "py.yaml"), "--out", str(out))
    assert refused.returncode == 2 and "tasks.classify.python" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    blocked = ridgeline("export", "triton", str(EXAMPLE), "--out", str(EXAMPLE), "--zoo", str(zoo))
    assert blocked.returncode == 2 and "is a file" in blocked.stderr


# --- a real tritonserver ----------------------------------------------------------------


def tritonserver() -> Path | None:
    given = os.environ.get("RIDGELINE_TRITONSERVER")
    path = Path(given) if given else REPO_ROOT / PYTRITON
    return path if path.is_file() else None


def _backends(binary: Path, tmp: Path) -> Path:
    """The backend directory: PyTriton's ships its Python backend stubs per interpreter
    version beside it, and copies the matching one in before it starts the server."""
    home = binary.parents[1]
    stubs = home / "python_backend_stubs"
    if not stubs.is_dir():
        return home / "backends"
    shutil.copytree(home / "backends", tmp / "backends")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copy(stubs / version / "triton_python_backend_stub", tmp / "backends" / "python")
    return tmp / "backends"


def _env(binary: Path) -> dict[str, str]:
    """The stub links the system's libpython: point it at the venv's interpreter's, with
    NumPy on that venv's PATH, and at PyTriton's bundled libraries."""
    env = dict(os.environ)
    venv = binary.parents[6]
    cfg = venv / "pyvenv.cfg"
    if cfg.is_file():
        conf = dict(line.split(" = ", 1) for line in cfg.read_text().splitlines() if " = " in line)
        libs = [
            str(Path(conf["home"]).parent / "lib"),
            str(binary.parents[3] / "nvidia_pytriton.libs"),
        ]
        env["LD_LIBRARY_PATH"] = ":".join([*libs, env.get("LD_LIBRARY_PATH", "")])
        env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    return env


def _wait_ready(url: str, proc: subprocess.Popen[str]) -> None:
    """Until ``/v2/health/ready`` answers 200: Triton logs "Started HTTPService" a moment
    before its listener accepts, so a refused connect is retried (bounded by the test's
    timeout), while the server lives."""
    while proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except (ConnectionRefusedError, urllib.error.URLError):
            time.sleep(0.05)
    raise AssertionError("tritonserver exited before it was ready")


@pytest.fixture
def triton_repo_server(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    binary = tritonserver()
    if binary is None:
        pytest.skip(
            f"no tritonserver: set RIDGELINE_TRITONSERVER, or install nvidia-pytriton==0.7.0 "
            f"in {REPO_ROOT / '.triton-venv'}"
        )
    export_triton(synthetic_plan(), tmp_path / "repo")
    # tritonserver's --http-port 0 binds a port it never reports: take a free one first
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        str(binary),
        f"--model-repository={tmp_path / 'repo'}",
        f"--backend-directory={_backends(binary, tmp_path)}",
        "--http-address=127.0.0.1",
        f"--http-port={port}",
        "--allow-grpc=false",
        "--allow-metrics=false",
    ]
    proc = subprocess.Popen(
        cmd, env=_env(binary), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    up, log = threading.Event(), []

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            if "Started HTTPService" in line:
                up.set()
        up.set()  # it exited: the test reads the log

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        up.wait(timeout=60)
        assert proc.poll() is None, "tritonserver exited:\n" + "".join(log[-30:])
        _wait_ready(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tritonserver_loads_the_synthetic_repository_and_answers(
    triton_repo_server: tuple[str, list[str]],
) -> None:
    url, log = triton_repo_server
    with urllib.request.urlopen(f"{url}/v2/health/ready") as r:
        assert r.status == 200
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [2, 8], "data": [1.0] * 16}]}
    request = urllib.request.Request(
        f"{url}/v2/models/syn/infer", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request) as r:
        answer = json.load(r)
    (out,) = answer["outputs"]
    # 2 rows x 1.5 = 3 classify rows, each 2 x (the glue's tiling of detect's 2 x 1.0)
    assert out["name"] == "classify.OUT" and out["shape"] == [3, 8]
    assert out["data"] == [4.0] * 24, "".join(log[-20:])
