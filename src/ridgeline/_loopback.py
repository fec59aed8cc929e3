"""Which sockets a process and the processes it started listen on, and whether any is
reachable from outside this machine (bound beyond 127.0.0.0/8 and ::1).

Read from ``/proc`` (Linux): each process's socket inodes (``/proc/PID/fd``) matched to
the listening TCP sockets of ``/proc/net/tcp`` and ``tcp6``. Elsewhere nothing is found
(an empty list: the check cannot refuse what it cannot see, and says so where it is
used). Used where the project starts servers it does not write itself (a local Ray).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Listener", "descendants", "listeners", "loopback_only_namespace", "outside_loopback"]

PROC = Path("/proc")
LISTEN = "0A"
"""``st`` of a listening socket in ``/proc/net/tcp``."""


@dataclass(frozen=True, slots=True)
class Listener:
    pid: int
    name: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        mapped = getattr(ip, "ipv4_mapped", None)
        return (mapped or ip).is_loopback

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.name} (pid {self.pid}) on {host}:{self.port}"


def descendants(root: int | None = None) -> set[int]:
    """``root`` (this process by default) and every process it started, at any depth,
    that is still running."""
    root = os.getpid() if root is None else root
    parent: dict[int, int] = {}
    for d in PROC.glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d.name)] = int(fields[1])
    found, todo = {root}, [root]
    while todo:
        p = todo.pop()
        for child, ppid in parent.items():
            if ppid == p and child not in found:
                found.add(child)
                todo.append(child)
    return found


def listeners(pids: set[int]) -> list[Listener]:
    """The listening TCP sockets the processes ``pids`` hold."""
    sockets = _listening()
    out: list[Listener] = []
    for pid in sorted(pids):
        try:
            name = (PROC / str(pid) / "comm").read_text().strip()
            fds = list((PROC / str(pid) / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and (inode := target[8:-1]) in sockets:
                address, port = sockets[inode]
                out.append(Listener(pid, name, address, port))
    return out


def outside_loopback(pids: set[int] | None = None) -> list[Listener]:
    """The listeners of ``pids`` (this process and its descendants by default) that
    another machine could reach: none in a network namespace whose only interface is
    loopback (``loopback_only_namespace``), where a socket on every interface is on
    loopback alone."""
    if loopback_only_namespace():
        return []
    return [s for s in listeners(descendants() if pids is None else pids) if not s.loopback]


def loopback_only_namespace() -> bool:
    """Whether this process's network namespace has no interface but loopback (``lo``),
    as in one ``unshare --net`` made: read from ``/proc/net/dev``, which lists the
    namespace's own interfaces (False where it cannot be read)."""
    try:
        lines = (PROC / "net" / "dev").read_text().splitlines()[2:]
    except OSError:
        return False
    names = {line.split(":", 1)[0].strip() for line in lines if ":" in line}
    return names == {"lo"}


def _listening() -> dict[str, tuple[str, int]]:
    """inode → (address, port) of every listening TCP socket."""
    found: dict[str, tuple[str, int]] = {}
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            hex_addr, hex_port = fields[1].split(":")
            found[fields[9]] = (_address(hex_addr, family), int(hex_port, 16))
    return found


def _address(hex_addr: str, family: int) -> str:
    raw = bytes.fromhex(hex_addr)
    # the kernel writes each 32-bit word in host order
    words = struct.unpack(f"<{len(raw) // 4}I", raw)
    return socket.inet_ntop(family, struct.pack(f">{len(words)}I", *words))
