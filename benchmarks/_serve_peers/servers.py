"""The four servers, each as a context manager that starts it in its own process group,
waits until its model is ready, yields its endpoint, and stops it all on the way out.

Every server gets the same work: the same ONNX file, one onnxruntime session (CPU,
``threads`` intra-op threads, one inter-op thread) in one worker process beside its HTTP
front end, and dynamic batching of at most ``batch`` requests within ``delay_ms``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _serve_peers.procs import free_port, running
from _serve_peers.triton_env import TritonEnv
from _serve_peers.venv import BenchEnv

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Serving:
    """What every server serves, and how."""

    model: str
    onnx: Path
    zoo: Path
    inputs: list[dict[str, object]]
    outputs: list[dict[str, object]]
    batch: int
    delay_ms: float
    threads: int
    work: Path

    def env(self) -> dict[str, str]:
        return {
            "OMP_NUM_THREADS": str(self.threads),
            "RIDGELINE_BENCH_THREADS": str(self.threads),
            "PYTHONPATH": str(HERE),
        }


@dataclass(frozen=True)
class Endpoint:
    name: str
    http_port: int
    grpc_port: int | None
    model: str
    config: str
    """How it was configured, in a few words."""
    process: subprocess.Popen[bytes]
    log: Path
    version: str = ""
    """The server's own version where it says it (Triton's ``GET /v2``)."""

    @property
    def model_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v2/models/{self.model}"


def _ready(port: int, model: str) -> str:
    return f"http://127.0.0.1:{port}/v2/models/{model}/ready"


@contextlib.contextmanager
def ridgeline(s: Serving, loop: str = "asyncio", decoders: int | None = None) -> Iterator[Endpoint]:
    """``PlanServer`` on a one-task plan (``_serve_peers/ridgeline_app.py``), early
    dropping off (neither peer drops), its worker pinned to one core."""
    plan = s.work / "ridgeline-plan.yaml"
    plan.write_text(
        f"name: serve-bench\nslo_ms: 50\ntasks:\n  {s.model}:\n"
        f"    variant: {s.model}\n"
        f"    segment: {{kind: cpu, cores: 1, threads: {s.threads}}}\n"
        f"    batch_size: {s.batch}\n    max_queue_delay_ms: {s.delay_ms:g}\n"
        "    instances: 1\n    latency_budget_ms: 50\n"
    )
    http, grpc = free_port(), free_port()
    cmd = [sys.executable, str(HERE / "ridgeline_app.py"), str(plan), "--zoo", str(s.zoo)]
    cmd += ["--port", str(http), "--grpc-port", str(grpc), "--loop", loop]
    if decoders is not None:
        cmd += ["--decoders", str(decoders)]
    log = s.work / "ridgeline.log"
    with running(cmd, ready_url=_ready(http, s.model), log=log, env=s.env()) as proc:
        yield Endpoint(
            "ridgeline",
            http,
            grpc,
            s.model,
            f"PlanServer ({loop} loop), batch ≤ {s.batch} in {s.delay_ms:g} ms, no dropping",
            proc,
            log,
        )


@contextlib.contextmanager
def mlserver(s: Serving, bench: BenchEnv) -> Iterator[Endpoint]:
    """``mlserver start DIR``: the custom runtime (``_serve_peers/mlserver_runtime.py``)
    in one parallel worker, adaptive batching on."""
    root = s.work / "mlserver"
    (root / s.model).mkdir(parents=True, exist_ok=True)
    http, grpc, metrics = free_port(), free_port(), free_port()
    settings = {
        "debug": False,
        "host": "127.0.0.1",
        "http_port": http,
        "grpc_port": grpc,
        "metrics_port": metrics,
        "parallel_workers": 1,
    }
    (root / "settings.json").write_text(json.dumps(settings))
    model_settings = {
        "name": s.model,
        "implementation": "mlserver_runtime.OnnxRuntimeModel",
        "parameters": {"uri": str(s.onnx)},
        "inputs": s.inputs,
        "outputs": s.outputs,
        "max_batch_size": s.batch,
        "max_batch_time": s.delay_ms / 1000,
    }
    (root / s.model / "model-settings.json").write_text(json.dumps(model_settings))
    cmd = [str(bench.bin("mlserver")), "start", str(root)]
    log = s.work / "mlserver.log"
    with running(cmd, ready_url=_ready(http, s.model), log=log, env=s.env(), cwd=root) as proc:
        yield Endpoint(
            "MLServer",
            http,
            grpc,
            s.model,
            f"parallel_workers 1, max_batch_size {s.batch}, max_batch_time {s.delay_ms:g} ms",
            proc,
            log,
        )


@contextlib.contextmanager
def ray_serve(s: Serving, bench: BenchEnv) -> Iterator[Endpoint]:
    """One Ray Serve replica (``_serve_peers/ray_app.py``) on a local Ray of 2 CPUs, its
    workers at normal priority; stopped with SIGINT, on which it shuts Serve and Ray
    down itself."""
    http = free_port()
    temp = Path(tempfile.mkdtemp(prefix="rl-ray-", dir="/tmp"))  # short: Ray's socket paths
    cmd = [str(bench.python), str(HERE / "ray_app.py"), str(s.onnx), "--name", s.model]
    cmd += ["--port", str(http), "--batch", str(s.batch), "--delay-ms", f"{s.delay_ms:g}"]
    cmd += ["--temp-dir", str(temp)]
    # Ray runs its workers at nice 15 by default: 0 puts them level with the other servers
    env = {**s.env(), "RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": "0"}
    log = s.work / "ray.log"
    try:
        with running(
            cmd,
            ready_url=_ready(http, s.model),
            log=log,
            env=env,
            start_timeout_s=300,
            stop_signal=signal.SIGINT,
        ) as proc:
            yield Endpoint(
                "Ray Serve",
                http,
                None,
                s.model,
                f"1 replica, @serve.batch({s.batch}, {s.delay_ms:g} ms), inference in a thread",
                proc,
                log,
            )
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@contextlib.contextmanager
def triton(s: Serving, env: TritonEnv) -> Iterator[Endpoint]:
    """``tritonserver`` (2.51, from nvidia-pytriton) on a model repository of one
    Python-backend model (``_serve_peers/triton_model.py``, beside ``session.py``: the
    stub's interpreter ignores PYTHONPATH), one instance, Triton's dynamic batcher on.
    Triton parses v2 HTTP/JSON and gRPC in its C++ front end."""
    version = s.work / "triton" / s.model / "1"
    version.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "triton_model.py", version / "model.py")
    shutil.copy(HERE / "session.py", version / "session.py")
    (version.parent / "config.pbtxt").write_text(triton_config(s))
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = env.command(version.parent.parent, http, grpc, metrics)
    log = s.work / "triton.log"
    with running(cmd, ready_url=_ready(http, s.model), log=log, env=s.env() | env.environ()) as p:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2", timeout=5) as reply:
            server = json.load(reply).get("version", "")
        yield Endpoint(
            "Triton",
            http,
            grpc,
            s.model,
            f"Python backend, 1 instance, max_batch_size {s.batch},"
            f" max_queue_delay {s.delay_ms * 1000:g} µs",
            p,
            log,
            server,
        )


def triton_config(s: Serving) -> str:
    """config.pbtxt: the tensors without their batch dimension, the batcher's limits and
    the ONNX file (the model parameter ``onnx``)."""

    def tensors(specs: list[dict[str, object]]) -> str:
        rows = []
        for t in specs:
            shape = t["shape"]
            assert isinstance(shape, list | tuple), f"tensor {t['name']}: shape {shape!r}"
            dims = ", ".join(str(d) for d in shape[1:])
            rows.append(
                f'{{ name: "{t["name"]}", data_type: TYPE_{t["datatype"]}, dims: [{dims}] }}'
            )
        return ", ".join(rows)

    return (
        f'name: "{s.model}"\nbackend: "python"\nmax_batch_size: {s.batch}\n'
        f"input [{tensors(s.inputs)}]\noutput [{tensors(s.outputs)}]\n"
        f"dynamic_batching {{ max_queue_delay_microseconds: {round(s.delay_ms * 1000)} }}\n"
        "instance_group [{ count: 1, kind: KIND_CPU }]\n"
        f'parameters: {{ key: "onnx" value: {{ string_value: "{s.onnx}" }} }}\n'
    )
