"""The serving runtime's execution layer: backends, and workers in real spawned processes.

Test-only backends live in tests/_serve_backends.py, which the spawned workers import by
the ``python`` backend kind (a spawned child inherits the parent's sys.path).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper
from pydantic import TypeAdapter, ValidationError

from _serve_backends import CRASH, RAISE
from ridgeline.errors import (
    BackendConfigError,
    ConfigError,
    ModelNotFoundError,
    PlacementError,
    WorkerCrashed,
    WorkerError,
    WorkerStartError,
)
from ridgeline.serve._synthetic import SyntheticBackend
from ridgeline.serve.affinity import Placement
from ridgeline.serve.backend import Signature
from ridgeline.serve.backends import (
    BackendConfig,
    OnnxBackendConfig,
    PythonBackendConfig,
    SyntheticBackendConfig,
)
from ridgeline.serve.workers import Worker
from ridgeline.synthetic.model import LatencyModel
from ridgeline.v2.spec import TensorSpec

DOUBLER = PythonBackendConfig(target="_serve_backends:Doubler")


def _doubling_model(path: Path) -> Path:
    """An ONNX model Y = 2·X with X of shape [N, 4], N dynamic."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["X", "two"], ["Y"])], "double", [x], [y])
    graph.initializer.append(two)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    return path


def _rows(n: int, first: float = 0.0) -> np.ndarray:
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    x.flat[0] = first
    return x


async def test_an_onnx_model_runs_batches_of_one_and_three_in_a_worker(tmp_path: Path) -> None:
    config = OnnxBackendConfig(path=_doubling_model(tmp_path / "double.onnx"))
    async with Worker(config, Placement(threads=1), name="double") as worker:
        assert worker.signature == Signature(
            (TensorSpec("X", "FP32", (-1, 4)),), (TensorSpec("Y", "FP32", (-1, 4)),)
        )
        for n in (1, 3):
            x = _rows(n, first=1.5)
            out = await worker.run({"X": x})
            assert list(out) == ["Y"]
            np.testing.assert_array_equal(out["Y"], 2 * x)
        assert worker.batches == 2


def test_the_synthetic_backend_sleeps_base_plus_per_item_per_row() -> None:
    slept: list[float] = []
    backend = SyntheticBackend(LatencyModel(base_ms=5.0, per_item_ms=2.0), sleep=slept.append)
    backend.load()
    x = np.ones((3, 16), dtype=np.float32)
    outputs = [backend.run({"INPUT0": x[:1]}), backend.run({"INPUT0": x})]
    assert slept == [0.007, 0.011]
    np.testing.assert_array_equal(outputs[1]["OUTPUT0"], 2 * x)


async def test_a_synthetic_worker_takes_at_least_the_modelled_time_and_counts_it() -> None:
    config = SyntheticBackendConfig(base_ms=30.0, per_item_ms=10.0)
    async with Worker(config) as worker:
        started = time.perf_counter()
        out = await worker.run({"INPUT0": np.ones((4, 16), dtype=np.float32)})
        elapsed = time.perf_counter() - started
        assert elapsed >= 0.070
        assert out["OUTPUT0"].shape == (4, 16)
        assert worker.busy_s >= 0.070
        assert worker.batches == 1


async def test_a_worker_runs_on_its_cores_with_its_threads_and_gpu_share() -> None:
    placement = Placement(
        cores=(0,), threads=2, cuda_visible_devices="MIG-test-uuid", mps_thread_percentage=30
    )
    async with Worker(PythonBackendConfig(target="_serve_backends:PlacementEcho"), placement) as w:
        out = await w.run({})
    assert out["cores"].tolist() == [0]
    assert out["env"].tolist() == [
        "CUDA_VISIBLE_DEVICES=MIG-test-uuid",
        "MPS=30",
        "OMP_NUM_THREADS=2",
    ]


