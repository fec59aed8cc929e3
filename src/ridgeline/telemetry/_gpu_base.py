"""GPU samples and the clock-throttle bitmask, shared by the NVML and Prometheus readers.

The bitmask is NVML's ``nvmlClocksThrottleReason*`` (now "clocks event reasons"), which
DCGM exports unchanged as ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``.
"""

from __future__ import annotations

from dataclasses import dataclass

THROTTLE_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
HARMFUL_THROTTLES = frozenset(
    {
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
)
"""Reasons that slow a loaded GPU below its clocks. Idle, application clocks, sync boost
and display settings are not problems."""


def throttle_names(mask: int) -> tuple[str, ...]:
    """The names of the bits set in an NVML/DCGM throttle-reason bitmask."""
    return tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one moment. None where the source does not report a reading."""

    index: int
    name: str
    utilisation: float | None = None
    """Busy fraction, 0..1."""
    memory_used: int | None = None
    """Bytes."""
    memory_total: int | None = None
    """Bytes."""
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    """Every reason set (``THROTTLE_REASONS``), harmless ones included."""
    xid_errors: int = 0
    """XID errors since the previous sample."""
    last_xid: int | None = None
    """The code of the last XID error seen (e.g. 79: the GPU fell off the bus)."""
    ecc_dbe_errors: int = 0
    """Volatile double-bit ECC errors since the previous sample."""
