"""GPU readings from a Prometheus text endpoint: NVIDIA's DCGM exporter, or Triton's.

DCGM (labelled ``gpu="0"``, ``UUID``, ``modelName``): ``DCGM_FI_DEV_GPU_UTIL`` (percent),
``DCGM_FI_DEV_FB_USED`` / ``_FB_FREE`` (MiB), ``DCGM_FI_DEV_GPU_TEMP`` (°C),
``DCGM_FI_DEV_SM_CLOCK`` (MHz), ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` (NVML's bitmask),
``DCGM_FI_DEV_XID_ERRORS`` (the last XID code: non-zero and changed means a new error),
``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` (cumulative). Triton (labelled ``gpu_uuid``):
``nv_gpu_utilization`` (0..1), ``nv_gpu_memory_used_bytes``, ``nv_gpu_memory_total_bytes``.

XID and ECC counts are those since the previous sample; the first sample only sets the
baseline. A scrape that fails is counted (``failures``, ``last_error``) and gives no
samples: a monitoring hiccup does not stop a run.
"""

from __future__ import annotations

import re
import urllib.request
from collections import defaultdict

from ridgeline.telemetry._gpu_base import GpuSample, throttle_names
from ridgeline.telemetry.scrape import parse_metrics

_MIB = 1 << 20
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_ID_LABELS = ("gpu", "gpu_uuid", "UUID")


class PrometheusGpuMonitor:
    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.failures = 0
        self.last_error = ""
        self._xid: dict[int, int] = {}
        self._ecc: dict[int, float] = {}
        self._seen = 0

    def describe(self) -> str:
        seen = f"{self._seen} GPU{'s' if self._seen != 1 else ''} at last sample"
        failed = (
            f"; {self.failures} scrapes failed (last: {self.last_error})" if self.failures else ""
        )
        return f"GPU metrics from {self.url} ({seen}){failed}"

    def sample(self) -> list[GpuSample]:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
                values, _ = parse_metrics(resp.read().decode())
        except (OSError, ValueError) as e:
            self.failures += 1
            self.last_error = str(e) or type(e).__name__
            return []
        out = [self._sample(key, m) for key, m in _by_gpu(values).items()]
        self._seen = len(out)
        return out

    def _sample(self, key: tuple[int, str], m: dict[str, float]) -> GpuSample:
        index, name = key
        xid = m.get("DCGM_FI_DEV_XID_ERRORS")
        prev_xid = self._xid.get(index)
        new_xid = xid is not None and prev_xid is not None and xid != prev_xid and xid != 0
        if xid is not None:
            self._xid[index] = int(xid)
        ecc = m.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
        prev_ecc = self._ecc.get(index)
        if ecc is not None:
            self._ecc[index] = ecc
        mask = m.get(
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", m.get("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
        )
        util = m.get("DCGM_FI_DEV_GPU_UTIL")
        used, free = m.get("DCGM_FI_DEV_FB_USED"), m.get("DCGM_FI_DEV_FB_FREE")
        return GpuSample(
            index=index,
            name=name,
            utilisation=util / 100 if util is not None else m.get("nv_gpu_utilization"),
            memory_used=int(used * _MIB)
            if used is not None
            else _int(m, "nv_gpu_memory_used_bytes"),
            memory_total=int((used + free) * _MIB)
            if used is not None and free is not None
            else _int(m, "nv_gpu_memory_total_bytes"),
            temperature_c=m.get("DCGM_FI_DEV_GPU_TEMP"),
            sm_clock_mhz=m.get("DCGM_FI_DEV_SM_CLOCK"),
            throttle_reasons=throttle_names(int(mask)) if mask is not None else (),
            xid_errors=1 if new_xid else 0,
            last_xid=int(xid) if new_xid and xid is not None else None,
            ecc_dbe_errors=int(max(0.0, ecc - prev_ecc))
            if ecc is not None and prev_ecc is not None
            else 0,
        )


def _by_gpu(values: dict[str, float]) -> dict[tuple[int, str], dict[str, float]]:
    """Metrics of each GPU, keyed (index, name); index from the ``gpu`` label, else the
    GPU's rank among the UUIDs seen."""
    series: dict[str, dict[str, float]] = defaultdict(dict)
    names: dict[str, str] = {}
    indices: dict[str, int] = {}
    for key, v in values.items():
        metric, _, rest = key.partition("{")
        metric = metric.removesuffix("_total")  # the parser's suffix on counters
        if not metric.startswith(("DCGM_FI_DEV_", "nv_gpu_")):
            continue
        labels = dict(_LABEL.findall(rest))
        gid = next((labels[k] for k in _ID_LABELS if k in labels), None)
        if gid is None:
            continue
        series[gid][metric] = v
        names.setdefault(gid, labels.get("modelName") or labels.get("UUID") or gid)
        if labels.get("gpu", "").isdigit():
            indices[gid] = int(labels["gpu"])
    rank = {gid: i for i, gid in enumerate(sorted(series))}
    return {
        (indices.get(g, rank[g]), names[g]): m
        for g, m in sorted(series.items(), key=lambda kv: indices.get(kv[0], rank[kv[0]]))
    }


def _int(m: dict[str, float], name: str) -> int | None:
    v = m.get(name)
    return int(v) if v is not None else None