async def test_a_crash_fails_its_batch_at_once_and_the_worker_restarts() -> None:
    async with Worker(DOUBLER, name="crashy") as worker:
        first_pid = worker.pid
        with pytest.raises(
            WorkerCrashed, match="'crashy' died with a batch in flight: exit code 3"
        ):
            await asyncio.wait_for(worker.run({"X": _rows(2, first=CRASH)}), timeout=10)
        assert worker.restarts == 1
        out = await worker.run({"X": _rows(1, first=1.0)})
        np.testing.assert_array_equal(out["Y"], 2 * _rows(1, first=1.0))
        assert worker.pid not in (None, first_pid)


async def test_a_backend_error_fails_its_batch_and_the_worker_keeps_serving() -> None:
    async with Worker(DOUBLER) as worker:
        with pytest.raises(WorkerError, match="ValueError: seven is not a number") as caught:
            await worker.run({"X": _rows(1, first=RAISE)})
        assert not isinstance(caught.value, WorkerCrashed)
        out = await worker.run({"X": _rows(3)})
        np.testing.assert_array_equal(out["Y"], 2 * _rows(3))
        assert (worker.restarts, worker.batches) == (0, 2)


async def test_stop_fails_the_batch_in_flight_and_ends_a_busy_process() -> None:
    worker = Worker(SyntheticBackendConfig(base_ms=30_000.0))
    await worker.start()
    batch = asyncio.create_task(worker.run({"INPUT0": np.ones((1, 16), dtype=np.float32)}))
    await asyncio.sleep(0)  # one turn of the loop: the started worker's run sends the batch
    started = time.perf_counter()
    await worker.stop(timeout_s=0.2)
    assert time.perf_counter() - started < 3.0
    with pytest.raises(WorkerError, match="stopped while a batch ran"):
        await batch
    with pytest.raises(WorkerError, match="it was stopped"):
        await worker.run({"INPUT0": np.ones((1, 16), dtype=np.float32)})


async def test_a_missing_model_file_fails_start_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.onnx"
    with pytest.raises(ModelNotFoundError, match=f"{missing} does not exist") as caught:
        await Worker(OnnxBackendConfig(path=missing)).start()
    assert isinstance(caught.value, ConfigError)


async def test_a_core_that_does_not_exist_fails_start() -> None:
    with pytest.raises(PlacementError, match=r"cores \[4096\] do not exist"):
        await Worker(DOUBLER, Placement(cores=(0, 4096))).start()


async def test_a_target_that_cannot_be_imported_fails_start() -> None:
    with pytest.raises(BackendConfigError, match="cannot import 'no_such_module'"):
        await Worker(PythonBackendConfig(target="no_such_module:Backend")).start()


async def test_a_worker_that_dies_while_loading_fails_start_with_its_exit_code() -> None:
    dying = PythonBackendConfig(target="_serve_backends:DiesWhileLoading")
    with pytest.raises(WorkerStartError, match="exit code 5 while loading"):
        await Worker(dying).start()


@pytest.mark.skipif(
    "CUDAExecutionProvider" in onnxruntime.get_available_providers(),
    reason="this onnxruntime has the CUDA execution provider",
)
async def test_cuda_without_the_cuda_provider_names_the_fix(tmp_path: Path) -> None:
    config = OnnxBackendConfig(path=_doubling_model(tmp_path / "double.onnx"), device="cuda")
    with pytest.raises(BackendConfigError, match="install onnxruntime-gpu"):
        await Worker(config).start()


def test_backend_configs_are_chosen_by_kind() -> None:
    adapter: TypeAdapter[BackendConfig] = TypeAdapter(BackendConfig)
    assert adapter.validate_python({"kind": "synthetic", "base_ms": 2}) == SyntheticBackendConfig(
        base_ms=2.0
    )
    with pytest.raises(ValidationError, match="expected tags: 'onnx', 'synthetic', 'python'"):
        adapter.validate_python({"kind": "tensorrt"})
    with pytest.raises(ValidationError, match="repeat a core"):
        Placement(cores=(1, 1))


