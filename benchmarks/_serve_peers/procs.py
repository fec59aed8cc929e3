"""A server in a process group of its own: started, waited for, and stopped — the
whole group, whatever happens (an error, Ctrl-C) — so that no process is left behind.

Each server starts in a new session (``start_new_session``): Ctrl-C at the terminal
reaches the benchmark only, whose ``finally`` stops the group in order — a polite signal
to the leader (MLServer and Ray shut their workers down themselves), then SIGTERM and
SIGKILL to whatever of the group is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


class PeerFailed(Exception):
    """A server did not come up; the message says why (the tail of its log)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def log_tail(log: Path, lines: int = 6) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " / ".join(line.strip() for line in text[-lines:]) or "(empty log)"


@contextlib.contextmanager
def running(
    cmd: Sequence[str],
    *,
    ready_url: str,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    start_timeout_s: float = 180.0,
    stop_signal: int = signal.SIGTERM,
    stop_timeout_s: float = 30.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``cmd`` (its output to ``log``), wait until ``ready_url`` answers 200, yield
    the process; on the way out stop its whole process group."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + start_timeout_s
        while not answers(ready_url):
            if proc.poll() is not None:
                raise PeerFailed(f"exited with code {proc.returncode}: {log_tail(log)}")
            if time.monotonic() > deadline:
                raise PeerFailed(f"not ready after {start_timeout_s:.0f} s: {log_tail(log)}")
            time.sleep(0.5)
        yield proc
    finally:
        stop_group(proc, stop_signal, stop_timeout_s)


def stop_group(proc: subprocess.Popen[bytes], sig: int, timeout_s: float) -> None:
    """``sig`` to the leader, then the group: SIGTERM, SIGKILL. Only this group's ids."""
    pgid = proc.pid  # the leader of its own session and group
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout_s)
    for final in (signal.SIGTERM, signal.SIGKILL):
        if not _group_alive(pgid):
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, final)
        for _ in range(50):
            if not _group_alive(pgid):
                break
            time.sleep(0.1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is alive (zombies are dead)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after the ')'
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
