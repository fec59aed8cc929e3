"""GPU health: a DCGM-style and a Triton-style endpoint served for real on loopback,
NVML through a stand-in for the third-party ``pynvml`` module, the no-GPU path here."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web

from _loopback import serving
from ridgeline.health import HealthState, Observation, assess, parse_slo
from ridgeline.telemetry.gpu import (
    GpuMonitor,
    GpuSample,
    GpuUnavailableError,
    NoGpu,
    NvmlMonitor,
    PrometheusGpuMonitor,
    detect_gpu_monitor,
    fatal_gpu_problem,
    gpu_problems,
    mean_utilisation,
    throttle_names,
)

H100 = "NVIDIA H100 80GB HBM3"
_KINDS = {
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
}


def dcgm(*gpus: dict[str, float]) -> str:
    """DCGM exporter text: one dict of field values per GPU."""
    lines = []
    for name, kind in _KINDS.items():
        lines += [f"# HELP {name} {name}.", f"# TYPE {name} {kind}"]
        for i, g in enumerate(gpus):
            labels = f'gpu="{i}",UUID="GPU-{i}",device="nvidia{i}",modelName="{H100}",Hostname="h"'
            lines.append(f"{name}{{{labels}}} {g[name]}")
    return "\n".join(lines) + "\n"


def healthy(**kw: float) -> dict[str, float]:
    g: dict[str, float] = dict(
        DCGM_FI_DEV_GPU_UTIL=50,
        DCGM_FI_DEV_FB_USED=1024,
        DCGM_FI_DEV_FB_FREE=3072,
        DCGM_FI_DEV_GPU_TEMP=60,
        DCGM_FI_DEV_SM_CLOCK=1980,
        DCGM_FI_DEV_CLOCK_THROTTLE_REASONS=0,
        DCGM_FI_DEV_XID_ERRORS=0,
        DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=0,
    )
    g.update(kw)
    return g


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[list[str]], Any]]:
    """Start a real metrics endpoint on 127.0.0.1 answering the given texts in turn."""
    async with AsyncExitStack() as servers:

        async def start(texts: list[str]) -> str:
            pending = list(texts)

            async def metrics(_: web.Request) -> web.Response:
                text = pending.pop(0) if len(pending) > 1 else pending[0]
                return web.Response(text=text, content_type="text/plain")

            return await servers.enter_async_context(serving("/metrics", metrics))

        yield start


async def test_dcgm_exporter_healthy_and_throttling_gpus(
    serve: Callable[[list[str]], Any],
) -> None:
    hot = dict(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS=0x21, DCGM_FI_DEV_GPU_TEMP=91)
    url = await serve(
        [
            dcgm(healthy(), healthy(**hot, DCGM_FI_DEV_XID_ERRORS=13)),
            dcgm(healthy(), healthy(**hot, DCGM_FI_DEV_XID_ERRORS=79,
                                    DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=2)),
            dcgm(healthy(), healthy(DCGM_FI_DEV_XID_ERRORS=79, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=2)),
        ]
    )  # fmt: skip
    mon: GpuMonitor = PrometheusGpuMonitor(url)
    first = await asyncio.to_thread(mon.sample)
    assert first[0] == GpuSample(
        index=0, name=H100, utilisation=0.5, memory_used=1024 << 20, memory_total=4096 << 20,
        temperature_c=60.0, sm_clock_mhz=1980.0,
    )  # fmt: skip
    assert first[1].throttle_reasons == ("gpu_idle", "sw_thermal_slowdown")
    # an XID code already there at the first sample is the baseline, not a new error
    assert (first[1].xid_errors, first[1].last_xid) == (0, None)
    assert gpu_problems(first) == (
        "GPU 1 throttling: sw_thermal_slowdown",
        "GPU 1 at 91 °C > 87 °C",
    )
    second = await asyncio.to_thread(mon.sample)
    assert (second[1].xid_errors, second[1].last_xid, second[1].ecc_dbe_errors) == (1, 79, 2)
    assert gpu_problems(second) == (
        "GPU 1 throttling: sw_thermal_slowdown",
        "GPU 1 at 91 °C > 87 °C",
        "GPU 1: 1 XID error (last 79)",
        "GPU 1: 2 ECC double-bit errors",
    )
    third = await asyncio.to_thread(mon.sample)  # same XID code, same ECC count: nothing new
    assert gpu_problems(third) == ()
    assert mon.describe() == f"GPU metrics from {url} (2 GPUs at last sample)"


async def test_triton_gpu_metrics(serve: Callable[[list[str]], Any]) -> None:
    text = "".join(
        f'# TYPE {n} gauge\n{n}{{gpu_uuid="GPU-{u}"}} {v}\n'
        for n, vals in (
            ("nv_gpu_utilization", (0.25, 0.75)),
            ("nv_gpu_memory_used_bytes", (1e9, 2e9)),
            ("nv_gpu_memory_total_bytes", (8e9, 8e9)),
        )
        for u, v in zip("ba", vals, strict=True)
    )
    samples = await asyncio.to_thread(PrometheusGpuMonitor(await serve([text])).sample)
    assert samples == [
        GpuSample(index=0, name="GPU-a", utilisation=0.75, memory_used=2_000_000_000,
                  memory_total=8_000_000_000),
        GpuSample(index=1, name="GPU-b", utilisation=0.25, memory_used=1_000_000_000,
                  memory_total=8_000_000_000),
    ]  # fmt: skip
    assert mean_utilisation(samples) == 0.5
    assert gpu_problems(samples) == ()


def test_an_unreachable_endpoint_is_counted_not_raised() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the scrape: nobody listens
    mon = PrometheusGpuMonitor(f"http://127.0.0.1:{port}/metrics", timeout_s=1.0)
    assert mon.sample() == []
    assert mon.failures == 1
    assert "1 scrapes failed (last: " in mon.describe()


def test_without_a_gpu_health_rests_on_latency_errors_and_throughput() -> None:
    mon = detect_gpu_monitor()
    if isinstance(mon, NvmlMonitor):
        pytest.skip("this machine has a GPU")
    assert isinstance(mon, NoGpu)
    assert mon.sample() == []
    assert mon.describe().startswith("no GPU found (NVML: ")
    assert mon.describe().endswith("); health is judged on latency, errors and throughput only")
    assert isinstance(detect_gpu_monitor("http://127.0.0.1:1/metrics"), PrometheusGpuMonitor)
    assert NoGpu("NVML: libnvidia-ml.so not found").describe() == (
        "no GPU found (NVML: libnvidia-ml.so not found); health is judged on latency, "
        "errors and throughput only"
    )


def test_throttle_bits_and_which_ones_are_problems() -> None:
    assert throttle_names(0x1) == ("gpu_idle",)
    assert throttle_names(0x4 | 0x8 | 0x40 | 0x80) == (
        "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
    )  # fmt: skip
    idle = GpuSample(0, "g", throttle_reasons=("gpu_idle", "applications_clocks_setting"))
    assert gpu_problems([idle]) == ()
    assert gpu_problems([GpuSample(3, "g", xid_errors=2)]) == ("GPU 3: 2 XID errors",)
    assert gpu_problems([GpuSample(0, "g", temperature_c=80.0)], max_temperature_c=75) == (
        "GPU 0 at 80 °C > 75 °C",
    )


def test_xid_and_ecc_are_critical_throttling_is_unhealthy() -> None:
    problems = gpu_problems(
        [GpuSample(0, "g", throttle_reasons=("hw_slowdown",), ecc_dbe_errors=1)]
    )
    assert problems == ("GPU 0 throttling: hw_slowdown", "GPU 0: 1 ECC double-bit error")
    assert [fatal_gpu_problem(p) for p in problems] == [False, True]
    policy = parse_slo("p99<100ms")
    base = dict(start_s=0.0, end_s=1.0, offered_rps=10.0, achieved_rps=10.0, error_rate=0.0,
                latency_ms={"p99": 10.0}, answered=10, gpu_utilisation=0.9)  # fmt: skip
    ok = assess(Observation(**base), policy)  # type: ignore[arg-type]
    slow = assess(Observation(**base, gpu_problems=problems[:1]), policy)  # type: ignore[arg-type]
    failing = assess(Observation(**base, gpu_problems=problems), policy)  # type: ignore[arg-type]
    assert (ok.state, ok.metric_scores["gpu"]) == (HealthState.HEALTHY, 0.0)
    assert (slow.state, slow.reason) == (HealthState.UNHEALTHY, "GPU 0 throttling: hw_slowdown")
    assert (failing.state, failing.reason) == (
        HealthState.CRITICAL,
        "GPU 0: 1 ECC double-bit error",
    )


class FakeNvml:
    """A stand-in for the third-party ``pynvml`` module: handles are GPU indices."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_Timeout(NVMLError):
        pass

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM = 0, 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus: list[dict[str, Any]], *, library: bool = True) -> None:
        self.gpus, self.library, self.down = gpus, library, False
        self.xids: list[tuple[int, int]] = []

    def nvmlInit(self) -> None:
        if not self.library:
            raise self.NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return str(self.gpus[h]["name"]).encode()

    def _get(self, h: int, key: str) -> Any:
        if key not in self.gpus[h]:
            raise self.NVMLError(f"{key}: Not Supported")
        return self.gpus[h][key]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._get(h, "util"), memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=self._get(h, "used"), total=self._get(h, "total"))

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return int(self._get(h, "temp"))

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return int(self._get(h, "sm"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return int(self._get(h, "throttle"))

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)  # uncorrected (double-bit), volatile
        return int(self._get(h, "dbe"))

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, h: int, kinds: int, events: str) -> None:
        assert (kinds, events) == (0x8, "events")

    def nvmlEventSetWait(self, events: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0
        if not self.xids:
            raise self.NVMLError_Timeout("Timeout")
        gpu, code = self.xids.pop(0)
        return SimpleNamespace(device=gpu, eventType=0x8, eventData=code)

    def nvmlEventSetFree(self, events: str) -> None:
        pass


def test_nvml_monitor_reads_every_gpu() -> None:
    nvml = FakeNvml(
        [
            dict(name="NVIDIA H200", util=40, used=2 << 30, total=141 << 30, temp=55, sm=1980,
                 throttle=0x1, dbe=3),
            dict(name="NVIDIA H200", util=100, used=1 << 30, total=141 << 30, sm=1200,
                 throttle=0x20 | 0x4, dbe=0),  # no temperature sensor
        ]
    )  # fmt: skip
    mon = NvmlMonitor(nvml)
    assert mon.describe() == "NVML: 2 GPUs (0: NVIDIA H200, 1: NVIDIA H200); XID events watched"
    first = mon.sample()
    assert first == [
        GpuSample(0, "NVIDIA H200", 0.4, 2 << 30, 141 << 30, 55.0, 1980.0, ("gpu_idle",)),
        GpuSample(
            1,
            "NVIDIA H200",
            1.0,
            1 << 30,
            141 << 30,
            None,
            1200.0,
            ("sw_power_cap", "sw_thermal_slowdown"),
        ),
    ]  # fmt: skip  (3 ECC errors from before the monitor opened are not new)
    nvml.xids += [(1, 13), (1, 79)]
    nvml.gpus[0]["dbe"] = 5
    second = mon.sample()
    assert gpu_problems(second) == (
        "GPU 0: 2 ECC double-bit errors",
        "GPU 1 throttling: sw_power_cap, sw_thermal_slowdown",
        "GPU 1: 2 XID errors (last 79)",
    )
    assert gpu_problems(mon.sample()) == ("GPU 1 throttling: sw_power_cap, sw_thermal_slowdown",)
    mon.close()
    assert nvml.down


def test_nvml_without_its_library_or_a_device() -> None:
    with pytest.raises(GpuUnavailableError) as e:
        NvmlMonitor(FakeNvml([], library=False))
    assert e.value.reason == "NVML: libnvidia-ml.so not found"
    assert "pip install 'ridgeline[gpu]'" in str(e.value)
    with pytest.raises(GpuUnavailableError, match="NVML: no GPU device"):
        NvmlMonitor(FakeNvml([]))


@pytest.mark.gpu
def test_nvml_on_a_real_gpu() -> None:
    try:
        mon = NvmlMonitor()
    except GpuUnavailableError as e:
        pytest.skip(e.reason)
    try:
        samples = mon.sample()
        assert [s.index for s in samples] == list(range(len(samples))) and samples
        for s in samples:
            assert s.name
            assert s.utilisation is None or 0.0 <= s.utilisation <= 1.0
            assert s.memory_total is None or 0 < (s.memory_used or 0) <= s.memory_total
        assert mon.describe().startswith("NVML: ")
        assert isinstance(detect_gpu_monitor(), NvmlMonitor)
    finally:
        mon.close()