async def test_a_killed_process_fails_its_batch_naming_the_signal() -> None:
    async with Worker(SyntheticBackendConfig(base_ms=30_000.0)) as worker:
        batch = asyncio.create_task(worker.run({"INPUT0": np.ones((1, 16), dtype=np.float32)}))
        await asyncio.sleep(0)  # one turn of the loop: the started worker's run sends the batch
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        with pytest.raises(WorkerCrashed, match="exit code -9, killed by SIGKILL") as caught:
            await asyncio.wait_for(batch, timeout=10)
        assert caught.value.exit_code == -9
        assert worker.restarts == 1


async def test_after_a_cancelled_batch_the_next_gets_its_own_answer() -> None:
    async with Worker(SyntheticBackendConfig(base_ms=200.0)) as worker:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(worker.run({"INPUT0": np.zeros((1, 16), np.float32)}), 0.05)
        x = np.full((2, 16), 3.0, dtype=np.float32)
        out = await worker.run({"INPUT0": x})
        np.testing.assert_array_equal(out["OUTPUT0"], 2 * x)


async def test_a_worker_whose_restart_fails_is_down_and_says_why(tmp_path: Path) -> None:
    marker = str(tmp_path / "loaded")
    config = PythonBackendConfig(target="_serve_backends:LoadsOnce", options={"marker": marker})
    async with Worker(config) as worker:
        with pytest.raises(WorkerCrashed):
            await worker.run({"X": _rows(1, first=CRASH)})
        with pytest.raises(WorkerError, match=r"restart failed: .*loaded before"):
            await worker.run({"X": _rows(1)})
        assert worker.restarts == 1


def test_a_batch_bigger_than_the_pipe_buffer_runs_under_uvloop(tmp_path: Path) -> None:
    """uvloop's add_reader makes the pipe non-blocking; a multi-MB batch must still go
    through whole (the serve CLI runs on uvloop)."""
    import uvloop

    from ridgeline.serve.backends import PythonBackendConfig
    from ridgeline.serve.workers import Worker

    async def main() -> float:
        config = PythonBackendConfig(target="_serve_backends:Doubler")
        async with Worker(config) as worker:
            x = np.ones((262_144, 4), np.float32)  # 4 MiB
            out = await asyncio.wait_for(worker.run({"X": x}), 30)
            return float(out["Y"].sum())

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == 2 * 262_144 * 4


async def test_batches_of_every_size_and_kind_arrive_whole_through_shared_memory() -> None:
    """A batch's arrays go through the worker's shared buffer, which grows when a batch
    does not fit and is reused when it does; BYTES arrays travel in the message (above
    32 KiB from a thread). Every batch comes back exactly as sent."""
    rng = np.random.default_rng(7)
    batches = [
        {"a": rng.standard_normal((2, 3)).astype(np.float32)},
        {  # over the first 1 MiB buffer: it grows
            "a": rng.standard_normal((3, 200_000)).astype(np.float32),
            "ids": rng.integers(-(2**40), 2**40, (3, 5), dtype=np.int64),
            "mask": rng.random((3, 7)) > 0.5,
        },
        {  # a strided view, a half-precision array, an empty one, and small BYTES
            "a": rng.standard_normal((4, 6)).astype(np.float32)[:, ::2],
            "h": np.arange(9, dtype=np.float16).reshape(3, 3),
            "none": np.empty((0, 4), np.float32),
            "text": np.array([b"x", b"yz"], dtype=object),
        },
        {"text": np.array([b"w" * 1000] * 64, dtype=object)},  # 64 kB of BYTES inline
    ]
    async with Worker(PythonBackendConfig(target="_serve_backends:Echo")) as worker:
        for batch in batches:
            out = await asyncio.wait_for(worker.run(batch), 30)
            assert out.keys() == batch.keys()
            for name, x in batch.items():
                assert out[name].dtype == x.dtype and out[name].shape == x.shape
                assert np.array_equal(out[name], x), name
