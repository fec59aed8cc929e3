"""GPU readings through NVML (``pynvml`` from nvidia-ml-py, imported lazily).

Readings a device does not support (temperature on some boards, ECC off, XID events in
some containers) are left None or zero rather than failing the sample. XID and ECC
counts are those since the previous sample; the first sample counts from the monitor's
opening, so errors from before the run are not held against it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ridgeline.errors import GpuUnavailableError
from ridgeline.telemetry._gpu_base import GpuSample, throttle_names

_FIX = "install the NVIDIA driver and `pip install 'ridgeline[gpu]'`, or give a DCGM exporter URL"
_MAX_EVENTS = 1000


class NvmlMonitor:
    """Every GPU NVML sees. ``nvml`` is the ``pynvml`` module unless given (tests)."""

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as e:
                raise GpuUnavailableError("NVML: nvidia-ml-py is not installed", _FIX) from e
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            missing = getattr(nvml, "NVMLError_LibraryNotFound", ())
            why = "libnvidia-ml.so not found" if isinstance(e, missing) else str(e)
            raise GpuUnavailableError(f"NVML: {why}", _FIX) from e
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            nvml.nvmlShutdown()
            raise GpuUnavailableError("NVML: no GPU device", _FIX)
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._names = [_text(nvml.nvmlDeviceGetName(h)) for h in self._handles]
        self._events = self._watch_xids()
        self._ecc = [self._ecc_count(h) for h in self._handles]

    def describe(self) -> str:
        gpus = ", ".join(f"{i}: {n}" for i, n in enumerate(self._names))
        xid = "watched" if self._events is not None else "not supported here"
        plural = "s" if len(self._names) != 1 else ""
        return f"NVML: {len(self._names)} GPU{plural} ({gpus}); XID events {xid}"

    def sample(self) -> list[GpuSample]:
        nvml, read = self._nvml, self._read
        xids = self._drain_xids()
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        out: list[GpuSample] = []
        for i, h in enumerate(self._handles):
            mem = read(nvml.nvmlDeviceGetMemoryInfo, h)
            util = read(nvml.nvmlDeviceGetUtilizationRates, h)
            temp = read(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
            clock = read(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
            mask = read(reasons, h)
            ecc = self._ecc_count(h)
            before, self._ecc[i] = self._ecc[i], ecc
            codes = xids.get(i, [])
            out.append(
                GpuSample(
                    index=i,
                    name=self._names[i],
                    utilisation=float(util.gpu) / 100 if util is not None else None,
                    memory_used=int(mem.used) if mem is not None else None,
                    memory_total=int(mem.total) if mem is not None else None,
                    temperature_c=float(temp) if temp is not None else None,
                    sm_clock_mhz=float(clock) if clock is not None else None,
                    throttle_reasons=throttle_names(int(mask)) if mask is not None else (),
                    xid_errors=len(codes),
                    last_xid=codes[-1] if codes else None,
                    ecc_dbe_errors=max(0, ecc - before)
                    if ecc is not None and before is not None
                    else 0,
                )
            )
        return out

    def close(self) -> None:
        """Stop watching XID events and shut NVML down."""
        if self._events is not None:
            self._read(self._nvml.nvmlEventSetFree, self._events)
            self._events = None
        self._read(self._nvml.nvmlShutdown)

    def _read(self, get: Callable[..., Any], *args: Any) -> Any:
        """``get(*args)``, or None where the device does not support it."""
        try:
            return get(*args)
        except self._nvml.NVMLError:
            return None

    def _ecc_count(self, handle: Any) -> int | None:
        nvml = self._nvml
        n = self._read(
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        return int(n) if n is not None else None

    def _watch_xids(self) -> Any:
        nvml = self._nvml
        events = self._read(nvml.nvmlEventSetCreate)
        if events is None:
            return None
        ok = False
        for h in self._handles:
            try:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
                ok = True
            except nvml.NVMLError:
                continue
        if not ok:
            self._read(nvml.nvmlEventSetFree, events)
            return None
        return events

    def _drain_xids(self) -> dict[int, list[int]]:
        """XID codes by GPU index, from every event waiting (without blocking)."""
        nvml, out = self._nvml, dict[int, list[int]]()
        if self._events is None:
            return out
        for _ in range(_MAX_EVENTS):
            try:
                ev = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError:  # NVMLError_Timeout: none left
                break
            index = self._read(nvml.nvmlDeviceGetIndex, ev.device)
            out.setdefault(int(index) if index is not None else 0, []).append(int(ev.eventData))
        return out


def _text(name: str | bytes) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)
