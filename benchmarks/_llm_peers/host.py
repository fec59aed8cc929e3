"""What else the cores did while a tool ran: the tool's CPU time, the fake server's, and
the host's busy and steal shares from ``/proc/stat`` (the tools and the server share
this machine's cores, so a tool that needs more CPU leaves less to the server)."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Host:
    wall_s: float
    tool_cpu_s: float
    server_cpu_s: float
    busy_pct: float
    """Share of all cores busy (user, system, irq...: not idle, iowait or steal)."""
    steal_pct: float
    """Share of all cores' time the hypervisor gave elsewhere."""

    def brief(self) -> str:
        return (
            f"CPU {self.tool_cpu_s:.0f} s tool, {self.server_cpu_s:.0f} s server in "
            f"{self.wall_s:.0f} s; host {self.busy_pct:.0f} % busy, {self.steal_pct:.1f} % steal"
        )


@dataclass(frozen=True)
class Mark:
    """A moment's counters: ``/proc/stat`` and the waited-for children's CPU time."""

    stat: tuple[int, ...]
    children_cpu_s: float

    @classmethod
    def now(cls) -> Mark:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(_cpu_line(), usage.ru_utime + usage.ru_stime)


def _cpu_line() -> tuple[int, ...]:
    """user nice system idle iowait irq softirq steal (ticks, all cores)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return (0,) * 8
    return tuple(int(x) for x in first[1:9])


def process_cpu_s(pid: int) -> float:
    """User + system CPU of a live process (all its threads), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def between(start: Mark, end: Mark, wall_s: float, server_cpu_s: float) -> Host:
    """The tool's CPU (children waited for between the marks), the server's, the host's."""
    delta = [b - a for a, b in zip(start.stat, end.stat, strict=True)]
    total = sum(delta) or 1
    idle, iowait, steal = delta[3], delta[4], delta[7]
    return Host(
        wall_s=wall_s,
        tool_cpu_s=end.children_cpu_s - start.children_cpu_s,
        server_cpu_s=server_cpu_s,
        busy_pct=100.0 * (total - idle - iowait - steal) / total,
        steal_pct=100.0 * steal / total,
    )
